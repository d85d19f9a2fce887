//! Groups end to end, as a client sees them: read receipts counted over current members, and
//! what former and later members may ask. The real binary on loopback, every test on SQLite
//! and (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::collections::BTreeMap;

use common::groups::{create, id_of, say};
use common::server::{Backend, User, ok, setup};
use serde_json::json;

on_both!(
    group_receipts_count_reads,
    former_members_see_no_read_positions_or_earlier_receipts,
    receipts_count_members_from_their_current_interval,
    receipts_agree_with_a_count_over_every_member,
);

async fn group_receipts_count_reads(b: Backend) {
    let (_db, s) = setup(&b, "group-receipts", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    s.user("dave").await;
    s.user("erin").await;
    let frank = s.user("frank").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "R", "members": ["bob", "carol", "dave"]}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    assert_eq!(say(&s, &alice, cid, 2, "one").await, 2);
    assert_eq!(say(&s, &alice, cid, 2, "two").await, 3);
    let receipts = |who: User, asked: Vec<i64>| {
        let s = &s;
        let path = g("/receipts");
        async move {
            let got = ok(s, &who, "POST", &path, Some(json!({ "seqs": asked }))).await;
            got["receipts"]
                .as_array()
                .unwrap_or_else(|| panic!("{got}"))
                .iter()
                .map(|r| {
                    (
                        r["seq"].as_i64().unwrap(),
                        (r["read"].as_i64().unwrap(), r["of"].as_i64().unwrap()),
                    )
                })
                .collect::<BTreeMap<_, _>>()
        }
    };
    let read = |who: User, seq: i64| {
        let s = &s;
        async move {
            ok(
                s,
                &who,
                "POST",
                &format!("/v1/conversations/{cid}/read"),
                Some(json!({ "seq": seq })),
            )
            .await
        }
    };
    assert_eq!(
        receipts(alice.clone(), vec![2, 3]).await,
        [(2, (0, 3)), (3, (0, 3))].into()
    );
    read(bob.clone(), 2).await;
    assert_eq!(
        receipts(alice.clone(), vec![2, 3]).await,
        [(2, (1, 3)), (3, (0, 3))].into()
    );
    read(carol.clone(), 3).await;
    assert_eq!(
        receipts(alice.clone(), vec![2, 3]).await,
        [(2, (2, 3)), (3, (1, 3))].into()
    );
    assert_eq!(
        receipts(bob.clone(), vec![3, 2]).await,
        [(2, (2, 3)), (3, (1, 3))].into(),
        "any member may ask"
    );
    // bob's own message: the others are counted, its sender is not.
    assert_eq!(say(&s, &bob, cid, 2, "three").await, 4);
    assert_eq!(receipts(alice.clone(), vec![4]).await, [(4, (0, 3))].into());
    read(alice.clone(), 4).await;
    assert_eq!(receipts(bob.clone(), vec![4]).await, [(4, (1, 3))].into());
    // Later members are not counted; departed ones no longer.
    ok(
        &s,
        &alice,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["erin"]})),
    )
    .await;
    assert_eq!(receipts(alice.clone(), vec![2]).await, [(2, (2, 3))].into());
    ok(
        &s,
        &alice,
        "POST",
        &g("/kick"),
        Some(json!({"userIds": ["dave"]})),
    )
    .await;
    // bob read seq 3 by sending seq 4.
    assert_eq!(
        receipts(alice.clone(), vec![2, 3]).await,
        [(2, (2, 2)), (3, (2, 2))].into()
    );

    let many: Vec<i64> = (1..=101).collect();
    s.expect_errors(&[
        (
            Some(&alice.token),
            "POST",
            &g("/receipts"),
            Some(json!({"seqs": [999]})),
            404,
            "message_not_found",
        ),
        (
            Some(&alice.token),
            "POST",
            &g("/receipts"),
            Some(json!({"seqs": []})),
            400,
            "bad_request",
        ),
        (
            Some(&alice.token),
            "POST",
            &g("/receipts"),
            Some(json!({ "seqs": many })),
            400,
            "bad_request",
        ),
        (
            Some(&frank.token),
            "POST",
            &g("/receipts"),
            Some(json!({"seqs": [2]})),
            403,
            "not_a_member",
        ),
    ])
    .await;
}

