//! Channels end to end, as a client sees them: subscribing, who may post, leaving and coming
//! back, a new subscriber's overview. The real binary on loopback, every test on SQLite and
//! (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::time::Duration;

use common::groups::{
    create, events_after, gtext, id_of, m, members, my_group, named, overview, position, say,
    say_fails, seqs,
};
use common::server::{Backend, ok, send_err, send_ok, setup};
use serde_json::{Value, json};

on_both!(
    channels_broadcast_to_subscribers,
    channel_history_survives_leaving_and_rejoining,
    a_new_subscriber_sees_no_earlier_post_in_the_overview,
    a_channel_checks_a_kick_as_a_group_does,
);

async fn channels_broadcast_to_subscribers(b: Backend) {
    let (_db, s) = setup(&b, "channels", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let info = create(&s, &alice, json!({"name": "News", "conversationType": 3})).await;
    assert_eq!(info["conversationType"], 3);
    assert_eq!(info["joinPolicy"], "open");
    assert_eq!(info["memberCount"], 1);
    let cid = id_of(&info);
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    assert_eq!(seqs(&s.pull_all(&alice, cid).await), vec![1]);

    // Subscribing is joining; it is not announced.
    let b0 = position(&s, &bob).await;
    assert_eq!(s.get(&bob, &g("")).await["conversationType"], 3);
    for u in [&bob, &carol] {
        let got = ok(&s, u, "POST", &g("/join"), Some(json!({}))).await;
        assert_eq!(got, json!({"state": "joined"}));
    }
    let ev = events_after(&s, &bob, b0).await;
    assert_eq!(
        named(&ev, "group.joined")
            .iter()
            .map(|e| e["data"].clone())
            .collect::<Vec<_>>(),
        vec![json!({"conversationId": cid, "conversationType": 3, "role": "member", "by": "bob"})]
    );
    assert_eq!(
        seqs(&s.pull_all(&alice, cid).await),
        vec![1],
        "no tip for a subscription"
    );
    assert_eq!(s.pull_all(&bob, cid).await, Vec::<Value>::new());
    assert_eq!(my_group(&s, &bob, cid).await["memberState"], "member");

    // The owner posts; every subscriber's device gets it and can pull it.
    let mut bob_ws = s.connect(&bob, "phone").await;
    let mut carol_ws = s.connect(&carol, "phone").await;
    let mut dave_ws = s.connect(&dave, "phone").await;
    let mut alice_ws = s.connect(&alice, "phone").await;
    let ack = send_ok(&mut alice_ws, gtext("p1", cid, 3, "first post")).await;
    assert_eq!(
        (ack["seq"].as_i64(), ack["conversationType"].as_i64()),
        (Some(2), Some(3))
    );
    for ws in [&mut bob_ws, &mut carol_ws] {
        let n = ws
            .until(|f| f["type"] == "notify" && f["conversationId"] == cid)
            .await
            .0;
        assert_eq!(n["conversationType"], 3);
        assert_eq!(n["seq"], 2);
        assert_eq!(n["senderId"], "alice");
        assert_eq!(n["payload"]["text"], "first post");
    }
    assert_eq!(seqs(&s.pull_all(&bob, cid).await), vec![2]);
    let o = overview(&s, &bob, cid).await;
    assert_eq!(
        (o["conversationType"].as_i64(), o["unread"].as_i64()),
        (Some(3), Some(1)),
        "{o}"
    );

    // Subscribers neither post nor see the member list.
    say_fails(&s, &bob, cid, 3, 403, "permission_denied").await;
    let e = send_err(&mut bob_ws, gtext("p2", cid, 3, "me too")).await;
    assert_eq!(e["code"], "permission_denied", "{e}");
    s.expect_error(
        "GET",
        &g("/members"),
        Some(&bob.token),
        None,
        403,
        "permission_denied",
    )
    .await;
    // Nor its size through receipts (their owner's and admins').
    s.expect_error(
        "POST",
        &g("/receipts"),
        Some(&bob.token),
        Some(json!({"seqs": [2]})),
        403,
        "permission_denied",
    )
    .await;
    let r = ok(
        &s,
        &alice,
        "POST",
        &g("/receipts"),
        Some(json!({"seqs": [2]})),
    )
    .await;
    assert_eq!(r["receipts"][0]["of"], 2, "{r}");
    assert_eq!(
        members(&s, &alice, cid).await,
        vec![
            m("alice", "owner", 0),
            m("bob", "member", 0),
            m("carol", "member", 0)
        ]
    );
    let typing = json!({"type": "send", "id": "t1", "clientMsgId": "t-1", "conversationType": 3,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}});
    let e = send_err(&mut alice_ws, typing).await;
    assert_eq!(e["code"], "conversation_type_not_allowed", "{e}");

    // Admins post too. Making one is announced (admins are the channel's public voices).
    ok(&s, &alice, "PUT", &g("/admins/carol"), None).await;
    let n = bob_ws
        .until(|f| f["type"] == "notify" && f["conversationId"] == cid)
        .await
        .0;
    assert_eq!(
        (n["seq"].as_i64(), n["contentType"].as_i64()),
        (Some(3), Some(9))
    );
    assert_eq!(
        n["payload"],
        json!({"operatorId": "alice", "event": "adminAdded", "userIds": ["carol"]})
    );
    assert_eq!(say(&s, &carol, cid, 3, "an admin's post").await, 4);
    let n = bob_ws
        .until(|f| f["type"] == "notify" && f["conversationId"] == cid)
        .await
        .0;
    assert_eq!(
        (n["seq"].as_i64(), n["senderId"].as_str()),
        (Some(4), Some("carol"))
    );

    // Unsubscribing is quitting: nothing later arrives.
    let b1 = position(&s, &bob).await;
    let got = ok(&s, &bob, "POST", &g("/quit"), None).await;
    assert_eq!(got, json!({"conversationId": cid, "memberState": "left"}));
    let ev = events_after(&s, &bob, b1).await;
    assert_eq!(
        ev.iter()
            .map(|e| (e["event"].clone(), e["data"].clone()))
            .collect::<Vec<_>>(),
        vec![(
            json!("group.left"),
            json!({"conversationId": cid, "conversationType": 3})
        )]
    );
    let ack = send_ok(&mut alice_ws, gtext("p3", cid, 3, "after bob left")).await;
    assert_eq!(ack["seq"], 5);
    let n = carol_ws
        .until(|f| f["type"] == "notify" && f["conversationId"] == cid && f["seq"] == 5)
        .await
        .0;
    assert_eq!(n["payload"]["text"], "after bob left");
    let later: Vec<Value> = bob_ws
        .drain(Duration::from_millis(500))
        .await
        .into_iter()
        .filter(|f| f["type"] == "notify" && f["conversationId"] == cid)
        .collect();
    assert!(later.is_empty(), "{later:?}");
    assert_eq!(seqs(&s.pull_all(&bob, cid).await), vec![2, 3, 4]);
    assert_eq!(my_group(&s, &bob, cid).await["memberState"], "left");
    // Settings changes are tips.
    ok(
        &s,
        &alice,
        "PATCH",
        &g(""),
        Some(json!({"notice": "read the rules"})),
    )
    .await;
    let msgs = s.pull_all(&carol, cid).await;
    let last = msgs.last().unwrap();
    assert_eq!(
        (last["seq"].as_i64(), last["contentType"].as_i64()),
        (Some(6), Some(9))
    );
    assert_eq!(
        last["payload"],
        json!({"operatorId": "alice", "notice": "read the rules"})
    );
    assert_eq!(
        overview(&s, &carol, cid).await["unread"],
        1,
        "read up to her own post; the later post counts, the tip does not"
    );
    // An outsider saw none of it.
    let seen: Vec<Value> = dave_ws
        .drain(Duration::from_millis(300))
        .await
        .into_iter()
        .filter(|f| f["type"] == "notify")
        .collect();
    assert!(seen.is_empty(), "{seen:?}");
}

