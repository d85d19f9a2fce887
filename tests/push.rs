//! Offline push against a real HTTP receiver on loopback: a user none of whose devices is
//! online gets one signed notice per burst (tokens, conversation, seq, sender, badge,
//! preview; none for a muted conversation, no preview for an encrypted payload); a webhook
//! that fails is retried after 1 s, 2 s and 4 s and then given up; one that hangs costs
//! notices, never sends. The real binary, on SQLite and on PostgreSQL.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::server::{
    ADMIN_TOKEN, Backend, Db, Server, call, conv, ok, peer, request, send_ok, text, with_token,
};
use common::webhook::{Got, Mode, Receiver};
use hmac::{Hmac, Mac as _};
use serde_json::{Value, json};
use sha2::Sha256;

on_both!(
    offline_users_get_one_signed_notice_per_burst,
    a_failing_webhook_is_retried_then_given_up,
    a_hanging_webhook_costs_notices_not_sends,
);

const SECRET: &str = "push-secret-push-secret-push-secret-0123";

/// A server whose offline notices go to `r`; bursts of 300 ms unless `push` says.
async fn server(b: &Backend, name: &str, r: &Receiver, push: &str) -> (Db, Server) {
    let db = Db::new(b, name).await;
    let coalesce = match push.contains("coalesce_ms") {
        true => "",
        false => "coalesce_ms = 300\n",
    };
    let extra = format!(
        "{}[push]\nwebhook_url = \"http://{}/hook?k=1\"\nwebhook_secret = \"{SECRET}\"\n\
         {coalesce}{push}\n",
        common::server::FAST,
        r.addr
    );
    let s = Server::start(&db, &extra).await;
    (db, s)
}

/// The counter `courier_push_notices_total{outcome}` now.
async fn pushed(s: &Server, outcome: &str) -> f64 {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let a = request(&s.addr, "GET", "/metrics", &[("Authorization", &auth)], "").await;
    let line = format!("courier_push_notices_total{{outcome=\"{outcome}\"}} ");
    a.body
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits (safety net 30 s) until the counter reaches `n`.
async fn until_pushed(s: &Server, outcome: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pushed(s, outcome).await < n {
        assert!(Instant::now() < deadline, "{outcome} never reached {n}");
        tokio::task::yield_now().await;
    }
}

fn verify(got: &Got) {
    let (t, v1) = got
        .signature
        .split_once(",v1=")
        .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v)))
        .unwrap_or_else(|| panic!("bad signature header {:?}", got.signature));
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(&got.raw);
    assert_eq!(
        hex::encode(mac.finalize().into_bytes()),
        v1,
        "the signature does not verify"
    );
}

