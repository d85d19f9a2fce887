//! The user stream, friends and blocks end to end, as a client sees them: the real binary
//! on loopback, every test on SQLite and (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::server::{
    ADMIN_TOKEN, Backend, FAST, Server, User, Ws, call, conv, ok, peer, send_err, send_ok, setup,
    text,
};
use serde_json::{Value, json};

on_both!(
    friend_request_lifecycle,
    crossing_requests_become_friends,
    friend_errors,
    blocks_refuse_messages_and_requests,
    user_stream_paging_and_reset,
    concurrent_changes_replay_to_the_snapshots,
    a_block_refuses_accepting_a_request,
    a_reset_names_a_known_user,
    a_block_made_before_the_first_message_holds,
    a_block_and_a_first_message_at_once_agree,
    a_deletion_and_a_first_message_to_it_at_once_agree,
    a_deletion_and_the_account_s_own_changes_at_once_leave_nothing,
    many_deletions_at_once_are_each_answered,
    ids_with_dots_and_at_signs_are_users_everywhere,
);

/// The test servers' `server.admin_token` (see `common::server`).
const ADMIN: &str = "admin-token-0123456789";

/// `POST /v1/friends/requests`, expecting 200.
async fn request(s: &Server, from: &User, to: &str, message: Option<&str>) -> Value {
    let body = match message {
        Some(m) => json!({"userId": to, "message": m}),
        None => json!({ "userId": to }),
    };
    ok(s, from, "POST", "/v1/friends/requests", Some(body)).await
}

/// `POST /v1/friends/requests/{id}/{verb}`: status and body.
async fn decide(s: &Server, u: &User, id: &str, verb: &str) -> (u16, Value) {
    call(
        s,
        u,
        "POST",
        &format!("/v1/friends/requests/{id}/{verb}"),
        None,
    )
    .await
}

/// The stream's position: `(epoch, lastSeq)` from a `limit=0` pull.
async fn position(s: &Server, u: &User) -> (i64, i64) {
    let page = s.get(u, "/v1/user-stream?limit=0").await;
    assert_eq!(page["events"], json!([]), "{page}");
    (
        page["epoch"].as_i64().expect("epoch"),
        page["lastSeq"].as_i64().expect("lastSeq"),
    )
}

/// Every event after `after` in `epoch`, paging until `hasMore` is false.
async fn pull_stream(s: &Server, u: &User, epoch: i64, after: i64) -> Vec<Value> {
    let mut after = after;
    let mut all = Vec::new();
    for _ in 0..1000 {
        let page = s
            .get(
                u,
                &format!("/v1/user-stream?epoch={epoch}&afterSeq={after}&limit=100"),
            )
            .await;
        assert_eq!(page["epoch"], epoch, "{page}");
        let events = page["events"].as_array().expect("events").clone();
        if let Some(last) = events.last() {
            after = last["seq"].as_i64().unwrap();
        }
        all.extend(events);
        if !page["hasMore"].as_bool().expect("hasMore") {
            return all;
        }
    }
    panic!("the user stream of {} never ended", u.id);
}

/// The events after `after` in the stream's current epoch.
async fn events_after(s: &Server, u: &User, after: i64) -> Vec<Value> {
    let (epoch, _) = position(s, u).await;
    pull_stream(s, u, epoch, after).await
}

fn seqs(items: &[Value]) -> Vec<i64> {
    items.iter().map(|m| m["seq"].as_i64().unwrap()).collect()
}

/// The `(event, data)` pairs of some stream events.
fn kinds(events: &[Value]) -> Vec<(String, Value)> {
    events
        .iter()
        .map(|e| (e["event"].as_str().unwrap().to_string(), e["data"].clone()))
        .collect()
}

/// The user-stream notifies a device receives until every seq of `from..=last` has come,
/// then whatever else comes within a moment (so a duplicate would show).
async fn pushed_until(ws: &mut Ws, have: &[Value], from: i64, last: i64) -> Vec<Value> {
    let mut seen: BTreeSet<i64> = have.iter().map(|f| f["seq"].as_i64().unwrap()).collect();
    let mut got = Vec::new();
    for _ in 0..1000 {
        if (from..=last).all(|n| seen.contains(&n)) {
            for f in ws.drain(Duration::from_millis(300)).await {
                if f["type"] == "notify" && f["conversationType"] == 0 {
                    got.push(f);
                }
            }
            return got;
        }
        let f = ws.next().await.expect("closed while waiting for events");
        if f["type"] == "notify" && f["conversationType"] == 0 {
            seen.insert(f["seq"].as_i64().expect("seq of a pushed event"));
            got.push(f);
        }
    }
    panic!("pushed events up to {last} never came");
}

/// A pending friend request: `(requestId, fromUserId, toUserId, message)`.
type Req = (String, String, String, Option<String>);

/// The pending requests of one direction, as `(requestId, from, to, message)`.
async fn pending(s: &Server, u: &User, direction: &str) -> BTreeSet<Req> {
    let got = s
        .get(u, &format!("/v1/friends/requests?direction={direction}"))
        .await;
    got["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| {
            assert_eq!(r["state"], "pending", "{r}");
            (
                r["requestId"].as_str().unwrap().to_string(),
                r["fromUserId"].as_str().unwrap().to_string(),
                r["toUserId"].as_str().unwrap().to_string(),
                r["message"].as_str().map(str::to_string),
            )
        })
        .collect()
}

async fn friends(s: &Server, u: &User) -> Vec<String> {
    s.get(u, "/v1/friends").await["friends"]
        .as_array()
        .expect("friends")
        .iter()
        .map(|f| f["userId"].as_str().unwrap().to_string())
        .collect()
}

/// A user's entry for a private conversation with `peer` in the overview.
async fn private_with(s: &Server, u: &User, peer: &str) -> Option<Value> {
    s.get(u, "/v1/conversations?limit=200").await["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversationType"] == 1 && c["peerId"] == peer)
        .cloned()
}

/// Event data without its `message` (an outcome may or may not repeat it).
fn without_message(d: &Value) -> Value {
    let mut d = d.clone();
    if let Some(o) = d.as_object_mut() {
        o.remove("message");
    }
    d
}

fn fr(action: &str, id: &str, from: &str, to: &str, message: Option<&str>) -> Value {
    let mut d = json!({"action": action, "requestId": id, "fromUserId": from, "toUserId": to});
    if let Some(m) = message {
        d["message"] = json!(m);
    }
    d
}

