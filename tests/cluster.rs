//! Cluster mode from the outside: several `courier` processes on one PostgreSQL database,
//! with real Redis and NATS, and clients spread over them. The machine's Redis and NATS
//! serve the tests that only need them up (each test has its own key and subject
//! prefix); the tests that stop one start a private server of their own.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::cluster::{
    Hanging, Private, Wiring, degraded_everywhere, eventually, health, metric, node, node_skewed,
    nodes, ok_everywhere, refused, services, skewed,
};
use common::groups::{create, id_of, say};
use common::server::{Backend, Db, Server, User, Ws, call, ok, peer, send_ok, text};
use common::webhook::{Mode, Receiver};
use serde_json::{Value, json};

/// The next `notify` of a text, skipping everything else.
async fn next_text(ws: &mut Ws) -> Value {
    ws.until(|f| f["type"] == "notify" && f["contentType"] == 1)
        .await
        .0
}

/// The next push of the text `body`.
async fn text_arrives(ws: &mut Ws, body: &str) -> Value {
    ws.until(|f| f["type"] == "notify" && f["payload"]["text"] == body)
        .await
        .0
}

fn typing(id: &str, cid: i64) -> Value {
    json!({"type": "send", "id": id, "clientMsgId": id, "conversationType": 1,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}})
}

async fn befriend(a_node: &Server, a: &User, b_node: &Server, b: &User) {
    let r = ok(
        a_node,
        a,
        "POST",
        "/v1/friends/requests",
        Some(json!({ "userId": b.id })),
    )
    .await;
    let rid = r["requestId"].as_str().unwrap();
    ok(
        b_node,
        b,
        "POST",
        &format!("/v1/friends/requests/{rid}/accept"),
        None,
    )
    .await;
}

/// Sends typing until the node refuses it with `code` (bounded).
async fn until_refused(ws: &mut Ws, cid: i64, code: &str) {
    until_answered(ws, cid, code, |f| f["type"] == "error" && f["code"] == code).await;
}