async fn offline_users_get_one_signed_notice_per_burst(b: Backend) {
    let mut r = Receiver::start(Mode::Ok).await;
    // Bursts of 2 s: a burst's sends and a recall in it, each waiting for its ack, are in
    // one burst on a busy machine too.
    let (_db, s) = server(&b, "push-notices", &r, "coalesce_ms = 2000\n").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let erin = s.user("erin").await;
    let frank = s.user("frank").await;
    with_token(&s, &bob, "phone").await;
    with_token(&s, &dave, "phone").await;
    with_token(&s, &erin, "tablet").await;
    with_token(&s, &frank, "phone").await;
    // dave is online; carol has no token; frank muted his conversation with alice.
    let _dave_online = s.connect(&dave, "laptop").await;
    let mut a = s.connect(&alice, "phone").await;
    let to_frank = send_ok(&mut a, text("f0", "f0", peer("frank"), "first")).await;
    let frank_cid = to_frank["conversationId"].as_i64().unwrap();
    let first = r.next().await;
    assert_eq!(first.body["userId"], "frank", "{:?}", first.body);
    ok(
        &s,
        &frank,
        "PUT",
        &format!("/v1/conversations/{frank_cid}/notifications"),
        Some(json!({"muted": true})),
    )
    .await;
    let entry = s
        .get(&frank, &format!("/v1/conversations/{frank_cid}"))
        .await;
    assert_eq!(entry["muted"], true, "{entry}");

    // A burst of three to bob, one each to carol, dave and frank.
    let mut cid = 0;
    for i in 1..=3 {
        let ack = send_ok(
            &mut a,
            text(
                &format!("b{i}"),
                &format!("b{i}"),
                peer("bob"),
                &format!("hello {i}"),
            ),
        )
        .await;
        cid = ack["conversationId"].as_i64().unwrap();
    }
    send_ok(&mut a, text("c1", "c1", peer("carol"), "hi carol")).await;
    send_ok(&mut a, text("d1", "d1", peer("dave"), "hi dave")).await;
    send_ok(&mut a, text("f1", "f1", conv(frank_cid), "hi again")).await;
    let got = r.next().await;
    verify(&got);
    assert_eq!(
        got.body,
        json!({
            "noticeId": got.notice_id, "userId": "bob",
            "devices": [{"deviceId": "phone", "provider": "apns", "token": "token-of-bob"}],
            "conversationId": cid, "conversationType": 1, "seq": 3, "senderId": "alice",
            "contentType": 1, "messages": 3, "badge": 3, "preview": "hello 3",
            "serverTime": got.body["serverTime"],
        })
    );
    // An encrypted payload is told without its preview. The next notice is erin's: none
    // went to carol (no token), dave (online) or frank (muted) meanwhile.
    let envelope = json!({"v": 1, "type": "message", "senderDeviceId": "phone",
        "header": "AQ==", "ciphertext": "AAAA"});
    send_ok(
        &mut a,
        json!({"type": "send", "id": "e1", "clientMsgId": "e1", "conversationType": 1,
            "peerId": "erin", "contentType": 10, "payload": envelope}),
    )
    .await;
    let got = r.next().await;
    verify(&got);
    assert_eq!(
        (
            &got.body["userId"],
            &got.body["contentType"],
            &got.body["preview"],
            &got.body["badge"]
        ),
        (&json!("erin"), &json!(10), &Value::Null, &json!(1)),
        "{:?}",
        got.body
    );
    until_pushed(&s, "sent", 3.0).await;
    assert_eq!(pushed(&s, "failed").await, 0.0);

    // A burst to frank from his muted conversation and from carol's: the notice is of
    // carol's message only, counted alone.
    let mut c = s.connect(&carol, "laptop").await;
    send_ok(&mut c, text("k1", "k1", peer("frank"), "from carol")).await;
    send_ok(&mut a, text("f2", "f2", conv(frank_cid), "muted again")).await;
    let got = r.next().await;
    assert_eq!(
        (
            &got.body["userId"],
            &got.body["senderId"],
            &got.body["messages"],
            &got.body["preview"]
        ),
        (
            &json!("frank"),
            &json!("carol"),
            &json!(1),
            &json!("from carol")
        ),
        "{:?}",
        got.body
    );
    // A message recalled before its notice leaves is not told: erin's notice of the burst
    // is of carol's message, the one before it.
    send_ok(&mut c, text("k2", "k2", peer("erin"), "from carol to erin")).await;
    let secret = send_ok(&mut a, text("e2", "e2", peer("erin"), "secret oops")).await;
    let recall = json!({"type": "send", "id": "e3", "clientMsgId": "e3", "conversationType": 1,
        "peerId": "erin", "contentType": 4, "payload": {"seq": secret["seq"]}});
    send_ok(&mut a, recall).await;
    // Her badge: the encrypted one and carol's; the recalled one no longer counts, nor is
    // it one of the notice's messages.
    let got = r.next().await;
    assert_eq!(
        (
            &got.body["userId"],
            &got.body["senderId"],
            &got.body["preview"],
            &got.body["badge"],
            &got.body["messages"]
        ),
        (
            &json!("erin"),
            &json!("carol"),
            &json!("from carol to erin"),
            &json!(2),
            &json!(1)
        ),
        "{:?}",
        got.body
    );
    // The same in one conversation: the newest recalled, the notice is of the one before.
    let first = send_ok(&mut a, text("b4", "b4", peer("bob"), "still there?")).await;
    let oops = send_ok(&mut a, text("b5", "b5", peer("bob"), "wrong chat")).await;
    let recall = json!({"type": "send", "id": "b6", "clientMsgId": "b6", "conversationType": 1,
        "peerId": "bob", "contentType": 4, "payload": {"seq": oops["seq"]}});
    send_ok(&mut a, recall).await;
    let got = r.next().await;
    assert_eq!(
        (
            &got.body["userId"],
            &got.body["seq"],
            &got.body["preview"],
            &got.body["messages"]
        ),
        (
            &json!("bob"),
            &first["seq"],
            &json!("still there?"),
            &json!(1)
        ),
        "{:?}",
        got.body
    );
}

async fn a_failing_webhook_is_retried_then_given_up(b: Backend) {
    let mut r = Receiver::start(Mode::Fail).await;
    let (_db, s) = server(&b, "push-fails", &r, "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    with_token(&s, &bob, "phone").await;
    let mut a = s.connect(&alice, "phone").await;
    send_ok(&mut a, text("b1", "b1", peer("bob"), "are you there")).await;
    // The first attempt, then one after 1 s, 2 s and 4 s: the same notice each time.
    let first = r.next().await;
    let mut at = Instant::now();
    for wait in [1, 2, 4] {
        let again = r.next().await;
        assert_eq!(again.notice_id, first.notice_id);
        assert_eq!(again.raw, first.raw, "a retry is the same notice");
        let gap = at.elapsed();
        assert!(
            gap >= Duration::from_millis(wait * 1000 - 100),
            "retried after {gap:?}, not {wait} s"
        );
        at = Instant::now();
    }
    until_pushed(&s, "failed", 1.0).await;
    assert_eq!(pushed(&s, "retried").await, 3.0);
    assert_eq!(pushed(&s, "sent").await, 0.0);
}

async fn a_hanging_webhook_costs_notices_not_sends(b: Backend) {
    let mut r = Receiver::start(Mode::Hang).await;
    let (_db, s) = server(
        &b,
        "push-hangs",
        &r,
        "timeout_secs = 1\nconcurrency = 1\nqueue = 20\n",
    )
    .await;
    let alice = s.user("alice").await;
    let mut offline = Vec::new();
    for i in 0..60 {
        let u = s.user(&format!("u{i}")).await;
        with_token(&s, &u, "phone").await;
        offline.push(u);
    }
    // Sends go on at once while the webhook holds its one connection.
    let mut a = s.connect(&alice, "phone").await;
    let started = Instant::now();
    let frames: Vec<Value> = offline
        .iter()
        .enumerate()
        .map(|(i, u)| text(&format!("s{i}"), &format!("s{i}"), peer(&u.id), "ping"))
        .collect();
    let answers = a.send_all(&frames, 64).await;
    assert!(answers.values().all(|f| f["type"] == "ack"), "{answers:?}");
    r.next().await;
    // One notice is in flight (and hangs), the queue holds 20 users: the others' notices
    // are dropped, and counted.
    until_pushed(&s, "dropped", 39.0).await;
    let (st, _) = call(&s, &alice, "GET", "/v1/conversations", None).await;
    assert_eq!(st, 200, "the server still answers");
    eprintln!(
        "60 sends acked in {:?} with the webhook hanging",
        started.elapsed()
    );
}