/// Read positions and receipts are for current members, about what they could see.
async fn former_members_see_no_read_positions_or_earlier_receipts(b: Backend) {
    let (_db, s) = setup(&b, "former-members", "").await;
    let alice = s.user("alice").await;
    s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "F", "members": ["bob", "carol"]}),
        )
        .await,
    );
    let early = say(&s, &alice, cid, 2, "early").await;
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    assert_eq!(
        s.get(&carol, &format!("/v1/conversations/{cid}/read-positions"))
            .await["positions"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    ok(
        &s,
        &alice,
        "POST",
        &g("/kick"),
        Some(json!({"userIds": ["carol"]})),
    )
    .await;
    s.expect_error(
        "GET",
        &format!("/v1/conversations/{cid}/read-positions"),
        Some(&carol.token),
        None,
        403,
        "not_a_member",
    )
    .await;
    s.expect_error(
        "POST",
        &g("/receipts"),
        Some(&carol.token),
        Some(json!({"seqs": [early]})),
        403,
        "not_a_member",
    )
    .await;
    ok(
        &s,
        &alice,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["dave"]})),
    )
    .await;
    s.expect_error(
        "POST",
        &g("/receipts"),
        Some(&dave.token),
        Some(json!({"seqs": [early]})),
        404,
        "message_not_found",
    )
    .await;
    let later = say(&s, &alice, cid, 2, "later").await;
    let r = ok(
        &s,
        &dave,
        "POST",
        &g("/receipts"),
        Some(json!({"seqs": [later]})),
    )
    .await;
    assert_eq!(r["receipts"][0]["seq"], later);
    assert_eq!(
        r["receipts"][0]["of"], 2,
        "bob and dave, not alice (the sender) nor carol (gone)"
    );
}

/// A member who left and came back counts only for what was sent since their return (their
/// earlier interval does not); the tip of their own return counts as read by them. Seqs are
/// answered in the order asked, repeats included.
async fn receipts_count_members_from_their_current_interval(b: Backend) {
    let (_db, s) = setup(&b, "receipts-rejoin", "").await;
    let alice = s.user("alice").await;
    s.user("bob").await;
    let carol = s.user("carol").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "J", "members": ["bob", "carol"]}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let early = say(&s, &alice, cid, 2, "early").await;
    ok(
        &s,
        &carol,
        "POST",
        &format!("/v1/conversations/{cid}/read"),
        Some(json!({ "seq": early })),
    )
    .await;
    ok(&s, &carol, "POST", &g("/quit"), None).await;
    ok(
        &s,
        &alice,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["carol"]})),
    )
    .await;
    let back = early + 2;
    let later = say(&s, &alice, cid, 2, "later").await;
    assert_eq!(later, back + 1);
    let got = ok(
        &s,
        &alice,
        "POST",
        &g("/receipts"),
        Some(json!({ "seqs": [later, early, back, later] })),
    )
    .await;
    assert_eq!(
        got,
        json!({"receipts": [
            {"seq": later, "read": 0, "delivered": 0, "of": 2},
            {"seq": early, "read": 0, "delivered": 0, "of": 1},
            {"seq": back, "read": 1, "delivered": 1, "of": 2},
            {"seq": later, "read": 0, "delivered": 0, "of": 2},
        ]}),
        "early: bob only (carol is back since, alice sent it); back: carol saw her own return \
         (a read delivers too)"
    );
}