async fn friend_request_lifecycle(b: Backend) {
    let (_db, s) = setup(&b, "friend-lifecycle", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    s.user("carol").await;
    let (epoch, start) = position(&s, &bob).await;
    assert_eq!(start, 0, "a new user's stream is empty");
    let (a_epoch, a_start) = position(&s, &alice).await;
    let mut bob_ws = s.connect(&bob, "phone").await;

    // A request with a message lands in both streams and is pushed live.
    let r = request(&s, &alice, "bob", Some("hi, it's Alice")).await;
    assert_eq!(r["state"], "pending", "{r}");
    let rid = r["requestId"].as_str().expect("requestId").to_string();
    let requested = fr("requested", &rid, "alice", "bob", Some("hi, it's Alice"));
    let ev = pull_stream(&s, &bob, epoch, 0).await;
    assert_eq!(seqs(&ev), vec![1]);
    assert_eq!(ev[0]["event"], "friend.request");
    assert_eq!(ev[0]["contentType"], 7);
    assert_eq!(ev[0]["data"], requested);
    assert!(ev[0]["serverTime"].as_i64().is_some(), "{}", ev[0]);
    let push = pushed_until(&mut bob_ws, &[], 1, 1).await;
    assert_eq!(push.len(), 1);
    assert_eq!(push[0]["type"], "notify");
    assert_eq!(push[0]["conversationType"], 0);
    assert_eq!(push[0]["epoch"], epoch);
    assert_eq!(push[0]["seq"], 1);
    assert_eq!(push[0]["event"], "friend.request");
    assert_eq!(push[0]["data"], requested);
    let a_ev = pull_stream(&s, &alice, a_epoch, a_start).await;
    assert_eq!(
        kinds(&a_ev),
        vec![("friend.request".into(), requested.clone())]
    );
    let bob_in = pending(&s, &bob, "in").await;
    let want: BTreeSet<_> = [(
        rid.clone(),
        "alice".to_string(),
        "bob".to_string(),
        Some("hi, it's Alice".to_string()),
    )]
    .into();
    assert_eq!(bob_in, want);
    // `in` is the default direction.
    let default = s.get(&bob, "/v1/friends/requests").await;
    assert_eq!(
        default["requests"].as_array().unwrap().len(),
        1,
        "{default}"
    );
    assert_eq!(pending(&s, &alice, "out").await, want);
    assert!(pending(&s, &alice, "in").await.is_empty());
    assert!(pending(&s, &bob, "out").await.is_empty());

    // Asking again updates the pending request: same id, new message, another event.
    let again = request(&s, &alice, "bob", Some("it's me again")).await;
    assert_eq!(
        (again["requestId"].as_str(), again["state"].as_str()),
        (Some(rid.as_str()), Some("pending"))
    );
    let ev = pull_stream(&s, &bob, epoch, 1).await;
    assert_eq!(
        kinds(&ev),
        vec![(
            "friend.request".into(),
            fr("requested", &rid, "alice", "bob", Some("it's me again"))
        )]
    );
    assert_eq!(ev[0]["seq"], 2);
    let bob_in = pending(&s, &bob, "in").await;
    assert_eq!(bob_in.len(), 1);
    assert_eq!(bob_in.first().unwrap().3.as_deref(), Some("it's me again"));

    // Reject: both streams, nothing pending, the request cannot be decided again.
    let (st, got) = decide(&s, &bob, &rid, "reject").await;
    assert_eq!(
        (st, &got),
        (200, &json!({"requestId": rid, "state": "rejected"}))
    );
    let ev = pull_stream(&s, &bob, epoch, 2).await;
    assert_eq!(seqs(&ev), vec![3]);
    assert_eq!(ev[0]["event"], "friend.request");
    assert_eq!(
        without_message(&ev[0]["data"]),
        fr("rejected", &rid, "alice", "bob", None)
    );
    let a_ev = pull_stream(&s, &alice, a_epoch, a_start).await;
    assert_eq!(
        a_ev.iter()
            .map(|e| e["data"]["action"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["requested", "requested", "rejected"]
    );
    assert!(pending(&s, &bob, "in").await.is_empty());
    assert!(pending(&s, &alice, "out").await.is_empty());
    for (who, verb) in [(&bob, "reject"), (&bob, "accept"), (&alice, "cancel")] {
        let (st, got) = decide(&s, who, &rid, verb).await;
        assert_eq!(
            (st, got["error"]["code"].as_str()),
            (409, Some("request_not_pending")),
            "{verb} a rejected request: {got}"
        );
    }

    // Cancel: the sender's verb.
    let r2 = request(&s, &alice, "bob", None).await;
    assert_eq!(r2["state"], "pending");
    let rid2 = r2["requestId"].as_str().unwrap().to_string();
    let (_, bob_last) = position(&s, &bob).await;
    let (st, got) = decide(&s, &alice, &rid2, "cancel").await;
    assert_eq!(
        (st, &got),
        (200, &json!({"requestId": rid2, "state": "cancelled"}))
    );
    let ev = pull_stream(&s, &bob, epoch, bob_last - 1).await;
    assert_eq!(
        kinds(&ev),
        vec![
            (
                "friend.request".into(),
                fr("requested", &rid2, "alice", "bob", None)
            ),
            (
                "friend.request".into(),
                fr("cancelled", &rid2, "alice", "bob", None)
            ),
        ]
    );
    assert!(pending(&s, &bob, "in").await.is_empty());
    assert!(pending(&s, &alice, "out").await.is_empty());
    let (st, got) = decide(&s, &bob, &rid2, "accept").await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (409, Some("request_not_pending"))
    );

    // Accept: friends, events in both streams, the tip in their private conversation.
    let r3 = request(&s, &alice, "bob", Some("third time")).await;
    let rid3 = r3["requestId"].as_str().unwrap().to_string();
    let (_, bob_before) = position(&s, &bob).await;
    let (_, alice_before) = position(&s, &alice).await;
    let (st, got) = decide(&s, &bob, &rid3, "accept").await;
    assert_eq!(
        (st, &got),
        (200, &json!({"requestId": rid3, "state": "accepted"}))
    );
    for (u, other, before) in [(&bob, "alice", bob_before), (&alice, "bob", alice_before)] {
        let ev = events_after(&s, u, before).await;
        assert_eq!(seqs(&ev), vec![before + 1, before + 2], "{} {ev:?}", u.id);
        let got: BTreeMap<String, Value> = kinds(&ev).into_iter().collect();
        assert_eq!(got["friend.request"]["action"], "accepted", "{ev:?}");
        assert_eq!(got["friend.request"]["requestId"], rid3.as_str());
        assert_eq!(got["friend.request"]["fromUserId"], "alice");
        assert_eq!(got["friend.request"]["toUserId"], "bob");
        assert_eq!(got["friend.added"], json!({ "userId": other }), "{}", u.id);
    }
    assert_eq!(friends(&s, &alice).await, vec!["bob"]);
    assert_eq!(friends(&s, &bob).await, vec!["alice"]);
    let listed = s.get(&bob, "/v1/friends").await;
    assert!(listed["friends"][0]["since"].as_i64().is_some(), "{listed}");
    assert!(pending(&s, &bob, "in").await.is_empty());
    assert!(pending(&s, &alice, "out").await.is_empty());
    for (u, other) in [(&alice, "bob"), (&bob, "alice")] {
        let c = private_with(&s, u, other)
            .await
            .unwrap_or_else(|| panic!("{} has no conversation with {other}", u.id));
        assert_eq!(
            (c["lastSeq"].as_i64(), c["unread"].as_i64()),
            (Some(1), Some(0)),
            "the tip does not count: {c}"
        );
        let cid = c["conversationId"].as_i64().unwrap();
        let msgs = s.pull_all(u, cid).await;
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert_eq!(msgs[0]["conversationType"], 1);
        assert_eq!(msgs[0]["contentType"], 7);
        assert_eq!(msgs[0]["payload"]["action"], "accepted");
        assert_eq!(msgs[0]["payload"]["requestId"], rid3.as_str());
        assert_eq!(msgs[0]["payload"]["fromUserId"], "alice");
        assert_eq!(msgs[0]["payload"]["toUserId"], "bob");
    }

    // Every event bob's stream holds was pushed to his device once, as pulled.
    let all = pull_stream(&s, &bob, epoch, 0).await;
    let last = *seqs(&all).last().unwrap();
    assert_eq!(seqs(&all), (1..=last).collect::<Vec<_>>());
    let mut pushed = push;
    pushed.extend(pushed_until(&mut bob_ws, &pushed.clone(), 1, last).await);
    let mut by_seq = BTreeMap::new();
    for p in &pushed {
        assert_eq!(p["epoch"], epoch, "{p}");
        assert!(
            by_seq
                .insert(p["seq"].as_i64().unwrap(), p.clone())
                .is_none(),
            "event pushed twice: {p}"
        );
    }
    assert_eq!(by_seq.keys().copied().collect::<Vec<_>>(), seqs(&all));
    for e in &all {
        let p = &by_seq[&e["seq"].as_i64().unwrap()];
        assert_eq!((&p["event"], &p["data"]), (&e["event"], &e["data"]));
    }

    // Removing the friendship: both streams, both lists; the history stays.
    let (_, bob_before) = position(&s, &bob).await;
    let (_, alice_before) = position(&s, &alice).await;
    let got = ok(&s, &alice, "DELETE", "/v1/friends/bob", None).await;
    assert_eq!(got, json!({"userId": "bob", "removed": true}));
    assert_eq!(
        kinds(&events_after(&s, &bob, bob_before).await),
        vec![(
            "friend.removed".into(),
            json!({"userId": "alice", "by": "alice"})
        )]
    );
    assert_eq!(
        kinds(&events_after(&s, &alice, alice_before).await),
        vec![(
            "friend.removed".into(),
            json!({"userId": "bob", "by": "alice"})
        )]
    );
    assert!(friends(&s, &alice).await.is_empty());
    assert!(friends(&s, &bob).await.is_empty());
    s.expect_errors(&[
        (
            Some(&alice.token),
            "DELETE",
            "/v1/friends/bob",
            None,
            404,
            "not_friends",
        ),
        (
            Some(&bob.token),
            "DELETE",
            "/v1/friends/alice",
            None,
            404,
            "not_friends",
        ),
        (
            Some(&bob.token),
            "DELETE",
            "/v1/friends/carol",
            None,
            404,
            "not_friends",
        ),
    ])
    .await;
    let c = private_with(&s, &bob, "alice")
        .await
        .expect("the conversation stays");
    assert_eq!(
        s.pull_all(&bob, c["conversationId"].as_i64().unwrap())
            .await
            .len(),
        1
    );
}

async fn crossing_requests_become_friends(b: Backend) {
    let (_db, s) = setup(&b, "friend-crossing", "").await;
    let alice = s.user("alice").await;
    let carol = s.user("carol").await;
    // They already talk: the tip goes into their one private conversation.
    let sent = ok(
        &s,
        &carol,
        "POST",
        "/v1/messages",
        Some(
            json!({"clientMsgId": "c-1", "conversationType": 1, "peerId": "alice",
                    "contentType": 1, "payload": {"text": "hello"}}),
        ),
    )
    .await;
    let cid = sent["conversationId"].as_i64().unwrap();
    let (_, a0) = position(&s, &alice).await;
    let (_, c0) = position(&s, &carol).await;

    let mine = request(&s, &alice, "carol", Some("from alice")).await;
    assert_eq!(mine["state"], "pending");
    let rid = mine["requestId"].as_str().unwrap().to_string();
    let crossed = request(&s, &carol, "alice", Some("from carol")).await;
    assert_eq!(
        crossed,
        json!({"requestId": rid, "state": "accepted"}),
        "a request to someone who asked you is their request accepted"
    );
    assert_eq!(friends(&s, &alice).await, vec!["carol"]);
    assert_eq!(friends(&s, &carol).await, vec!["alice"]);
    for u in [&alice, &carol] {
        assert!(pending(&s, u, "in").await.is_empty(), "{}", u.id);
        assert!(pending(&s, u, "out").await.is_empty(), "{}", u.id);
    }
    for (u, other, before) in [(&alice, "carol", a0), (&carol, "alice", c0)] {
        let ev = events_after(&s, u, before).await;
        assert_eq!(
            seqs(&ev),
            (before + 1..=before + ev.len() as i64).collect::<Vec<_>>()
        );
        let added: Vec<_> = ev.iter().filter(|e| e["event"] == "friend.added").collect();
        assert_eq!(added.len(), 1, "{} {ev:?}", u.id);
        assert_eq!(added[0]["data"], json!({ "userId": other }));
        let last_req = ev
            .iter()
            .rfind(|e| e["event"] == "friend.request")
            .expect("friend.request");
        assert_eq!(last_req["data"]["action"], "accepted");
        assert_eq!(last_req["data"]["requestId"], rid.as_str());
        assert_eq!(last_req["data"]["fromUserId"], "alice");
    }
    // The tip follows the text in the same conversation and does not count.
    let msgs = s.pull_all(&alice, cid).await;
    assert_eq!(seqs(&msgs), vec![1, 2]);
    assert_eq!(msgs[1]["contentType"], 7);
    assert_eq!(msgs[1]["payload"]["action"], "accepted");
    let c = private_with(&s, &alice, "carol").await.unwrap();
    assert_eq!(c["conversationId"], cid);
    assert_eq!(
        (c["lastSeq"].as_i64(), c["unread"].as_i64()),
        (Some(2), Some(1)),
        "{c}"
    );
    let c = private_with(&s, &carol, "alice").await.unwrap();
    assert_eq!(c["unread"], 0, "{c}");
    s.expect_error(
        "POST",
        "/v1/friends/requests",
        Some(&carol.token),
        Some(json!({"userId": "alice"})),
        409,
        "already_friends",
    )
    .await;
    s.expect_error(
        "POST",
        "/v1/friends/requests",
        Some(&alice.token),
        Some(json!({"userId": "carol", "message": "again?"})),
        409,
        "already_friends",
    )
    .await;
}

/// A user id may hold `.` and `@` (registration takes them): such a user is a user
/// everywhere another is, in friend requests, groups (created, added, made admin,
/// kicked) and mentions.
async fn ids_with_dots_and_at_signs_are_users_everywhere(b: Backend) {
    use common::groups::{create, id_of};
    let (_db, s) = setup(&b, "dotted-ids", "").await;
    let dot = s.user("dot.user").await;
    let mail = s.user("mail@example.com").await;
    s.user("x.y@z").await;

    let r = request(&s, &dot, "mail@example.com", None).await;
    let rid = r["requestId"].as_str().expect("requestId").to_string();
    let want: BTreeSet<_> = [(
        rid.clone(),
        "dot.user".to_string(),
        "mail@example.com".to_string(),
        Some(String::new()),
    )]
    .into();
    assert_eq!(pending(&s, &mail, "in").await, want);
    let (st, got) = decide(&s, &mail, &rid, "accept").await;
    assert_eq!(st, 200, "{got}");
    assert_eq!(
        friends(&s, &dot).await,
        vec!["mail@example.com".to_string()]
    );

    let info = create(
        &s,
        &dot,
        json!({"name": "Dots", "members": ["mail@example.com"]}),
    )
    .await;
    let cid = id_of(&info);
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let added = ok(
        &s,
        &dot,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["x.y@z"]})),
    )
    .await;
    assert_eq!(added["added"], json!(["x.y@z"]), "{added}");
    let admin = ok(&s, &dot, "PUT", &g("/admins/mail@example.com"), None).await;
    assert_eq!(
        admin,
        json!({"userId": "mail@example.com", "role": "admin"})
    );

    let mut ws = s.connect(&mail, "phone").await;
    let ack = send_ok(
        &mut ws,
        json!({"type": "send", "id": "m1", "clientMsgId": "mail-1", "conversationType": 2,
               "conversationId": cid, "contentType": 1,
               "payload": {"text": "hi both", "mentions": ["dot.user", "x.y@z"]}}),
    )
    .await;
    let seq = ack["seq"].as_i64().expect("seq");
    let page = s
        .get(
            &dot,
            &format!("/v1/conversations/{cid}/messages?afterSeq={}", seq - 1),
        )
        .await;
    assert_eq!(
        page["messages"][0]["payload"]["mentions"],
        json!(["dot.user", "x.y@z"]),
        "{page}"
    );

    let kicked = ok(
        &s,
        &dot,
        "POST",
        &g("/kick"),
        Some(json!({"userIds": ["x.y@z"]})),
    )
    .await;
    assert_eq!(kicked["kicked"], json!(["x.y@z"]), "{kicked}");
}

