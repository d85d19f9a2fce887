//! Groups end to end, as a client sees them: join requests (asked, approved, rejected, and
//! answered by an add, an opening or a dissolution) and the join body. The real binary on
//! loopback, every test on SQLite and (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::collections::BTreeMap;

use common::groups::{
    create, events_after, id_of, my_group, named, overview, position, say, say_fails, without_by,
};
use common::server::{Backend, Server, User, ok, setup};
use serde_json::{Value, json};

on_both!(
    join_requests_with_approval,
    joining_an_opened_group_answers_the_pending_request,
    dissolving_rejects_pending_requests_and_no_op_changes_make_no_tips,
    a_join_body_is_optional_and_checked_like_every_body,
    a_member_adding_a_requester_answers_the_request,
    a_deleted_requester_s_request_is_withdrawn,
);

/// `asker` asks to join the `approval` group `cid` with `body` (pending), then `owner` opens
/// it: the request, as its answer was.
async fn ask_then_open(s: &Server, owner: &User, asker: &User, cid: i64, body: Value) -> Value {
    let path = format!("/v1/groups/{cid}");
    let asked = ok(s, asker, "POST", &format!("{path}/join"), Some(body)).await;
    assert_eq!(asked["state"], "pending");
    ok(
        s,
        owner,
        "PATCH",
        &path,
        Some(json!({"joinPolicy": "open"})),
    )
    .await;
    asked
}

/// `by` adds `user`, who had asked to join: added, and no request is left pending (as
/// `admin` lists them).
async fn adds_and_answers(s: &Server, by: &User, admin: &User, cid: i64, user: &str) {
    let path = format!("/v1/groups/{cid}");
    let got = ok(
        s,
        by,
        "POST",
        &format!("{path}/members"),
        Some(json!({"userIds": [user]})),
    )
    .await;
    assert_eq!(got, json!({"added": [user]}));
    assert_eq!(
        s.get(admin, &format!("{path}/join-requests")).await["requests"],
        json!([])
    );
}

