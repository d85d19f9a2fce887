//! Groups end to end, as a client sees them: creation, snapshots and tips, and what a member
//! sees across their membership intervals (added, kicked, back again, quit; a resend; the
//! overview of a former member). The real binary on loopback, every test on SQLite and
//! (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::time::Duration;

use common::groups::{
    create, events_after, gtext, id_of, m, members, my_group, named, overview, position, say,
    say_fails, seqs,
};
use common::server::{Backend, call, ok, send_err, send_ok, setup, text};
use serde_json::{Value, json};

on_both!(
    create_snapshots_and_tips,
    visibility_follows_membership,
    a_resend_in_a_group_reaches_no_later_member,
    a_former_members_list_stops_at_their_departure,
    leaving_ends_a_mute,
    muting_notices_while_the_member_changes_is_answered,
    a_group_picture_can_be_removed,
);

async fn create_snapshots_and_tips(b: Backend) {
    let (_db, s) = setup(&b, "group-create", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let bob0 = position(&s, &bob).await;

    let info = create(
        &s,
        &alice,
        json!({"name": "Hiking", "conversationType": 2, "members": ["bob", "carol"],
               "joinPolicy": "invite", "notice": "",
               "avatar": "https://cdn.example.com/g.png"}),
    )
    .await;
    let cid = id_of(&info);
    assert_eq!(info["conversationType"], 2);
    assert_eq!(info["name"], "Hiking");
    assert_eq!(info["notice"], "");
    assert_eq!(info["avatar"], "https://cdn.example.com/g.png");
    assert_eq!(info["ownerId"], "alice");
    assert_eq!(info["joinPolicy"], "invite");
    assert_eq!(info["muteAll"], false);
    assert_eq!(info["state"], "active");
    assert_eq!(info["memberCount"], 3);
    let v1 = info["version"].as_i64().expect("version");
    assert!(info["createdAt"].as_i64().is_some() && info["updatedAt"].as_i64().is_some());

    // Seq 1 is the created tip, seen by every initial member, not unread.
    for u in [&alice, &bob, &carol] {
        let msgs = s.pull_all(u, cid).await;
        assert_eq!(seqs(&msgs), vec![1], "{}: {msgs:?}", u.id);
        assert_eq!(msgs[0]["conversationType"], 2);
        assert_eq!(msgs[0]["contentType"], 9);
        assert_eq!(msgs[0]["payload"]["event"], "created");
        assert_eq!(msgs[0]["payload"]["operatorId"], "alice");
        let o = overview(&s, u, cid).await;
        assert_eq!(o["conversationType"], 2);
        assert_eq!(o["peerId"], Value::Null);
        assert_eq!(
            (o["lastSeq"].as_i64(), o["unread"].as_i64()),
            (Some(1), Some(0)),
            "{o}"
        );
    }
    let joined = named(&events_after(&s, &bob, bob0).await, "group.joined")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(joined.len(), 1, "{joined:?}");
    assert_eq!(
        joined[0]["data"],
        json!({"conversationId": cid, "conversationType": 2, "role": "member", "by": "alice"})
    );

    // Snapshots.
    let mine = my_group(&s, &bob, cid).await;
    assert_eq!(
        (&mine["memberState"], &mine["role"], &mine["mutedUntil"]),
        (&json!("member"), &json!("member"), &json!(0)),
        "{mine}"
    );
    assert_eq!(mine["name"], "Hiking");
    assert_eq!(mine["ownerId"], "alice");
    assert_eq!(my_group(&s, &alice, cid).await["role"], "owner");
    let got = s.get(&carol, &format!("/v1/groups/{cid}")).await;
    assert_eq!(
        (got["conversationId"].as_i64(), got["memberCount"].as_i64()),
        (Some(cid), Some(3))
    );
    assert_eq!(
        members(&s, &bob, cid).await,
        vec![
            m("alice", "owner", 0),
            m("bob", "member", 0),
            m("carol", "member", 0)
        ]
    );
    let page = s
        .get(&bob, &format!("/v1/groups/{cid}/members?limit=2"))
        .await;
    let ids: Vec<&str> = page["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert!(m["joinedAt"].as_i64().is_some(), "{m}");
            m["userId"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        (ids, page["hasMore"].as_bool()),
        (vec!["alice", "bob"], Some(true))
    );
    let page = s
        .get(&bob, &format!("/v1/groups/{cid}/members?after=bob&limit=2"))
        .await;
    assert_eq!(page["members"][0]["userId"], "carol");
    assert_eq!(page["members"].as_array().unwrap().len(), 1);
    assert_eq!(page["hasMore"], false);

    // Renames and notices are tips: pulled, pushed, not unread. A text is unread.
    let mut bob_ws = s.connect(&bob, "phone").await;
    let renamed = ok(
        &s,
        &alice,
        "PATCH",
        &format!("/v1/groups/{cid}"),
        Some(json!({"name": "Hiking 2"})),
    )
    .await;
    assert_eq!(renamed["name"], "Hiking 2");
    let v2 = renamed["version"].as_i64().unwrap();
    assert!(v2 > v1, "version grows: {v1} -> {v2}");
    let n = bob_ws
        .until(|f| f["type"] == "notify" && f["conversationId"] == cid)
        .await
        .0;
    assert_eq!(
        (n["seq"].as_i64(), n["contentType"].as_i64()),
        (Some(2), Some(9))
    );
    assert_eq!(
        n["payload"],
        json!({"operatorId": "alice", "name": "Hiking 2"})
    );
    let noticed = ok(
        &s,
        &alice,
        "PATCH",
        &format!("/v1/groups/{cid}"),
        Some(json!({"notice": "bring water"})),
    )
    .await;
    assert_eq!(noticed["notice"], "bring water");
    assert!(noticed["version"].as_i64().unwrap() > v2);
    let msgs = s.pull_all(&bob, cid).await;
    assert_eq!(seqs(&msgs), vec![1, 2, 3]);
    assert_eq!(msgs[2]["contentType"], 9);
    assert_eq!(
        msgs[2]["payload"],
        json!({"operatorId": "alice", "notice": "bring water"})
    );
    let o = overview(&s, &bob, cid).await;
    assert_eq!(
        (o["lastSeq"].as_i64(), o["unread"].as_i64()),
        (Some(3), Some(0)),
        "{o}"
    );
    assert_eq!(say(&s, &carol, cid, 2, "who brings the map?").await, 4);
    let o = overview(&s, &bob, cid).await;
    assert_eq!(
        (o["lastSeq"].as_i64(), o["unread"].as_i64()),
        (Some(4), Some(1)),
        "{o}"
    );
    let read = ok(
        &s,
        &bob,
        "POST",
        &format!("/v1/conversations/{cid}/read"),
        Some(json!({"seq": 4})),
    )
    .await;
    assert_eq!(read["unread"], 0);
    let got = s.get(&dave, "/v1/groups").await;
    assert_eq!(got["groups"], json!([]), "dave is in no group");
    let got = s.get(&bob, &format!("/v1/groups/{cid}")).await;
    assert_eq!(
        (got["name"].as_str(), got["notice"].as_str()),
        (Some("Hiking 2"), Some("bring water"))
    );

    // Defaults: a group, invite only, the creator alone.
    let solo = create(&s, &dave, json!({"name": "Solo"})).await;
    assert_eq!(solo["conversationType"], 2);
    assert_eq!(solo["joinPolicy"], "invite");
    assert_eq!(solo["memberCount"], 1);
    assert_eq!(solo["ownerId"], "dave");
    assert_eq!(seqs(&s.pull_all(&dave, id_of(&solo)).await), vec![1]);

    // Errors.
    s.expect_errors(&[
        (
            Some(&alice.token),
            "POST",
            "/v1/groups",
            Some(json!({"name": "Ghosts", "members": ["bob", "nobody"]})),
            404,
            "user_not_found",
        ),
        (
            Some(&alice.token),
            "POST",
            "/v1/groups",
            Some(json!({"members": ["bob"]})),
            400,
            "bad_request",
        ),
        (
            Some(&dave.token),
            "GET",
            &format!("/v1/groups/{cid}"),
            None,
            403,
            "not_a_member",
        ),
        (
            Some(&dave.token),
            "GET",
            "/v1/groups/987654321",
            None,
            404,
            "group_not_found",
        ),
    ])
    .await;
}

async fn visibility_follows_membership(b: Backend) {
    let (_db, s) = setup(&b, "group-visibility", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let carol0 = position(&s, &carol).await;
    let cid = id_of(&create(&s, &alice, json!({"name": "G", "members": ["bob"]})).await);
    assert_eq!(say(&s, &alice, cid, 2, "before carol").await, 2);

    // Added later: history starts at her own join tip, nothing unread.
    let got = ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/members"),
        Some(json!({"userIds": ["carol"]})),
    )
    .await;
    assert_eq!(got, json!({"added": ["carol"]}));
    let msgs = s.pull_all(&carol, cid).await;
    assert_eq!(seqs(&msgs), vec![3], "{msgs:?}");
    assert_eq!(msgs[0]["contentType"], 9);
    assert_eq!(
        msgs[0]["payload"],
        json!({"operatorId": "alice", "event": "membersAdded", "userIds": ["carol"]})
    );
    let o = overview(&s, &carol, cid).await;
    assert_eq!(
        (o["lastSeq"].as_i64(), o["unread"].as_i64()),
        (Some(3), Some(0)),
        "{o}"
    );
    let before = s
        .get(
            &carol,
            &format!("/v1/conversations/{cid}/messages?beforeSeq=3"),
        )
        .await;
    assert_eq!(before["messages"], json!([]), "{before}");
    assert_eq!(say(&s, &bob, cid, 2, "while carol is in").await, 4);
    assert_eq!(seqs(&s.pull_all(&carol, cid).await), vec![3, 4]);

    // Kicked: keeps seeing up to and including the kick tip, nothing later.
    let mut carol_ws = s.connect(&carol, "phone").await;
    let got = ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/kick"),
        Some(json!({"userIds": ["carol"], "reason": "spam"})),
    )
    .await;
    assert_eq!(got, json!({"kicked": ["carol"]}));
    let msgs = s.pull_all(&carol, cid).await;
    assert_eq!(seqs(&msgs), vec![3, 4, 5]);
    assert_eq!(msgs[2]["contentType"], 8);
    assert_eq!(
        msgs[2]["payload"],
        json!({"operatorId": "alice", "kickedUserIds": ["carol"], "reason": "spam"})
    );
    say_fails(&s, &carol, cid, 2, 403, "not_a_member").await;
    let e = send_err(&mut carol_ws, gtext("k1", cid, 2, "am I out?")).await;
    assert_eq!(e["code"], "not_a_member");
    assert_eq!(say(&s, &bob, cid, 2, "while carol is out").await, 6);
    assert_eq!(seqs(&s.pull_all(&carol, cid).await), vec![3, 4, 5]);
    let after = s
        .get(
            &carol,
            &format!("/v1/conversations/{cid}/messages?afterSeq=5"),
        )
        .await;
    assert_eq!(after["messages"], json!([]), "{after}");
    let back = s
        .get(
            &carol,
            &format!("/v1/conversations/{cid}/messages?beforeSeq=100"),
        )
        .await;
    assert_eq!(seqs(back["messages"].as_array().unwrap()), vec![3, 4, 5]);
    let o = overview(&s, &carol, cid).await;
    assert_eq!(
        (o["lastSeq"].as_i64(), o["member"].as_bool()),
        (Some(5), Some(false)),
        "{o}"
    );
    assert_eq!(my_group(&s, &carol, cid).await["memberState"], "kicked");
    s.expect_error(
        "POST",
        &format!("/v1/groups/{cid}/kick"),
        Some(&alice.token),
        Some(json!({"userIds": ["carol"]})),
        404,
        "target_not_member",
    )
    .await;
    let frames = carol_ws.drain(Duration::from_millis(500)).await;
    assert!(
        !frames
            .iter()
            .any(|f| f["conversationId"] == cid && f["seq"] == 6),
        "a kicked member got a later message pushed: {frames:?}"
    );

    // Back again: a new interval. Seq 6 stays invisible.
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/members"),
        Some(json!({"userIds": ["carol"]})),
    )
    .await;
    assert_eq!(say(&s, &bob, cid, 2, "welcome back").await, 8);
    assert_eq!(seqs(&s.pull_all(&carol, cid).await), vec![3, 4, 5, 7, 8]);
    let page = s
        .get(
            &carol,
            &format!("/v1/conversations/{cid}/messages?afterSeq=5"),
        )
        .await;
    assert_eq!(seqs(page["messages"].as_array().unwrap()), vec![7, 8]);
    assert_eq!(say(&s, &carol, cid, 2, "glad to be back").await, 9);

    // Quits: the same, with her own departure tip.
    let got = ok(&s, &carol, "POST", &format!("/v1/groups/{cid}/quit"), None).await;
    assert_eq!(got, json!({"conversationId": cid, "memberState": "left"}));
    let msgs = s.pull_all(&carol, cid).await;
    assert_eq!(seqs(&msgs), vec![3, 4, 5, 7, 8, 9, 10]);
    assert_eq!(msgs[6]["contentType"], 9);
    assert_eq!(msgs[6]["payload"]["event"], "left");
    say_fails(&s, &carol, cid, 2, 403, "not_a_member").await;
    assert_eq!(say(&s, &bob, cid, 2, "carol left").await, 11);
    assert_eq!(
        seqs(&s.pull_all(&carol, cid).await),
        vec![3, 4, 5, 7, 8, 9, 10]
    );
    assert_eq!(my_group(&s, &carol, cid).await["memberState"], "left");
    assert_eq!(
        seqs(&s.pull_all(&bob, cid).await),
        (1..=11).collect::<Vec<_>>()
    );

    // Her stream tells each change.
    let ev = events_after(&s, &carol, carol0).await;
    let got: Vec<(&str, Value)> = ev
        .iter()
        .map(|e| (e["event"].as_str().unwrap(), e["data"].clone()))
        .collect();
    let g = |by: Option<&str>| {
        let mut d = json!({"conversationId": cid, "conversationType": 2});
        if let Some(by) = by {
            d["by"] = json!(by);
        }
        d
    };
    let mut joined = g(Some("alice"));
    joined["role"] = json!("member");
    assert_eq!(
        got,
        vec![
            ("group.joined", joined.clone()),
            ("group.kicked", g(Some("alice"))),
            ("group.joined", joined),
            ("group.left", g(None)),
        ]
    );

    // An outsider gets nothing.
    let (st, got) = call(
        &s,
        &dave,
        "GET",
        &format!("/v1/conversations/{cid}/messages"),
        None,
    )
    .await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (403, Some("not_a_member")),
        "{got}"
    );
    say_fails(&s, &dave, cid, 2, 403, "not_a_member").await;
    s.expect_error(
        "GET",
        &format!("/v1/groups/{cid}/members"),
        Some(&dave.token),
        None,
        403,
        "not_a_member",
    )
    .await;
    s.expect_error(
        "POST",
        &format!("/v1/conversations/{cid}/read"),
        Some(&dave.token),
        Some(json!({"seq": 1})),
        403,
        "not_a_member",
    )
    .await;
}

