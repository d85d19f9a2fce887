//! Groups end to end, as a client sees them: fan-out to each device once, the offline
//! catch-up table, sends racing kicks. The real binary on loopback, every test on SQLite and
//! (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::groups::{create, gtext, id_of, overview, seqs, without_by};
use common::server::{Backend, FAST, Server, User, ok, peer, send_ok, setup, text};
use serde_json::{Value, json};

on_both!(
    group_fan_out_reaches_each_device_once,
    an_offline_device_catches_up,
    kicked_members_get_no_pushes_sent_after_their_kick,
);

/// Messages of a conversation after `after`, paging to the end.
async fn pull_after(s: &Server, u: &User, cid: i64, after: i64) -> Vec<Value> {
    let mut after = after;
    let mut all = Vec::new();
    for _ in 0..1000 {
        let page = s
            .get(
                u,
                &format!("/v1/conversations/{cid}/messages?afterSeq={after}&limit=500"),
            )
            .await;
        let msgs = page["messages"].as_array().unwrap().clone();
        if let Some(last) = msgs.last() {
            after = last["seq"].as_i64().unwrap();
        }
        all.extend(msgs);
        if !page["hasMore"].as_bool().unwrap() {
            return all;
        }
    }
    panic!("conversation {cid} never ended");
}

async fn group_fan_out_reaches_each_device_once(b: Backend) {
    let (_db, s) = setup(&b, "group-fan-out", FAST).await;
    let mut users = BTreeMap::new();
    for u in ["alice", "bob", "carol", "dave", "erin", "frank"] {
        users.insert(u, s.user(u).await);
    }
    let cid = id_of(
        &create(
            &s,
            &users["alice"],
            json!({"name": "Fan", "members": ["bob", "carol", "dave", "erin"]}),
        )
        .await,
    );
    const EACH: usize = 15;
    // Listening devices: (user, device). erin stays offline; frank is no member.
    let listeners = [
        ("alice", "tablet"),
        ("bob", "tablet"),
        ("carol", "phone"),
        ("dave", "phone"),
        ("dave", "laptop"),
        ("frank", "phone"),
    ];
    let mut conns = Vec::new();
    for (u, d) in listeners {
        conns.push((u, d, s.connect(&users[u], d).await));
    }
    let mut senders = Vec::new();
    for u in ["alice", "bob"] {
        senders.push((u, s.connect(&users[u], "phone").await));
    }
    // Both senders pipeline at once.
    let mut tasks = Vec::new();
    for (who, mut ws) in senders {
        tasks.push(tokio::spawn(async move {
            for j in 0..EACH {
                ws.send(gtext(&format!("{who}-{j}"), cid, 2, &format!("{who}-{j}")))
                    .await;
            }
            let mut acks = Vec::new();
            let mut pushed = Vec::new();
            while acks.len() < EACH || pushed.len() < EACH {
                let f = ws.next().await.expect("closed");
                match f["type"].as_str() {
                    Some("ack") => acks.push(f["seq"].as_i64().unwrap()),
                    Some("notify") if f["conversationId"] == cid && f["seq"] != 1 => pushed.push(f),
                    Some("notify") => {}
                    _ => panic!("{who}: {f}"),
                }
            }
            for f in ws.drain(Duration::from_millis(500)).await {
                if f["type"] == "notify" && f["conversationId"] == cid && f["seq"] != 1 {
                    pushed.push(f);
                }
            }
            (who, acks, pushed)
        }));
    }
    let mut listening = Vec::new();
    for (u, d, mut ws) in conns {
        listening.push(tokio::spawn(async move {
            let want = if u == "frank" { 0 } else { 2 * EACH };
            let mut pushed = Vec::new();
            while pushed.len() < want {
                let f = ws.next().await.expect("closed");
                if f["type"] == "notify" && f["conversationId"] == cid && f["seq"] != 1 {
                    pushed.push(f);
                }
            }
            for f in ws.drain(Duration::from_millis(800)).await {
                if f["type"] == "notify" && f["seq"] != 1 {
                    pushed.push(f);
                }
            }
            (u, d, pushed)
        }));
    }
    let all: Vec<i64> = (2..=(2 * EACH as i64 + 1)).collect();
    let mut acked = BTreeMap::new();
    for t in tasks {
        let (who, acks, pushed) = t.await.unwrap();
        for seq in &acks {
            assert!(acked.insert(*seq, who).is_none(), "seq {seq} acked twice");
        }
        // The sending connection gets the other's messages once, in order, not its own.
        let got = seqs(&pushed);
        let others: Vec<i64> = all.iter().copied().filter(|s| !acks.contains(s)).collect();
        assert_eq!(got, others, "{who}'s sending connection");
        assert!(pushed.iter().all(|f| f["senderId"] != who));
    }
    assert_eq!(acked.keys().copied().collect::<Vec<_>>(), all);
    for t in listening {
        let (u, d, pushed) = t.await.unwrap();
        if u == "frank" {
            assert!(pushed.is_empty(), "a non-member got {pushed:?}");
            continue;
        }
        assert_eq!(
            seqs(&pushed),
            all,
            "{u}/{d}: every message once, in seq order"
        );
        for f in &pushed {
            let seq = f["seq"].as_i64().unwrap();
            let sender = acked[&seq];
            assert_eq!(f["senderId"], sender, "{f}");
            assert!(f["payload"]["text"].as_str().unwrap().starts_with(sender));
        }
    }
    // The offline member pulls the same.
    let pulled = s.pull_all(&users["erin"], cid).await;
    assert_eq!(
        seqs(&pulled),
        (1..=(2 * EACH as i64 + 1)).collect::<Vec<_>>()
    );
}