async fn friend_errors(b: Backend) {
    let (_db, s) = setup(&b, "friend-errors", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let rid = request(&s, &alice, "bob", None).await["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    // Not yours to decide: a third user, the sender accepting or rejecting, the recipient
    // cancelling; and an id that names nothing.
    for (who, verb) in [
        (&carol, "accept"),
        (&carol, "reject"),
        (&carol, "cancel"),
        (&alice, "accept"),
        (&alice, "reject"),
        (&bob, "cancel"),
    ] {
        let (st, got) = decide(&s, who, &rid, verb).await;
        assert_eq!(
            (st, got["error"]["code"].as_str()),
            (404, Some("request_not_found")),
            "{} {verb}: {got}",
            who.id
        );
    }
    for verb in ["accept", "reject", "cancel"] {
        let (st, got) = decide(&s, &bob, "385384229409652736", verb).await;
        assert_eq!(
            (st, got["error"]["code"].as_str()),
            (404, Some("request_not_found")),
            "{got}"
        );
    }
    // The request is untouched by all that.
    assert_eq!(pending(&s, &bob, "in").await.len(), 1);
    s.expect_errors(&[
        (
            Some(&alice.token),
            "POST",
            "/v1/friends/requests",
            Some(json!({"userId": "alice"})),
            400,
            "bad_request",
        ),
        (
            Some(&alice.token),
            "POST",
            "/v1/friends/requests",
            Some(json!({"userId": "nobody"})),
            404,
            "user_not_found",
        ),
        (
            Some(&alice.token),
            "DELETE",
            "/v1/friends/carol",
            None,
            404,
            "not_friends",
        ),
    ])
    .await;
    let (st, _) = decide(&s, &bob, &rid, "accept").await;
    assert_eq!(st, 200);
    s.expect_error(
        "POST",
        "/v1/friends/requests",
        Some(&bob.token),
        Some(json!({"userId": "alice"})),
        409,
        "already_friends",
    )
    .await;
    let (st, got) = decide(&s, &bob, &rid, "accept").await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (409, Some("request_not_pending"))
    );
    // Without a token nothing of this answers.
    for (m, p) in [
        ("GET", "/v1/friends"),
        ("GET", "/v1/blocks"),
        ("GET", "/v1/user-stream"),
        ("POST", "/v1/friends/requests"),
    ] {
        s.expect_error(m, p, None, None, 401, "unauthorized").await;
    }
}

async fn blocks_refuse_messages_and_requests(b: Backend) {
    let (_db, s) = setup(&b, "blocks", "").await;
    let alice = s.user("alice").await;
    let mallory = s.user("mallory").await;
    let bob = s.user("bob").await;
    let mut m_ws = s.connect(&mallory, "phone").await;
    let mut a_ws = s.connect(&alice, "phone").await;
    let first = send_ok(&mut m_ws, text("m0", "m-0", peer("alice"), "hi alice")).await;
    let cid = first["conversationId"].as_i64().unwrap();
    a_ws.expect("notify").await;
    // bob and alice are friends: a block does not end that.
    let rid = request(&s, &bob, "alice", None).await["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(decide(&s, &alice, &rid, "accept").await.0, 200);
    let (_, a0) = position(&s, &alice).await;
    let (_, m0) = position(&s, &mallory).await;

    let got = ok(&s, &alice, "PUT", "/v1/blocks/mallory", None).await;
    assert_eq!(got, json!({"userId": "mallory", "blocked": true}));
    let got = ok(&s, &alice, "PUT", "/v1/blocks/bob", None).await;
    assert_eq!(got, json!({"userId": "bob", "blocked": true}));
    assert_eq!(
        kinds(&events_after(&s, &alice, a0).await),
        vec![
            ("block.added".into(), json!({"userId": "mallory"})),
            ("block.added".into(), json!({"userId": "bob"})),
        ]
    );
    assert_eq!(
        position(&s, &mallory).await.1,
        m0,
        "the blocked is not told"
    );
    let blocks = s.get(&alice, "/v1/blocks").await;
    let listed: BTreeSet<&str> = blocks["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            assert!(b["since"].as_i64().is_some(), "{b}");
            b["userId"].as_str().unwrap()
        })
        .collect();
    assert_eq!(listed, ["bob", "mallory"].into());
    assert!(
        s.get(&mallory, "/v1/blocks").await["blocks"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        friends(&s, &alice).await,
        vec!["bob"],
        "blocking keeps the friendship"
    );
    // Blocking twice is harmless and says nothing.
    let (_, a1) = position(&s, &alice).await;
    let got = ok(&s, &alice, "PUT", "/v1/blocks/bob", None).await;
    assert_eq!(got, json!({"userId": "bob", "blocked": true}));
    assert_eq!(position(&s, &alice).await.1, a1);

    // Messages to the blocker are refused: HTTP and WebSocket, stored and live kinds.
    for to in [json!({"peerId": "alice"}), json!({ "conversationId": cid })] {
        let mut body = json!({"clientMsgId": format!("h-{}", fastrand::u32(..)),
            "conversationType": 1, "contentType": 1, "payload": {"text": "let me talk"}});
        body.as_object_mut()
            .unwrap()
            .extend(to.as_object().unwrap().clone());
        s.expect_error(
            "POST",
            "/v1/messages",
            Some(&mallory.token),
            Some(body),
            403,
            "blocked",
        )
        .await;
    }
    let e = send_err(&mut m_ws, text("m1", "m-1", peer("alice"), "hello?")).await;
    assert_eq!(e["code"], "blocked", "{e}");
    let e = send_err(&mut m_ws, text("m2", "m-2", conv(cid), "hello??")).await;
    assert_eq!(e["code"], "blocked", "{e}");
    let typing = json!({"type": "send", "id": "t1", "clientMsgId": "t-1", "conversationType": 1,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}});
    let e = send_err(&mut m_ws, typing).await;
    assert_eq!(e["code"], "blocked", "{e}");
    let typing = json!({"type": "send", "id": "t2", "clientMsgId": "t-2", "conversationType": 1,
        "peerId": "alice", "contentType": 5, "payload": {"state": "typing"}});
    let e = send_err(&mut m_ws, typing).await;
    assert_eq!(e["code"], "blocked", "{e}");
    let (st, got) = call(
        &s,
        &bob,
        "POST",
        "/v1/messages",
        Some(
            json!({"clientMsgId": "b-1", "conversationType": 1, "peerId": "alice",
                    "contentType": 1, "payload": {"text": "friend, blocked"}}),
        ),
    )
    .await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (403, Some("blocked")),
        "{got}"
    );
    let reached: Vec<Value> = a_ws
        .drain(Duration::from_millis(500))
        .await
        .into_iter()
        .filter(|f| f["type"] == "notify" && (f["contentType"] == 1 || f["contentType"] == 5))
        .collect();
    assert!(
        reached.is_empty(),
        "nothing of a blocked sender reaches the blocker: {reached:?}"
    );
    assert_eq!(seqs(&s.pull_all(&alice, cid).await), vec![1]);
    // The blocker may still talk to them.
    let ack = send_ok(&mut a_ws, text("a1", "a-1", conv(cid), "I can talk")).await;
    assert_eq!(ack["seq"], 2);
    let n = m_ws
        .until(|f| f["type"] == "notify" && f["conversationType"] == 1)
        .await
        .0;
    assert_eq!(n["payload"]["text"], "I can talk");

    // Friend requests either way are refused.
    for (from, to) in [(&mallory, "alice"), (&alice, "mallory")] {
        s.expect_error(
            "POST",
            "/v1/friends/requests",
            Some(&from.token),
            Some(json!({ "userId": to })),
            403,
            "blocked",
        )
        .await;
    }
    assert!(pending(&s, &alice, "in").await.is_empty());
    assert!(pending(&s, &mallory, "in").await.is_empty());

    // Unblocking restores both; unblocking twice is harmless.
    let (_, a2) = position(&s, &alice).await;
    let got = ok(&s, &alice, "DELETE", "/v1/blocks/mallory", None).await;
    assert_eq!(got, json!({"userId": "mallory", "blocked": false}));
    let got = ok(&s, &alice, "DELETE", "/v1/blocks/mallory", None).await;
    assert_eq!(got, json!({"userId": "mallory", "blocked": false}));
    assert_eq!(
        kinds(&events_after(&s, &alice, a2).await),
        vec![("block.removed".into(), json!({"userId": "mallory"}))]
    );
    let blocks = s.get(&alice, "/v1/blocks").await;
    let listed: Vec<&str> = blocks["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["userId"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec!["bob"]);
    let ack = send_ok(&mut m_ws, text("m3", "m-3", conv(cid), "thanks")).await;
    assert_eq!(ack["seq"], 3);
    let n = a_ws
        .until(|f| f["type"] == "notify" && f["conversationId"] == cid)
        .await
        .0;
    assert_eq!(n["payload"]["text"], "thanks");
    let r = request(&s, &mallory, "alice", Some("friends?")).await;
    assert_eq!(r["state"], "pending");
    // bob is still blocked.
    s.expect_error(
        "POST",
        "/v1/messages",
        Some(&bob.token),
        Some(
            json!({"clientMsgId": "b-2", "conversationType": 1, "peerId": "alice",
                    "contentType": 1, "payload": {"text": "still?"}}),
        ),
        403,
        "blocked",
    )
    .await;
}

async fn user_stream_paging_and_reset(b: Backend) {
    let (_db, s) = setup(&b, "stream-paging", "").await;
    let bob = s.user("bob").await;
    let mut others = Vec::new();
    for i in 0..6 {
        others.push(s.user(&format!("u{i}")).await);
    }
    // 6 requests, 3 accepted (2 events each) and 1 rejected: 6 + 6 + 1 = 13 events.
    let mut ids = Vec::new();
    for o in &others {
        ids.push(
            request(&s, o, "bob", Some(&format!("from {}", o.id))).await["requestId"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for id in &ids[..3] {
        assert_eq!(decide(&s, &bob, id, "accept").await.0, 200);
    }
    assert_eq!(decide(&s, &bob, &ids[3], "reject").await.0, 200);

    // limit=0 is only the position.
    let head = s.get(&bob, "/v1/user-stream?limit=0").await;
    let epoch = head["epoch"].as_i64().expect("epoch");
    assert_eq!(head["lastSeq"], 13, "{head}");
    assert_eq!(head["events"], json!([]));
    // Without epoch (no cursor yet) the same stream.
    let first = s.get(&bob, "/v1/user-stream").await;
    assert_eq!(first["epoch"], epoch);
    assert_eq!(
        seqs(first["events"].as_array().unwrap()),
        (1..=13).collect::<Vec<_>>()
    );
    assert_eq!(first["hasMore"], false);

    // Pages of 5: 1-5, 6-10, 11-13.
    let mut after = 0;
    let mut pages = Vec::new();
    for _ in 0..10 {
        let page = s
            .get(
                &bob,
                &format!("/v1/user-stream?epoch={epoch}&afterSeq={after}&limit=5"),
            )
            .await;
        assert_eq!(page["lastSeq"], 13);
        let got = seqs(page["events"].as_array().unwrap());
        after = *got.last().unwrap_or(&after);
        pages.push((got, page["hasMore"].as_bool().unwrap()));
        if !page["hasMore"].as_bool().unwrap() {
            break;
        }
    }
    assert_eq!(
        pages,
        vec![
            (vec![1, 2, 3, 4, 5], true),
            (vec![6, 7, 8, 9, 10], true),
            (vec![11, 12, 13], false)
        ]
    );
    let mid = s
        .get(
            &bob,
            &format!("/v1/user-stream?epoch={epoch}&afterSeq=9&limit=2"),
        )
        .await;
    assert_eq!(seqs(mid["events"].as_array().unwrap()), vec![10, 11]);
    assert_eq!(mid["hasMore"], true);
    let end = s
        .get(&bob, &format!("/v1/user-stream?epoch={epoch}&afterSeq=13"))
        .await;
    assert_eq!(
        (end["events"].clone(), end["hasMore"].clone()),
        (json!([]), json!(false))
    );
    // Every event's data is what happened, in order.
    let all = pull_stream(&s, &bob, epoch, 0).await;
    let actions: Vec<String> = all
        .iter()
        .map(|e| match e["event"].as_str().unwrap() {
            "friend.request" => e["data"]["action"].as_str().unwrap().to_string(),
            other => other.to_string(),
        })
        .collect();
    assert_eq!(actions[..6], ["requested"; 6]);
    assert_eq!(actions[12], "rejected");
    assert_eq!(
        actions[6..12].iter().filter(|a| *a == "accepted").count(),
        3,
        "{actions:?}"
    );
    assert_eq!(
        actions[6..12]
            .iter()
            .filter(|a| *a == "friend.added")
            .count(),
        3,
        "{actions:?}"
    );
    // A made-up epoch is not this stream's.
    s.expect_error(
        "GET",
        &format!("/v1/user-stream?epoch={}&afterSeq=0", epoch + 1000),
        Some(&bob.token),
        None,
        409,
        "resync_required",
    )
    .await;

    // The admin compacts the stream: the old epoch is refused, the new one starts afresh.
    s.expect_error(
        "POST",
        "/admin/users/bob/stream/reset",
        Some(&bob.token),
        None,
        401,
        "unauthorized",
    )
    .await;
    let mut ws = s.connect(&bob, "phone").await;
    let (st, reset) = s
        .http("POST", "/admin/users/bob/stream/reset", Some(ADMIN), None)
        .await;
    assert_eq!(st, 200, "{reset}");
    assert_eq!(reset["userId"], "bob");
    let epoch2 = reset["epoch"].as_i64().expect("epoch");
    assert_ne!(epoch2, epoch);
    for after in [0, 5, 13] {
        s.expect_error(
            "GET",
            &format!("/v1/user-stream?epoch={epoch}&afterSeq={after}"),
            Some(&bob.token),
            None,
            409,
            "resync_required",
        )
        .await;
    }
    let head2 = s.get(&bob, "/v1/user-stream?limit=0").await;
    assert_eq!(head2["epoch"], epoch2);
    let base = head2["lastSeq"].as_i64().expect("lastSeq");
    assert_eq!(
        pull_stream(&s, &bob, epoch2, 0).await,
        Vec::<Value>::new(),
        "events deleted"
    );
    // The snapshots are untouched.
    assert_eq!(
        friends(&s, &bob).await,
        vec!["u0", "u1", "u2"],
        "sorted by userId"
    );
    assert_eq!(pending(&s, &bob, "in").await.len(), 2);
    // New events follow in the new epoch, pulled and pushed.
    let r = request(&s, &bob, "u5", Some("my turn")).await;
    assert_eq!(r["state"], "accepted", "u5 had asked bob: {r}");
    let ev = pull_stream(&s, &bob, epoch2, 0).await;
    assert_eq!(seqs(&ev), vec![base + 1, base + 2]);
    let got: BTreeSet<&str> = ev.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(got, ["friend.added", "friend.request"].into());
    let pushed = pushed_until(&mut ws, &[], base + 1, base + 2).await;
    for p in &pushed {
        assert_eq!(p["epoch"], epoch2, "{p}");
    }
    let other = s.user("carol").await;
    // The admin endpoint needs the admin token, not any user's.
    s.expect_error(
        "POST",
        "/admin/users/carol/stream/reset",
        Some(&other.token),
        None,
        401,
        "unauthorized",
    )
    .await;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// One group as U's stream tells it, or as `GET /v1/groups` does.
#[derive(Debug, Clone, PartialEq)]
struct Membership {
    state: String,
    /// Role and mute, compared while a member.
    role: String,
    muted_until: i64,
}

/// Users who befriend and unfriend U round after round, and the rounds.
const CHURNERS: usize = 4;
const ROUNDS: usize = 4;

async fn concurrent_changes_replay_to_the_snapshots(b: Backend) {
    let (_db, s) = setup(&b, "stream-storm", FAST).await;
    let s = Arc::new(s);
    let u = s.user("u").await;
    let mut senders = Vec::new();
    for i in 0..8 {
        senders.push(s.user(&format!("o{i}")).await);
    }
    s.user("x").await;
    s.user("y").await;
    let mut churners = Vec::new();
    for i in 0..CHURNERS {
        churners.push(s.user(&format!("p{i}")).await);
    }
    let mut owners = Vec::new();
    for i in 0..10 {
        owners.push(s.user(&format!("g{i}")).await);
    }
    let (epoch, start) = position(&s, &u).await;
    assert_eq!(start, 0);
    let deadline = Instant::now() + Duration::from_secs(180);

    // U's client pulls from its cursor the whole time, in small pages.
    let stop = Arc::new(AtomicBool::new(false));
    let puller = tokio::spawn({
        let (s, u, stop) = (s.clone(), u.clone(), stop.clone());
        async move {
            let mut cursor = 0;
            let mut got: Vec<Value> = Vec::new();
            let mut pulls = 0;
            loop {
                let stopping = stop.load(Ordering::SeqCst);
                loop {
                    pulls += 1;
                    assert!(
                        pulls < 50_000 && Instant::now() < deadline,
                        "puller ran too long"
                    );
                    let page = s
                        .get(
                            &u,
                            &format!("/v1/user-stream?epoch={epoch}&afterSeq={cursor}&limit=5"),
                        )
                        .await;
                    let events = page["events"].as_array().unwrap().clone();
                    if let Some(last) = events.last() {
                        cursor = last["seq"].as_i64().unwrap();
                    }
                    got.extend(events);
                    if !page["hasMore"].as_bool().unwrap() {
                        break;
                    }
                }
                if stopping {
                    return (got, pulls);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });

    // Eight users ask U at once; some ask twice, some cancel.
    let asked = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (i, o) in senders.iter().cloned().enumerate() {
        let (s, asked) = (s.clone(), asked.clone());
        tasks.push(tokio::spawn(async move {
            let first = ok(
                &s,
                &o,
                "POST",
                "/v1/friends/requests",
                Some(json!({"userId": "u", "message": format!("m-{i}-0")})),
            )
            .await;
            let state = first["state"].as_str().unwrap();
            assert!(
                state == "pending" || (i == 7 && state == "accepted"),
                "o{i}: {first}"
            );
            let rid = first["requestId"].as_str().unwrap().to_string();
            match i {
                1 | 5 => {
                    let (st, again) = call(
                        &s,
                        &o,
                        "POST",
                        "/v1/friends/requests",
                        Some(json!({"userId": "u", "message": format!("m-{i}-1")})),
                    )
                    .await;
                    let fine = (st == 200 && again["state"] == "pending")
                        || (i == 5 && st == 409 && again["error"]["code"] == "already_friends");
                    assert!(fine, "o{i} asking again: {st} {again}");
                }
                2 | 6 => {
                    let (st, got) = decide(&s, &o, &rid, "cancel").await;
                    let fine = (st == 200 && got["state"] == "cancelled")
                        || (st == 409 && got["error"]["code"] == "request_not_pending");
                    assert!(fine, "o{i} cancelling: {st} {got}");
                }
                _ => {}
            }
            asked.fetch_add(1, Ordering::SeqCst);
        }));
    }

    // Four users befriend U, unfriend and ask again, round after round; p0 and p2 stay.
    for (i, p) in churners.iter().cloned().enumerate() {
        let (s, asked) = (s.clone(), asked.clone());
        tasks.push(tokio::spawn(async move {
            for r in 0..ROUNDS {
                let got = request(&s, &p, "u", Some(&format!("p{i} round {r}"))).await;
                assert_eq!(got["state"], "pending", "p{i} round {r}: {got}");
                let mut waits = 0;
                while !friends(&s, &p).await.iter().any(|f| f == "u") {
                    waits += 1;
                    assert!(
                        waits < 10_000 && Instant::now() < deadline,
                        "u never accepted p{i}"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                if r + 1 < ROUNDS || i % 2 == 1 {
                    let got = ok(&s, &p, "DELETE", "/v1/friends/u", None).await;
                    assert_eq!(got, json!({"userId": "u", "removed": true}));
                }
            }
            asked.fetch_add(1, Ordering::SeqCst);
        }));
    }

    // U decides what comes in, while asking x, y and o7 itself.
    tasks.push(tokio::spawn({
        let (s, u, asked) = (s.clone(), u.clone(), asked.clone());
        async move {
            let to7 = request(&s, &u, "o7", Some("u to o7")).await;
            assert!(
                to7["state"] == "pending" || to7["state"] == "accepted",
                "{to7}"
            );
            request(&s, &u, "x", Some("u to x")).await;
            let y = request(&s, &u, "y", None).await;
            let (st, _) = decide(&s, &u, y["requestId"].as_str().unwrap(), "cancel").await;
            assert_eq!(st, 200);
            let mut rounds = 0;
            loop {
                rounds += 1;
                assert!(
                    rounds < 5000 && Instant::now() < deadline,
                    "U never settled"
                );
                let all_asked = asked.load(Ordering::SeqCst) == 8 + CHURNERS;
                let mut decided = 0;
                for (rid, from, _, _) in pending(&s, &u, "in").await {
                    let i: usize = from[1..].parse().unwrap();
                    let verb = match i {
                        _ if from.starts_with('p') => "accept",
                        3 => continue,
                        1 | 6 => "reject",
                        _ => "accept",
                    };
                    decided += 1;
                    let (st, got) = decide(&s, &u, &rid, verb).await;
                    let fine =
                        st == 200 || (st == 409 && got["error"]["code"] == "request_not_pending");
                    assert!(fine, "{verb} {from}: {st} {got}");
                    if st == 200 && from == "o0" {
                        let got = ok(&s, &u, "DELETE", "/v1/friends/o0", None).await;
                        assert_eq!(got["removed"], true);
                    }
                }
                if all_asked && decided == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }
    }));

    // Ten groups change U's membership at the same time.
    let until = now_ms() + 3_600_000;
    for (k, g) in owners.iter().cloned().enumerate() {
        let (s, u) = (s.clone(), u.clone());
        tasks.push(tokio::spawn(async move {
            let create = |body: Value| {
                let (s, g) = (s.clone(), g.clone());
                async move {
                    ok(&s, &g, "POST", "/v1/groups", Some(body)).await["conversationId"]
                        .as_i64()
                        .unwrap()
                }
            };
            let add = |cid: i64| {
                let (s, g) = (s.clone(), g.clone());
                async move {
                    let got = ok(
                        &s,
                        &g,
                        "POST",
                        &format!("/v1/groups/{cid}/members"),
                        Some(json!({"userIds": ["u"]})),
                    )
                    .await;
                    assert_eq!(got["added"], json!(["u"]));
                }
            };
            let kick = |cid: i64| {
                let (s, g) = (s.clone(), g.clone());
                async move {
                    let got = ok(
                        &s,
                        &g,
                        "POST",
                        &format!("/v1/groups/{cid}/kick"),
                        Some(json!({"userIds": ["u"]})),
                    )
                    .await;
                    assert_eq!(got["kicked"], json!(["u"]));
                }
            };
            // quit takes no body, join an optional one.
            let by_u = |cid: i64, what: &'static str| {
                let (s, u) = (s.clone(), u.clone());
                let body = (what == "join").then(|| json!({}));
                async move { ok(&s, &u, "POST", &format!("/v1/groups/{cid}/{what}"), body).await }
            };
            match k {
                // Added and kicked three times, added, made admin, muted.
                0 => {
                    let cid = create(json!({"name": "A"})).await;
                    for _ in 0..3 {
                        add(cid).await;
                        kick(cid).await;
                    }
                    add(cid).await;
                    ok(&s, &g, "PUT", &format!("/v1/groups/{cid}/admins/u"), None).await;
                    let got = ok(
                        &s,
                        &g,
                        "POST",
                        &format!("/v1/groups/{cid}/mute"),
                        Some(json!({"userId": "u", "until": until})),
                    )
                    .await;
                    assert_eq!(got["mutedUntil"], until);
                }
                // A member from the start, kicked, back, kicked.
                1 => {
                    let cid = create(json!({"name": "B", "members": ["u"]})).await;
                    kick(cid).await;
                    add(cid).await;
                    kick(cid).await;
                }
                // Quits twice.
                2 => {
                    let cid = create(json!({"name": "C", "members": ["u"]})).await;
                    by_u(cid, "quit").await;
                    add(cid).await;
                    let got = by_u(cid, "quit").await;
                    assert_eq!(got["memberState"], "left");
                }
                // Made admin, then the group is dissolved.
                3 => {
                    let cid = create(json!({"name": "D", "members": ["u"]})).await;
                    ok(&s, &g, "PUT", &format!("/v1/groups/{cid}/admins/u"), None).await;
                    ok(&s, &g, "POST", &format!("/v1/groups/{cid}/dissolve"), None).await;
                }
                // Asks to join, is approved, becomes the owner.
                4 => {
                    let cid = create(json!({"name": "E", "joinPolicy": "approval"})).await;
                    let got = ok(
                        &s,
                        &u,
                        "POST",
                        &format!("/v1/groups/{cid}/join"),
                        Some(json!({"message": "let me in"})),
                    )
                    .await;
                    assert_eq!(got["state"], "pending");
                    ok(
                        &s,
                        &g,
                        "POST",
                        &format!("/v1/groups/{cid}/join-requests/u/approve"),
                        None,
                    )
                    .await;
                    let got = ok(
                        &s,
                        &g,
                        "POST",
                        &format!("/v1/groups/{cid}/transfer"),
                        Some(json!({"userId": "u"})),
                    )
                    .await;
                    assert_eq!(got["ownerId"], "u");
                }
                // A channel: subscribe, unsubscribe, subscribe.
                5 => {
                    let cid = create(json!({"name": "F", "conversationType": 3})).await;
                    assert_eq!(by_u(cid, "join").await["state"], "joined");
                    by_u(cid, "quit").await;
                    assert_eq!(by_u(cid, "join").await["state"], "joined");
                }
                // Churn: added and kicked ten times; the even ones add U once more.
                _ => {
                    let cid = create(json!({"name": format!("churn {k}")})).await;
                    for _ in 0..10 {
                        add(cid).await;
                        kick(cid).await;
                    }
                    if k % 2 == 0 {
                        add(cid).await;
                    }
                }
            };
        }));
    }
    for t in tasks {
        t.await.expect("a change task failed");
    }
    stop.store(true, Ordering::SeqCst);
    let (events, pulls) = puller.await.expect("the puller failed");
    assert!(pulls > 1);
    assert!(
        events.len() >= 150,
        "the storm was too small to mean anything: {} events",
        events.len()
    );

    // Every seq once, none missing.
    let last = s
        .get(&u, &format!("/v1/user-stream?epoch={epoch}&limit=0"))
        .await["lastSeq"]
        .as_i64()
        .unwrap();
    let got = seqs(&events);
    assert_eq!(
        got,
        (1..=last).collect::<Vec<_>>(),
        "the pulls from the cursor are not the stream 1..={last} once each"
    );

    // Replaying the events gives the snapshots.
    let mut friends_now = BTreeSet::new();
    let mut requests: BTreeMap<String, (String, String, Option<String>, String)> = BTreeMap::new();
    let mut groups: BTreeMap<i64, Membership> = BTreeMap::new();
    for e in &events {
        let d = &e["data"];
        let cid = d["conversationId"].as_i64();
        match e["event"].as_str().unwrap() {
            "friend.added" => {
                friends_now.insert(d["userId"].as_str().unwrap().to_string());
            }
            "friend.removed" => {
                friends_now.remove(d["userId"].as_str().unwrap());
            }
            "friend.request" => {
                let state = match d["action"].as_str().unwrap() {
                    "requested" => "pending",
                    other => other,
                };
                requests.insert(
                    d["requestId"].as_str().unwrap().to_string(),
                    (
                        d["fromUserId"].as_str().unwrap().to_string(),
                        d["toUserId"].as_str().unwrap().to_string(),
                        d["message"].as_str().map(str::to_string),
                        state.to_string(),
                    ),
                );
            }
            "group.joined" => {
                groups.insert(
                    cid.unwrap(),
                    Membership {
                        state: "member".into(),
                        role: d["role"].as_str().unwrap().to_string(),
                        muted_until: 0,
                    },
                );
            }
            ev @ ("group.left" | "group.kicked" | "group.dissolved") => {
                let m = groups
                    .get_mut(&cid.unwrap())
                    .expect("an event of a group not joined");
                m.state = match ev {
                    "group.left" => "left",
                    "group.kicked" => "kicked",
                    _ => "dissolved",
                }
                .into();
            }
            "group.role" => {
                let m = groups
                    .get_mut(&cid.unwrap())
                    .expect("role in a group not joined");
                m.role = d["role"].as_str().unwrap().to_string();
            }
            "group.muted" => {
                let m = groups
                    .get_mut(&cid.unwrap())
                    .expect("mute in a group not joined");
                m.muted_until = d["mutedUntil"].as_i64().unwrap();
            }
            "group.joinRequest" => {
                assert_eq!(d["userId"], "u", "{e}");
            }
            other => panic!("unexpected event {other}: {e}"),
        }
    }
    let snap_friends: BTreeSet<String> = friends(&s, &u).await.into_iter().collect();
    assert_eq!(
        friends_now, snap_friends,
        "friends: replay vs GET /v1/friends"
    );
    for must in ["o4", "o5", "o7", "p0", "p2"] {
        assert!(
            snap_friends.contains(must),
            "{must} is not u's friend: {snap_friends:?}"
        );
    }
    for never in ["o0", "o1", "o3", "o6", "p1", "p3", "x", "y"] {
        assert!(!snap_friends.contains(never), "{never} is u's friend");
    }
    let replay_pending = |dir_in: bool| -> BTreeSet<Req> {
        requests
            .iter()
            .filter(|(_, (from, to, _, state))| {
                state == "pending" && if dir_in { to == "u" } else { from == "u" }
            })
            .map(|(id, (from, to, msg, _))| (id.clone(), from.clone(), to.clone(), msg.clone()))
            .collect()
    };
    let snap_in = pending(&s, &u, "in").await;
    let snap_out = pending(&s, &u, "out").await;
    assert_eq!(replay_pending(true), snap_in, "incoming requests");
    assert_eq!(replay_pending(false), snap_out, "outgoing requests");
    assert_eq!(
        snap_in.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
        vec!["o3"]
    );
    assert_eq!(
        snap_out.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
        vec!["x"]
    );
    let listed = s.get(&u, "/v1/groups").await;
    let snap_groups: BTreeMap<i64, Membership> = listed["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["conversationId"].as_i64().unwrap(),
                Membership {
                    state: g["memberState"].as_str().unwrap().to_string(),
                    role: g["role"].as_str().unwrap_or_default().to_string(),
                    muted_until: g["mutedUntil"].as_i64().unwrap_or_default(),
                },
            )
        })
        .collect();
    assert_eq!(snap_groups.len(), 10, "{listed}");
    assert_eq!(
        groups.keys().collect::<Vec<_>>(),
        snap_groups.keys().collect::<Vec<_>>()
    );
    for (cid, replayed) in &groups {
        let snap = &snap_groups[cid];
        assert_eq!(replayed.state, snap.state, "group {cid}: {listed}");
        if snap.state == "member" {
            assert_eq!(replayed, snap, "group {cid}: {listed}");
        }
    }
    let states: BTreeMap<&str, usize> = snap_groups.values().fold(BTreeMap::new(), |mut m, g| {
        *m.entry(g.state.as_str()).or_default() += 1;
        m
    });
    assert_eq!(
        states,
        [("dissolved", 1), ("kicked", 3), ("left", 1), ("member", 5)].into()
    );
    let roles: BTreeSet<(String, i64)> = snap_groups
        .values()
        .filter(|g| g.state == "member")
        .map(|g| (g.role.clone(), g.muted_until))
        .collect();
    assert_eq!(
        roles,
        [
            ("admin".to_string(), until),
            ("member".to_string(), 0),
            ("owner".to_string(), 0)
        ]
        .into()
    );
}

/// A request made before a block cannot be accepted while it holds; after the unblock it can.
async fn a_block_refuses_accepting_a_request(b: Backend) {
    let (_db, s) = setup(&b, "accept-blocked", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let r = request(&s, &bob, "alice", Some("hi")).await;
    let id = r["requestId"].as_str().unwrap().to_string();
    ok(&s, &bob, "PUT", "/v1/blocks/alice", None).await;
    let accept = format!("/v1/friends/requests/{id}/accept");
    s.expect_error("POST", &accept, Some(&alice.token), None, 403, "blocked")
        .await;
    assert_eq!(s.get(&alice, "/v1/friends").await["friends"], json!([]));
    assert_eq!(
        s.get(&alice, "/v1/friends/requests?direction=in").await["requests"][0]["state"],
        "pending"
    );
    ok(&s, &bob, "DELETE", "/v1/blocks/alice", None).await;
    assert_eq!(
        ok(&s, &alice, "POST", &accept, None).await["state"],
        "accepted"
    );
}

/// The admin reset refuses an unknown or invalid user id, and starts the new epoch at seq 1.
async fn a_reset_names_a_known_user(b: Backend) {
    let (_db, s) = setup(&b, "reset-users", "").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    request(&s, &bob, "carol", None).await;
    s.expect_error(
        "POST",
        "/admin/users/nobody/stream/reset",
        Some(ADMIN),
        None,
        404,
        "user_not_found",
    )
    .await;
    s.expect_error(
        "POST",
        "/admin/users/bad%20id/stream/reset",
        Some(ADMIN),
        None,
        400,
        "bad_request",
    )
    .await;
    let (st, got) = s
        .http("POST", "/admin/users/carol/stream/reset", Some(ADMIN), None)
        .await;
    assert_eq!((st, got["epoch"].clone()), (200, json!(2)), "{got}");
    request(&s, &bob, "carol", Some("again")).await;
    let page = s.get(&carol, "/v1/user-stream?epoch=2&afterSeq=0").await;
    assert_eq!(page["events"][0]["seq"], 1, "{page}");
}

/// A block made before two users have a conversation holds once the blocker starts one:
/// the blocked user's reply is refused, by peer and by conversation.
async fn a_block_made_before_the_first_message_holds(b: Backend) {
    let (_db, s) = setup(&b, "block-first", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    ok(&s, &alice, "PUT", "/v1/blocks/bob", None).await;
    let sent = ok(&s, &alice, "POST", "/v1/messages", Some(json!({"clientMsgId": "a-1",
        "conversationType": 1, "peerId": "bob", "contentType": 1, "payload": {"text": "last word"}}))).await;
    let cid = sent["conversationId"].as_i64().unwrap();
    for to in [json!({"conversationId": cid}), json!({"peerId": "alice"})] {
        let mut body = json!({"clientMsgId": format!("b-{}", fastrand::u32(..)), "conversationType": 1,
            "contentType": 1, "payload": {"text": "reply"}});
        body.as_object_mut()
            .unwrap()
            .extend(to.as_object().unwrap().clone());
        s.expect_error(
            "POST",
            "/v1/messages",
            Some(&bob.token),
            Some(body),
            403,
            "blocked",
        )
        .await;
    }
    ok(&s, &alice, "DELETE", "/v1/blocks/bob", None).await;
    ok(
        &s,
        &bob,
        "POST",
        "/v1/messages",
        Some(json!({"clientMsgId": "b-ok", "conversationId": cid,
        "conversationType": 1, "contentType": 1, "payload": {"text": "reply"}})),
    )
    .await;
}

/// A block (or an unblock) and the first message that creates the pair's conversation,
/// sent at the same moment, pair after pair: whichever the server takes first, the
/// conversation ends up holding the block as it stands. Half the pairs start unblocked and
/// block; the other half start blocked and unblock. In half of each, the blocker writes the
/// first message (a blocker may still write); in the other half the peer does, and it is
/// stored or refused `blocked` depending on which came first. Then the peer's reply must be
/// refused where the block stands and accepted where it was lifted.
async fn a_block_and_a_first_message_at_once_agree(b: Backend) {
    const PAIRS: usize = 128;
    let (_db, s) = setup(&b, "block-race", "").await;
    let s = Arc::new(s);
    let users = user_pairs(&s, PAIRS, "a", "b").await;
    let unblocking = |i: usize| i % 2 == 1;
    let peer_first = |i: usize| i % 4 >= 2;
    for (i, (a, b)) in users.iter().enumerate() {
        if unblocking(i) {
            ok(&s, a, "PUT", &format!("/v1/blocks/{}", b.id), None).await;
        }
    }
    // Every pair's block change and first message at once.
    let mut tasks = Vec::new();
    for (i, (a, b)) in users.iter().cloned().enumerate() {
        let method = if unblocking(i) { "DELETE" } else { "PUT" };
        let (s2, a2, b2) = (s.clone(), a.clone(), b.id.clone());
        tasks.push(tokio::spawn(async move {
            ok(&s2, &a2, method, &format!("/v1/blocks/{b2}"), None).await;
        }));
        let s2 = s.clone();
        let (from, to) = if peer_first(i) { (b, a) } else { (a, b) };
        tasks.push(tokio::spawn(async move {
            let (status, body) = call(
                &s2,
                &from,
                "POST",
                "/v1/messages",
                Some(json!({"clientMsgId": format!("first-{i}"),
                "conversationType": 1, "peerId": to.id, "contentType": 1,
                "payload": {"text": "first"}})),
            )
            .await;
            // The blocked peer's first message goes or not, as the block stood when it
            // was taken; the blocker's always goes.
            let refused = status == 403 && body["error"]["code"] == "blocked";
            assert!(
                status == 200 || (peer_first(i) && refused),
                "the first message from {} to {}: {status} {body}",
                from.id,
                to.id
            );
        }));
    }
    for t in tasks {
        t.await.expect("a block change or a first message");
    }
    let mut wrong = Vec::new();
    for (i, (a, b)) in users.iter().enumerate() {
        let (status, body) = call(
            &s,
            b,
            "POST",
            "/v1/messages",
            Some(json!({
            "clientMsgId": format!("reply-{i}"), "conversationType": 1, "peerId": a.id,
            "contentType": 1, "payload": {"text": "reply"}})),
        )
        .await;
        let fine = match unblocking(i) {
            true => status == 200,
            false => status == 403 && body["error"]["code"] == "blocked",
        };
        if !fine {
            wrong.push(format!(
                "{} to {} ({}): {status} {body}",
                b.id,
                a.id,
                if unblocking(i) {
                    "unblocked"
                } else {
                    "blocked"
                }
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "replies answered against the block as it stands: {wrong:#?}"
    );
}

/// An account deleted at the same moment as a first message to it, pair after pair:
/// whichever the server takes first, the deleted id is in no conversation afterwards. The
/// first message is accepted (its conversation then belongs to the alias) or refused
/// `user_not_found`; afterwards a message to the old id is refused, and the sender's
/// conversations name only the alias.
async fn a_deletion_and_a_first_message_to_it_at_once_agree(b: Backend) {
    const PAIRS: usize = 48;
    let (_db, s) = setup(&b, "delete-race", "").await;
    let s = Arc::new(s);
    let users = user_pairs(&s, PAIRS, "sender", "doomed").await;
    let first = |i: usize, tag: &str| {
        json!({"clientMsgId": format!("{tag}-{i}"), "conversationType": 1,
        "peerId": format!("doomed{i}"), "contentType": 1, "payload": {"text": tag}})
    };
    let mut tasks = Vec::new();
    for (i, (a, doomed)) in users.iter().cloned().enumerate() {
        let s2 = s.clone();
        tasks.push(tokio::spawn(async move {
            let path = format!("/admin/users/{}", doomed.id);
            let (status, body) = s2.http("DELETE", &path, Some(ADMIN_TOKEN), None).await;
            assert_eq!(status, 200, "deleting {}: {body}", doomed.id);
            None
        }));
        let s2 = s.clone();
        tasks.push(tokio::spawn(async move {
            let (status, body) =
                call(&s2, &a, "POST", "/v1/messages", Some(first(i, "first"))).await;
            Some((i, status, body))
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        if let Some((i, status, body)) = t.await.expect("a deletion or a first message") {
            match status {
                200 => accepted += 1,
                404 if body["error"]["code"] == "user_not_found" => {}
                _ => panic!("the first message to doomed{i}: {status} {body}"),
            }
        }
    }
    let mut wrong = Vec::new();
    for (i, (a, doomed)) in users.iter().enumerate() {
        let (status, body) = call(&s, a, "POST", "/v1/messages", Some(first(i, "again"))).await;
        if !(status == 404 && body["error"]["code"] == "user_not_found") {
            wrong.push(format!(
                "a message to {} afterwards: {status} {body}",
                doomed.id
            ));
        }
        let listed = ok(&s, a, "GET", "/v1/conversations", None).await;
        if listed.to_string().contains(&format!("\"{}\"", doomed.id)) {
            wrong.push(format!(
                "{}'s conversations name {}: {listed}",
                a.id, doomed.id
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "a deleted id outlived its deletion: {wrong:#?}"
    );
    println!("{accepted} of {PAIRS} first messages came before their deletion");
}

/// An account deleted while it creates a group with another user and sends them a friend
/// request, pair after pair: each change is made before the deletion, and ended by it like
/// the account's other groups and requests, or refused `account_deleted`. Afterwards the
/// other user is in no active group owned by the alias, has no pending request from it,
/// and nothing in their user stream or the group's messages names the old id.
async fn a_deletion_and_the_account_s_own_changes_at_once_leave_nothing(b: Backend) {
    const PAIRS: usize = 48;
    let (_db, s) = setup(&b, "delete-own-race", "").await;
    let users = user_pairs(&s, PAIRS, "doomed", "other").await;
    let mut made = 0;
    // One pair at a time, the changes started a little later each time (0 to 15 ms), so
    // that they meet the deletion at different points.
    for (i, (doomed, other)) in users.iter().enumerate() {
        let path = format!("/admin/users/{}", doomed.id);
        let server = &s;
        let later = move |ms: u64, path: &'static str, body: Value| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            call(server, doomed, "POST", path, Some(body)).await
        };
        let group = json!({"name": "mine", "members": [other.id]});
        let request = json!({"userId": other.id});
        let (deleted, created, requested) = tokio::join!(
            s.http("DELETE", &path, Some(ADMIN_TOKEN), None),
            later(i as u64 % 16, "/v1/groups", group),
            later(i as u64 * 7 % 16, "/v1/friends/requests", request),
        );
        assert_eq!(deleted.0, 200, "deleting {}: {}", doomed.id, deleted.1);
        for (what, (status, answer)) in [("group", created), ("request", requested)] {
            match status {
                200 => made += 1,
                401 if answer["error"]["code"] == "account_deleted" => {}
                _ => panic!("{}'s {what}: {status} {answer}", doomed.id),
            }
        }
    }
    let mut wrong = Vec::new();
    for (doomed, other) in &users {
        let old = format!("\"{}\"", doomed.id);
        for g in s.get(other, "/v1/groups").await["groups"]
            .as_array()
            .unwrap()
        {
            if g["state"] == "active" && g["ownerId"] != other.id.as_str() {
                wrong.push(format!("{} is in a group owned by another: {g}", other.id));
            }
            let id = g["conversationId"].as_i64().unwrap();
            let tips = s
                .get(
                    other,
                    &format!("/v1/conversations/{id}/messages?afterSeq=0"),
                )
                .await;
            if tips.to_string().contains(&old) {
                wrong.push(format!("the group's messages name {}: {tips}", doomed.id));
            }
        }
        let requests = pending(&s, other, "in").await;
        if !requests.is_empty() {
            wrong.push(format!("{} has requests pending: {requests:?}", other.id));
        }
        let events = events_after(&s, other, 0).await;
        if serde_json::to_string(&events).unwrap().contains(&old) {
            wrong.push(format!(
                "{}'s stream names {}: {events:#?}",
                other.id, doomed.id
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "changes racing a deletion outlived it: {wrong:#?}"
    );
    println!("{made} of {} changes came before their deletion", 2 * PAIRS);
}

/// More deletions at once than the database pool has connections (8), each account with
/// a group and a request whose stored tips and events name it, each group with the next
/// account deleted too (its tips name both): every deletion is answered `200`, each group
/// passes to its one member left, and nothing the other users read names the old ids.
async fn many_deletions_at_once_are_each_answered(b: Backend) {
    const PAIRS: usize = 32;
    let (_db, s) = setup(&b, "many-deletions", "").await;
    let s = Arc::new(s);
    let users = user_pairs(&s, PAIRS, "doomed", "other").await;
    for (i, (doomed, other)) in users.iter().enumerate() {
        let next = &users[(i + 1) % PAIRS].0;
        let group = json!({"name": "mine", "members": [other.id, next.id]});
        ok(&s, doomed, "POST", "/v1/groups", Some(group)).await;
        request(&s, doomed, &other.id, None).await;
    }
    let mut tasks = Vec::new();
    for (doomed, _) in &users {
        let (s2, path) = (s.clone(), format!("/admin/users/{}", doomed.id));
        tasks.push(tokio::spawn(async move {
            s2.http("DELETE", &path, Some(ADMIN_TOKEN), None).await
        }));
    }
    let mut refused = Vec::new();
    for (t, (doomed, _)) in tasks.into_iter().zip(&users) {
        let (status, body) = t.await.expect("a deletion");
        if status != 200 {
            refused.push(format!("{}: {status} {body}", doomed.id));
        }
    }
    assert!(refused.is_empty(), "deletions not made: {refused:#?}");
    for (doomed, other) in &users {
        let old = format!("\"{}\"", doomed.id);
        let groups = s.get(other, "/v1/groups").await;
        let mut seen = vec![
            s.get(other, "/v1/conversations").await,
            json!(events_after(&s, other, 0).await),
        ];
        for g in groups["groups"].as_array().unwrap() {
            assert_eq!(
                (&g["state"], &g["ownerId"]),
                (&json!("active"), &json!(other.id)),
                "the group passes to the one member left"
            );
            let id = g["conversationId"].as_i64().unwrap();
            let path = format!("/v1/conversations/{id}/messages?afterSeq=0");
            seen.push(s.get(other, &path).await);
        }
        seen.push(groups);
        assert!(
            !seen.iter().any(|v| v.to_string().contains(&old)),
            "{} still reads {}: {seen:#?}",
            other.id,
            doomed.id
        );
    }
}

/// `n` pairs of new users, `{a}{i}` and `{b}{i}`.
async fn user_pairs(s: &Server, n: usize, a: &str, b: &str) -> Vec<(User, User)> {
    let mut users = Vec::new();
    for i in 0..n {
        users.push((
            s.user(&format!("{a}{i}")).await,
            s.user(&format!("{b}{i}")).await,
        ));
    }
    users
}