/// A subscriber who leaves a channel before anything was posted, comes back, reads, and
/// leaves and comes back again keeps what they could read.
async fn channel_history_survives_leaving_and_rejoining(b: Backend) {
    let (_db, s) = setup(&b, "channel-rejoin", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "News", "conversationType": 3})).await);
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    ok(&s, &bob, "POST", &g("/join"), None).await;
    ok(&s, &bob, "POST", &g("/quit"), None).await;
    ok(&s, &bob, "POST", &g("/join"), None).await;
    let mut seen = Vec::new();
    for i in 0..3 {
        seen.push(say(&s, &alice, cid, 3, &format!("post {i}")).await);
    }
    ok(&s, &bob, "POST", &g("/quit"), None).await;
    say(&s, &alice, cid, 3, "while bob is away").await;
    ok(&s, &bob, "POST", &g("/join"), None).await;
    seen.push(say(&s, &alice, cid, 3, "after bob is back").await);
    assert_eq!(seqs(&s.pull_all(&bob, cid).await), seen);
}

/// A channel's earlier posts reach a new subscriber neither by pull nor by the overview.
async fn a_new_subscriber_sees_no_earlier_post_in_the_overview(b: Backend) {
    let (_db, s) = setup(&b, "channel-overview", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "C", "conversationType": 3})).await);
    say(&s, &alice, cid, 3, "secret before bob").await;
    ok(&s, &bob, "POST", &format!("/v1/groups/{cid}/join"), None).await;
    let o = overview(&s, &bob, cid).await;
    assert_eq!(
        (o["lastMessage"].clone(), o["unread"].clone()),
        (Value::Null, json!(0)),
        "{o}"
    );
    let seq = say(&s, &alice, cid, 3, "for bob too").await;
    let o = overview(&s, &bob, cid).await;
    assert_eq!(
        (o["lastMessage"]["seq"].as_i64(), o["unread"].as_i64()),
        (Some(seq), Some(1)),
        "{o}"
    );
}

/// A kick from a channel writes no tip, but its request is checked as a group's: a reason
/// over 200 characters is refused the same way.
async fn a_channel_checks_a_kick_as_a_group_does(b: Backend) {
    let (_db, s) = setup(&b, "channel-kick", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "News", "conversationType": 3})).await);
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    ok(&s, &bob, "POST", &g("/join"), Some(json!({}))).await;
    let long = "r".repeat(201);
    let (st, got) = common::server::call(
        &s,
        &alice,
        "POST",
        &g("/kick"),
        Some(json!({"userIds": ["bob"], "reason": long})),
    )
    .await;
    assert_eq!(
        (
            st,
            got["error"]["code"].as_str(),
            got["error"]["reason"].as_str()
        ),
        (422, Some("payload_invalid"), Some("too_long")),
        "{got}"
    );
    assert_eq!(my_group(&s, &bob, cid).await["memberState"], "member");
    let kicked = ok(
        &s,
        &alice,
        "POST",
        &g("/kick"),
        Some(json!({"userIds": ["bob"], "reason": "spam"})),
    )
    .await;
    assert_eq!(kicked, json!({"kicked": ["bob"]}));
    assert_eq!(
        seqs(&s.pull_all(&alice, cid).await),
        vec![1],
        "no tip in a channel"
    );
}