async fn an_offline_device_catches_up(b: Backend) {
    let (_db, s) = setup(&b, "group-offline", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    s.user("dave").await;
    let erin = s.user("erin").await;
    let frank = s.user("frank").await;
    let phone = s.connect(&bob, "phone").await;
    let mut laptop = s.connect(&bob, "laptop").await;
    let mut alice_ws = s.connect(&alice, "phone").await;
    let mut carol_ws = s.connect(&carol, "phone").await;

    // What the phone has before it goes offline.
    let ack = send_ok(&mut alice_ws, text("a0", "a-0", peer("bob"), "hi")).await;
    let pid = ack["conversationId"].as_i64().unwrap();
    let gid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "G", "members": ["bob", "carol"]}),
        )
        .await,
    );
    let hid = id_of(&create(&s, &bob, json!({"name": "H", "joinPolicy": "approval"})).await);
    assert_eq!(seqs(&s.pull_all(&bob, pid).await), vec![1]);
    assert_eq!(seqs(&s.pull_all(&bob, gid).await), vec![1]);
    let head = s.get(&bob, "/v1/user-stream?limit=0").await;
    let (epoch, cursor) = (
        head["epoch"].as_i64().unwrap(),
        head["lastSeq"].as_i64().unwrap(),
    );
    phone.close().await;

    // While it is away.
    for (i, t) in ["a", "b", "c"].iter().enumerate() {
        let ack = send_ok(
            &mut alice_ws,
            text(
                &format!("a{}", i + 1),
                &format!("a-{}", i + 1),
                peer("bob"),
                t,
            ),
        )
        .await;
        assert_eq!(ack["seq"], i as i64 + 2);
    }
    let recall = json!({"type": "send", "id": "rc", "clientMsgId": "a-rc", "conversationType": 1,
        "conversationId": pid, "contentType": 4, "payload": {"seq": 3}});
    assert_eq!(send_ok(&mut alice_ws, recall).await["seq"], 5);
    let typing = json!({"type": "send", "id": "t1", "clientMsgId": "t-1", "conversationType": 1,
        "conversationId": pid, "contentType": 5, "payload": {"state": "typing"}});
    assert_eq!(send_ok(&mut alice_ws, typing).await["live"], true);
    let call = json!({"type": "send", "id": "c1", "clientMsgId": "c-1", "conversationType": 1,
        "conversationId": pid, "contentType": 6,
        "payload": {"action": "invite", "callId": "call-1", "media": "audio"}});
    assert_eq!(send_ok(&mut alice_ws, call).await["live"], true);
    ok(
        &s,
        &alice,
        "PATCH",
        &format!("/v1/groups/{gid}"),
        Some(json!({"notice": "new notice"})),
    )
    .await;
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{gid}/members"),
        Some(json!({"userIds": ["dave"]})),
    )
    .await;
    assert_eq!(
        send_ok(&mut carol_ws, gtext("g1", gid, 2, "g1")).await["seq"],
        4
    );
    let gtyping = json!({"type": "send", "id": "t2", "clientMsgId": "t-2", "conversationType": 2,
        "conversationId": gid, "contentType": 5, "payload": {"state": "typing"}});
    assert_eq!(send_ok(&mut carol_ws, gtyping).await["live"], true);
    assert_eq!(
        send_ok(&mut carol_ws, gtext("g2", gid, 2, "g2")).await["seq"],
        5
    );
    // The laptop got the live kinds and reads on.
    let mut live = BTreeSet::new();
    for _ in 0..100 {
        if live.len() == 3 {
            break;
        }
        let f = laptop.next().await.expect("laptop closed");
        if f["type"] == "notify" && f.get("seq").is_none() {
            live.insert((
                f["conversationId"].as_i64().unwrap(),
                f["contentType"].as_i64().unwrap(),
            ));
        }
    }
    assert_eq!(live, [(pid, 5), (pid, 6), (gid, 5)].into());
    let pread = ok(
        &s,
        &bob,
        "POST",
        &format!("/v1/conversations/{pid}/read"),
        Some(json!({"seq": 2})),
    )
    .await;
    let gread = ok(
        &s,
        &bob,
        "POST",
        &format!("/v1/conversations/{gid}/read"),
        Some(json!({"seq": 1})),
    )
    .await;
    assert_eq!(
        (pread["readSeq"].as_i64(), gread["readSeq"].as_i64()),
        (Some(2), Some(1))
    );
    let asked = ok(
        &s,
        &erin,
        "POST",
        "/v1/friends/requests",
        Some(json!({"userId": "bob", "message": "hello bob"})),
    )
    .await;
    let joined = ok(
        &s,
        &frank,
        "POST",
        &format!("/v1/groups/{hid}/join"),
        Some(json!({"message": "me?"})),
    )
    .await;
    assert_eq!(joined["state"], "pending");

    // Back: the WebSocket first, then the overview, the pulls, the user stream.
    let mut phone = s.connect(&bob, "phone").await;
    let p = overview(&s, &bob, pid).await;
    assert_eq!(
        (
            p["lastSeq"].as_i64(),
            p["readSeq"].as_i64(),
            p["unread"].as_i64()
        ),
        (Some(5), Some(2), Some(1)),
        "read on the laptop; the recalled message and the recall do not count: {p}"
    );
    let gview = overview(&s, &bob, gid).await;
    assert_eq!(
        (
            gview["lastSeq"].as_i64(),
            gview["readSeq"].as_i64(),
            gview["unread"].as_i64()
        ),
        (Some(5), Some(1), Some(2)),
        "tips do not count: {gview}"
    );
    let msgs = pull_after(&s, &bob, pid, 1).await;
    assert_eq!(seqs(&msgs), vec![2, 3, 4, 5]);
    assert_eq!(msgs[1]["payload"], Value::Null, "recalled: {}", msgs[1]);
    assert_eq!(msgs[1]["recalledBy"], 5);
    assert_eq!(
        (msgs[3]["contentType"].as_i64(), &msgs[3]["payload"]),
        (Some(4), &json!({"seq": 3}))
    );
    let msgs = pull_after(&s, &bob, gid, 1).await;
    assert_eq!(seqs(&msgs), vec![2, 3, 4, 5]);
    assert_eq!(
        msgs.iter()
            .map(|m| m["contentType"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        vec![9, 9, 1, 1],
        "tips as messages, the typing nowhere"
    );
    assert_eq!(
        msgs[0]["payload"],
        json!({"operatorId": "alice", "notice": "new notice"})
    );
    assert_eq!(msgs[1]["payload"]["event"], "membersAdded");
    let page = s
        .get(
            &bob,
            &format!("/v1/user-stream?epoch={epoch}&afterSeq={cursor}"),
        )
        .await;
    let ev = page["events"].as_array().unwrap();
    assert_eq!(seqs(ev), vec![cursor + 1, cursor + 2], "{page}");
    assert_eq!(page["hasMore"], false);
    assert_eq!(ev[0]["event"], "friend.request");
    assert_eq!(
        ev[0]["data"],
        json!({"action": "requested", "requestId": asked["requestId"], "fromUserId": "erin",
               "toUserId": "bob", "message": "hello bob"})
    );
    assert_eq!(ev[1]["event"], "group.joinRequest");
    assert_eq!(
        without_by(&ev[1]["data"]),
        json!({"conversationId": hid, "conversationType": 2, "requestId": joined["requestId"],
               "userId": "frank", "message": "me?", "state": "pending"})
    );
    // The peer's read receipt (a read delivers too).
    let positions = s
        .get(&bob, &format!("/v1/conversations/{pid}/read-positions"))
        .await;
    assert_eq!(
        positions["positions"],
        json!([{"userId": "alice", "readSeq": 5, "deliveredSeq": 5}])
    );
    // Nothing live is replayed.
    let late = phone.drain(Duration::from_millis(500)).await;
    assert!(late.is_empty(), "{late:?}");
}

/// Sends race kicks: a member kicked at seq k is pushed nothing after k (the batch sees the
/// group as the kick left it, on PostgreSQL too).
async fn kicked_members_get_no_pushes_sent_after_their_kick(b: Backend) {
    let (_db, s) = setup(&b, "kick-race", FAST).await;
    let owner = s.user("owner").await;
    let mut names = Vec::new();
    for i in 0..12 {
        names.push(format!("k{i}"));
    }
    let mut users = Vec::new();
    for n in &names {
        users.push(s.user(n).await);
    }
    let cid = id_of(&create(&s, &owner, json!({"name": "race", "members": names})).await);
    let mut sockets = Vec::new();
    for u in &users {
        sockets.push(s.connect(u, "phone").await);
    }
    let mut sender = s.connect(&owner, "flood").await;
    let flood = tokio::spawn(async move {
        let frames: Vec<Value> = (0..300)
            .map(|i| gtext(&format!("f{i}"), cid, 2, &format!("flood {i}")))
            .collect();
        let answers = sender.send_all(&frames, 16).await;
        assert!(
            answers.values().all(|a| a["type"] == "ack"),
            "every flood send is acked"
        );
    });
    for n in &names {
        ok(
            &s,
            &owner,
            "POST",
            &format!("/v1/groups/{cid}/kick"),
            Some(json!({"userIds": [n]})),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    flood.await.unwrap();
    // Where each kick landed.
    let mut kicked_at = HashMap::new();
    for m in s.pull_all(&owner, cid).await {
        if m["contentType"] == 8 {
            kicked_at.insert(
                m["payload"]["kickedUserIds"][0]
                    .as_str()
                    .unwrap()
                    .to_string(),
                m["seq"].as_i64().unwrap(),
            );
        }
    }
    assert_eq!(kicked_at.len(), names.len());
    for (n, ws) in names.iter().zip(sockets.iter_mut()) {
        let k = kicked_at[n];
        let late: Vec<i64> = ws
            .drain(Duration::from_millis(300))
            .await
            .iter()
            .filter(|f| f["type"] == "notify" && f["conversationId"] == cid)
            .filter_map(|f| f["seq"].as_i64())
            .filter(|&seq| seq > k)
            .collect();
        assert!(
            late.is_empty(),
            "{n} was kicked at seq {k} and pushed {late:?}"
        );
        // And pulls end at the kick.
        let u = users.iter().find(|u| &u.id == n).unwrap();
        assert_eq!(s.pull_all(u, cid).await.last().unwrap()["seq"], k);
    }
}