/// A resend in a group pushes the original to the sender's devices only: a member added
/// since never receives what was sent before they joined.
async fn a_resend_in_a_group_reaches_no_later_member(b: Backend) {
    let (_db, s) = setup(&b, "group-resend", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let dave = s.user("dave").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "R", "members": ["bob"]})).await);
    let frame = text(
        "r1",
        "before-dave",
        json!({"conversationId": cid, "conversationType": 2}),
        "secret before dave",
    );
    let mut bob_ws = s.connect(&bob, "phone").await;
    let first = send_ok(&mut bob_ws, frame.clone()).await;
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/members"),
        Some(json!({"userIds": ["dave"]})),
    )
    .await;
    let mut dave_ws = s.connect(&dave, "phone").await;
    let mut bob_laptop = s.connect(&bob, "laptop").await;
    let again = send_ok(
        &mut bob_ws,
        text(
            "r2",
            "before-dave",
            json!({"conversationId": cid, "conversationType": 2}),
            "secret before dave",
        ),
    )
    .await;
    assert_eq!(
        (again["seq"].clone(), again["duplicate"].clone()),
        (first["seq"].clone(), json!(true))
    );
    let to_dave: Vec<Value> = dave_ws
        .drain(Duration::from_millis(400))
        .await
        .into_iter()
        .filter(|f| f["type"] == "notify" && f["seq"] == first["seq"])
        .collect();
    assert!(to_dave.is_empty(), "{to_dave:?}");
    let (n, _) = bob_laptop
        .until(|f| f["type"] == "notify" && f["conversationId"] == cid)
        .await;
    assert_eq!(
        n["seq"], first["seq"],
        "the sender's other device gets it again"
    );
}