async fn join_requests_with_approval(b: Backend) {
    let (_db, s) = setup(&b, "group-join-requests", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let erin = s.user("erin").await;
    let frank = s.user("frank").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Club", "members": ["bob", "carol"], "joinPolicy": "approval"}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    ok(&s, &alice, "PUT", &g("/admins/bob"), None).await;
    let mut at = BTreeMap::new();
    for u in [&alice, &bob, &carol, &dave, &erin, &frank] {
        at.insert(u.id.clone(), position(&s, u).await);
    }
    let since = |u: &User| at[&u.id];

    // Anyone may look before asking.
    let info = s.get(&dave, &g("")).await;
    assert_eq!(info["joinPolicy"], "approval");
    let asked = ok(
        &s,
        &dave,
        "POST",
        &g("/join"),
        Some(json!({"message": "let me in"})),
    )
    .await;
    assert_eq!(asked["state"], "pending", "{asked}");
    let rid = asked["requestId"].as_str().expect("requestId").to_string();
    let pending = json!({"conversationId": cid, "conversationType": 2, "requestId": rid,
                         "userId": "dave", "message": "let me in", "state": "pending"});
    for u in [&dave, &alice, &bob] {
        let ev = events_after(&s, u, since(u)).await;
        let got = named(&ev, "group.joinRequest");
        assert_eq!(got.len(), 1, "{}: {ev:?}", u.id);
        assert_eq!(without_by(&got[0]["data"]), pending, "{}", u.id);
    }
    assert!(
        named(
            &events_after(&s, &carol, since(&carol)).await,
            "group.joinRequest"
        )
        .is_empty(),
        "an ordinary member is not told"
    );
    assert_eq!(my_group(&s, &alice, cid).await["memberCount"], 3);
    // Asking again, after another asked, updates the pending request and keeps its
    // place: the list is by when each first asked.
    let erin_rid = ok(&s, &erin, "POST", &g("/join"), Some(json!({}))).await["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(erin_rid, rid);
    let again = ok(
        &s,
        &dave,
        "POST",
        &g("/join"),
        Some(json!({"message": "please"})),
    )
    .await;
    assert_eq!(again, json!({"state": "pending", "requestId": rid}));
    let list = s.get(&bob, &g("/join-requests")).await;
    let reqs = list["requests"].as_array().unwrap();
    assert_eq!(reqs.len(), 2, "{list}");
    assert_eq!(
        (
            &reqs[0]["requestId"],
            &reqs[0]["userId"],
            &reqs[0]["message"],
            &reqs[0]["state"]
        ),
        (
            &json!(rid),
            &json!("dave"),
            &json!("please"),
            &json!("pending")
        ),
        "oldest first: {list}"
    );
    assert!(reqs[0]["createdAt"].as_i64().is_some());
    assert_eq!(
        (&reqs[1]["requestId"], &reqs[1]["userId"]),
        (&json!(erin_rid), &json!("erin"))
    );
    s.expect_error(
        "POST",
        &g("/join-requests/dave/approve"),
        Some(&carol.token),
        None,
        403,
        "permission_denied",
    )
    .await;
    say_fails(&s, &dave, cid, 2, 403, "not_a_member").await;

    // An admin approves: dave is in, from his joined tip on.
    let got = ok(&s, &bob, "POST", &g("/join-requests/dave/approve"), None).await;
    assert_eq!(got, json!({"requestId": rid, "state": "approved"}));
    for u in [&dave, &alice, &bob] {
        let ev = events_after(&s, u, since(u)).await;
        let last = named(&ev, "group.joinRequest").pop().cloned().unwrap();
        assert_eq!(last["data"]["state"], "approved", "{}: {ev:?}", u.id);
        assert_eq!(last["data"]["requestId"], rid.as_str());
        assert_eq!(last["data"]["userId"], "dave");
        assert_eq!(last["data"]["by"], "bob");
    }
    let ev = events_after(&s, &dave, since(&dave)).await;
    let joined = named(&ev, "group.joined");
    assert_eq!(joined.len(), 1, "{ev:?}");
    assert_eq!(
        joined[0]["data"],
        json!({"conversationId": cid, "conversationType": 2, "role": "member", "by": "bob"})
    );
    assert_eq!(my_group(&s, &dave, cid).await["memberState"], "member");
    let msgs = s.pull_all(&dave, cid).await;
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["payload"]["event"], "joined");
    assert_eq!(overview(&s, &dave, cid).await["unread"], 0);
    say(&s, &dave, cid, 2, "thanks").await;
    for verb in ["approve", "reject"] {
        s.expect_error(
            "POST",
            &g(&format!("/join-requests/dave/{verb}")),
            Some(&alice.token),
            None,
            409,
            "request_not_pending",
        )
        .await;
    }
    s.expect_error(
        "POST",
        &g("/join"),
        Some(&dave.token),
        Some(json!({})),
        409,
        "already_member",
    )
    .await;

    // The owner rejects: erin stays out and is told.
    let got = ok(&s, &alice, "POST", &g("/join-requests/erin/reject"), None).await;
    assert_eq!(got, json!({"requestId": erin_rid, "state": "rejected"}));
    let ev = events_after(&s, &erin, since(&erin)).await;
    let last = named(&ev, "group.joinRequest").pop().cloned().unwrap();
    assert_eq!(
        (
            &last["data"]["state"],
            &last["data"]["by"],
            &last["data"]["requestId"]
        ),
        (&json!("rejected"), &json!("alice"), &json!(erin_rid))
    );
    assert!(named(&ev, "group.joined").is_empty());
    say_fails(&s, &erin, cid, 2, 403, "not_a_member").await;
    s.expect_error(
        "POST",
        &g("/join-requests/erin/reject"),
        Some(&bob.token),
        None,
        409,
        "request_not_pending",
    )
    .await;
    s.expect_error(
        "POST",
        &g("/join-requests/erin/approve"),
        Some(&bob.token),
        None,
        409,
        "request_not_pending",
    )
    .await;
    assert_eq!(
        s.get(&alice, &g("/join-requests")).await["requests"],
        json!([])
    );
    s.expect_error(
        "POST",
        &g("/join-requests/frank/approve"),
        Some(&alice.token),
        None,
        404,
        "request_not_found",
    )
    .await;

    // Adding someone who asked approves their request.
    let frank_rid = ok(
        &s,
        &frank,
        "POST",
        &g("/join"),
        Some(json!({"message": "me too"})),
    )
    .await["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    adds_and_answers(&s, &alice, &alice, cid, "frank").await;
    s.expect_error(
        "POST",
        &g("/join-requests/frank/approve"),
        Some(&alice.token),
        None,
        409,
        "request_not_pending",
    )
    .await;
    assert_eq!(my_group(&s, &frank, cid).await["memberState"], "member");
    let ev = events_after(&s, &frank, since(&frank)).await;
    let last = named(&ev, "group.joinRequest").pop().cloned().unwrap();
    assert_eq!(
        (&last["data"]["state"], &last["data"]["requestId"]),
        (&json!("approved"), &json!(frank_rid))
    );

    // Open: joined at once, by oneself.
    let open = id_of(&create(&s, &alice, json!({"name": "Open", "joinPolicy": "open"})).await);
    let e0 = position(&s, &erin).await;
    let got = ok(
        &s,
        &erin,
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(json!({})),
    )
    .await;
    assert_eq!(got, json!({"state": "joined"}));
    let ev = events_after(&s, &erin, e0).await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (ev[0]["event"].clone(), ev[0]["data"].clone()),
        (
            json!("group.joined"),
            json!({"conversationId": open, "conversationType": 2, "role": "member", "by": "erin"})
        )
    );
}

/// A request made while a group needed approval is answered when its requester joins the
/// group after it was opened.
async fn joining_an_opened_group_answers_the_pending_request(b: Backend) {
    let (_db, s) = setup(&b, "opened-join", "").await;
    let alice = s.user("alice").await;
    let dave = s.user("dave").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "A", "joinPolicy": "approval"})).await);
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let asked = ask_then_open(&s, &alice, &dave, cid, json!({"message": "hi"})).await;
    let d0 = position(&s, &dave).await;
    assert_eq!(
        ok(&s, &dave, "POST", &g("/join"), None).await,
        json!({"state": "joined"})
    );
    assert_eq!(
        s.get(&alice, &g("/join-requests")).await["requests"],
        json!([])
    );
    let ev = events_after(&s, &dave, d0).await;
    let answered: Vec<&Value> = named(&ev, "group.joinRequest");
    assert_eq!(answered.len(), 1, "{ev:?}");
    assert_eq!(answered[0]["data"]["state"], "approved");
    assert_eq!(answered[0]["data"]["requestId"], asked["requestId"]);
}