/// Sends typing until the node's answer is `wanted` (bounded); `what` names it.
async fn until_answered(ws: &mut Ws, cid: i64, what: &str, wanted: impl Fn(&Value) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for i in 0.. {
        let frame = typing(&format!("until-{what}-{i}"), cid);
        ws.send(frame.clone()).await;
        let (f, _) = ws.until(|f| f["id"] == frame["id"]).await;
        if wanted(&f) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never answered {what}: {f}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Switches the plugin `name` on or off through node `s` (`POST /admin/plugins/…`).
async fn switch(s: &Server, name: &str, on: bool) {
    let to = if on { "enable" } else { "disable" };
    let (st, body) = s
        .http(
            "POST",
            &format!("/admin/plugins/{name}/{to}"),
            Some(common::server::ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(st, 200, "{to} {name}: {body}");
}

/// `GET /v1/presence` as `viewer`: `userId → online`.
async fn presence(s: &Server, viewer: &User, users: &str) -> HashMap<String, bool> {
    let got = ok(
        s,
        viewer,
        "GET",
        &format!("/v1/presence?userIds={users}"),
        None,
    )
    .await;
    got["presence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["userId"].as_str().unwrap().to_string(),
                p["online"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Reads `presence` frames until the last said of each user is as `want` says.
async fn told_until(ws: &mut Ws, want: &[(&str, bool)]) {
    let mut told: HashMap<String, bool> = HashMap::new();
    while want.iter().any(|(u, on)| told.get(*u) != Some(on)) {
        let f = ws.until(|f| f["type"] == "presence").await.0;
        told.insert(
            f["userId"].as_str().unwrap().to_string(),
            f["online"].as_bool().unwrap(),
        );
    }
}

/// Two nodes whose bus is a NATS server of the test's own, which it may stop.
async fn on_a_bus_of_its_own(test: &str) -> Option<(Private, Db, Vec<Server>)> {
    let svc = services(test)?;
    let nats = Private::nats(test)?;
    let db = Db::new(&svc.postgres, &test.replace('_', "-")).await;
    let mut w = Wiring::nats(&svc, &test.replace('_', "-"));
    w.bus_url = nats.url();
    let n = nodes(&db, &w, 2).await;
    Some((nats, db, n))
}

/// Texts of a conversation as pulled, in seq order.
async fn pulled_texts(s: &Server, u: &User, cid: i64) -> Vec<String> {
    let all = s.pull_all(u, cid).await;
    let seqs: Vec<i64> = all.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "a gap: {seqs:?}");
    all.iter()
        .map(|m| m["payload"]["text"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_group_echo_and_live_delivery_cross_nodes() {
    let Some(svc) = services("cluster_delivery") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-delivery").await;
    let w = Wiring::nats(&svc, "delivery");
    let n = nodes(&db, &w, 3).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let carol = n[2].user("carol").await;
    let mut a_phone = n[0].connect(&alice, "phone").await;
    let mut a_laptop = n[2].connect(&alice, "laptop").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let mut c = n[2].connect(&carol, "phone").await;

    // Private, node 1 → node 2, and the echo to the sender's device on node 3.
    let ack = send_ok(&mut a_phone, text("1", "p-1", peer("bob"), "hi bob")).await;
    let cid = ack["conversationId"].as_i64().unwrap();
    let got = next_text(&mut b).await;
    assert_eq!(
        (got["payload"]["text"].as_str(), got["seq"].as_i64()),
        (Some("hi bob"), Some(1))
    );
    let echo = next_text(&mut a_laptop).await;
    assert_eq!(
        (echo["seq"].as_i64(), echo["conversationId"].as_i64()),
        (Some(1), Some(cid))
    );
    // The sending connection is not pushed its own message.
    let reply = send_ok(&mut b, text("2", "p-2", peer("alice"), "hi alice")).await;
    assert_eq!(reply["seq"], 2);
    assert_eq!(next_text(&mut a_phone).await["payload"]["text"], "hi alice");
    assert_eq!(
        next_text(&mut a_laptop).await["payload"]["text"],
        "hi alice"
    );

    // A group whose members are on three nodes: every member sees every text, in seq
    // order.
    let g = id_of(
        &create(
            &n[0],
            &alice,
            json!({"name": "G", "members": ["bob", "carol"]}),
        )
        .await,
    );
    // Each sends over HTTP to its own node, so every device of every member is pushed
    // all three.
    say(&n[0], &alice, g, 2, "from alice").await;
    say(&n[1], &bob, g, 2, "from bob").await;
    say(&n[2], &carol, g, 2, "from carol").await;
    let expected = ["from alice", "from bob", "from carol"];
    for (who, ws) in [
        ("alice's phone", &mut a_phone),
        ("alice's laptop", &mut a_laptop),
        ("bob", &mut b),
        ("carol", &mut c),
    ] {
        let mut seen = Vec::new();
        while seen.len() < expected.len() {
            let f = ws
                .until(|f| {
                    f["type"] == "notify" && f["conversationId"] == g && f["contentType"] == 1
                })
                .await
                .0;
            seen.push((
                f["seq"].as_i64().unwrap(),
                f["payload"]["text"].as_str().unwrap().to_string(),
            ));
        }
        assert!(
            seen.windows(2).all(|p| p[0].0 < p[1].0),
            "{who}: out of order {seen:?}"
        );
        let texts: Vec<&str> = seen.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, expected, "{who}");
    }

    // A live kind crosses nodes too, and its ack counts the devices on every node.
    let ack = send_ok(&mut a_phone, typing("t1", cid)).await;
    assert_eq!(
        (ack["live"].as_bool(), ack["delivered"].as_u64()),
        (Some(true), Some(2))
    );
    for ws in [&mut b, &mut a_laptop] {
        let f = ws
            .until(|f| f["type"] == "notify" && f["contentType"] == 5)
            .await
            .0;
        assert_eq!(f["senderId"], "alice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_on_another_node_replaces_the_connection_and_a_late_kick_spares_the_newer() {
    let Some(svc) = services("cluster_kick") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-kick").await;
    let w = Wiring::nats(&svc, "kick");
    let n = nodes(&db, &w, 3).await;
    let alice = n[0].user("alice").await;
    let bob = n[2].user("bob").await;
    let mut b = n[2].connect(&bob, "phone").await;
    for round in 0..5 {
        let device = format!("phone{round}");
        // Node 1, then node 2, then node 1 again at once: node 2's kick of the first
        // connection may reach node 1 after the third registered there.
        let mut first = n[0].connect(&alice, &device).await;
        let mut second = n[1].connect(&alice, &device).await;
        let mut third = n[0].connect(&alice, &device).await;
        assert_eq!(
            first.closed().await.0,
            Some(4001),
            "round {round}: the first"
        );
        assert_eq!(
            second.closed().await.0,
            Some(4001),
            "round {round}: the second"
        );
        let body = format!("still there? {round}");
        send_ok(
            &mut b,
            text(
                &format!("r{round}"),
                &format!("k-{round}"),
                peer("alice"),
                &body,
            ),
        )
        .await;
        text_arrives(&mut third, &body).await;
        assert_eq!(
            third.next_within(Duration::from_millis(300)).await,
            None,
            "round {round}: the newest connection must stay open"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_is_what_the_routes_say_and_only_friends_and_co_members_see_it() {
    let Some(svc) = services("cluster_presence") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-presence").await;
    let w = Wiring::nats(&svc, "presence");
    let n = nodes(&db, &w, 3).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let carol = n[2].user("carol").await;
    befriend(&n[0], &alice, &n[1], &bob).await;
    let mut bw = Ws::connect_query(&n[1].addr, &bob.token, "phone", "&presence=true")
        .await
        .unwrap();
    assert_eq!(
        presence(&n[2], &bob, "alice,carol").await,
        HashMap::from([("alice".to_string(), false)]),
        "carol is no friend of bob's and shares no conversation: left out"
    );
    let a = n[0].connect(&alice, "phone").await;
    let f = bw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (f["userId"].as_str(), f["online"].as_bool()),
        (Some("alice"), Some(true))
    );
    assert!(presence(&n[2], &bob, "alice").await["alice"]);
    assert!(presence(&n[0], &carol, "alice,bob").await.is_empty());
    // A second device does not change alice's presence; the last one leaving does.
    let a2 = n[2].connect(&alice, "laptop").await;
    a.close().await;
    assert!(presence(&n[1], &bob, "alice").await["alice"]);
    a2.close().await;
    let f = bw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (f["userId"].as_str(), f["online"].as_bool()),
        (Some("alice"), Some(false))
    );
    assert!(!presence(&n[2], &bob, "alice").await["alice"]);
    // Carol, once in a group with alice, may see her.
    create(&n[0], &alice, json!({"name": "G", "members": ["carol"]})).await;
    assert_eq!(
        presence(&n[2], &carol, "alice").await,
        HashMap::from([("alice".to_string(), false)])
    );
}

/// A node killed and started again at once (as a supervisor does) claims its number as
/// soon as the dead instance's lease lapses, before another node takes the dead routes
/// out: its users with no other device are offline once it listens again, and their
/// friends are told, not after the routes' expiry (90 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_at_once_takes_out_its_earlier_routes() {
    let Some(svc) = services("cluster_restart") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-restart").await;
    let w = Wiring::nats(&svc, "restart");
    let mut n = nodes(&db, &w, 3).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    befriend(&n[0], &alice, &n[1], &bob).await;
    let mut bw = Ws::connect_query(&n[0].addr, &bob.token, "phone", "&presence=true")
        .await
        .unwrap();
    let _a = n[1].connect(&alice, "phone").await;
    let f = bw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (&f["userId"], &f["online"]),
        (&json!("alice"), &json!(true))
    );
    n[1].restart();
    assert!(
        !presence(&n[0], &bob, "alice").await["alice"],
        "alice's only device was on the node that restarted"
    );
    let f = bw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (&f["userId"], &f["online"]),
        (&json!("alice"), &json!(false))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_stream_loses_nothing_after_reconnect_and_pull() {
    let Some(svc) = services("cluster_kill") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-kill").await;
    let w = Wiring::nats(&svc, "kill");
    let mut n = nodes(&db, &w, 3).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let mut a = n[0].connect(&alice, "phone").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let cid = send_ok(&mut a, text("0", "m-0", peer("bob"), "m0")).await["conversationId"]
        .as_i64()
        .unwrap();
    let mut bob_seq = next_text(&mut b).await["seq"].as_i64().unwrap();
    for i in 1..100 {
        send_ok(
            &mut a,
            text(
                &i.to_string(),
                &format!("m-{i}"),
                peer("bob"),
                &format!("m{i}"),
            ),
        )
        .await;
    }
    // Bob's node dies; alice goes on sending; bob comes back on node 3 and pulls.
    while bob_seq < 50 {
        bob_seq = next_text(&mut b).await["seq"].as_i64().unwrap();
    }
    n[1].kill9();
    for i in 100..200 {
        send_ok(
            &mut a,
            text(
                &i.to_string(),
                &format!("m-{i}"),
                peer("bob"),
                &format!("m{i}"),
            ),
        )
        .await;
    }
    let mut b = n[2].connect(&bob, "phone").await;
    let page = n[2]
        .get(
            &bob,
            &format!("/v1/conversations/{cid}/messages?afterSeq={bob_seq}&limit=500"),
        )
        .await;
    let caught_up = page["messages"].as_array().unwrap();
    assert_eq!(
        caught_up.first().unwrap()["seq"].as_i64(),
        Some(bob_seq + 1)
    );
    assert_eq!(caught_up.last().unwrap()["payload"]["text"], "m199");

    // Now alice's node dies with sends in flight; she resends what was not acked, on
    // node 3, with the same clientMsgIds.
    for i in 200..300 {
        a.send(text(
            &i.to_string(),
            &format!("m-{i}"),
            peer("bob"),
            &format!("m{i}"),
        ))
        .await;
    }
    let mut acked = Vec::new();
    while acked.len() < 30 {
        let f = a.until(|f| f["type"] == "ack").await.0;
        acked.push(f["id"].as_str().unwrap().parse::<usize>().unwrap());
    }
    n[0].kill9();
    let mut a = n[2].connect(&alice, "phone").await;
    for i in 200..300 {
        if acked.contains(&i) {
            continue;
        }
        send_ok(
            &mut a,
            text(
                &i.to_string(),
                &format!("m-{i}"),
                peer("bob"),
                &format!("m{i}"),
            ),
        )
        .await;
    }
    let expected: Vec<String> = (0..300).map(|i| format!("m{i}")).collect();
    assert_eq!(pulled_texts(&n[2], &bob, cid).await, expected);
    // Bob's device on node 3 was pushed the last one.
    text_arrives(&mut b, "m299").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stopped_mid_stream_loses_nothing_and_the_nodes_recover_by_themselves() {
    let Some((mut nats, _db, n)) = on_a_bus_of_its_own("cluster_bus_down").await else {
        return;
    };
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let mut a = n[0].connect(&alice, "phone").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let cid = send_ok(&mut a, text("0", "m-0", peer("bob"), "m0")).await["conversationId"]
        .as_i64()
        .unwrap();
    let last = next_text(&mut b).await["seq"].as_i64().unwrap();
    // Connections on node 2 whose token or device node 1 ends while the bus is away.
    let carol = n[1].user("carol").await;
    let dave = n[1].user("dave").await;
    let mut c = n[1].connect(&carol, "phone").await;
    let mut d = n[1].connect(&dave, "phone").await;

    nats.down();
    degraded_everywhere(&n, "bus: NATS").await;
    let (st, _) = call(&n[0], &carol, "POST", "/v1/auth/logout", None).await;
    assert_eq!(st, 200);
    ok(&n[0], &dave, "DELETE", "/v1/devices/phone", None).await;
    // A runtime switch node 1 makes meanwhile: node 2 hears it once the bus is back.
    switch(&n[0], "typing", false).await;
    for i in 1..=20 {
        send_ok(
            &mut a,
            text(
                &i.to_string(),
                &format!("m-{i}"),
                peer("bob"),
                &format!("m{i}"),
            ),
        )
        .await;
    }
    nats.up();
    ok_everywhere(&n).await;
    // The closes node 1 sent were lost with the bus; node 2 reads its connections' tokens
    // and devices again once it is back, and closes those that were ended.
    let (code, frames) = c.closed().await;
    assert_eq!(code, Some(4003), "{frames:?}");
    assert!(
        frames
            .iter()
            .any(|f| f["type"] == "kicked" && f["reason"] == "token_revoked"),
        "{frames:?}"
    );
    let (code, frames) = d.closed().await;
    assert_eq!(code, Some(4009), "{frames:?}");
    until_refused(&mut b, cid, "content_type_disabled").await;
    switch(&n[0], "typing", true).await;
    // Pushes flow again; bob sees the gap and pulls what the bus lost.
    send_ok(&mut a, text("21", "m-21", peer("bob"), "m21")).await;
    let pushed = text_arrives(&mut b, "m21").await["seq"].as_i64().unwrap();
    assert!(pushed > last + 1, "a gap to pull");
    let page = n[1]
        .get(
            &bob,
            &format!("/v1/conversations/{cid}/messages?afterSeq={last}&limit=500"),
        )
        .await;
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["payload"]["text"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (1..=21).map(|i| format!("m{i}")).collect();
    assert_eq!(texts, expected);
}

/// A bus that hangs (`SIGSTOP`: its connections stay open, and it keeps what it is sent
/// to hand on when it goes on) is noticed like one that dies: `/healthz` says so, and a
/// live signal meanwhile reaches this node's devices only, not another's minutes later.
/// Presence changed while the bus was away, hung or dead, is told once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_that_hangs_is_noticed_and_presence_changed_while_it_was_away_is_told_after() {
    let Some((mut nats, _db, n)) = on_a_bus_of_its_own("cluster_bus_hang").await else {
        return;
    };
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let carol = n[1].user("carol").await;
    let dave = n[0].user("dave").await;
    let erin = n[1].user("erin").await;
    befriend(&n[0], &alice, &n[1], &bob).await;
    befriend(&n[0], &alice, &n[1], &carol).await;
    befriend(&n[0], &alice, &n[1], &erin).await;
    let mut aw = Ws::connect_query(&n[0].addr, &alice.token, "watch", "&presence=true")
        .await
        .unwrap();
    let mut a = n[0].connect(&alice, "phone").await;
    // Dave has a device on each node.
    let mut d0 = n[0].connect(&dave, "laptop").await;
    let mut d1 = n[1].connect(&dave, "phone").await;
    let cid = send_ok(&mut a, text("0", "h-0", peer("dave"), "before")).await["conversationId"]
        .as_i64()
        .unwrap();
    text_arrives(&mut d0, "before").await;
    text_arrives(&mut d1, "before").await;
    let b = n[1].connect(&bob, "phone").await;
    let f = aw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (f["userId"].as_str(), f["online"].as_bool()),
        (Some("bob"), Some(true))
    );

    nats.hang(true);
    // Sent before the nodes can tell the bus hangs: the bus holds it, and hands it on
    // seconds late, when it is over.
    send_ok(&mut a, typing("t-early", cid)).await;
    degraded_everywhere(&n, "bus:").await;
    // Alice's watcher and Dave's laptop, on the sender's node; not Dave's phone.
    assert_eq!(
        send_ok(&mut a, typing("t-hung", cid)).await["delivered"],
        2,
        "only the devices on the sender's node are reached"
    );
    d0.until(|f| f["type"] == "notify" && f["contentType"] == 5)
        .await;
    b.close().await;
    let c = n[1].connect(&carol, "phone").await;
    // The hang outlasts the 10 s a node keeps what it told over a bus that works; and a
    // change told right after the bus is back does not make it forget those of the hang.
    tokio::time::sleep(Duration::from_secs(11)).await;
    nats.hang(false);
    ok_everywhere(&n).await;
    let _e = n[1].connect(&erin, "phone").await;
    told_until(&mut aw, &[("bob", false), ("carol", true), ("erin", true)]).await;
    // Neither typing was handed on late: the next push on the other node is the next
    // message.
    send_ok(&mut a, text("1", "h-1", peer("dave"), "after")).await;
    let next = d1.until(|f| f["type"] == "notify").await.0;
    assert_eq!(next["payload"]["text"], "after", "{next}");

    // The same for a bus that dies: carol leaves and bob comes back while it is away.
    nats.down();
    degraded_everywhere(&n, "bus:").await;
    c.close().await;
    let _b = n[1].connect(&bob, "phone").await;
    nats.up();
    ok_everywhere(&n).await;
    told_until(&mut aw, &[("bob", true), ("carol", false)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_keeps_local_delivery_and_started_again_brings_the_routes_back() {
    let Some(svc) = services("cluster_redis_down") else {
        return;
    };
    let Some(mut redis) = Private::redis("cluster_redis_down") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-redis-down").await;
    let mut w = Wiring::nats(&svc, "redis-down");
    w.redis = redis.url();
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let carol = n[0].user("carol").await;
    befriend(&n[0], &alice, &n[1], &bob).await;
    let mut a = n[0].connect(&alice, "phone").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let mut c = n[0].connect(&carol, "phone").await;
    send_ok(&mut a, text("0", "b-0", peer("bob"), "to bob 0")).await;
    text_arrives(&mut b, "to bob 0").await;

    redis.down();
    degraded_everywhere(&n, "redis:").await;
    // Local delivery and pulls go on; without routes a push goes to every node.
    send_ok(&mut a, text("1", "c-1", peer("carol"), "to carol")).await;
    text_arrives(&mut c, "to carol").await;
    send_ok(&mut a, text("2", "b-1", peer("bob"), "to bob 1")).await;
    text_arrives(&mut b, "to bob 1").await;
    let (status, _) = call(&n[1], &alice, "GET", "/v1/presence?userIds=bob", None).await;
    assert_eq!(status, 503, "presence cannot be read without Redis");

    // Redis comes back empty; the nodes write their routes again by themselves.
    redis.up();
    ok_everywhere(&n).await;
    eventually("bob's route is back", || async {
        presence(&n[0], &alice, "bob").await.get("bob") == Some(&true)
    })
    .await;
    send_ok(&mut a, text("3", "b-2", peer("bob"), "to bob 2")).await;
    text_arrives(&mut b, "to bob 2").await;
}

/// One command to the Redis at `addr` (`host:port`, its database 0); its one-line answer.
fn redis_call(addr: &str, args: &[&str]) -> String {
    use std::io::{BufRead as _, Write as _};
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd += &format!("${}\r\n{a}\r\n", a.len());
    }
    let mut r = std::net::TcpStream::connect(addr).unwrap();
    r.write_all(cmd.as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(r).read_line(&mut answer).unwrap();
    answer.trim_end().to_string()
}

/// `host:port` of a `redis://host:port[/db]` URL.
fn redis_addr(url: &str) -> &str {
    url.trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
}

/// Whether `key` is in the Redis at `url` (`redis://host:port`).
fn redis_has(url: &str, key: &str) -> bool {
    match redis_call(redis_addr(url), &["EXISTS", key]).as_str() {
        ":1" => true,
        ":0" => false,
        other => panic!("EXISTS answered {other:?}"),
    }
}

/// The value of `key` in the Redis at `url` (`redis://host:port`), if it is there.
fn redis_get(url: &str, key: &str) -> Option<String> {
    use std::io::{BufRead as _, Write as _};
    let mut r = std::net::TcpStream::connect(redis_addr(url)).unwrap();
    r.write_all(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes())
        .unwrap();
    let mut lines = std::io::BufReader::new(r).lines();
    let head = lines.next().unwrap().unwrap();
    if head == "$-1" {
        return None;
    }
    assert!(head.starts_with('$'), "GET answered {head:?}");
    Some(lines.next().unwrap().unwrap())
}

/// Makes the Redis at `port` answer nobody for `ms` (it keeps its data, as a Redis behind
/// a stalled network does).
fn pause_redis(port: u16, ms: u64) {
    let answer = redis_call(
        &format!("127.0.0.1:{port}"),
        &["CLIENT", "PAUSE", &ms.to_string(), "ALL"],
    );
    assert_eq!(answer, "+OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_gone_while_redis_stalled_is_told_offline_once_it_answers() {
    let Some(svc) = services("cluster_redis_stall") else {
        return;
    };
    let Some(redis) = Private::redis("cluster_redis_stall") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-redis-stall").await;
    let mut w = Wiring::nats(&svc, "redis-stall");
    w.redis = redis.url();
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    befriend(&n[0], &alice, &n[1], &bob).await;
    let mut aw = Ws::connect_query(&n[0].addr, &alice.token, "phone", "&presence=true")
        .await
        .unwrap();
    let b = n[1].connect(&bob, "phone").await;
    let f = aw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (f["userId"].as_str(), f["online"].as_bool()),
        (Some("bob"), Some(true))
    );
    // Bob leaves while Redis answers nobody: node 2 cannot take his route out then. Once
    // Redis answers, node 2 takes out the routes it wrote whose connections are gone, and
    // alice is told (the route would otherwise stay until it expires, 90 s).
    pause_redis(redis.port, 2800);
    b.close().await;
    let f = aw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (f["userId"].as_str(), f["online"].as_bool()),
        (Some("bob"), Some(false))
    );
    assert!(!presence(&n[0], &alice, "bob").await["bob"]);
}

/// Two connections of one device made while Redis was away, on two nodes: once Redis
/// answers (empty), the newer keeps the route and the older is closed `replaced`, whichever
/// node writes its routes back first. One device moves each way, so one of them is always
/// on the node that writes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_moved_while_redis_was_away_keeps_its_newer_connection() {
    let Some(svc) = services("cluster_redis_moved") else {
        return;
    };
    let Some(mut redis) = Private::redis("cluster_redis_moved") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-redis-moved").await;
    let mut w = Wiring::nats(&svc, "redis-moved");
    w.redis = redis.url();
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let mut older = [
        n[0].connect(&alice, "phone").await,
        n[1].connect(&alice, "laptop").await,
    ];
    // The route names its node and session, and orders the device's connections by time
    // (deploy.md has its form).
    let url = redis.url();
    let route = |device: &str| {
        redis_get(&url, &format!("{}:route:alice:{device}", w.prefix))
            .unwrap_or_else(|| panic!("alice's {device} has no route"))
    };
    let phone = route("phone");
    let parts: Vec<&str> = phone.split(':').collect();
    assert_eq!((parts.len(), parts[0]), (3, "1"), "{phone}");
    let at: i64 = parts[2].parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now - at).abs() < 60_000,
        "{phone}: not a time of now ({now})"
    );

    redis.down();
    degraded_everywhere(&n, "redis:").await;
    let mut newer = [
        n[1].connect(&alice, "phone").await,
        n[0].connect(&alice, "laptop").await,
    ];
    redis.up();
    ok_everywhere(&n).await;

    older_closed_newer_kept(&mut older, &mut newer, &mut b, "after the outage").await;
    assert!(route("phone").starts_with("2:"), "{}", route("phone"));
    assert!(route("laptop").starts_with("1:"), "{}", route("laptop"));
}

/// Connections made while Redis hangs: the registration of the first of each device waits
/// in Redis's queue and runs once Redis answers, after the node gave it up; the device's
/// newer connection, made on the other node meanwhile, still keeps the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_moved_while_redis_hung_keeps_its_newer_connection() {
    let Some(svc) = services("cluster_redis_hung") else {
        return;
    };
    let Some(redis) = Private::redis("cluster_redis_hung") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-redis-hung").await;
    let mut w = Wiring::nats(&svc, "redis-hung");
    w.redis = redis.url();
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let mut b = n[1].connect(&bob, "phone").await;

    redis.hang(true);
    let (phone, laptop) = tokio::join!(
        n[0].connect(&alice, "phone"),
        n[1].connect(&alice, "laptop")
    );
    let mut older = [phone, laptop];
    degraded_everywhere(&n, "redis:").await;
    let mut newer = [
        n[1].connect(&alice, "phone").await,
        n[0].connect(&alice, "laptop").await,
    ];
    redis.hang(false);
    ok_everywhere(&n).await;

    older_closed_newer_kept(&mut older, &mut newer, &mut b, "after the hang").await;
}

/// Each of `older` is closed `replaced`; each of `newer` gets the text `body` that `b`
/// sends to alice, and stays open.
async fn older_closed_newer_kept(older: &mut [Ws], newer: &mut [Ws], b: &mut Ws, body: &str) {
    for (i, ws) in older.iter_mut().enumerate() {
        assert_eq!(ws.closed().await.0, Some(4001), "the older connection {i}");
    }
    send_ok(b, text("1", &body.replace(' ', "-"), peer("alice"), body)).await;
    for (i, ws) in newer.iter_mut().enumerate() {
        text_arrives(ws, body).await;
        assert_eq!(
            ws.next_within(Duration::from_millis(300)).await,
            None,
            "the newer connection {i} stays open"
        );
    }
}

/// Presence changes made while Redis was away (and came back empty, keeping nothing of
/// what friends were told) are told once it answers: a friend who left meanwhile offline,
/// one who came meanwhile online.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_changed_while_redis_was_down_is_told_once_it_is_back() {
    let Some(svc) = services("cluster_redis_presence") else {
        return;
    };
    let Some(mut redis) = Private::redis("cluster_redis_presence") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-redis-presence").await;
    let mut w = Wiring::nats(&svc, "redis-presence");
    w.redis = redis.url();
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let carol = n[1].user("carol").await;
    befriend(&n[0], &alice, &n[1], &bob).await;
    befriend(&n[0], &alice, &n[1], &carol).await;
    let mut aw = Ws::connect_query(&n[0].addr, &alice.token, "phone", "&presence=true")
        .await
        .unwrap();
    let b = n[1].connect(&bob, "phone").await;
    let f = aw.until(|f| f["type"] == "presence").await.0;
    assert_eq!(
        (f["userId"].as_str(), f["online"].as_bool()),
        (Some("bob"), Some(true))
    );

    redis.down();
    degraded_everywhere(&n, "redis:").await;
    b.close().await;
    let _c = n[1].connect(&carol, "phone").await;
    redis.up();
    ok_everywhere(&n).await;

    told_until(&mut aw, &[("bob", false), ("carol", true)]).await;
    assert_eq!(
        presence(&n[0], &alice, "bob,carol").await,
        HashMap::from([("bob".to_string(), false), ("carol".to_string(), true)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_node_changes_the_others_stop_caching_at_once() {
    let Some(svc) = services("cluster_caches") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-caches").await;
    let mut w = Wiring::nats(&svc, "caches");
    // No staleness fallback within the test: only the bus can make the others forget.
    w.extra = "cache_secs = 3600".into();
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let mut a = n[0].connect(&alice, "phone").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let cid = send_ok(&mut a, text("0", "o-0", peer("bob"), "hello")).await["conversationId"]
        .as_i64()
        .unwrap();
    // Node 2 caches the conversation for bob's live sends.
    assert_eq!(send_ok(&mut b, typing("t0", cid)).await["delivered"], 1);

    // A block made on node 1 stops bob's live sends on node 2.
    ok(&n[0], &alice, "PUT", "/v1/blocks/bob", None).await;
    until_refused(&mut b, cid, "blocked").await;
    ok(&n[0], &alice, "DELETE", "/v1/blocks/bob", None).await;

    // A plugin switched off on node 1 is off on node 2.
    switch(&n[0], "typing", false).await;
    until_refused(&mut b, cid, "content_type_disabled").await;
    switch(&n[0], "typing", true).await;

    // A logout on node 1 closes bob's connection on node 2 and his token stops working
    // there.
    let (st, _) = call(&n[0], &bob, "POST", "/v1/auth/logout", None).await;
    assert_eq!(st, 200);
    assert_eq!(b.closed().await.0, Some(4003));
    let (st, _) = call(&n[1], &bob, "GET", "/v1/conversations", None).await;
    assert_eq!(st, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_refuses_sqlite_and_a_second_node_with_the_same_id() {
    // Needs nothing but the binary: the config check refuses before anything connects.
    let db = Db::new(&Backend::Sqlite, "cluster-sqlite").await;
    let w = Wiring {
        redis: "redis://127.0.0.1:1".into(),
        bus: "nats",
        bus_url: "nats://127.0.0.1:1".into(),
        prefix: "unused".into(),
        extra: String::new(),
    };
    let log = refused(&db, &w, 1, "sqlite-node", "");
    assert!(log.contains("cluster mode needs PostgreSQL"), "{log}");

    let Some(svc) = services("cluster_duplicate_node") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-duplicate").await;
    let w = Wiring::nats(&svc, "duplicate");
    let first = node(&db, &w, 7, "");
    let log = refused(&db, &w, 7, "second-node7", "");
    assert!(
        log.contains("cluster.node_id 7 is held by a live node"),
        "{log}"
    );
    assert_eq!(health(&first).await["status"], "ok");

    // A start refused after it claimed its number (its metrics address is taken) gives
    // the number back: the next start with it does not wait out the lease.
    let taken = format!("metrics_listen = \"{}\"\n", first.addr);
    let log = refused(&db, &w, 8, "node8-metrics-taken", &taken);
    assert!(log.contains("server.metrics_listen"), "{log}");
    let lease = format!("{}:node:8", w.prefix);
    assert!(!redis_has(&svc.redis, &lease), "{lease} is still held");
    let eighth = node(&db, &w, 8, "");
    assert!(!eighth.log().contains("is held"), "{}", eighth.log());
    assert_eq!(health(&eighth).await["status"], "ok");
}

/// One node's link to the bus hangs while the other's works: the presence changes told
/// meanwhile, over the bus it could not hear, are told to its devices once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_link_to_the_bus_hung_alone_tells_its_devices_the_presence_it_missed() {
    let test = "cluster_bus_link_hang";
    let Some(svc) = services(test) else {
        return;
    };
    let Some(nats) = Private::nats(test) else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-bus-link-hang").await;
    let mut w = Wiring::nats(&svc, "bus-link-hang");
    w.bus_url = nats.url();
    let link = Hanging::start(nats.port).await;
    let mut through = w.clone();
    through.bus_url = format!("nats://127.0.0.1:{}", link.port);
    let n = [node(&db, &w, 1, ""), node(&db, &through, 2, "")];
    let alice = n[0].user("alice").await;
    let carol = n[0].user("carol").await;
    let dave = n[0].user("dave").await;
    let bob = n[1].user("bob").await;
    for (viewer, node) in [(&bob, &n[1]), (&dave, &n[0])] {
        befriend(&n[0], &alice, node, viewer).await;
        befriend(&n[0], &carol, node, viewer).await;
    }
    // Bob watches on the node whose link will hang, Dave on the other.
    let mut bw = Ws::connect_query(&n[1].addr, &bob.token, "watch", "&presence=true")
        .await
        .unwrap();
    let mut dw = Ws::connect_query(&n[0].addr, &dave.token, "watch", "&presence=true")
        .await
        .unwrap();
    let a = n[0].connect(&alice, "phone").await;
    told_until(&mut bw, &[("alice", true)]).await;
    told_until(&mut dw, &[("alice", true)]).await;

    link.hang(true);
    eventually("the node behind the link says its bus is away", || async {
        health(&n[1]).await["reasons"].to_string().contains("bus:")
    })
    .await;
    assert_eq!(
        health(&n[0]).await["status"],
        "ok",
        "the other node kept its bus"
    );
    a.close().await;
    let _c = n[0].connect(&carol, "phone").await;
    // Told on the node that kept its bus, over the bus, while bob's node could not hear.
    told_until(&mut dw, &[("alice", false), ("carol", true)]).await;
    // Long enough that what the link held is handed on too late to be told as it was.
    tokio::time::sleep(Duration::from_secs(4)).await;
    link.hang(false);
    ok_everywhere(&n).await;
    told_until(&mut bw, &[("alice", false), ("carol", true)]).await;
}

/// A Redis used as the bus that hangs is noticed too (its publishes time out where a
/// NATS client's are buffered), and each node's sends go on without waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_bus_that_hangs_is_noticed() {
    let Some(svc) = services("cluster_redis_bus_hang") else {
        return;
    };
    let Some(bus) = Private::redis("cluster_redis_bus_hang") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-redis-bus-hang").await;
    let mut w = Wiring::nats(&svc, "redis-bus-hang");
    w.bus = "redis";
    w.bus_url = bus.url();
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let mut a = n[0].connect(&alice, "phone").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let cid = send_ok(&mut a, text("1", "rh-1", peer("bob"), "before")).await["conversationId"]
        .as_i64()
        .unwrap();
    text_arrives(&mut b, "before").await;
    bus.hang(true);
    // Before the hang is noticed: the acks do not wait for the bus's publishes, and the
    // frames after them are not held for long (sent together, answered in order).
    let sent = std::time::Instant::now();
    for i in 0..4 {
        a.send(typing(&format!("t-early-{i}"), cid)).await;
    }
    a.send(text("e", "rh-e", peer("bob"), "early")).await;
    let mut acked = Vec::new();
    while acked.len() < 5 {
        let f = a.next().await.expect("open");
        if f["type"] == "ack" {
            acked.push(format!(
                "{} {:.2?}",
                f["id"].as_str().unwrap(),
                sent.elapsed()
            ));
        }
    }
    println!("acks in a hang not noticed yet: {}", acked.join(", "));
    degraded_everywhere(&n, "bus:").await;
    assert_eq!(send_ok(&mut a, typing("t-hung", cid)).await["delivered"], 0);
    send_ok(&mut a, text("2", "rh-2", peer("bob"), "during")).await;
    bus.hang(false);
    ok_everywhere(&n).await;
    send_ok(&mut a, text("3", "rh-3", peer("bob"), "after")).await;
    // The message sent during the hang is a gap before the next push: pulled. (The one
    // sent before the hang was noticed may come first: the bus had it.)
    let next = b
        .until(|f| f["type"] == "notify" && f["payload"]["text"] != "early")
        .await
        .0;
    assert_eq!(next["payload"]["text"], "after", "{next}");
    assert_eq!(
        pulled_texts(&n[1], &bob, cid).await,
        ["before", "early", "during", "after"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pub_sub_as_the_bus_carries_pushes_kicks_and_closes() {
    let Some(svc) = services("cluster_redis_bus") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-redis-bus").await;
    let mut w = Wiring::nats(&svc, "redis-bus");
    w.bus = "redis";
    w.bus_url = String::new(); // left out of the config: the bus uses redis_url
    let n = nodes(&db, &w, 2).await;
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let mut a = n[0].connect(&alice, "phone").await;
    let mut b = n[1].connect(&bob, "phone").await;
    let cid = send_ok(&mut a, text("1", "r-1", peer("bob"), "over redis")).await["conversationId"]
        .as_i64()
        .unwrap();
    text_arrives(&mut b, "over redis").await;
    assert_eq!(send_ok(&mut a, typing("t1", cid)).await["delivered"], 1);
    // Bob's phone logs in on node 1: node 2's connection is kicked.
    let mut b2 = n[0].connect(&bob, "phone").await;
    assert_eq!(b.closed().await.0, Some(4001));
    send_ok(&mut a, text("2", "r-2", peer("bob"), "to the new one")).await;
    text_arrives(&mut b2, "to the new one").await;
    assert_eq!(health(&n[1]).await["status"], "ok");
}

/// Devices, delivery receipts and offline notices across nodes: a device is listed online
/// from any node, removed through one node while connected to another (closed there with
/// 4009, refused everywhere after), a `delivered` frame reaches the sender on another node,
/// and a notice goes to a user only while no node holds a device of theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_receipts_and_offline_notices_across_nodes() {
    let Some(svc) = services("cluster_devices") else {
        return;
    };
    let mut hook = Receiver::start(Mode::Ok).await;
    let db = Db::new(&svc.postgres, "cluster-devices").await;
    let w = Wiring::nats(&svc, "devices");
    // One POST at a time: notices leave in the order their bursts ended.
    let push = format!(
        "[push]\nwebhook_url = \"http://{}/hook\"\nwebhook_secret = \"{}\"\n\
         coalesce_ms = 200\nconcurrency = 1\n",
        hook.addr,
        "s".repeat(40)
    );
    let n: Vec<Server> = (1..=2).map(|i| node(&db, &w, i, &push)).collect();
    let alice = n[0].user("alice").await;
    let bob = n[1].user("bob").await;
    let carol = n[1].user("carol").await;
    for (u, device) in [(&bob, "tablet"), (&carol, "phone")] {
        ok(
            &n[1],
            u,
            "POST",
            "/v1/devices",
            Some(json!({ "deviceId": device })),
        )
        .await;
        ok(
            &n[1],
            u,
            "PUT",
            &format!("/v1/devices/{device}/push"),
            Some(json!({"provider": "fcm", "token": format!("t-{}", u.id)})),
        )
        .await;
    }
    // alice: a phone on node 2, a laptop on node 1; node 1 lists both online.
    let mut phone = n[1].connect(&alice, "phone").await;
    let mut laptop = n[0].connect(&alice, "laptop").await;
    let listed = n[0].get(&alice, "/v1/devices").await;
    let online: Vec<(&str, bool)> = listed["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["deviceId"].as_str().unwrap(), d["online"] == true))
        .collect();
    assert_eq!(online, [("laptop", true), ("phone", true)], "{listed}");

    // bob is offline everywhere: alice's message, committed on node 1, is a notice.
    let ack = send_ok(&mut laptop, text("m1", "m1", peer("bob"), "hello bob")).await;
    let cid = ack["conversationId"].as_i64().unwrap();
    let got = hook.next().await;
    assert_eq!(
        (
            &got.body["userId"],
            &got.body["seq"],
            &got.body["devices"][0]["token"]
        ),
        (&json!("bob"), &json!(1), &json!("t-bob")),
        "{:?}",
        got.body
    );
    // bob online on node 2: the next message is pushed there and is no notice (the next
    // notice is carol's, whose burst ended after it).
    let mut b = n[1].connect(&bob, "tablet").await;
    send_ok(&mut laptop, text("m2", "m2", peer("bob"), "you there?")).await;
    assert_eq!(next_text(&mut b).await["seq"], 2);
    send_ok(&mut laptop, text("m3", "m3", peer("carol"), "hello carol")).await;
    let got = hook.next().await;
    assert_eq!(got.body["userId"], "carol", "{:?}", got.body);

    // bob's tablet (node 2) received it: alice's devices on both nodes are told.
    b.send(json!({"type": "received", "id": "r", "conversationId": cid, "seq": 2}))
        .await;
    for ws in [&mut laptop, &mut phone] {
        let (d, _) = ws.until(|f| f["type"] == "delivered").await;
        assert_eq!(
            d,
            json!({"type": "delivered", "conversationId": cid, "userId": "bob", "seq": 2})
        );
    }

    // A to-device message sent through node 1 reaches bob's tablet on node 2.
    let envelope = json!({"v": 1, "type": "message", "senderDeviceId": "laptop",
        "header": "AQ==", "ciphertext": "AAAA"});
    laptop
        .send(
            json!({"type": "send_to_devices", "id": "d1", "clientMsgId": "d1",
            "contentType": 10, "messages": [{"userId": "bob", "deviceId": "tablet",
            "payload": envelope}]}),
        )
        .await;
    assert_eq!(laptop.until(|f| f["id"] == "d1").await.0["type"], "ack");
    let (m, _) = b.until(|f| f["type"] == "device_message").await;
    assert_eq!(
        (&m["seq"], &m["senderId"], &m["senderDeviceId"]),
        (&json!(1), &json!("alice"), &json!("laptop")),
        "{m}"
    );

    // alice removes her phone through node 1; node 2 closes it, and no node takes it back.
    ok(&n[0], &alice, "DELETE", "/v1/devices/phone", None).await;
    let (code, frames) = phone.closed().await;
    assert_eq!(code, Some(4009), "{frames:?}");
    for node in &n {
        assert_eq!(
            Ws::connect(&node.addr, &alice.token, "phone").await.err(),
            Some(403)
        );
    }
}

/// The `serverTime` of a `pong` from `ws`.
async fn server_time(ws: &mut Ws, id: &str) -> i64 {
    ws.send(json!({"type": "ping", "id": id})).await;
    let (pong, _) = ws.until(|f| f["id"] == id).await;
    pong["serverTime"].as_i64().unwrap()
}

/// Nodes whose machines' clocks disagree by 5 s keep one time, Redis's: a device that
/// moves to the node behind is the newer connection there and gets what is sent to it at
/// once, live signals from that node are not taken for stale, a plugin switch made there
/// after one made on the other node wins, and `serverTime` agrees across the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_clocks_disagree_keep_redis_time() {
    let Some(svc) = services("cluster_clocks") else {
        return;
    };
    let Some(behind) = skewed("cluster_clocks", "-5s") else {
        return;
    };
    let db = Db::new(&svc.postgres, "cluster-clocks").await;
    let w = Wiring::nats(&svc, "clocks");
    let n = [node(&db, &w, 1, ""), node_skewed(&db, &w, 2, &behind)];
    // Node 2 keeps Redis's time, 5 s ahead of its machine's.
    eventually("node 2 keeps Redis's time", || async {
        let offset = metric(&n[1], "courier_cluster_clock_offset_seconds").await;
        offset.parse::<f64>().is_ok_and(|s| (4.0..6.0).contains(&s))
    })
    .await;
    let alice = n[0].user("alice").await;
    let bob = n[0].user("bob").await;
    let mut b = n[0].connect(&bob, "phone").await;
    let mut a1 = n[0].connect(&alice, "phone").await;
    let sent = send_ok(&mut b, text("1", "c-1", peer("alice"), "one")).await;
    let cid = sent["conversationId"].as_i64().unwrap();
    text_arrives(&mut a1, "one").await;

    // The same device on the node behind: the newer connection, whose route is written at
    // once, so a text sent right after its connect reaches it.
    let mut a2 = n[1].connect(&alice, "phone").await;
    assert_eq!(a1.closed().await.0, Some(4001), "the older connection");
    send_ok(&mut b, text("2", "c-2", peer("alice"), "two")).await;
    text_arrives(&mut a2, "two").await;

    // One time on both nodes: pongs, and texts sent through each in turn.
    let (t1, t2) = (
        server_time(&mut b, "p1").await,
        server_time(&mut a2, "p2").await,
    );
    assert!((t2 - t1).abs() < 1_000, "pong times {t1} and {t2}");
    for i in 0..6 {
        let (ws, to) = if i % 2 == 0 {
            (&mut b, "alice")
        } else {
            (&mut a2, "bob")
        };
        send_ok(
            ws,
            text(&format!("t{i}"), &format!("c-t{i}"), peer(to), "turn"),
        )
        .await;
    }
    let times: Vec<i64> = n[0]
        .pull_all(&bob, cid)
        .await
        .iter()
        .map(|m| m["serverTime"].as_i64().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[1] > w[0] - 1_000),
        "serverTime went back across the nodes: {times:?}"
    );

    // A live signal from the node behind reaches bob on the other.
    let ack = send_ok(&mut a2, typing("ty1", cid)).await;
    assert_eq!(ack["delivered"], 1, "{ack}");
    b.until(|f| f["type"] == "notify" && f["contentType"] == 5)
        .await;

    // A plugin switched off on node 1, then, once node 2 has heard of it, on again on
    // node 2: on everywhere (node 1 does not keep the older switch).
    switch(&n[0], "typing", false).await;
    until_refused(&mut a2, cid, "content_type_disabled").await;
    switch(&n[1], "typing", true).await;
    until_answered(&mut b, cid, "acked", |f| f["type"] == "ack").await;
}