/// A kicked member's overview entry stops at the tip of their kick: later activity neither
/// shows nor moves it.
async fn a_former_members_list_stops_at_their_departure(b: Backend) {
    let (_db, s) = setup(&b, "former-overview", "").await;
    let alice = s.user("alice").await;
    let carol = s.user("carol").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "O", "members": ["carol"]})).await);
    let other = id_of(&create(&s, &alice, json!({"name": "P", "members": ["carol"]})).await);
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/kick"),
        Some(json!({"userIds": ["carol"]})),
    )
    .await;
    let before = overview(&s, &carol, cid).await;
    assert_eq!(before["member"], false);
    tokio::time::sleep(Duration::from_millis(20)).await;
    say(&s, &alice, other, 2, "in the group carol is still in").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    say(&s, &alice, cid, 2, "after carol left").await;
    let after = overview(&s, &carol, cid).await;
    assert_eq!(
        (
            after["lastTime"].clone(),
            after["lastSeq"].clone(),
            after["lastMessage"]["seq"].clone()
        ),
        (
            before["lastTime"].clone(),
            before["lastSeq"].clone(),
            before["lastMessage"]["seq"].clone()
        )
    );
    let list = s.get(&carol, "/v1/conversations").await;
    let order: Vec<i64> = list["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["conversationId"].as_i64().unwrap())
        .collect();
    assert_eq!(
        order,
        vec![other, cid],
        "the group she left did not move to the front"
    );
}

