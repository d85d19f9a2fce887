//! Groups and channels end to end, as a client sees them: the real binary on loopback,
//! every test on SQLite and (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::server::{
    Backend, FAST, Server, User, call, fails, ok, peer, send_err, send_ok, setup, text,
};
use serde_json::{Value, json};

on_both!(
    create_snapshots_and_tips,
    visibility_follows_membership,
    every_permission_code,
    group_full_limit,
    join_requests_with_approval,
    owner_transfer_admins_and_mutes,
    channels_broadcast_to_subscribers,
    group_receipts_count_reads,
    group_fan_out_reaches_each_device_once,
    an_offline_device_catches_up,
    kicked_members_get_no_pushes_sent_after_their_kick,
    channel_history_survives_leaving_and_rejoining,
    a_resend_in_a_group_reaches_no_later_member,
    former_members_see_no_read_positions_or_earlier_receipts,
    live_kinds_honour_mutes,
    a_former_members_list_stops_at_their_departure,
    joining_an_opened_group_answers_the_pending_request,
    a_new_subscriber_sees_no_earlier_post_in_the_overview,
    dissolving_rejects_pending_requests_and_no_op_changes_make_no_tips,
    a_join_body_is_optional_and_checked_like_every_body,
);

/// `POST /v1/groups`: the group info.
async fn create(s: &Server, owner: &User, body: Value) -> Value {
    ok(s, owner, "POST", "/v1/groups", Some(body)).await
}

fn id_of(info: &Value) -> i64 {
    info["conversationId"]
        .as_i64()
        .unwrap_or_else(|| panic!("no conversationId: {info}"))
}

fn fresh() -> String {
    format!("c-{}", fastrand::u64(..))
}

/// The HTTP send of a text into a group (2) or channel (3): status and body.
async fn post_text(s: &Server, u: &User, cid: i64, ctype: i64, body: &str) -> (u16, Value) {
    call(
        s,
        u,
        "POST",
        "/v1/messages",
        Some(
            json!({"clientMsgId": fresh(), "conversationId": cid, "conversationType": ctype,
                    "contentType": 1, "payload": {"text": body}}),
        ),
    )
    .await
}

/// A text that must be stored: its seq.
async fn say(s: &Server, u: &User, cid: i64, ctype: i64, body: &str) -> i64 {
    let (st, got) = post_text(s, u, cid, ctype, body).await;
    assert_eq!(st, 200, "{} says {body:?}: {got}", u.id);
    got["seq"].as_i64().unwrap()
}

/// A text that must be refused with `status` and `code`.
async fn say_fails(s: &Server, u: &User, cid: i64, ctype: i64, status: u16, code: &str) {
    let (st, got) = post_text(s, u, cid, ctype, "refused?").await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (status, Some(code)),
        "{} sending into {cid}: {got}",
        u.id
    );
}

/// A WebSocket `send` frame of a text into a group or channel.
fn gtext(id: &str, cid: i64, ctype: i64, body: &str) -> Value {
    text(
        id,
        &fresh(),
        json!({"conversationId": cid, "conversationType": ctype}),
        body,
    )
}

/// The user stream's `lastSeq`.
async fn position(s: &Server, u: &User) -> i64 {
    s.get(u, "/v1/user-stream?limit=0").await["lastSeq"]
        .as_i64()
        .expect("lastSeq")
}