/// Six members at six different places (two joined partway; reads, deliveries and their
/// own sends move them), several senders: every receipt asked, alone or with others,
/// equals the count of the documented rule over each member's join, read and delivered
/// seq, kept here as the test does things.
async fn receipts_agree_with_a_count_over_every_member(b: Backend) {
    let (_db, s) = setup(&b, "receipts-model", "").await;
    let names = ["alice", "bob", "carol", "dave", "erin", "frank"];
    let mut users = BTreeMap::new();
    for n in names {
        users.insert(n, s.user(n).await);
    }
    let cid = id_of(
        &create(
            &s,
            &users["alice"],
            json!({"name": "M", "members": ["bob", "carol", "dave"]}),
        )
        .await,
    );
    // Per member: (joined after, read, delivered), as the docs define them. The creation
    // tip (seq 1) is read by everyone in the group then.
    let mut at: BTreeMap<&str, (i64, i64, i64)> =
        names[..4].iter().map(|&n| (n, (0, 1, 0))).collect();
    let mut sender: BTreeMap<i64, &str> = BTreeMap::new();
    let send = |who: &'static str, at: &mut BTreeMap<&str, (i64, i64, i64)>, seq: i64| {
        let p = at.get_mut(who).unwrap();
        p.1 = p.1.max(seq);
    };
    for who in ["alice", "bob", "carol", "alice"] {
        let seq = say(&s, &users[who], cid, 2, "before").await;
        send(who, &mut at, seq);
        sender.insert(seq, who);
    }
    let added = ok(
        &s,
        &users["alice"],
        "POST",
        &format!("/v1/groups/{cid}/members"),
        Some(json!({"userIds": ["erin", "frank"]})),
    )
    .await;
    assert_eq!(added["added"], json!(["erin", "frank"]), "{added}");
    // They see the tip of their arrival (seq 6) and have read it.
    at.insert("erin", (5, 6, 0));
    at.insert("frank", (5, 6, 0));
    for who in ["bob", "erin", "alice", "dave"] {
        let seq = say(&s, &users[who], cid, 2, "after").await;
        send(who, &mut at, seq);
        sender.insert(seq, who);
    }
    assert_eq!(
        sender.keys().copied().collect::<Vec<_>>(),
        [2, 3, 4, 5, 7, 8, 9, 10]
    );
    for (who, what, seq) in [
        ("bob", "read", 8),
        ("carol", "received", 6),
        ("frank", "received", 10),
        ("dave", "read", 3),
        ("erin", "received", 9),
    ] {
        ok(
            &s,
            &users[who],
            "POST",
            &format!("/v1/conversations/{cid}/{what}"),
            Some(json!({ "seq": seq })),
        )
        .await;
        let p = at.get_mut(who).unwrap();
        if what == "read" {
            p.1 = p.1.max(seq);
        } else {
            p.2 = p.2.max(seq);
        }
    }
    let expected = |at: &BTreeMap<&str, (i64, i64, i64)>, seq: i64| {
        let (mut read, mut delivered, mut of) = (0, 0, 0);
        for (who, &(joined_after, r, d)) in at {
            if joined_after < seq && sender[&seq] != *who {
                of += 1;
                read += i64::from(r >= seq);
                delivered += i64::from(r.max(d) >= seq);
            }
        }
        json!({"seq": seq, "read": read, "delivered": delivered, "of": of})
    };
    let asked: [&[i64]; 5] = [
        &[2, 3, 4, 5, 7, 8, 9, 10],
        &[10, 3],
        &[7],
        &[5, 8, 5],
        &[9, 4, 2],
    ];
    for seqs in asked {
        let got = ok(
            &s,
            &users["carol"],
            "POST",
            &format!("/v1/groups/{cid}/receipts"),
            Some(json!({ "seqs": seqs })),
        )
        .await;
        let want: Vec<_> = seqs.iter().map(|&seq| expected(&at, seq)).collect();
        assert_eq!(got, json!({ "receipts": want }), "asked {seqs:?}");
    }

    // Asked together, by the four members who saw every seq, three times over: the asks that arrive while
    // the group's pass over its members runs share the next one, which must cover each
    // one's seqs and senders. Every answer is still the count above.
    let path = format!("/v1/groups/{cid}/receipts");
    let together = (0..3)
        .flat_map(|_| asked)
        .zip(names[..4].iter().cycle())
        .map(|(seqs, who)| {
            let (s, path, u) = (&s, &path, &users[who]);
            async move {
                let got = ok(s, u, "POST", path, Some(json!({ "seqs": seqs }))).await;
                (seqs, got)
            }
        });
    for (seqs, got) in futures_util::future::join_all(together).await {
        let want: Vec<_> = seqs.iter().map(|&seq| expected(&at, seq)).collect();
        assert_eq!(
            got,
            json!({ "receipts": want }),
            "asked {seqs:?} together with others"
        );
    }

    // While others keep asking, the members read the newest message one after another, and
    // each asks right after its read was answered: its answer counts its own read and every
    // one before it, never an earlier pass's count.
    let reading = std::sync::atomic::AtomicBool::new(true);
    let flood = (0..4).map(|i| {
        let (s, path, reading, u) = (&s, &path, &reading, &users[names[i]]);
        async move {
            let mut answered = 0;
            while reading.load(std::sync::atomic::Ordering::SeqCst) {
                // Its passes cover the readers' asks below (their seqs and senders).
                let got = ok(s, u, "POST", path, Some(json!({ "seqs": [2, 7, 10] }))).await;
                assert_eq!(got["receipts"][2]["of"], 5, "{got}");
                answered += 1;
            }
            answered
        }
    });
    let readers = async {
        for who in ["alice", "bob", "carol", "erin", "frank"] {
            let u = &users[who];
            ok(
                &s,
                u,
                "POST",
                &format!("/v1/conversations/{cid}/read"),
                Some(json!({ "seq": 10 })),
            )
            .await;
            let p = at.get_mut(who).unwrap();
            p.1 = p.1.max(10);
            let got = ok(&s, u, "POST", &path, Some(json!({ "seqs": [10, 7] }))).await;
            assert_eq!(
                got,
                json!({ "receipts": [expected(&at, 10), expected(&at, 7)] }),
                "{who} asked right after reading"
            );
        }
        reading.store(false, std::sync::atomic::Ordering::SeqCst);
    };
    let (_, answered) = tokio::join!(readers, futures_util::future::join_all(flood));
    assert!(answered.iter().all(|&n| n > 0), "{answered:?}");
}