/// `avatar: ""` removes a group's picture, as `notice: ""` clears its notice: a tip says so.
async fn a_group_picture_can_be_removed(b: Backend) {
    let (_db, s) = setup(&b, "group-avatar", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let info = create(
        &s,
        &alice,
        json!({"name": "Pics", "members": ["bob"], "avatar": "https://cdn.example.com/g.png"}),
    )
    .await;
    let cid = id_of(&info);
    let g = format!("/v1/groups/{cid}");
    let removed = ok(&s, &alice, "PATCH", &g, Some(json!({"avatar": ""}))).await;
    assert_eq!(removed["avatar"], "", "{removed}");
    assert_eq!(s.get(&bob, &g).await["avatar"], "");
    let tip = s.pull_all(&bob, cid).await.pop().expect("the tip");
    assert_eq!(tip["payload"], json!({"operatorId": "alice", "avatar": ""}));
    // Removed already: nothing changes, no tip.
    ok(&s, &alice, "PATCH", &g, Some(json!({"avatar": ""}))).await;
    assert_eq!(s.pull_all(&bob, cid).await.len(), 2);
}

/// A member muting a group's notices at the moment the owner kicks them, makes them an
/// admin or mutes them in the group: each answer is one the docs give (200, or
/// `403 not_a_member` after the kick), never a deadlock's `503`.
async fn muting_notices_while_the_member_changes_is_answered(b: Backend) {
    let (_db, s) = setup(&b, "group-notices-race", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "Races", "members": ["bob"]})).await);
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let notices = format!("/v1/conversations/{cid}/notifications");
    for round in 0..8 {
        let muted = round % 2 == 0;
        let (change, body) = match round % 3 {
            0 => (g("/kick"), json!({"userIds": ["bob"]})),
            1 => (g("/admins/bob"), Value::Null),
            _ => (g("/mute"), json!({"userId": "bob", "until": 0})),
        };
        let method = if round % 3 == 1 { "PUT" } else { "POST" };
        let body = (!body.is_null()).then_some(body);
        let (mine, theirs) = tokio::join!(
            call(&s, &bob, "PUT", &notices, Some(json!({"muted": muted}))),
            call(&s, &alice, method, &change, body),
        );
        assert_eq!(theirs.0, 200, "round {round}: {theirs:?}");
        assert!(
            mine.0 == 200 || mine.1["error"]["code"] == "not_a_member",
            "round {round}: {mine:?}"
        );
        if round % 3 == 0 {
            ok(
                &s,
                &alice,
                "POST",
                &g("/members"),
                Some(json!({"userIds": ["bob"]})),
            )
            .await;
        } else if round % 3 == 1 {
            ok(&s, &alice, "DELETE", &g("/admins/bob"), None).await;
        }
    }
}