/// The user stream's events after `after` (current epoch), paging to the end.
async fn events_after(s: &Server, u: &User, after: i64) -> Vec<Value> {
    let epoch = s.get(u, "/v1/user-stream?limit=0").await["epoch"]
        .as_i64()
        .expect("epoch");
    let mut after = after;
    let mut all = Vec::new();
    for _ in 0..1000 {
        let page = s
            .get(
                u,
                &format!("/v1/user-stream?epoch={epoch}&afterSeq={after}&limit=100"),
            )
            .await;
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

/// The events of one name among `events`.
fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// `data` without `by` (compared separately where the doc names it).
fn without_by(d: &Value) -> Value {
    let mut d = d.clone();
    if let Some(o) = d.as_object_mut() {
        o.remove("by");
    }
    d
}

fn seqs(items: &[Value]) -> Vec<i64> {
    items.iter().map(|m| m["seq"].as_i64().unwrap()).collect()
}

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

/// The user's overview entry of a conversation.
async fn overview(s: &Server, u: &User, cid: i64) -> Value {
    let list = s.get(u, "/v1/conversations?limit=200").await;
    list["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversationId"] == cid)
        .cloned()
        .unwrap_or_else(|| panic!("{} has no conversation {cid}: {list}", u.id))
}

/// The user's entry for a group in `GET /v1/groups`.
async fn my_group(s: &Server, u: &User, cid: i64) -> Value {
    let list = s.get(u, "/v1/groups").await;
    list["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["conversationId"] == cid)
        .cloned()
        .unwrap_or_else(|| panic!("{} does not list group {cid}: {list}", u.id))
}

/// `(userId, role, mutedUntil)` of every current member, one page.
async fn members(s: &Server, u: &User, cid: i64) -> Vec<(String, String, i64)> {
    let got = s
        .get(u, &format!("/v1/groups/{cid}/members?limit=1000"))
        .await;
    assert_eq!(got["hasMore"], false, "{got}");
    got["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["userId"].as_str().unwrap().to_string(),
                m["role"].as_str().unwrap().to_string(),
                m["mutedUntil"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn m(user: &str, role: &str, muted: i64) -> (String, String, i64) {
    (user.to_string(), role.to_string(), muted)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The group-update `event` of a tip, or "settings" for a settings change.
fn tip_event(msg: &Value) -> String {
    match msg["contentType"].as_i64() {
        Some(8) => "kick".into(),
        Some(9) => msg["payload"]["event"]
            .as_str()
            .unwrap_or("settings")
            .to_string(),
        _ => format!("content type {}", msg["contentType"]),
    }
}

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
    fails(
        &s,
        &alice,
        "POST",
        "/v1/groups",
        Some(json!({"name": "Ghosts", "members": ["bob", "nobody"]})),
        404,
        "user_not_found",
    )
    .await;
    fails(
        &s,
        &alice,
        "POST",
        "/v1/groups",
        Some(json!({"members": ["bob"]})),
        400,
        "bad_request",
    )
    .await;
    fails(
        &s,
        &dave,
        "GET",
        &format!("/v1/groups/{cid}"),
        None,
        403,
        "not_a_member",
    )
    .await;
    fails(
        &s,
        &dave,
        "GET",
        "/v1/groups/987654321",
        None,
        404,
        "group_not_found",
    )
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
    fails(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/kick"),
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
    fails(
        &s,
        &dave,
        "GET",
        &format!("/v1/groups/{cid}/members"),
        None,
        403,
        "not_a_member",
    )
    .await;
    fails(
        &s,
        &dave,
        "POST",
        &format!("/v1/conversations/{cid}/read"),
        Some(json!({"seq": 1})),
        403,
        "not_a_member",
    )
    .await;
}

async fn every_permission_code(b: Backend) {
    let (_db, s) = setup(&b, "group-permissions", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let erin = s.user("erin").await;
    let frank = s.user("frank").await;
    for u in ["gus", "hank"] {
        s.user(u).await;
    }
    let ivan = s.user("ivan").await;
    let newbie = s.user("newbie").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Roles", "members": ["bob", "carol", "dave", "frank"]}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    for admin in ["bob", "frank"] {
        let got = ok(&s, &alice, "PUT", &g(&format!("/admins/{admin}")), None).await;
        assert_eq!(got, json!({"userId": admin, "role": "admin"}));
    }

    // permission_denied, one per rule of the table.
    let denied = [
        (&carol, "PATCH", g(""), Some(json!({"name": "Mine"}))),
        (&carol, "PATCH", g(""), Some(json!({"muteAll": true}))),
        (&carol, "PATCH", g(""), Some(json!({"joinPolicy": "open"}))),
        (
            &bob,
            "POST",
            g("/kick"),
            Some(json!({"userIds": ["frank"]})),
        ),
        (
            &bob,
            "POST",
            g("/kick"),
            Some(json!({"userIds": ["alice"]})),
        ),
        (
            &carol,
            "POST",
            g("/kick"),
            Some(json!({"userIds": ["dave"]})),
        ),
        (
            &bob,
            "POST",
            g("/mute"),
            Some(json!({"userId": "frank", "until": now_ms() + 60_000})),
        ),
        (
            &carol,
            "POST",
            g("/mute"),
            Some(json!({"userId": "dave", "until": now_ms() + 60_000})),
        ),
        (
            &bob,
            "POST",
            g("/transfer"),
            Some(json!({"userId": "carol"})),
        ),
        (
            &carol,
            "POST",
            g("/transfer"),
            Some(json!({"userId": "dave"})),
        ),
        (&bob, "POST", g("/dissolve"), None),
        (&bob, "PUT", g("/admins/carol"), None),
        (&bob, "DELETE", g("/admins/frank"), None),
        (&carol, "PUT", g("/admins/dave"), None),
        (&carol, "GET", g("/join-requests"), None),
    ];
    for (who, method, path, body) in denied {
        let (st, got) = call(&s, who, method, &path, body.clone()).await;
        assert_eq!(
            (st, got["error"]["code"].as_str()),
            (403, Some("permission_denied")),
            "{} {method} {path} {body:?}: {got}",
            who.id
        );
    }
    // What admins and members may do.
    ok(
        &s,
        &bob,
        "PATCH",
        &g(""),
        Some(json!({"notice": "admins may"})),
    )
    .await;
    let got = ok(
        &s,
        &carol,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["gus"]})),
    )
    .await;
    assert_eq!(
        got,
        json!({"added": ["gus"]}),
        "a member adds in an invite group"
    );
    ok(
        &s,
        &alice,
        "PATCH",
        &g(""),
        Some(json!({"joinPolicy": "approval"})),
    )
    .await;
    fails(
        &s,
        &carol,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["hank"]})),
        403,
        "permission_denied",
    )
    .await;
    ok(
        &s,
        &alice,
        "PATCH",
        &g(""),
        Some(json!({"joinPolicy": "invite"})),
    )
    .await;
    let got = ok(
        &s,
        &bob,
        "POST",
        &g("/kick"),
        Some(json!({"userIds": ["gus"]})),
    )
    .await;
    assert_eq!(got, json!({"kicked": ["gus"]}), "an admin kicks a member");

    // muted: one member until a time.
    let carol0 = position(&s, &carol).await;
    let until = now_ms() + 3_600_000;
    let got = ok(
        &s,
        &alice,
        "POST",
        &g("/mute"),
        Some(json!({"userId": "carol", "until": until})),
    )
    .await;
    assert_eq!(got, json!({"userId": "carol", "mutedUntil": until}));
    say_fails(&s, &carol, cid, 2, 403, "muted").await;
    let mut carol_ws = s.connect(&carol, "phone").await;
    let e = send_err(&mut carol_ws, gtext("m1", cid, 2, "hello?")).await;
    assert_eq!(e["code"], "muted", "{e}");
    assert!(
        members(&s, &alice, cid)
            .await
            .contains(&m("carol", "member", until))
    );
    assert_eq!(my_group(&s, &carol, cid).await["mutedUntil"], until);
    let ev = events_after(&s, &carol, carol0).await;
    assert_eq!(
        ev.iter()
            .map(|e| (e["event"].clone(), e["data"].clone()))
            .collect::<Vec<_>>(),
        vec![(
            json!("group.muted"),
            json!({"conversationId": cid, "conversationType": 2, "mutedUntil": until, "by": "alice"})
        )]
    );
    let tips = s.pull_all(&alice, cid).await;
    let tip = tips.last().unwrap();
    assert_eq!(tip["contentType"], 9);
    assert_eq!(tip["payload"]["event"], "memberMuted");
    assert_eq!(tip["payload"]["mutedUntil"], until);
    ok(
        &s,
        &bob,
        "POST",
        &g("/mute"),
        Some(json!({"userId": "dave", "until": until})),
    )
    .await;
    say_fails(&s, &dave, cid, 2, 403, "muted").await;
    let got = ok(
        &s,
        &alice,
        "POST",
        &g("/mute"),
        Some(json!({"userId": "carol", "until": 0})),
    )
    .await;
    assert_eq!(got, json!({"userId": "carol", "mutedUntil": 0}));
    assert_eq!(
        s.pull_all(&alice, cid).await.last().unwrap()["payload"]["event"],
        "memberUnmuted"
    );
    say(&s, &carol, cid, 2, "I may talk again").await;
    let ev = events_after(&s, &carol, carol0).await;
    assert_eq!(ev.last().unwrap()["event"], "group.muted");
    assert_eq!(ev.last().unwrap()["data"]["mutedUntil"], 0);

    // muted: everyone, but owner and admins.
    let got = ok(&s, &alice, "PATCH", &g(""), Some(json!({"muteAll": true}))).await;
    assert_eq!(got["muteAll"], true);
    let tip = s.pull_all(&alice, cid).await.pop().unwrap();
    assert_eq!(
        tip["payload"],
        json!({"operatorId": "alice", "muteAll": true})
    );
    say_fails(&s, &carol, cid, 2, 403, "muted").await;
    let e = send_err(&mut carol_ws, gtext("m2", cid, 2, "and now?")).await;
    assert_eq!(e["code"], "muted", "{e}");
    say(&s, &bob, cid, 2, "admins talk under muteAll").await;
    say(&s, &alice, cid, 2, "owners too").await;
    ok(&s, &alice, "PATCH", &g(""), Some(json!({"muteAll": false}))).await;
    say(&s, &carol, cid, 2, "free again").await;

    // not_a_member, join_closed, already_member, owner_cannot_quit.
    say_fails(&s, &erin, cid, 2, 403, "not_a_member").await;
    fails(
        &s,
        &erin,
        "GET",
        &format!("/v1/conversations/{cid}/messages"),
        None,
        403,
        "not_a_member",
    )
    .await;
    fails(&s, &erin, "GET", &g("/members"), None, 403, "not_a_member").await;
    fails(&s, &erin, "GET", &g(""), None, 403, "not_a_member").await;
    fails(
        &s,
        &erin,
        "POST",
        &g("/join"),
        Some(json!({})),
        403,
        "join_closed",
    )
    .await;
    fails(
        &s,
        &alice,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["carol"]})),
        409,
        "already_member",
    )
    .await;
    let got = ok(
        &s,
        &alice,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["carol", "ivan"]})),
    )
    .await;
    assert_eq!(
        got,
        json!({"added": ["ivan"]}),
        "members already in are left out"
    );
    fails(
        &s,
        &alice,
        "POST",
        &g("/quit"),
        None,
        409,
        "owner_cannot_quit",
    )
    .await;

    // target_not_member: the named user is not a current member; nothing changes.
    for (method, path, body) in [
        ("POST", g("/kick"), Some(json!({"userIds": ["erin"]}))),
        (
            "POST",
            g("/kick"),
            Some(json!({"userIds": ["carol", "erin"]})),
        ),
        ("POST", g("/kick"), Some(json!({"userIds": ["gus"]}))),
        ("PUT", g("/admins/erin"), None),
        ("DELETE", g("/admins/erin"), None),
        (
            "POST",
            g("/mute"),
            Some(json!({"userId": "erin", "until": until})),
        ),
        ("POST", g("/transfer"), Some(json!({"userId": "erin"}))),
    ] {
        let (st, got) = call(&s, &alice, method, &path, body.clone()).await;
        assert_eq!(
            (st, got["error"]["code"].as_str()),
            (404, Some("target_not_member")),
            "{method} {path} {body:?}: {got}"
        );
    }
    assert!(
        members(&s, &alice, cid)
            .await
            .iter()
            .any(|m| m.0 == "carol"),
        "a refused kick kicked no one"
    );

    // group_not_found, request_not_found.
    let nowhere = "/v1/groups/987654321";
    for (method, path, body) in [
        ("GET", nowhere.to_string(), None),
        ("PATCH", nowhere.to_string(), Some(json!({"name": "x"}))),
        ("POST", format!("{nowhere}/join"), Some(json!({}))),
        (
            "POST",
            format!("{nowhere}/members"),
            Some(json!({"userIds": ["bob"]})),
        ),
        (
            "POST",
            format!("{nowhere}/kick"),
            Some(json!({"userIds": ["bob"]})),
        ),
        ("POST", format!("{nowhere}/dissolve"), None),
    ] {
        let (st, got) = call(&s, &alice, method, &path, body).await;
        assert_eq!(
            (st, got["error"]["code"].as_str()),
            (404, Some("group_not_found")),
            "{method} {path}: {got}"
        );
    }
    for verb in ["approve", "reject"] {
        fails(
            &s,
            &alice,
            "POST",
            &g(&format!("/join-requests/erin/{verb}")),
            None,
            404,
            "request_not_found",
        )
        .await;
    }

    // An open group: already_member on join.
    let open = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Open", "members": ["bob"], "joinPolicy": "open"}),
        )
        .await,
    );
    fails(
        &s,
        &bob,
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(json!({})),
        409,
        "already_member",
    )
    .await;
    let got = s.get(&erin, &format!("/v1/groups/{open}")).await;
    assert_eq!(
        got["joinPolicy"], "open",
        "anyone may look at an open group"
    );
    let got = ok(
        &s,
        &erin,
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(json!({})),
    )
    .await;
    assert_eq!(got["state"], "joined");
    fails(
        &s,
        &erin,
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(json!({})),
        409,
        "already_member",
    )
    .await;

    // group_dissolved: every later send and change.
    let bob0 = position(&s, &bob).await;
    let got = ok(&s, &alice, "POST", &g("/dissolve"), None).await;
    assert_eq!(got, json!({"conversationId": cid, "state": "dissolved"}));
    for u in [&bob, &carol, &dave, &frank, &ivan] {
        let info = my_group(&s, u, cid).await;
        assert_eq!(
            (info["memberState"].as_str(), info["state"].as_str()),
            (Some("dissolved"), Some("dissolved")),
            "{}: {info}",
            u.id
        );
    }
    let dissolved = named(&events_after(&s, &bob, bob0).await, "group.dissolved")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(dissolved.len(), 1);
    assert_eq!(
        dissolved[0]["data"],
        json!({"conversationId": cid, "conversationType": 2, "by": "alice"})
    );
    let last = s.pull_all(&bob, cid).await.pop().unwrap();
    assert_eq!(
        (
            last["contentType"].as_i64(),
            last["payload"]["event"].as_str()
        ),
        (Some(9), Some("dissolved"))
    );
    say_fails(&s, &bob, cid, 2, 409, "group_dissolved").await;
    let mut bob_ws = s.connect(&bob, "phone").await;
    let e = send_err(&mut bob_ws, gtext("d1", cid, 2, "anyone?")).await;
    assert_eq!(e["code"], "group_dissolved", "{e}");
    say_fails(&s, &alice, cid, 2, 409, "group_dissolved").await;
    for (method, path, body) in [
        ("PATCH", g(""), Some(json!({"name": "Back"}))),
        ("POST", g("/members"), Some(json!({"userIds": ["erin"]}))),
        ("POST", g("/dissolve"), None),
    ] {
        let (st, got) = call(&s, &alice, method, &path, body).await;
        assert_eq!(
            (st, got["error"]["code"].as_str()),
            (409, Some("group_dissolved")),
            "{method} {path}: {got}"
        );
    }
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{open}/dissolve"),
        None,
    )
    .await;
    fails(
        &s,
        &newbie,
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(json!({})),
        409,
        "group_dissolved",
    )
    .await;
    // The history stays readable.
    assert!(!s.pull_all(&carol, cid).await.is_empty());
}

