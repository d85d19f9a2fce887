//! The messaging core end to end: the real binary on loopback, real WebSocket clients,
//! every test on SQLite and (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::server::{
    Backend, Db, FAST, JWT_SECRET, Server, User, Ws, conv, peer, send_err, send_ok, setup, text,
};
use serde_json::{Value, json};

on_both!(
    a_pull_gives_each_payload_as_stored,
    a_first_message_refused_by_a_racing_block_makes_no_conversation,
    multi_device_delivery_and_echo,
    a_second_login_of_a_device_kicks_the_first_and_only_the_first,
    the_same_client_msg_id_at_once_on_two_connections_is_one_message,
    concurrent_senders_get_gapless_seqs_and_receivers_get_each_once_in_order,
    acknowledged_messages_survive_kill_9,
    live_kinds_are_pushed_and_never_stored,
    frames_sent_together_are_each_answered_once_in_order,
    unread_counts_reads_and_recalls,
    recall_rules,
    bad_input_gets_documented_codes,
    accounts_and_tokens,
    both_first_messages_at_once_make_one_private_conversation,
    a_resend_naming_another_peer_makes_no_conversation,
    after_a_restart_sends_by_peer_and_by_conversation_keep_their_order,
    a_new_conversation_named_by_peer_then_by_id_keeps_the_order_sent,
    a_silent_device_is_dropped_and_a_pinging_one_stays,
    a_slow_reader_is_disconnected_and_pulls_afterwards,
    http_send_and_pull_paging,
);

