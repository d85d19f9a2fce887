//! Groups end to end, as a client sees them: every permission code, the member limit, roles
//! (admins, the owner's transfer) and mutes, of stored and live kinds. The real binary on
//! loopback, every test on SQLite and (when `PG_TEST_URL` is set) on PostgreSQL.

#[macro_use]
mod common;

use common::groups::{
    create, events_after, gtext, id_of, m, members, my_group, named, overview, position, say,
    say_fails,
};
use common::server::{Backend, User, call, ok, send_err, send_ok, setup};
use serde_json::{Value, json};

on_both!(
    every_permission_code,
    group_full_limit,
    the_longest_member_lists,
    owner_transfer_admins_and_mutes,
    live_kinds_honour_mutes,
);

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
    s.expect_error(
        "POST",
        &g("/members"),
        Some(&carol.token),
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
    s.expect_errors(&[
        (
            Some(&erin.token),
            "GET",
            &format!("/v1/conversations/{cid}/messages"),
            None,
            403,
            "not_a_member",
        ),
        (
            Some(&erin.token),
            "GET",
            &g("/members"),
            None,
            403,
            "not_a_member",
        ),
        (Some(&erin.token), "GET", &g(""), None, 403, "not_a_member"),
        (
            Some(&erin.token),
            "POST",
            &g("/join"),
            Some(json!({})),
            403,
            "join_closed",
        ),
        (
            Some(&alice.token),
            "POST",
            &g("/members"),
            Some(json!({"userIds": ["carol"]})),
            409,
            "already_member",
        ),
    ])
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
    s.expect_error(
        "POST",
        &g("/quit"),
        Some(&alice.token),
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
        s.expect_error(
            "POST",
            &g(&format!("/join-requests/erin/{verb}")),
            Some(&alice.token),
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
    s.expect_error(
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(&bob.token),
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
    s.expect_error(
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(&erin.token),
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
    // A live kind gets the same answer as a stored one.
    let typing = json!({"type": "send", "id": "d2", "clientMsgId": "d2", "conversationType": 2,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}});
    let e = send_err(&mut bob_ws, typing).await;
    assert_eq!(e["code"], "group_dissolved", "{e}");
    // Someone who never was a member is told just that.
    let mut erin_ws = s.connect(&erin, "phone").await;
    let typing = json!({"type": "send", "id": "d3", "clientMsgId": "d3", "conversationType": 2,
        "conversationId": cid, "contentType": 5, "payload": {"state": "typing"}});
    let e = send_err(&mut erin_ws, typing).await;
    assert_eq!(e["code"], "not_a_member", "{e}");
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
    s.expect_error(
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(&newbie.token),
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
    s.expect_error(
        "POST",
        "/v1/groups",
        Some(&alice.token),
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
    s.expect_error(
        "POST",
        &format!("/v1/groups/{cid}/members"),
        Some(&alice.token),
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
    s.expect_error(
        "POST",
        &format!("/v1/groups/{open}/join"),
        Some(&frank.token),
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

/// A group made and filled with as many users as one creation, one add and one kick may
/// name, every id as long as ids go: each answers, and each tip lists them all.
async fn the_longest_member_lists(b: Backend) {
    let (_db, s) = setup(&b, "group-long-lists", "").await;
    let alice = s.user("alice").await;
    // 1,999 users with ids of 64 characters, known from their first request.
    let users: Vec<User> = (0..1999)
        .map(|k| {
            let id = format!("{k:_>64}");
            User {
                token: s.deployer_token(&id, None),
                id,
            }
        })
        .collect();
    for chunk in users.chunks(50) {
        futures_util::future::join_all(chunk.iter().map(|u| s.get(u, "/v1/friends"))).await;
    }
    let ids: Vec<&str> = users.iter().map(|u| u.id.as_str()).collect();
    s.expect_error(
        "POST",
        "/v1/groups",
        Some(&alice.token),
        Some(json!({"name": "Too many at once", "members": &ids[..1001]})),
        400,
        "bad_request",
    )
    .await;
    let info = create(&s, &alice, json!({"name": "Long", "members": &ids[..1000]})).await;
    assert_eq!(info["memberCount"], 1001, "{info}");
    let cid = id_of(&info);
    let added = ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/members"),
        Some(json!({"userIds": &ids[1000..]})),
    )
    .await;
    assert_eq!(
        added["added"].as_array().map(Vec::len),
        Some(999),
        "{added}"
    );
    ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/kick"),
        Some(json!({"userIds": &ids[1899..]})),
    )
    .await;
    assert_eq!(
        s.get(&alice, &format!("/v1/groups/{cid}")).await["memberCount"],
        1900
    );

    let tips: Vec<(String, usize)> = s
        .pull_all(&users[0], cid)
        .await
        .iter()
        .map(|m| {
            let listed = ["userIds", "kickedUserIds"]
                .iter()
                .find_map(|f| m["payload"][f].as_array())
                .map_or(0, Vec::len);
            (tip_event(m), listed)
        })
        .collect();
    assert_eq!(
        tips,
        [
            ("created".to_string(), 1000),
            ("membersAdded".to_string(), 999),
            ("kick".to_string(), 100)
        ],
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
    s.expect_error(
        "PATCH",
        &g(""),
        Some(&bob.token),
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
    s.expect_errors(&[
        (
            Some(&alice.token),
            "POST",
            &g("/dissolve"),
            None,
            403,
            "permission_denied",
        ),
        (
            Some(&alice.token),
            "PUT",
            &g("/admins/bob"),
            None,
            403,
            "permission_denied",
        ),
        (
            Some(&carol.token),
            "POST",
            &g("/quit"),
            None,
            409,
            "owner_cannot_quit",
        ),
    ])
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