/// A member's mute of a group's notices ends when they leave: the entry says so, and a
/// rejoin starts unmuted.
async fn leaving_ends_a_mute(b: Backend) {
    let (_db, s) = setup(&b, "group-mute-leave", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Mutes", "members": ["bob"], "joinPolicy": "open"}),
        )
        .await,
    );
    ok(
        &s,
        &bob,
        "PUT",
        &format!("/v1/conversations/{cid}/notifications"),
        Some(json!({"muted": true})),
    )
    .await;
    assert_eq!(mute_of(&s, &bob, cid).await, (Some(true), Some(true)));
    ok(&s, &bob, "POST", &format!("/v1/groups/{cid}/quit"), None).await;
    assert_eq!(mute_of(&s, &bob, cid).await, (Some(false), Some(false)));
    ok(
        &s,
        &bob,
        "POST",
        &format!("/v1/groups/{cid}/join"),
        Some(json!({})),
    )
    .await;
    assert_eq!(mute_of(&s, &bob, cid).await, (Some(true), Some(false)));
}

/// `member` and `muted` of the user's entry for a conversation.
async fn mute_of(
    s: &common::server::Server,
    u: &common::server::User,
    cid: i64,
) -> (Option<bool>, Option<bool>) {
    let e = s.get(u, &format!("/v1/conversations/{cid}")).await;
    (e["member"].as_bool(), e["muted"].as_bool())
}