async fn multi_device_delivery_and_echo(b: Backend) {
    let (_db, s) = setup(&b, "multi-device", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut a1 = s.connect(&alice, "phone").await;
    let mut a2 = s.connect(&alice, "laptop").await;
    let mut b1 = s.connect(&bob, "phone").await;
    let mut b2 = s.connect(&bob, "laptop").await;

    let ack = send_ok(&mut a1, text("r1", "m-1", peer("bob"), "hello bob")).await;
    assert_eq!(
        (ack["seq"].as_i64(), ack["duplicate"].as_bool()),
        (Some(1), Some(false))
    );
    let cid = ack["conversationId"].as_i64().unwrap();
    for ws in [&mut a2, &mut b1, &mut b2] {
        let n = ws.expect("notify").await;
        assert_eq!(n["conversationId"], cid);
        assert_eq!(n["conversationType"], 1);
        assert_eq!(n["seq"], 1);
        assert_eq!(n["msgId"], ack["msgId"]);
        assert_eq!(n["senderId"], "alice");
        assert_eq!(n["contentType"], 1);
        assert_eq!(n["payload"]["text"], "hello bob");
        assert_eq!(n["serverTime"], ack["serverTime"]);
    }
    // The sending connection gets its ack, not its own message.
    assert!(a1.drain(Duration::from_millis(300)).await.is_empty());

    let ack = send_ok(&mut b2, text("r2", "m-2", conv(cid), "hi alice")).await;
    assert_eq!(ack["seq"], 2);
    for ws in [&mut a1, &mut a2, &mut b1] {
        let n = ws.expect("notify").await;
        assert_eq!(
            (n["seq"].as_i64(), n["senderId"].as_str()),
            (Some(2), Some("bob"))
        );
    }
    assert!(b2.drain(Duration::from_millis(300)).await.is_empty());
}

async fn a_second_login_of_a_device_kicks_the_first_and_only_the_first(b: Backend) {
    let (_db, s) = setup(&b, "kick", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut a = s.connect(&alice, "phone").await;
    let mut old = s.connect(&bob, "phone").await;
    let mut new = s.connect(&bob, "phone").await;
    assert_ne!(old.hello["sessionId"], new.hello["sessionId"]);
    let (code, frames) = old.closed().await;
    assert_eq!(code, Some(4001));
    assert_eq!(frames.last().unwrap()["type"], "kicked");
    assert_eq!(frames.last().unwrap()["reason"], "replaced");
    // The old connection's close came after the new one registered: the new one stays.
    send_ok(&mut a, text("r1", "k-1", peer("bob"), "still there?")).await;
    assert_eq!(
        new.expect("notify").await["payload"]["text"],
        "still there?"
    );

    // Many logins of one device at once: exactly one survives and gets the pushes.
    let mut racers = Vec::new();
    for _ in 0..6 {
        let addr = s.addr.clone();
        let token = bob.token.clone();
        racers.push(tokio::spawn(async move {
            Ws::connect(&addr, &token, "tablet").await.unwrap()
        }));
    }
    let mut conns = Vec::new();
    for r in racers {
        conns.push(r.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_ok(
        &mut a,
        text("r2", "k-2", peer("bob"), "who has the tablet?"),
    )
    .await;
    let mut survivors = 0;
    let mut kicked = 0;
    for mut c in conns {
        match c.next_within(Duration::from_secs(3)).await {
            Some(Some(f)) if f["type"] == "notify" => {
                survivors += 1;
                assert_eq!(f["payload"]["text"], "who has the tablet?");
            }
            Some(Some(f)) if f["type"] == "kicked" => {
                kicked += 1;
                assert_eq!(c.closed().await.0, Some(4001));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((survivors, kicked), (1, 5));
    // The phone connection was never touched by the tablet's logins.
    assert_eq!(
        new.expect("notify").await["payload"]["text"],
        "who has the tablet?"
    );
}

async fn the_same_client_msg_id_at_once_on_two_connections_is_one_message(b: Backend) {
    let (_db, s) = setup(&b, "dedupe", FAST).await;
    let alice = s.user("alice").await;
    s.user("bob").await;
    let mut first = s.connect(&alice, "phone").await;
    let mut second = s.connect(&alice, "laptop").await;
    let cid =
        send_ok(&mut first, text("r0", "hello-0", peer("bob"), "first")).await["conversationId"]
            .as_i64()
            .unwrap();
    second.expect("notify").await;
    for round in 0..20 {
        let cmid = format!("same-{round}");
        let f1 = text("x", &cmid, conv(cid), &cmid);
        let f2 = text("y", &cmid, conv(cid), &cmid);
        let (a1, a2) = tokio::join!(first.send(f1), second.send(f2));
        let ((), ()) = (a1, a2);
        let (ack1, _) = first.until(|f| f["id"] == "x").await;
        let (ack2, _) = second.until(|f| f["id"] == "y").await;
        assert_eq!(ack1["type"], "ack");
        assert_eq!(ack1["msgId"], ack2["msgId"], "{ack1} {ack2}");
        assert_eq!(ack1["seq"], ack2["seq"]);
        let dups = [
            ack1["duplicate"].as_bool().unwrap(),
            ack2["duplicate"].as_bool().unwrap(),
        ];
        assert!(dups.contains(&true) && dups.contains(&false), "{dups:?}");
    }
    let all = s.pull_all(&alice, cid).await;
    assert_eq!(all.len(), 21);
    let seqs: Vec<i64> = all.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=21).collect::<Vec<_>>());
}

async fn concurrent_senders_get_gapless_seqs_and_receivers_get_each_once_in_order(b: Backend) {
    let (_db, s) = setup(&b, "storm", FAST).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    // Receivers: one stays online throughout, one leaves halfway and pulls the gap.
    let mut steady = s.connect(&bob, "steady").await;
    let mut flaky = s.connect(&bob, "flaky").await;
    let mut opener = s.connect(&alice, "opener").await;
    let cid = send_ok(&mut opener, text("r0", "open", peer("bob"), "open")).await["conversationId"]
        .as_i64()
        .unwrap();
    steady.expect("notify").await;
    flaky.expect("notify").await;

    const SENDERS: usize = 8;
    const EACH: usize = 40;
    let mut tasks = Vec::new();
    for i in 0..SENDERS {
        let user = if i.is_multiple_of(2) {
            alice.clone()
        } else {
            bob.clone()
        };
        let addr = s.addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut ws = Ws::connect(&addr, &user.token, &format!("sender-{i}"))
                .await
                .unwrap();
            for j in 0..EACH {
                ws.send(text(
                    &format!("{j}"),
                    &format!("s{i}-{j}"),
                    conv(cid),
                    &format!("s{i}-{j}"),
                ))
                .await;
            }
            let mut acks = Vec::new();
            while acks.len() < EACH {
                let f = ws.next().await.unwrap();
                if f["type"] == "ack" {
                    acks.push(f["seq"].as_i64().unwrap());
                } else {
                    assert_eq!(f["type"], "notify", "{f}");
                }
            }
            acks
        }));
    }
    let total = SENDERS * EACH + 1;
    // The flaky device reads a while, then drops.
    let mut flaky_seen: Vec<i64> = vec![1];
    while flaky_seen.len() < total / 3 {
        let f = flaky.expect("notify").await;
        flaky_seen.push(f["seq"].as_i64().unwrap());
    }
    flaky.close().await;

    let mut acked = BTreeSet::new();
    for t in tasks {
        for seq in t.await.unwrap() {
            assert!(acked.insert(seq), "seq {seq} acked twice");
        }
    }
    assert_eq!(acked.len(), SENDERS * EACH);

    let mut steady_seen = vec![1];
    while steady_seen.len() < total {
        let f = steady.expect("notify").await;
        steady_seen.push(f["seq"].as_i64().unwrap());
    }
    let all_seqs: Vec<i64> = (1..=total as i64).collect();
    assert_eq!(
        steady_seen, all_seqs,
        "the online device got every seq once, in order"
    );

    // The flaky device catches up from its cursor: push ∪ pull is every message once.
    let cursor = *flaky_seen.last().unwrap();
    assert_eq!(
        flaky_seen,
        (1..=cursor).collect::<Vec<_>>(),
        "pushes come in seq order"
    );
    let mut after = cursor;
    loop {
        let page = s
            .get(
                &bob,
                &format!("/v1/conversations/{cid}/messages?afterSeq={after}&limit=37"),
            )
            .await;
        for m in page["messages"].as_array().unwrap() {
            flaky_seen.push(m["seq"].as_i64().unwrap());
            after = m["seq"].as_i64().unwrap();
        }
        if !page["hasMore"].as_bool().unwrap() {
            break;
        }
    }
    assert_eq!(flaky_seen, all_seqs);
    // Each sender's messages are there once, with the text it sent.
    let texts: BTreeSet<String> = s
        .pull_all(&alice, cid)
        .await
        .iter()
        .map(|m| m["payload"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(texts.len(), total);
}

async fn acknowledged_messages_survive_kill_9(b: Backend) {
    let (_db, mut s) = setup(&b, "kill9", FAST).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut opener = s.connect(&alice, "opener").await;
    let cid = send_ok(&mut opener, text("r0", "open", peer("bob"), "open")).await["conversationId"]
        .as_i64()
        .unwrap();
    drop(opener);

    // Senders pipeline as fast as they can; the server is killed under them.
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut tasks = Vec::new();
    for i in 0..6usize {
        let user = if i.is_multiple_of(2) {
            alice.clone()
        } else {
            bob.clone()
        };
        let addr = s.addr.clone();
        let mut stop = stop_tx.subscribe();
        tasks.push(tokio::spawn(async move {
            let mut ws = Ws::connect(&addr, &user.token, &format!("d{i}")).await.unwrap();
            let mut acked: HashMap<String, (i64, String)> = HashMap::new();
            let mut sent = Vec::new();
            let mut j = 0;
            loop {
                // Keep up to 32 sends in flight.
                while sent.len() - acked.len() < 32 && j < 2000 {
                    let cmid = format!("k{i}-{j}");
                    let f = text(&cmid, &cmid, conv(cid), &cmid);
                    // Counted as sent before it leaves: it may reach the server either way.
                    sent.push(cmid);
                    j += 1;
                    if !ws.try_send(&f).await {
                        return (acked, sent);
                    }
                }
                if j == 2000 && sent.len() == acked.len() {
                    let _ = stop.recv().await;
                    return (acked, sent);
                }
                tokio::select! {
                    f = ws.next_within(Duration::from_secs(5)) => match f {
                        Some(Some(f)) if f["type"] == "ack" => {
                            acked.insert(f["id"].as_str().unwrap().to_string(), (f["seq"].as_i64().unwrap(), f["msgId"].as_str().unwrap().to_string()));
                        }
                        Some(Some(_)) => {}
                        _ => return (acked, sent),
                    },
                    _ = stop.recv() => return (acked, sent),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.kill9();
    let _ = stop_tx.send(());
    let mut acked: HashMap<String, (i64, String)> = HashMap::new();
    let mut sent: Vec<String> = Vec::new();
    for t in tasks {
        let (a, s) = t.await.unwrap();
        acked.extend(a);
        sent.extend(s);
    }
    assert!(
        acked.len() > 50,
        "the storm was too small to mean anything: {}",
        acked.len()
    );

    s.restart();
    let stored = s.pull_all(&alice, cid).await;
    let by_text: HashMap<String, &Value> = stored
        .iter()
        .map(|m| (m["payload"]["text"].as_str().unwrap().to_string(), m))
        .collect();
    assert_eq!(by_text.len(), stored.len(), "a message is stored twice");
    let seqs: Vec<i64> = stored.iter().map(|m| m["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=stored.len() as i64).collect::<Vec<_>>(),
        "seqs have a gap"
    );
    for (cmid, (seq, msg_id)) in &acked {
        let m = by_text
            .get(cmid)
            .unwrap_or_else(|| panic!("acked {cmid} is lost"));
        assert_eq!(
            (m["seq"].as_i64().unwrap(), m["msgId"].as_str().unwrap()),
            (*seq, msg_id.as_str())
        );
    }

    // Resending everything (as clients do after a reconnect) stores each message once.
    let mut a = s.connect(&alice, "resend").await;
    let mut bws = s.connect(&bob, "resend").await;
    let (mut of_a, mut of_b) = (Vec::new(), Vec::new());
    for cmid in &sent {
        let i: usize = cmid[1..].split('-').next().unwrap().parse().unwrap();
        let f = text(cmid, cmid, conv(cid), cmid);
        if i.is_multiple_of(2) {
            of_a.push(f)
        } else {
            of_b.push(f)
        }
    }
    let (mut answers, from_b) = tokio::join!(a.send_all(&of_a, 64), bws.send_all(&of_b, 64));
    answers.extend(from_b);
    for (cmid, ack) in &answers {
        assert_eq!(ack["type"], "ack", "{ack}");
        if let Some((seq, msg_id)) = acked.get(cmid) {
            assert_eq!(ack["duplicate"], true);
            assert_eq!(
                (ack["seq"].as_i64().unwrap(), ack["msgId"].as_str().unwrap()),
                (*seq, msg_id.as_str())
            );
        }
    }
    let stored = s.pull_all(&alice, cid).await;
    assert_eq!(stored.len(), sent.len() + 1);
}

async fn live_kinds_are_pushed_and_never_stored(b: Backend) {
    let (_db, s) = setup(&b, "live", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut a = s.connect(&alice, "phone").await;
    let cid = send_ok(&mut a, text("r0", "open", peer("bob"), "open")).await["conversationId"]
        .as_i64()
        .unwrap();
    let mut b1 = s.connect(&bob, "phone").await;
    let typing = json!({"type": "send", "id": "t1", "clientMsgId": "t-1", "conversationType": 1,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}});
    let ack = send_ok(&mut a, typing).await;
    assert_eq!(
        (ack["live"].as_bool(), ack["delivered"].as_u64()),
        (Some(true), Some(1))
    );
    assert!(ack.get("seq").is_none());
    let n = b1.expect("notify").await;
    assert_eq!(
        (n["contentType"].as_u64(), n["senderId"].as_str()),
        (Some(5), Some("alice"))
    );
    assert!(n.get("seq").is_none() && n.get("msgId").is_none(), "{n}");

    let call = json!({"type": "send", "id": "c1", "clientMsgId": "c-1", "conversationType": 1,
        "peerId": "bob", "contentType": 6,
        "payload": {"action": "invite", "callId": "call-1", "media": "video"}});
    a.send(call).await;
    let (ack, _) = a.until(|f| f["id"] == "c1").await;
    if ack["type"] == "error" {
        panic!("rtc-call offer refused: {ack}");
    }
    assert_eq!(b1.expect("notify").await["contentType"], 6);

    // Nothing live is pulled, counted or replayed to a device that comes later.
    let pulled = s.pull_all(&bob, cid).await;
    assert_eq!(pulled.len(), 1);
    let overview = s.get(&bob, "/v1/conversations").await;
    assert_eq!(overview["conversations"][0]["unread"], 1);
    assert_eq!(overview["conversations"][0]["lastSeq"], 1);
    let mut late = s.connect(&bob, "laptop").await;
    assert!(late.drain(Duration::from_millis(500)).await.is_empty());
    // With nobody of bob's online, a live send reaches no one and is not kept.
    drop(b1);
    late.close().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let typing = json!({"type": "send", "id": "t2", "clientMsgId": "t-2", "conversationType": 1,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}});
    assert_eq!(send_ok(&mut a, typing).await["delivered"], 0);
    let mut back = s.connect(&bob, "phone").await;
    assert!(back.drain(Duration::from_millis(500)).await.is_empty());

    // A live kind never starts a conversation.
    let carol = s.user("carol").await;
    let mut c = s.connect(&carol, "phone").await;
    let typing = json!({"type": "send", "id": "t3", "clientMsgId": "t-3", "conversationType": 1,
        "peerId": "alice", "contentType": 5, "payload": {"state": "typing"}});
    assert_eq!(
        send_err(&mut c, typing).await["code"],
        "conversation_not_found"
    );
    let list = s.get(&carol, "/v1/conversations").await;
    assert!(
        list["conversations"].as_array().unwrap().is_empty(),
        "{list}"
    );
    assert_eq!(
        s.get(&alice, "/v1/conversations").await["conversations"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// A client that writes many frames at once (the server reads them in rounds) gets one
/// answer per frame, in the order of its frames, and its peer gets every signal once, in
/// order.
/// The answers to the frames of these ids, in whatever order they come (sends to
/// different conversations may be answered out of the order sent).
async fn answers<const N: usize>(ws: &mut Ws, ids: [&str; N]) -> [Value; N] {
    let mut got: [Value; N] = std::array::from_fn(|_| Value::Null);
    while got.iter().any(Value::is_null) {
        let f = ws.next().await.expect("closed while waiting for answers");
        if let Some(at) = ids.iter().position(|id| f["id"] == *id) {
            got[at] = f;
        }
    }
    got
}

/// A resend is answered with the message its `clientMsgId` stored, whatever peer it names:
/// it makes no conversation with another peer, alone or together with its original; a key
/// whose first send was refused is free for the next.
async fn a_resend_naming_another_peer_makes_no_conversation(b: Backend) {
    let (_db, s) = setup(&b, "resend-other-peer", "").await;
    let alice = s.user("alice").await;
    s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let mut a = s.connect(&alice, "phone").await;
    let first = send_ok(&mut a, text("r1", "k-1", peer("bob"), "to bob")).await;
    let again = send_ok(&mut a, text("r2", "k-1", peer("carol"), "to carol")).await;
    assert_eq!(
        (
            &again["conversationId"],
            &again["seq"],
            again["duplicate"].as_bool()
        ),
        (&first["conversationId"], &first["seq"], Some(true)),
        "{again}"
    );
    let list = s.get(&carol, "/v1/conversations").await;
    assert_eq!(list["conversations"], json!([]), "{list}");
    let typing = json!({"type": "send", "id": "t1", "clientMsgId": "t-1", "conversationType": 1,
        "peerId": "carol", "contentType": 5, "payload": {"state": "typing"}});
    assert_eq!(
        send_err(&mut a, typing).await["code"],
        "conversation_not_found"
    );

    // Together: one batch when one committer takes them at once; on PostgreSQL two
    // conversations may be two committers', and either send may be stored first. One is
    // stored, the other is its resend, and no conversation is left empty.
    a.send_together(&[
        text("r3", "k-2", peer("bob"), "to bob again"),
        text("r4", "k-2", peer("dave"), "to dave"),
    ])
    .await;
    let answers_2 = answers(&mut a, ["r3", "r4"]).await;
    let [stored, resend] = match answers_2[0]["duplicate"].as_bool() {
        Some(false) => [&answers_2[0], &answers_2[1]],
        _ => [&answers_2[1], &answers_2[0]],
    };
    assert_eq!(
        (stored["duplicate"].as_bool(), resend["duplicate"].as_bool()),
        (Some(false), Some(true)),
        "{answers_2:?}"
    );
    assert_eq!(
        resend["conversationId"], stored["conversationId"],
        "{answers_2:?}"
    );
    // A key refused (no such user) stores a later send that names it.
    a.send_together(&[
        text("r5", "k-3", peer("nobody"), "to nobody"),
        text("r6", "k-3", peer("carol"), "to carol"),
    ])
    .await;
    let [refused, stored] = answers(&mut a, ["r5", "r6"]).await;
    assert_eq!(
        (
            stored["type"].as_str(),
            stored["seq"].as_i64(),
            stored["duplicate"].as_bool()
        ),
        (Some("ack"), Some(1), Some(false)),
        "{stored}"
    );
    // Refused, or (stored after it by another committer) its resend.
    assert!(
        refused["code"] == "user_not_found"
            || (refused["duplicate"] == true && refused["msgId"] == stored["msgId"]),
        "{refused}"
    );
    let list = s.get(&carol, "/v1/conversations").await;
    assert_eq!(
        list["conversations"][0]["lastMessage"]["payload"]["text"], "to carol",
        "{list}"
    );
    for u in [&carol, &dave] {
        let list = s.get(u, "/v1/conversations").await;
        for c in list["conversations"].as_array().unwrap() {
            assert!(
                c["lastSeq"].as_i64() > Some(0),
                "{}: an empty conversation: {c}",
                u.id
            );
        }
    }
}

async fn frames_sent_together_are_each_answered_once_in_order(b: Backend) {
    let (_db, s) = setup(&b, "together", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut a = s.connect(&alice, "phone").await;
    let cid = send_ok(&mut a, text("r0", "open", peer("bob"), "open")).await["conversationId"]
        .as_i64()
        .unwrap();
    let mut b1 = s.connect(&bob, "phone").await;
    // A call signal: a live send, answered at once.
    let signal = |id: String, call: String| {
        json!({"type": "send", "id": id, "clientMsgId": format!("c-{id}"),
            "conversationType": 1, "conversationId": cid, "contentType": 6,
            "payload": {"action": "invite", "callId": call, "media": "audio"}})
    };
    // A call signal, a ping and a frame of no known type, over and over: 100 frames, 34
    // of them sends.
    let frames: Vec<Value> = (0..100)
        .map(|i| match i % 3 {
            0 => signal(format!("f{i}"), format!("call-{i}")),
            1 => json!({"type": "ping", "id": format!("f{i}")}),
            _ => json!({"type": "nope", "id": format!("f{i}")}),
        })
        .collect();
    a.send_together(&frames).await;
    let mut answers = Vec::new();
    for _ in 0..100 {
        answers.push(a.next().await.expect("closed while answering"));
    }
    // A ping is answered at once, so its pong may pass the answers of the frames before
    // it (the first call signal waits for the conversation's members); the pongs come in
    // the pings' order, and every other answer in its frame's.
    let (pongs, others): (Vec<&Value>, Vec<&Value>) =
        answers.iter().partition(|f| f["type"] == "pong");
    let ids = |of: &[&Value]| -> Vec<String> {
        of.iter()
            .map(|f| f["id"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    let expected = |pings: bool| -> Vec<String> {
        (0..100)
            .filter(|i| (i % 3 == 1) == pings)
            .map(|i| format!("f{i}"))
            .collect()
    };
    assert_eq!(ids(&pongs), expected(true));
    assert_eq!(ids(&others), expected(false));
    for f in &answers {
        let i: usize = f["id"].as_str().unwrap()[1..].parse().unwrap();
        match i % 3 {
            0 => assert_eq!(
                (f["type"].as_str(), f["delivered"].as_u64()),
                (Some("ack"), Some(1)),
                "{f}"
            ),
            1 => assert_eq!(f["type"], "pong", "{f}"),
            _ => assert_eq!(
                (f["type"].as_str(), f["code"].as_str()),
                (Some("error"), Some("unknown_frame_type")),
                "{f}"
            ),
        }
    }
    // A stored message after them reaches bob after every signal.
    send_ok(&mut a, text("r1", "after", conv(cid), "after the signals")).await;
    let (last, before) = b1.until(|f| f["seq"] == 2).await;
    assert_eq!(last["payload"]["text"], "after the signals");
    let calls: Vec<&str> = before
        .iter()
        .map(|f| f["payload"]["callId"].as_str().unwrap_or("?"))
        .collect();
    let sent: Vec<String> = (0..100).step_by(3).map(|i| format!("call-{i}")).collect();
    assert_eq!(calls, sent);

    // A WebSocket ping is answered with its pong.
    assert!(a.ping_pong(b"are you there").await.is_empty());

    // Frames and then a close, together: every frame is answered before the close.
    let frames: Vec<Value> = (0..20)
        .map(|i| match i % 2 {
            0 => signal(format!("g{i}"), format!("last-{i}")),
            _ => json!({"type": "ping", "id": format!("g{i}")}),
        })
        .collect();
    a.send_together_and_close(&frames).await;
    for i in 0..20 {
        let f = a
            .next()
            .await
            .unwrap_or_else(|| panic!("closed before answer {i}"));
        assert_eq!(f["id"], format!("g{i}"), "answer {i}: {f}");
    }
    assert_eq!(
        a.next().await,
        None,
        "the close is answered after the frames"
    );
}

async fn overview_entry(s: &Server, u: &User, cid: i64) -> Value {
    s.get(u, &format!("/v1/conversations/{cid}")).await
}

async fn unread_counts_reads_and_recalls(b: Backend) {
    let (_db, s) = setup(&b, "unread", FAST).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut a = s.connect(&alice, "phone").await;
    let mut b1 = s.connect(&bob, "phone").await;
    let mut b2 = s.connect(&bob, "laptop").await;
    let mut cid = 0;
    for i in 1..=3 {
        cid = send_ok(
            &mut a,
            text(&format!("r{i}"), &format!("u{i}"), peer("bob"), "x"),
        )
        .await["conversationId"]
            .as_i64()
            .unwrap();
    }
    let e = overview_entry(&s, &bob, cid).await;
    assert_eq!(
        (
            e["unread"].as_i64(),
            e["readSeq"].as_i64(),
            e["lastSeq"].as_i64()
        ),
        (Some(3), Some(0), Some(3))
    );
    assert_eq!(e["peerId"], "alice");
    // Own messages never count.
    assert_eq!(overview_entry(&s, &alice, cid).await["unread"], 0);

    // Reading on one device: acked, pushed to the other device and to the peer.
    b1.drain(Duration::from_millis(200)).await;
    b2.drain(Duration::from_millis(200)).await;
    a.drain(Duration::from_millis(200)).await;
    b1.send(json!({"type": "read", "id": "rd", "conversationId": cid, "seq": 2}))
        .await;
    let (ack, _) = b1.until(|f| f["id"] == "rd").await;
    assert_eq!(
        (
            ack["readSeq"].as_i64(),
            ack["moved"].as_bool(),
            ack["unread"].as_i64()
        ),
        (Some(2), Some(true), Some(1))
    );
    let other = b2.expect("read").await;
    assert_eq!(
        (
            other["readSeq"].as_i64(),
            other["unread"].as_i64(),
            other["userId"].as_str()
        ),
        (Some(2), Some(1), Some("bob"))
    );
    let receipt = a.expect("read").await;
    assert_eq!(
        (receipt["readSeq"].as_i64(), receipt["userId"].as_str()),
        (Some(2), Some("bob"))
    );
    assert!(receipt.get("unread").is_none());
    let pos = s
        .get(&alice, &format!("/v1/conversations/{cid}/read-positions"))
        .await;
    assert_eq!(
        pos["positions"],
        json!([{"userId": "bob", "readSeq": 2, "deliveredSeq": 2}])
    );

    // A lower read position is ignored and says so.
    b2.send(json!({"type": "read", "id": "back", "conversationId": cid, "seq": 1}))
        .await;
    let (ack, _) = b2.until(|f| f["id"] == "back").await;
    assert_eq!(
        (ack["readSeq"].as_i64(), ack["moved"].as_bool()),
        (Some(2), Some(false))
    );
    assert_eq!(overview_entry(&s, &bob, cid).await["readSeq"], 2);
    // Beyond the end is the end.
    let (st, r) = s
        .http(
            "POST",
            &format!("/v1/conversations/{cid}/read"),
            Some(&bob.token),
            Some(json!({"seq": 99})),
        )
        .await;
    assert_eq!(
        (st, r["readSeq"].as_i64(), r["unread"].as_i64()),
        (200, Some(3), Some(0))
    );

    // Recalling an unread message stops it counting; the recall itself never counts.
    let m4 = send_ok(&mut a, text("r4", "u4", conv(cid), "four")).await["seq"]
        .as_i64()
        .unwrap();
    send_ok(&mut a, text("r5", "u5", conv(cid), "five")).await;
    assert_eq!(overview_entry(&s, &bob, cid).await["unread"], 2);
    let recall = json!({"type": "send", "id": "rc", "clientMsgId": "rc-1", "conversationType": 1,
        "conversationId": cid, "contentType": 4, "payload": {"seq": m4}});
    let ack = send_ok(&mut a, recall).await;
    assert_eq!(ack["seq"], 6);
    let e = overview_entry(&s, &bob, cid).await;
    assert_eq!(
        (e["unread"].as_i64(), e["lastSeq"].as_i64()),
        (Some(1), Some(6))
    );
    assert_eq!(e["lastMessage"]["contentType"], 4);
    // Sending moves the sender's own read position: both of bob's devices agree.
    let ack = send_ok(&mut b2, text("r6", "u6", conv(cid), "seen")).await;
    assert_eq!(ack["seq"], 7);
    let e = overview_entry(&s, &bob, cid).await;
    assert_eq!(
        (e["unread"].as_i64(), e["readSeq"].as_i64()),
        (Some(0), Some(7))
    );
    assert_eq!(overview_entry(&s, &alice, cid).await["unread"], 1);
}

async fn recall_rules(b: Backend) {
    let (_db, s) = setup(&b, "recall", "[messaging]\nrecall_window_secs = 2\n").await;
    let alice = s.user("alice").await;
    s.user("bob").await;
    let bob = User {
        id: "bob".into(),
        token: courier::auth::Tokens::new(JWT_SECRET.as_bytes(), 60)
            .issue("bob")
            .0,
    };
    let mut a = s.connect(&alice, "phone").await;
    let mut bw = s.connect(&bob, "phone").await;
    let cid = send_ok(&mut a, text("r1", "q1", peer("bob"), "mine")).await["conversationId"]
        .as_i64()
        .unwrap();
    let bobs = send_ok(&mut bw, text("r2", "q2", conv(cid), "his")).await["seq"]
        .as_i64()
        .unwrap();
    let recall = |id: &str, seq: i64| {
        json!({"type": "send", "id": id, "clientMsgId": id, "conversationType": 1,
            "conversationId": cid, "contentType": 4, "payload": {"seq": seq}})
    };
    assert_eq!(
        send_err(&mut a, recall("x1", bobs)).await["code"],
        "recall_not_own_message"
    );
    assert_eq!(
        send_err(&mut a, recall("x2", 99)).await["code"],
        "message_not_found"
    );
    let ev = send_ok(&mut a, recall("x3", 1)).await["seq"]
        .as_i64()
        .unwrap();
    // The peer sees the recall event as a push.
    let (n, _) = bw.until(|f| f["contentType"] == 4).await;
    assert_eq!(n["payload"]["seq"], 1);
    assert_eq!(
        send_err(&mut a, recall("x4", 1)).await["code"],
        "already_recalled"
    );
    assert_eq!(
        send_err(&mut a, recall("x5", ev)).await["code"],
        "message_not_recallable"
    );
    // A resend of the recalled message acks the original and does not bring it back.
    bw.drain(Duration::from_millis(200)).await;
    let again = send_ok(&mut a, text("r1-again", "q1", conv(cid), "mine")).await;
    assert_eq!(
        (again["duplicate"].as_bool(), again["seq"].as_i64()),
        (Some(true), Some(1))
    );
    assert!(
        bw.drain(Duration::from_millis(300))
            .await
            .iter()
            .all(|f| f["payload"]["text"] != "mine")
    );
    let pulled = s.pull_all(&bob, cid).await;
    assert_eq!(pulled[0]["payload"], Value::Null);
    assert_eq!(pulled[0]["recalledBy"], ev);
    assert_eq!(pulled[1]["payload"]["text"], "his");
    let late = send_ok(&mut a, text("r3", "q3", conv(cid), "late")).await["seq"]
        .as_i64()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert_eq!(
        send_err(&mut a, recall("x6", late)).await["code"],
        "recall_window_expired"
    );
}

async fn bad_input_gets_documented_codes(b: Backend) {
    let extra = "[gateway]\nmax_frame_bytes = 4096\nsend_rate_per_sec = 1\nsend_burst = 40\n\
                 [plugins.image]\nenabled = false\n";
    let (_db, s) = setup(&b, "bad-input", extra).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let mut a = s.connect(&alice, "phone").await;
    let mut c = s.connect(&carol, "phone").await;
    let cid = send_ok(&mut a, text("r0", "b0", peer("bob"), "hi")).await["conversationId"]
        .as_i64()
        .unwrap();

    // Each error comes back with the request id where it could be read, and the
    // connection stays usable.
    let cases: Vec<(String, Option<&str>, &str)> = vec![
        ("{not json".into(), None, "bad_frame"),
        ("[1,2]".into(), None, "bad_frame"),
        // A frame is an object, not an array of a frame's fields.
        (r#"["ping","p"]"#.into(), None, "bad_frame"),
        (json!({"id": "n1"}).to_string(), Some("n1"), "bad_frame"),
        (json!({"type": 5, "id": "n2"}).to_string(), Some("n2"), "bad_frame"),
        (json!({"type": ["send"], "id": "n3"}).to_string(), Some("n3"), "bad_frame"),
        (json!({"type": "subscribe", "id": "u1"}).to_string(), Some("u1"), "unknown_frame_type"),
        (json!({"type": "send", "id": "s1", "conversationType": 1}).to_string(), Some("s1"), "bad_frame"),
        ("x".repeat(5000), None, "frame_too_large"),
        (text("s2", "b2", conv(cid), "").to_string(), Some("s2"), "payload_invalid"),
        (json!({"type": "send", "id": "s3", "clientMsgId": "b3", "conversationType": 1, "conversationId": cid,
            "contentType": 2, "payload": {"url": "https://x/y.png", "width": 1, "height": 1}}).to_string(), Some("s3"), "content_type_disabled"),
        (json!({"type": "send", "id": "s4", "clientMsgId": "b4", "conversationType": 1, "conversationId": cid,
            "contentType": 4242, "payload": {}}).to_string(), Some("s4"), "content_type_unknown"),
        (json!({"type": "send", "id": "s5", "clientMsgId": "b5", "conversationType": 1, "conversationId": cid,
            "contentType": 8, "payload": {"userId": "bob"}}).to_string(), Some("s5"), "content_type_forbidden"),
        (json!({"type": "send", "id": "s6", "clientMsgId": "b6", "conversationType": 0, "conversationId": cid,
            "contentType": 1, "payload": {"text": "x"}}).to_string(), Some("s6"), "conversation_type_not_allowed"),
        (text("s7", "b7", peer("nobody"), "x").to_string(), Some("s7"), "user_not_found"),
        (text("s8", "b8", peer("alice"), "me").to_string(), Some("s8"), "bad_request"),
        (text("s9", "", conv(cid), "x").to_string(), Some("s9"), "bad_request"),
        // A send that is whole but for its id: the id is not echoed.
        (text(&"i".repeat(65), "b11", conv(cid), "x").to_string(), None, "bad_frame"),
        (json!({"type": "send", "id": 7, "clientMsgId": "b12", "conversationType": 1, "conversationId": cid,
            "contentType": 1, "payload": {"text": "x"}}).to_string(), None, "bad_frame"),
    ];
    for (frame, id, code) in &cases {
        a.send_text(frame).await;
        let err = a.expect("error").await;
        assert_eq!(
            (err["code"].as_str(), err["id"].as_str()),
            (Some(*code), *id),
            "{frame:.80}: {err}"
        );
        assert!(!err["message"].as_str().unwrap().is_empty());
    }
    let invalid = {
        a.send(text("s10", "b10", conv(cid), "")).await;
        a.expect("error").await
    };
    assert!(
        invalid["reason"].is_string(),
        "payload_invalid carries the plugin's reason: {invalid}"
    );
    // A value of the wrong kind where a kind reads one of a few names (`typing`'s state)
    // is a wrong field, not broken JSON; so is a payload that is not an object, though it
    // holds the fields a kind reads, in order (docs/protocol.md).
    for (kind, payload) in [
        (5, json!({"state": null})),
        (5, json!({"state": 7})),
        (5, json!(["typing"])),
        (1, json!(["hi"])),
    ] {
        a.send(
            json!({"type": "send", "id": "s13", "clientMsgId": "b13", "conversationType": 1,
            "conversationId": cid, "contentType": kind, "payload": payload}),
        )
        .await;
        let wrong = a.expect("error").await;
        assert_eq!(
            (wrong["code"].as_str(), wrong["reason"].as_str()),
            (Some("payload_invalid"), Some("invalid_field")),
            "{payload}: {wrong}"
        );
    }
    a.send(json!({"type": "ping", "id": "p"})).await;
    assert_eq!(a.expect("pong").await["id"], "p");

    // Someone else's conversation: no sending, no reading, no pulling.
    assert_eq!(
        send_err(&mut c, text("c1", "c1", conv(cid), "hi")).await["code"],
        "not_a_member"
    );
    c.send(json!({"type": "read", "id": "c2", "conversationId": cid, "seq": 1}))
        .await;
    assert_eq!(c.expect("error").await["code"], "not_a_member");
    for path in [
        format!("/v1/conversations/{cid}/messages"),
        format!("/v1/conversations/{cid}"),
        format!("/v1/conversations/{cid}/read-positions"),
    ] {
        s.expect_error("GET", &path, Some(&carol.token), None, 403, "not_a_member")
            .await;
    }
    assert_eq!(
        send_err(&mut c, text("c3", "c3", conv(987654), "hi")).await["code"],
        "not_a_member"
    );
    // A type that does not match the conversation's.
    let group_text = json!({"type": "send", "id": "g1", "clientMsgId": "g1", "conversationType": 2,
        "conversationId": cid, "contentType": 1, "payload": {"text": "x"}});
    assert_eq!(
        send_err(&mut a, group_text).await["code"],
        "conversation_type_mismatch"
    );
    // Nothing of it was stored.
    assert_eq!(s.pull_all(&bob, cid).await.len(), 1);

    // Bad tokens never upgrade.
    assert_eq!(Ws::connect(&s.addr, "nonsense", "d").await.err(), Some(401));
    let forged = courier::auth::Tokens::new(b"some-other-key-some-other-key-0123", 60)
        .issue("alice")
        .0;
    assert_eq!(Ws::connect(&s.addr, &forged, "d").await.err(), Some(401));
    assert_eq!(
        Ws::connect(&s.addr, &alice.token, "bad*device").await.err(),
        Some(400)
    );
    s.expect_error(
        "GET",
        "/v1/conversations",
        Some("nonsense"),
        None,
        401,
        "unauthorized",
    )
    .await;

    // The send rate: a burst of 40, then 1 per second (per connection).
    let mut fresh = s.connect(&alice, "rate").await;
    let mut limited = 0;
    for i in 0..45 {
        fresh
            .send(text(&format!("rl{i}"), &format!("rl{i}"), conv(cid), "r"))
            .await;
    }
    for _ in 0..45 {
        let f = fresh.next().await.unwrap();
        if f["type"] == "error" {
            assert_eq!(f["code"], "rate_limited");
            limited += 1;
        }
    }
    assert!((4..=5).contains(&limited), "{limited} of 45 limited");

    // Over HTTP a user's sends, all its tokens together, have one connection's rate (a
    // burst of 40, then 1 a second); a refused one is not stored. Sent at once: each
    // second they take lets one more through.
    let started = std::time::Instant::now();
    let answers = futures_util::future::join_all((0..45).map(|i| {
        let send = json!({"clientMsgId": format!("http-rl{i}"), "conversationType": 1,
            "conversationId": cid, "contentType": 1, "payload": {"text": "over http"}});
        s.http("POST", "/v1/messages", Some(&alice.token), Some(send))
    }))
    .await;
    let took = started.elapsed().as_secs() as usize;
    let mut refused = 0;
    for (status, answer) in answers {
        if status == 429 {
            assert_eq!(answer["error"]["code"], "rate_limited", "{answer}");
            refused += 1;
        } else {
            assert_eq!(status, 200, "{answer}");
        }
    }
    assert!(
        (4_usize.saturating_sub(took)..=5).contains(&refused),
        "{refused} of 45 refused in {took} s"
    );
    let stored = s
        .pull_all(&alice, cid)
        .await
        .iter()
        .filter(|m| m["payload"]["text"] == "over http")
        .count();
    assert_eq!(stored, 45 - refused);

    // A frame far above the limit closes the connection (1009), and nothing else.
    a.send_text(&"y".repeat(20_000)).await;
    assert_eq!(a.closed().await.0, Some(1009));
    let mut again = s.connect(&alice, "phone").await;
    again.send(json!({"type": "ping"})).await;
    again.expect("pong").await;
}

async fn accounts_and_tokens(b: Backend) {
    let (_db, s) = setup(&b, "accounts", "").await;
    s.user("alice").await;
    s.expect_errors(&[
        (
            None,
            "POST",
            "/v1/auth/register",
            Some(json!({"userId": "alice", "password": "another-password"})),
            409,
            "user_exists",
        ),
        (
            None,
            "POST",
            "/v1/auth/register",
            Some(json!({"userId": "x", "password": "short"})),
            400,
            "bad_request",
        ),
        (
            None,
            "POST",
            "/v1/auth/register",
            Some(json!({"userId": "..", "password": "long-enough-password"})),
            400,
            "bad_request",
        ),
        (
            None,
            "POST",
            "/v1/auth/login",
            Some(json!({"userId": "alice", "password": "wrong-password"})),
            401,
            "invalid_credentials",
        ),
        (
            None,
            "POST",
            "/v1/auth/login",
            Some(json!({"userId": "nobody", "password": "wrong-password"})),
            401,
            "invalid_credentials",
        ),
    ])
    .await;
    let (st, body) = s
        .http(
            "POST",
            "/v1/auth/login",
            None,
            Some(json!({"userId": "alice", "password": "password-of-"})),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let alice = User {
        id: "alice".into(),
        token: body["token"].as_str().unwrap().into(),
    };
    assert!(body["expiresAt"].as_i64().unwrap() > 0);

    // A token the deployer's backend signed with the shared key: the user becomes known
    // and can be messaged.
    let dave = User {
        id: "dave".into(),
        token: courier::auth::Tokens::new(JWT_SECRET.as_bytes(), 60)
            .issue("dave")
            .0,
    };
    let mut d = s.connect(&dave, "web").await;
    let mut a = s.connect(&alice, "web").await;
    send_ok(&mut a, text("r1", "t1", peer("dave"), "hello dave")).await;
    assert_eq!(d.expect("notify").await["payload"]["text"], "hello dave");
    // The token as a header works too, and every endpoint but health and auth needs one.
    let (st, _) = s
        .http("GET", "/v1/conversations", Some(&dave.token), None)
        .await;
    assert_eq!(st, 200);
    for (m, p) in [
        ("GET", "/v1/conversations"),
        ("GET", "/v1/plugins"),
        ("POST", "/v1/messages"),
        ("GET", "/v1/conversations/1/messages"),
    ] {
        s.expect_error(m, p, None, None, 401, "unauthorized").await;
    }
    let (st, _) = s.http("GET", "/healthz", None, None).await;
    assert_eq!(st, 200);
}

async fn both_first_messages_at_once_make_one_private_conversation(b: Backend) {
    let (_db, s) = setup(&b, "pairs", FAST).await;
    let mut users = Vec::new();
    for i in 0..6 {
        users.push(s.user(&format!("u{i}")).await);
    }
    let mut conns = Vec::new();
    for u in &users {
        conns.push(s.connect(u, "d").await);
    }
    // Every pair writes to each other at the same instant.
    for (i, ws) in conns.iter_mut().enumerate() {
        for j in 0..users.len() {
            if i != j {
                ws.send(text(
                    &format!("to{j}"),
                    &format!("hi-{i}-{j}"),
                    peer(&format!("u{j}")),
                    "hi",
                ))
                .await;
            }
        }
    }
    let mut ids: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    for (i, ws) in conns.iter_mut().enumerate() {
        let mut acks = 0;
        while acks < users.len() - 1 {
            let f = ws.next().await.unwrap();
            if f["type"] == "ack" {
                acks += 1;
                let j: usize = f["id"].as_str().unwrap()[2..].parse().unwrap();
                let id = f["conversationId"].as_i64().unwrap();
                if let Some(old) = ids.insert((i.min(j), i.max(j)), id) {
                    assert_eq!(old, id, "two conversations for {i},{j}");
                }
            }
        }
    }
    assert_eq!(ids.len(), 15);
    let distinct: BTreeSet<i64> = ids.values().copied().collect();
    assert_eq!(distinct.len(), 15);
    for u in &users {
        let list = s.get(u, "/v1/conversations").await;
        assert_eq!(list["conversations"].as_array().unwrap().len(), 5);
        for c in list["conversations"].as_array().unwrap() {
            assert_eq!(c["lastSeq"], 2);
        }
    }
}

/// A restarted server knows none of the conversations it routed before. A device that
/// then writes to its peers by `peerId` and by `conversationId` in turn, every frame at
/// once, gets each message stored in the order it sent them (on PostgreSQL the two ways
/// of naming a conversation must reach the same committer).
async fn after_a_restart_sends_by_peer_and_by_conversation_keep_their_order(b: Backend) {
    let (_db, mut s) = setup(&b, "reroute", FAST).await;
    let alice = s.user("alice").await;
    let peers: Vec<String> = (0..8).map(|k| format!("p{k}")).collect();
    for p in &peers {
        s.user(p).await;
    }
    let mut a = s.connect(&alice, "phone").await;
    let mut ids = HashMap::new();
    for p in &peers {
        let ack = send_ok(
            &mut a,
            text(&format!("o-{p}"), &format!("o-{p}"), peer(p), "0"),
        )
        .await;
        ids.insert(p.clone(), ack["conversationId"].as_i64().unwrap());
    }
    drop(a);
    s.restart();
    let mut a = s.connect(&alice, "phone").await;
    const ROUNDS: usize = 12;
    for r in 1..=ROUNDS {
        for p in &peers {
            let to = match r % 2 {
                0 => conv(ids[p]),
                _ => peer(p),
            };
            let id = format!("{p}-{r}");
            a.send(text(&id, &id, to, &r.to_string())).await;
        }
    }
    let mut seqs: HashMap<String, Vec<(usize, i64)>> = HashMap::new();
    for _ in 0..ROUNDS * peers.len() {
        let (ack, _) = a
            .until(|f| f["type"] == "ack" || f["type"] == "error")
            .await;
        assert_eq!(ack["type"], "ack", "{ack}");
        let (p, r) = ack["id"].as_str().unwrap().split_once('-').unwrap();
        assert_eq!(ack["conversationId"].as_i64(), Some(ids[p]), "{ack}");
        let entry = seqs.entry(p.to_string()).or_default();
        entry.push((r.parse().unwrap(), ack["seq"].as_i64().unwrap()));
    }
    for p in &peers {
        let mut got = seqs.remove(p).unwrap();
        got.sort();
        let expected: Vec<(usize, i64)> = (1..=ROUNDS).map(|r| (r, r as i64 + 1)).collect();
        assert_eq!(
            got, expected,
            "seqs of the messages to {p}, in the order sent"
        );
        let texts: Vec<String> = s
            .pull_all(&alice, ids[p])
            .await
            .iter()
            .map(|m| m["payload"]["text"].as_str().unwrap().to_string())
            .collect();
        let sent: Vec<String> = (0..=ROUNDS).map(|r| r.to_string()).collect();
        assert_eq!(texts, sent, "what {p}'s conversation holds");
    }
}

/// A device writes first messages to a new peer by `peerId`, many at once, and as soon as
/// the first ack tells it the conversation's id, more by `conversationId` while the first
/// ones may still be in flight (batches of four ops, so they commit a few at a time): the
/// conversation holds them in the order sent. On PostgreSQL a private conversation goes
/// to its pair's committer however it is named; eight peers in turn, so that some
/// conversations' ids and pairs would fall to different committers.
async fn a_new_conversation_named_by_peer_then_by_id_keeps_the_order_sent(b: Backend) {
    let db = Db::new(&b, "new-reroute").await;
    let s = Server::start_with(&db, "batch_max = 4", FAST).await;
    let alice = s.user("alice").await;
    let mut a = s.connect(&alice, "phone").await;
    const BY_PEER: usize = 40;
    const BY_ID: usize = 10;
    for k in 0..8 {
        let p = format!("q{k}");
        s.user(&p).await;
        for r in 0..BY_PEER {
            let id = format!("{p}-{r}");
            a.send(text(&id, &id, peer(&p), &r.to_string())).await;
        }
        let mut conversation = None;
        let mut seqs: Vec<(usize, i64)> = Vec::new();
        for _ in 0..BY_PEER + BY_ID {
            let (ack, _) = a
                .until(|f| f["type"] == "ack" || f["type"] == "error")
                .await;
            assert_eq!(ack["type"], "ack", "{ack}");
            let id = ack["conversationId"].as_i64().unwrap();
            if conversation.is_none() {
                conversation = Some(id);
                for r in BY_PEER..BY_PEER + BY_ID {
                    let fid = format!("{p}-{r}");
                    a.send(text(&fid, &fid, conv(id), &r.to_string())).await;
                }
            }
            assert_eq!(Some(id), conversation, "{ack}");
            let (_, r) = ack["id"].as_str().unwrap().split_once('-').unwrap();
            seqs.push((r.parse().unwrap(), ack["seq"].as_i64().unwrap()));
        }
        seqs.sort();
        let expected: Vec<(usize, i64)> = (0..BY_PEER + BY_ID).map(|r| (r, r as i64 + 1)).collect();
        assert_eq!(
            seqs, expected,
            "seqs of the messages to {p}, in the order sent"
        );
        let texts: Vec<String> = s
            .pull_all(&alice, conversation.unwrap())
            .await
            .iter()
            .map(|m| m["payload"]["text"].as_str().unwrap().to_string())
            .collect();
        let sent: Vec<String> = (0..BY_PEER + BY_ID).map(|r| r.to_string()).collect();
        assert_eq!(texts, sent, "what {p}'s conversation holds");
    }
}

async fn a_silent_device_is_dropped_and_a_pinging_one_stays(b: Backend) {
    let extra = "[gateway]\nheartbeat_secs = 2\n";
    let (_db, s) = setup(&b, "heartbeat", extra).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    // A silent device is dropped; one that pings stays.
    let mut silent = s.connect(&bob, "silent").await;
    let mut pinger = s.connect(&alice, "pinger").await;
    let started = std::time::Instant::now();
    let pinging = tokio::spawn(async move {
        for _ in 0..8 {
            pinger.send(json!({"type": "ping"})).await;
            pinger.expect("pong").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        pinger
    });
    assert_eq!(silent.closed().await.0, Some(4000));
    assert!(started.elapsed() >= Duration::from_millis(1500));
    let mut pinger = pinging.await.unwrap();
    pinger.send(json!({"type": "ping"})).await;
    pinger.expect("pong").await;
}

async fn a_slow_reader_is_disconnected_and_pulls_afterwards(b: Backend) {
    let extra =
        "[gateway]\noutbox_frames = 16\nsend_rate_per_sec = 1000000\nsend_burst = 1000000\n";
    let (_db, s) = setup(&b, "slow-reader", extra).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut pinger = s.connect(&alice, "sender").await;
    // A reader that stops reading is disconnected once its queue overflows, and pulls
    // everything after reconnecting.
    let mut stuck = s.connect(&bob, "stuck").await;
    // 3990 four-byte characters: within text's 4000 characters and 16 KiB.
    let big = "😀".repeat(3990);
    let cid = send_ok(
        &mut pinger,
        text("first", "slow-first", peer("bob"), "first"),
    )
    .await["conversationId"]
        .as_i64()
        .unwrap();
    // Rounds of 100 pipelined sends until the server reports the slow reader (kernel
    // buffers on loopback hold a few MB first).
    for round in 0..40 {
        let frames: Vec<Value> = (0..100)
            .map(|i| {
                text(
                    &format!("{round}-{i}"),
                    &format!("slow-{round}-{i}"),
                    conv(cid),
                    &big,
                )
            })
            .collect();
        let answers = pinger.send_all(&frames, 100).await;
        assert!(
            answers.values().all(|a| a["type"] == "ack"),
            "{:?}",
            answers.values().find(|a| a["type"] != "ack")
        );
        if s.log().contains("slow consumers") {
            break;
        }
    }
    let (code, _) = stuck.closed().await;
    assert_eq!(
        code,
        Some(4008),
        "the slow reader is closed as slow_consumer"
    );
    let pulled = s.pull_all(&bob, cid).await;
    assert!(
        pulled.len() >= 100
            && pulled
                .iter()
                .enumerate()
                .all(|(i, m)| m["seq"] == i as i64 + 1)
    );
}

async fn http_send_and_pull_paging(b: Backend) {
    let (_db, s) = setup(&b, "http-send", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut bw = s.connect(&bob, "phone").await;
    let body = |cmid: &str, to: Value| {
        let mut v = json!({"clientMsgId": cmid, "conversationType": 1, "contentType": 1, "payload": {"text": cmid}});
        v.as_object_mut()
            .unwrap()
            .extend(to.as_object().unwrap().clone());
        v
    };
    let (st, ack) = s
        .http(
            "POST",
            "/v1/messages",
            Some(&alice.token),
            Some(body("h0", peer("bob"))),
        )
        .await;
    assert_eq!(
        (st, ack["seq"].as_i64(), ack["duplicate"].as_bool()),
        (200, Some(1), Some(false)),
        "{ack}"
    );
    let cid = ack["conversationId"].as_i64().unwrap();
    assert_eq!(bw.expect("notify").await["msgId"], ack["msgId"]);
    let (_, again) = s
        .http(
            "POST",
            "/v1/messages",
            Some(&alice.token),
            Some(body("h0", peer("bob"))),
        )
        .await;
    assert_eq!(
        (again["msgId"].clone(), again["duplicate"].as_bool()),
        (ack["msgId"].clone(), Some(true))
    );
    // The HTTP body is the frame without `type` and `id`; each is a field it does not
    // take, named. So is any field of an endpoint that takes no body, and anything but
    // JSON; nothing and `{}` are no body.
    for field in ["type", "id"] {
        let mut with = body("h-frame", conv(cid));
        with[field] = "send".into();
        let err = s
            .expect_error(
                "POST",
                "/v1/messages",
                Some(&alice.token),
                Some(with),
                400,
                "bad_request",
            )
            .await;
        let said = err["error"]["message"].as_str().unwrap();
        assert!(said.contains(&format!("`{field}`")), "{err}");
    }
    for (method, path, sent, named) in [
        ("PUT", "/v1/blocks/dora", r#"{"bogus":1}"#, Some("`bogus`")),
        ("POST", "/v1/auth/revoke-all", "garbage", None),
        ("POST", "/v1/auth/logout", "[1,2]", None),
        ("POST", "/v1/auth/logout", "[]", None),
        ("POST", "/v1/auth/logout", "null", None),
        (
            "POST",
            "/v1/messages",
            r#"["h-array",1,null,"bob",1,{"text":"an array"}]"#,
            None,
        ),
    ] {
        let (st, err) = s.http_raw(method, path, Some(&alice.token), sent).await;
        assert_eq!(
            (st, err["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{path}: {err}"
        );
        if let Some(named) = named {
            assert!(
                err["error"]["message"].as_str().unwrap().contains(named),
                "{err}"
            );
        }
    }
    s.user("dora").await;
    for (method, sent) in [("PUT", "{}"), ("DELETE", ""), ("PUT", "")] {
        let (st, got) = s
            .http_raw(method, "/v1/blocks/dora", Some(&alice.token), sent)
            .await;
        assert_eq!(st, 200, "{method} {sent:?}: {got}");
    }
    // The refused logout did not log out.
    s.get(&alice, "/v1/conversations").await;
    for i in 1..120 {
        let (st, _) = s
            .http(
                "POST",
                "/v1/messages",
                Some(&alice.token),
                Some(body(&format!("h{i}"), conv(cid))),
            )
            .await;
        assert_eq!(st, 200);
    }
    // Forwards: default page 100; backwards: default 50, newest last.
    let page = s
        .get(&bob, &format!("/v1/conversations/{cid}/messages"))
        .await;
    assert_eq!(
        (
            page["messages"].as_array().unwrap().len(),
            page["hasMore"].as_bool()
        ),
        (100, Some(true))
    );
    assert_eq!(page["lastSeq"], 120);
    let hist = s
        .get(
            &bob,
            &format!("/v1/conversations/{cid}/messages?beforeSeq=121"),
        )
        .await;
    let seqs: Vec<i64> = hist["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (71..=120).collect::<Vec<_>>());
    assert_eq!(hist["hasMore"], true);
    let hist = s
        .get(
            &bob,
            &format!("/v1/conversations/{cid}/messages?beforeSeq=5&limit=10"),
        )
        .await;
    assert_eq!(hist["messages"].as_array().unwrap().len(), 4);
    assert_eq!(hist["hasMore"], false);
    let big = s
        .get(
            &bob,
            &format!("/v1/conversations/{cid}/messages?afterSeq=0&limit=100000"),
        )
        .await;
    assert_eq!(big["messages"].as_array().unwrap().len(), 120);
    s.expect_error(
        "GET",
        &format!("/v1/conversations/{cid}/messages?afterSeq=1&beforeSeq=9"),
        Some(&bob.token),
        None,
        400,
        "bad_request",
    )
    .await;
    // Overview paging with a cursor.
    let carol = s.user("carol").await;
    for p in ["alice", "bob"] {
        let (st, _) = s
            .http(
                "POST",
                "/v1/messages",
                Some(&carol.token),
                Some(body(&format!("c-{p}"), peer(p))),
            )
            .await;
        assert_eq!(st, 200);
    }
    let first = s.get(&carol, "/v1/conversations?limit=1").await;
    assert_eq!(first["conversations"][0]["peerId"], "bob");
    let cursor = first["nextCursor"].as_str().unwrap();
    let second = s
        .get(
            &carol,
            &format!("/v1/conversations?limit=1&cursor={cursor}"),
        )
        .await;
    assert_eq!(second["conversations"][0]["peerId"], "alice");
    // The page that holds the last conversation says so: no request for an empty page.
    assert!(second["nextCursor"].is_null(), "{second}");
    // A live kind over HTTP.
    let (st, live) = s
        .http(
            "POST",
            "/v1/messages",
            Some(&alice.token),
            Some(json!({"clientMsgId": "l1", "conversationType": 1,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}})),
        )
        .await;
    assert_eq!(
        (st, live["live"].as_bool(), live["delivered"].as_u64()),
        (200, Some(true), Some(1)),
        "{live}"
    );
    let (st, e) = s
        .http_raw("POST", "/v1/messages", Some(&alice.token), "{oops")
        .await;
    assert_eq!(
        (st, e["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );
}

/// A pull, the overview and a conversation's entry write each payload as stored, in the
/// order its kind's plugin wrote the keys (as the push did), not parsed and printed again.
async fn a_pull_gives_each_payload_as_stored(b: Backend) {
    let (_db, s) = setup(&b, "pull-as-stored", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let body = json!({"clientMsgId": "f", "peerId": "bob", "conversationType": 1,
        "contentType": 3, "payload": {"size": 3, "mime": "Text/Plain", "name": " a.txt ",
            "url": "https://files.example/a"}});
    let ack = common::server::ok(&s, &alice, "POST", "/v1/messages", Some(body)).await;
    let cid = ack["conversationId"].as_i64().unwrap();
    let auth = format!("Bearer {}", bob.token);
    let stored = r#""payload":{"url":"https://files.example/a","name":"a.txt","mime":"text/plain","size":3}"#;
    // The overview's and the conversation's last message are the same bytes.
    for path in [
        format!("/v1/conversations/{cid}/messages?afterSeq=0"),
        "/v1/conversations".to_string(),
        format!("/v1/conversations/{cid}"),
    ] {
        let answer = common::server::request(
            &s.addr,
            "GET",
            &path,
            &[("Authorization", auth.as_str())],
            "",
        )
        .await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert!(answer.body.contains(stored), "{path}: {}", answer.body);
    }
}

/// A block and the blocked user's first message to the blocker at the same moment: the
/// message is stored (the block came after) or refused `blocked` — and then neither user
/// has a conversation, as when the block came first.
async fn a_first_message_refused_by_a_racing_block_makes_no_conversation(b: Backend) {
    let (_db, s) = setup(&b, "block-race", "").await;
    for round in 0..12 {
        let blocker = s.user(&format!("blocker{round}")).await;
        let sender = s.user(&format!("sender{round}")).await;
        let path = format!("/v1/blocks/{}", sender.id);
        let body = json!({"clientMsgId": "first", "peerId": blocker.id, "conversationType": 1,
            "contentType": 1, "payload": {"text": "hi"}});
        let (blocked, (status, answer)) = tokio::join!(
            s.http("PUT", &path, Some(&blocker.token), None),
            s.http("POST", "/v1/messages", Some(&sender.token), Some(body)),
        );
        assert_eq!(blocked.0, 200, "round {round}: {blocked:?}");
        let lists = [
            s.get(&blocker, "/v1/conversations").await,
            s.get(&sender, "/v1/conversations").await,
        ];
        let counts: Vec<usize> = lists
            .iter()
            .map(|l| l["conversations"].as_array().unwrap().len())
            .collect();
        match status {
            200 => assert_eq!(counts, [1, 1], "round {round}: {lists:?}"),
            _ => {
                assert_eq!(
                    answer["error"]["code"], "blocked",
                    "round {round}: {answer}"
                );
                assert_eq!(counts, [0, 0], "round {round}: {lists:?}");
            }
        }
    }
}