/// A member may add people once the group is no longer `approval`; adding someone who asked
/// to join answers their request, as an owner's or admin's add does.
async fn a_member_adding_a_requester_answers_the_request(b: Backend) {
    let (_db, s) = setup(&b, "member-adds-requester", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let dave = s.user("dave").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "A", "joinPolicy": "approval", "members": ["bob"]}),
        )
        .await,
    );
    let asked = ask_then_open(&s, &alice, &dave, cid, json!({})).await;
    let (d0, a0) = (position(&s, &dave).await, position(&s, &alice).await);
    adds_and_answers(&s, &bob, &alice, cid, "dave").await;
    for (who, from) in [(&dave, d0), (&alice, a0)] {
        let ev = events_after(&s, who, from).await;
        let answered: Vec<&Value> = named(&ev, "group.joinRequest");
        assert_eq!(answered.len(), 1, "{}: {ev:?}", who.id);
        assert_eq!(answered[0]["data"]["state"], "approved");
        assert_eq!(answered[0]["data"]["by"], "bob");
        assert_eq!(answered[0]["data"]["requestId"], asked["requestId"]);
    }
}

/// Dissolving answers pending join requests; patches and unmutes that change nothing make
/// no tip.
async fn dissolving_rejects_pending_requests_and_no_op_changes_make_no_tips(b: Backend) {
    let (_db, s) = setup(&b, "dissolve-requests", "").await;
    let alice = s.user("alice").await;
    s.user("bob").await;
    let dave = s.user("dave").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "D", "members": ["bob"], "joinPolicy": "approval"}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let last = || async { s.pull_all(&alice, cid).await.last().unwrap()["seq"].clone() };
    let before = last().await;
    ok(
        &s,
        &alice,
        "PATCH",
        &g(""),
        Some(json!({"name": "D", "joinPolicy": "approval"})),
    )
    .await;
    ok(
        &s,
        &alice,
        "POST",
        &g("/mute"),
        Some(json!({"userId": "bob", "until": 0})),
    )
    .await;
    assert_eq!(last().await, before, "nothing changed, nothing announced");
    let asked = ok(&s, &dave, "POST", &g("/join"), None).await;
    let d0 = position(&s, &dave).await;
    ok(&s, &alice, "POST", &g("/dissolve"), None).await;
    let ev = events_after(&s, &dave, d0).await;
    let answered = named(&ev, "group.joinRequest");
    assert_eq!(answered.len(), 1, "{ev:?}");
    assert_eq!(answered[0]["data"]["state"], "rejected");
    assert_eq!(answered[0]["data"]["requestId"], asked["requestId"]);
    s.expect_error("GET", &g(""), Some(&dave.token), None, 403, "not_a_member")
        .await;
}