async fn group_full_limit(b: Backend) {
    let (_db, s) = setup(&b, "group-full", "[messaging]\nmax_group_members = 3\n").await;
    let alice = s.user("alice").await;
    for u in ["bob", "carol", "dave"] {
        s.user(u).await;
    }
    let erin = s.user("erin").await;
    let frank = s.user("frank").await;
    fails(
        &s,
        &alice,
        "POST",
        "/v1/groups",
        Some(json!({"name": "Too many", "members": ["bob", "carol", "dave"]})),
        409,
        "group_full",
    )
    .await;
    let full = create(
        &s,
        &alice,
        json!({"name": "Three", "members": ["bob", "carol"]}),
    )
    .await;
    assert_eq!(full["memberCount"], 3);
    let cid = id_of(&full);
    fails(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/members"),
        Some(json!({"userIds": ["dave"]})),
        409,
        "group_full",
    )
    .await;
    let open = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Open", "members": ["bob"], "joinPolicy": "open"}),
        )
        .await,
    );
    let got = ok(
        &s,
        &erin,
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(json!({})),
    )
    .await;
    assert_eq!(got["state"], "joined");
    fails(
        &s,
        &frank,
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(json!({})),
        409,
        "group_full",
    )
    .await;
    assert_eq!(
        s.get(&alice, &format!("/v1/groups/{open}")).await["memberCount"],
        3
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
    // Asking again updates the pending request.
    let again = ok(
        &s,
        &dave,
        "POST",
        &g("/join"),
        Some(json!({"message": "please"})),
    )
    .await;
    assert_eq!(again, json!({"state": "pending", "requestId": rid}));
    let erin_rid = ok(&s, &erin, "POST", &g("/join"), Some(json!({}))).await["requestId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(erin_rid, rid);
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
    fails(
        &s,
        &carol,
        "POST",
        &g("/join-requests/dave/approve"),
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
        fails(
            &s,
            &alice,
            "POST",
            &g(&format!("/join-requests/dave/{verb}")),
            None,
            409,
            "request_not_pending",
        )
        .await;
    }
    fails(
        &s,
        &dave,
        "POST",
        &g("/join"),
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
    fails(
        &s,
        &bob,
        "POST",
        &g("/join-requests/erin/reject"),
        None,
        409,
        "request_not_pending",
    )
    .await;
    fails(
        &s,
        &bob,
        "POST",
        &g("/join-requests/erin/approve"),
        None,
        409,
        "request_not_pending",
    )
    .await;
    assert_eq!(
        s.get(&alice, &g("/join-requests")).await["requests"],
        json!([])
    );
    fails(
        &s,
        &alice,
        "POST",
        &g("/join-requests/frank/approve"),
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
    let got = ok(
        &s,
        &alice,
        "POST",
        &g("/members"),
        Some(json!({"userIds": ["frank"]})),
    )
    .await;
    assert_eq!(got, json!({"added": ["frank"]}));
    assert_eq!(
        s.get(&alice, &g("/join-requests")).await["requests"],
        json!([])
    );
    fails(
        &s,
        &alice,
        "POST",
        &g("/join-requests/frank/approve"),
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

async fn owner_transfer_admins_and_mutes(b: Backend) {
    let (_db, s) = setup(&b, "group-roles", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Roles", "members": ["bob", "carol"]}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let (a0, b0, c0) = (
        position(&s, &alice).await,
        position(&s, &bob).await,
        position(&s, &carol).await,
    );
    let role = |role: &str, by: &str| json!({"conversationId": cid, "conversationType": 2, "role": role, "by": by});

    let got = ok(&s, &alice, "PUT", &g("/admins/bob"), None).await;
    assert_eq!(got, json!({"userId": "bob", "role": "admin"}));
    assert_eq!(my_group(&s, &bob, cid).await["role"], "admin");
    assert_eq!(
        members(&s, &carol, cid).await,
        vec![
            m("alice", "owner", 0),
            m("bob", "admin", 0),
            m("carol", "member", 0)
        ]
    );
    ok(
        &s,
        &bob,
        "PATCH",
        &g(""),
        Some(json!({"notice": "by an admin"})),
    )
    .await;
    let got = ok(&s, &alice, "DELETE", &g("/admins/bob"), None).await;
    assert_eq!(got, json!({"userId": "bob", "role": "member"}));
    fails(
        &s,
        &bob,
        "PATCH",
        &g(""),
        Some(json!({"notice": "no longer"})),
        403,
        "permission_denied",
    )
    .await;
    let ev = events_after(&s, &bob, b0).await;
    assert_eq!(
        named(&ev, "group.role")
            .iter()
            .map(|e| e["data"].clone())
            .collect::<Vec<_>>(),
        vec![role("admin", "alice"), role("member", "alice")]
    );

    // Transfer: carol owns it, alice is an ordinary member and may leave.
    let info = ok(
        &s,
        &alice,
        "POST",
        &g("/transfer"),
        Some(json!({"userId": "carol"})),
    )
    .await;
    assert_eq!(info["ownerId"], "carol");
    assert_eq!(info["conversationId"], cid);
    assert_eq!(
        members(&s, &bob, cid).await,
        vec![
            m("alice", "member", 0),
            m("bob", "member", 0),
            m("carol", "owner", 0)
        ]
    );
    let ev = events_after(&s, &carol, c0).await;
    assert_eq!(
        named(&ev, "group.role")
            .iter()
            .map(|e| e["data"].clone())
            .collect::<Vec<_>>(),
        vec![role("owner", "alice")]
    );
    let ev = events_after(&s, &alice, a0).await;
    assert_eq!(
        named(&ev, "group.role")
            .iter()
            .map(|e| e["data"].clone())
            .collect::<Vec<_>>(),
        vec![role("member", "alice")]
    );
    fails(
        &s,
        &alice,
        "POST",
        &g("/dissolve"),
        None,
        403,
        "permission_denied",
    )
    .await;
    fails(
        &s,
        &alice,
        "PUT",
        &g("/admins/bob"),
        None,
        403,
        "permission_denied",
    )
    .await;
    fails(
        &s,
        &carol,
        "POST",
        &g("/quit"),
        None,
        409,
        "owner_cannot_quit",
    )
    .await;
    let got = ok(&s, &alice, "POST", &g("/quit"), None).await;
    assert_eq!(got, json!({"conversationId": cid, "memberState": "left"}));

    // Mute and unmute.
    let until = now_ms() + 3_600_000;
    let got = ok(
        &s,
        &carol,
        "POST",
        &g("/mute"),
        Some(json!({"userId": "bob", "until": until})),
    )
    .await;
    assert_eq!(got, json!({"userId": "bob", "mutedUntil": until}));
    assert_eq!(my_group(&s, &bob, cid).await["mutedUntil"], until);
    assert!(
        members(&s, &carol, cid)
            .await
            .contains(&m("bob", "member", until))
    );
    say_fails(&s, &bob, cid, 2, 403, "muted").await;
    let got = ok(
        &s,
        &carol,
        "POST",
        &g("/mute"),
        Some(json!({"userId": "bob", "until": 0})),
    )
    .await;
    assert_eq!(got, json!({"userId": "bob", "mutedUntil": 0}));
    say(&s, &bob, cid, 2, "unmuted").await;
    let ev = events_after(&s, &bob, b0).await;
    assert_eq!(
        named(&ev, "group.muted")
            .iter()
            .map(|e| e["data"].clone())
            .collect::<Vec<_>>(),
        vec![
            json!({"conversationId": cid, "conversationType": 2, "mutedUntil": until, "by": "carol"}),
            json!({"conversationId": cid, "conversationType": 2, "mutedUntil": 0, "by": "carol"}),
        ]
    );

    // Every change is a tip, in order.
    let msgs = s.pull_all(&bob, cid).await;
    let tips: Vec<String> = msgs
        .iter()
        .filter(|m| m["contentType"] != 1)
        .map(tip_event)
        .collect();
    assert_eq!(
        tips,
        vec![
            "created",
            "adminAdded",
            "settings",
            "adminRemoved",
            "ownerChanged",
            "left",
            "memberMuted",
            "memberUnmuted"
        ]
    );
    let muted = msgs
        .iter()
        .find(|m| m["payload"]["event"] == "memberMuted")
        .unwrap();
    assert_eq!(muted["payload"]["mutedUntil"], until);
    assert_eq!(muted["payload"]["operatorId"], "carol");
    let unread = overview(&s, &bob, cid).await["unread"].clone();
    assert_eq!(unread, 0, "tips never count");
}

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
    fails(
        &s,
        &bob,
        "GET",
        &g("/members"),
        None,
        403,
        "permission_denied",
    )
    .await;
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

    fails(
        &s,
        &alice,
        "POST",
        &g("/receipts"),
        Some(json!({"seqs": [999]})),
        404,
        "message_not_found",
    )
    .await;
    fails(
        &s,
        &alice,
        "POST",
        &g("/receipts"),
        Some(json!({"seqs": []})),
        400,
        "bad_request",
    )
    .await;
    let many: Vec<i64> = (1..=101).collect();
    fails(
        &s,
        &alice,
        "POST",
        &g("/receipts"),
        Some(json!({ "seqs": many })),
        400,
        "bad_request",
    )
    .await;
    fails(
        &s,
        &frank,
        "POST",
        &g("/receipts"),
        Some(json!({"seqs": [2]})),
        403,
        "not_a_member",
    )
    .await;
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
    // The peer's read receipt.
    let positions = s
        .get(&bob, &format!("/v1/conversations/{pid}/read-positions"))
        .await;
    assert_eq!(
        positions["positions"],
        json!([{"userId": "alice", "readSeq": 5}])
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
    fails(
        &s,
        &carol,
        "GET",
        &format!("/v1/conversations/{cid}/read-positions"),
        None,
        403,
        "not_a_member",
    )
    .await;
    fails(
        &s,
        &carol,
        "POST",
        &g("/receipts"),
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
    fails(
        &s,
        &dave,
        "POST",
        &g("/receipts"),
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

/// Typing and call signals follow a group's mutes like stored messages.
async fn live_kinds_honour_mutes(b: Backend) {
    let (_db, s) = setup(&b, "live-mutes", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "M", "members": ["bob"]})).await);
    let typing = |id: &str| {
        json!({"type": "send", "id": id, "clientMsgId": id, "conversationType": 2,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}})
    };
    let mut bob_ws = s.connect(&bob, "phone").await;
    send_ok(&mut bob_ws, typing("t1")).await;
    let until = now_ms() + 3_600_000;
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/mute"),
        Some(json!({"userId": "bob", "until": until})),
    )
    .await;
    assert_eq!(send_err(&mut bob_ws, typing("t2")).await["code"], "muted");
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/mute"),
        Some(json!({"userId": "bob", "until": 0})),
    )
    .await;
    send_ok(&mut bob_ws, typing("t3")).await;
    ok(
        &s,
        &alice,
        "PATCH",
        &format!("/v1/groups/{cid}"),
        Some(json!({"muteAll": true})),
    )
    .await;
    assert_eq!(send_err(&mut bob_ws, typing("t4")).await["code"], "muted");
    let mut alice_ws = s.connect(&alice, "phone").await;
    send_ok(&mut alice_ws, typing("t5")).await;
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

/// A request made while a group needed approval is answered when its requester joins the
/// group after it was opened.
async fn joining_an_opened_group_answers_the_pending_request(b: Backend) {
    let (_db, s) = setup(&b, "opened-join", "").await;
    let alice = s.user("alice").await;
    let dave = s.user("dave").await;
    let cid = id_of(&create(&s, &alice, json!({"name": "A", "joinPolicy": "approval"})).await);
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let asked = ok(
        &s,
        &dave,
        "POST",
        &g("/join"),
        Some(json!({"message": "hi"})),
    )
    .await;
    assert_eq!(asked["state"], "pending");
    ok(
        &s,
        &alice,
        "PATCH",
        &g(""),
        Some(json!({"joinPolicy": "open"})),
    )
    .await;
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
    fails(&s, &dave, "GET", &g(""), None, 403, "not_a_member").await;
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