/// A requester who deletes their account: the request goes, and the owner and admins, who
/// heard of it, hear that it was withdrawn, by the alias (never the old id).
async fn a_deleted_requester_s_request_is_withdrawn(b: Backend) {
    let (_db, s) = setup(&b, "deleted-requester", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let dave = s.user("dave").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "W", "members": ["bob"], "joinPolicy": "approval"}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    ok(&s, &alice, "PUT", &g("/admins/bob"), None).await;
    let asked = ok(
        &s,
        &dave,
        "POST",
        &g("/join"),
        Some(json!({"message": "hi"})),
    )
    .await;
    let before = [position(&s, &alice).await, position(&s, &bob).await];
    let gone = ok(
        &s,
        &dave,
        "DELETE",
        "/v1/account",
        Some(json!({"password": "password-of-"})),
    )
    .await;
    let alias = gone["alias"].as_str().unwrap();
    for (u, from) in [(&alice, before[0]), (&bob, before[1])] {
        let ev = events_after(&s, u, from).await;
        let told = named(&ev, "group.joinRequest");
        assert_eq!(told.len(), 1, "{}: {ev:?}", u.id);
        assert_eq!(
            told[0]["data"],
            json!({"conversationId": cid, "conversationType": 2,
                "requestId": asked["requestId"], "userId": alias, "message": "hi",
                "state": "withdrawn", "by": alias}),
            "{}",
            u.id
        );
        assert!(!json!(ev).to_string().contains("dave"), "{}: {ev:?}", u.id);
    }
    let pending = s.get(&alice, &g("/join-requests")).await;
    assert_eq!(pending["requests"], json!([]), "{pending}");
}

/// `POST …/join` takes no body or a JSON one; a bad or oversized one gets the documented
/// codes, and nothing changes.
async fn a_join_body_is_optional_and_checked_like_every_body(b: Backend) {
    let (_db, s) = setup(&b, "join-bodies", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "J", "joinPolicy": "approval"})).await);
    let join = format!("/v1/groups/{cid}/join");
    let (st, got) = s
        .http_raw("POST", &join, Some(&bob.token), "{not json")
        .await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{got}"
    );
    let big = format!("{{\"message\": \"{}\"}}", "x".repeat(2_000_000));
    let (st, got) = s.http_raw("POST", &join, Some(&bob.token), &big).await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (413, Some("request_too_large")),
        "{got}"
    );
    assert_eq!(
        s.get(&alice, &format!("/v1/groups/{cid}/join-requests"))
            .await["requests"],
        json!([])
    );
    let (st, got) = s.http_raw("POST", &join, Some(&bob.token), "").await;
    assert_eq!((st, got["state"].as_str()), (200, Some("pending")), "{got}");
}
