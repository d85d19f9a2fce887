//! Devices as records of their own, and delivery receipts, as a client sees them: a device
//! is registered when it first connects, listed with whether it is online, removed by its
//! user (its connection closed with 4009, its id refused until registered again); a
//! `received` frame moves the user's delivered position, the other member of a private
//! conversation hears of it, group receipts count it. The real binary on loopback, on
//! SQLite and on PostgreSQL.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::groups::{create, id_of, say};
use common::server::{Backend, Server, User, Ws, call, conv, ok, peer, send_ok, setup, text};
use serde_json::{Value, json};

on_both!(
    devices_register_list_and_go,
    a_user_has_at_most_the_devices_allowed,
    received_moves_the_delivered_position,
    group_receipts_count_deliveries,
    receipts_switched_off,
);

/// The user's devices as `GET /v1/devices` lists them, by id.
async fn devices(s: &Server, u: &User) -> Vec<Value> {
    s.get(u, "/v1/devices").await["devices"]
        .as_array()
        .unwrap()
        .clone()
}

/// Waits (safety net 20 s) until the device's `online` is `want`.
async fn until_online(s: &Server, u: &User, device: &str, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = devices(s, u).await;
        let d = list.iter().find(|d| d["deviceId"] == device);
        if d.is_some_and(|d| d["online"] == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{device} never became online={want}: {list:?}"
        );
        tokio::task::yield_now().await;
    }
}

async fn devices_register_list_and_go(b: Backend) {
    let (_db, s) = setup(&b, "devices", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    assert!(devices(&s, &alice).await.is_empty());

    // Registered by connecting, with the name and platform the connection gives.
    let mut phone = Ws::connect_query(
        &s.addr,
        &alice.token,
        "phone",
        "&deviceName=Alice%27s%20phone&platform=ios",
    )
    .await
    .unwrap();
    let laptop = s.connect(&alice, "laptop").await;
    let list = devices(&s, &alice).await;
    let ids: Vec<&str> = list
        .iter()
        .map(|d| d["deviceId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["laptop", "phone"], "{list:?}");
    let p = &list[1];
    assert_eq!(
        (&p["name"], &p["platform"], &p["online"], &p["pushProvider"]),
        (
            &json!("Alice's phone"),
            &json!("ios"),
            &json!(true),
            &Value::Null
        ),
        "{p}"
    );
    assert!(p["firstSeen"].as_i64().unwrap() <= p["lastSeen"].as_i64().unwrap());
    assert!(devices(&s, &bob).await.is_empty(), "devices are per user");

    // Gone offline, still listed.
    laptop.close().await;
    until_online(&s, &alice, "laptop", false).await;

    // A push token: set, shown by provider (never the token), cleared.
    let got = ok(
        &s,
        &alice,
        "PUT",
        "/v1/devices/phone/push",
        Some(json!({"provider": "apns", "token": "0f1e2d3c"})),
    )
    .await;
    assert_eq!(got, json!({"deviceId": "phone", "provider": "apns"}));
    let p = devices(&s, &alice).await[1].clone();
    assert_eq!(p["pushProvider"], "apns", "{p}");
    assert!(
        !p.to_string().contains("0f1e2d3c"),
        "the token is never shown: {p}"
    );

    // Refusals, each with its documented code.
    let (a, b) = (Some(alice.token.as_str()), Some(bob.token.as_str()));
    let push = |provider: &str, token: &str| Some(json!({"provider": provider, "token": token}));
    let long_name = Some(json!({"deviceId": "ok", "name": "x".repeat(65)}));
    s.expect_errors(&[
        (
            a,
            "DELETE",
            "/v1/devices/tablet",
            None,
            404,
            "device_not_found",
        ),
        (
            b,
            "DELETE",
            "/v1/devices/phone",
            None,
            404,
            "device_not_found",
        ),
        (
            a,
            "DELETE",
            "/v1/devices/no%20spaces",
            None,
            400,
            "bad_request",
        ),
        (
            a,
            "PUT",
            "/v1/devices/tablet/push",
            push("apns", "t"),
            404,
            "device_not_found",
        ),
        (
            a,
            "PUT",
            "/v1/devices/phone/push",
            push("APNS", "t"),
            400,
            "bad_request",
        ),
        (
            a,
            "PUT",
            "/v1/devices/phone/push",
            push("apns", "has space"),
            400,
            "bad_request",
        ),
        (a, "POST", "/v1/devices", long_name, 400, "bad_request"),
        (
            a,
            "POST",
            "/v1/devices",
            Some(json!({"deviceId": ".."})),
            400,
            "bad_request",
        ),
        (None, "GET", "/v1/devices", None, 401, "unauthorized"),
    ])
    .await;

    // Removed: its connection is told and closed with 4009, its token goes, it is no
    // longer listed, and its id may not connect again.
    let got = ok(&s, &alice, "DELETE", "/v1/devices/phone", None).await;
    assert_eq!(got, json!({"deviceId": "phone", "removed": true}));
    let (code, frames) = phone.closed().await;
    assert_eq!(code, Some(4009), "{frames:?}");
    assert!(
        frames
            .iter()
            .any(|f| f["type"] == "kicked" && f["reason"] == "device_removed"),
        "{frames:?}"
    );
    let ids: Vec<String> = devices(&s, &alice)
        .await
        .iter()
        .map(|d| d["deviceId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["laptop"]);
    assert_eq!(
        Ws::connect(&s.addr, &alice.token, "phone").await.err(),
        Some(403),
        "a removed device connected again"
    );
    let (st, got) = call(&s, &alice, "DELETE", "/v1/devices/phone", None).await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (404, Some("device_not_found"))
    );

    // Registered again explicitly, it may connect; its old token did not come back.
    let got = ok(
        &s,
        &alice,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "phone", "name": "new phone", "platform": "android"})),
    )
    .await;
    assert_eq!(
        (&got["deviceId"], &got["name"], &got["pushProvider"]),
        (&json!("phone"), &json!("new phone"), &Value::Null),
        "{got}"
    );
    let _phone = s.connect(&alice, "phone").await;
    until_online(&s, &alice, "phone", true).await;
    // Registering a known device again changes what it gives and keeps the rest.
    let got = ok(
        &s,
        &alice,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "phone", "name": "renamed"})),
    )
    .await;
    assert_eq!(
        (&got["name"], &got["platform"], &got["online"]),
        (&json!("renamed"), &json!("android"), &json!(true)),
        "{got}"
    );
    assert!(
        got["firstSeen"].as_i64() <= got["lastSeen"].as_i64(),
        "{got}"
    );
}

/// The next frame of `kind` (other frames skipped).
async fn a_user_has_at_most_the_devices_allowed(b: Backend) {
    let (_db, s) = setup(&b, "device-cap", "[messaging]\nmax_devices_per_user = 3\n").await;
    let alice = s.user("alice").await;
    // Six registrations at once, each on a connection of its own: three are taken.
    let server = &s;
    let user = &alice;
    let answers = futures_util::future::join_all((0..6).map(|i| async move {
        let body = json!({"deviceId": format!("d{i}")});
        call(server, user, "POST", "/v1/devices", Some(body)).await
    }))
    .await;
    let refused: Vec<&Value> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .map(|(_, body)| body)
        .collect();
    assert_eq!(refused.len(), 3, "{answers:?}");
    for r in &refused {
        assert_eq!(r["error"]["code"], "too_many_devices", "{r}");
    }
    let held: Vec<String> = devices(&s, &alice)
        .await
        .iter()
        .map(|d| d["deviceId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(held.len(), 3, "{held:?}");
    // A fourth, by connecting, is refused before the upgrade; one of the three connects
    // and is registered again as it is.
    assert_eq!(
        Ws::connect(&s.addr, &alice.token, "another").await.err(),
        Some(409)
    );
    let mut ws = s.connect(&alice, &held[0]).await;
    ws.send(json!({"type": "ping", "id": "p"})).await;
    ws.expect("pong").await;
    ok(
        &s,
        &alice,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": held[1], "name": "renamed"})),
    )
    .await;
    // Removing one makes room.
    ok(
        &s,
        &alice,
        "DELETE",
        &format!("/v1/devices/{}", held[2]),
        None,
    )
    .await;
    let mut another = s.connect(&alice, "another").await;
    another.send(json!({"type": "ping", "id": "p"})).await;
    another.expect("pong").await;
    s.expect_error(
        "POST",
        "/v1/devices",
        Some(&alice.token),
        Some(json!({"deviceId": held[2]})),
        409,
        "too_many_devices",
    )
    .await;
}

async fn next_of(ws: &mut Ws, kind: &str) -> Value {
    ws.until(|f| f["type"] == kind).await.0
}

async fn received_moves_the_delivered_position(b: Backend) {
    let (_db, s) = setup(&b, "received", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let mut a = s.connect(&alice, "phone").await;
    let mut a2 = s.connect(&alice, "laptop").await;
    let mut bws = s.connect(&bob, "phone").await;
    let mut cid = 0;
    for i in 1..=3 {
        let ack = send_ok(
            &mut a,
            text(&format!("s{i}"), &format!("m{i}"), peer("bob"), "hi"),
        )
        .await;
        cid = ack["conversationId"].as_i64().unwrap();
        assert_eq!(bws.expect("notify").await["seq"], i);
    }
    let received = |id: &str, seq: i64| json!({"type": "received", "id": id, "conversationId": cid, "seq": seq});
    // Moved: answered, and both of alice's devices hear of it.
    bws.send(received("r1", 2)).await;
    let ack = next_of(&mut bws, "ack").await;
    assert_eq!(
        ack,
        json!({"type": "ack", "id": "r1", "conversationId": cid, "deliveredSeq": 2, "moved": true})
    );
    for ws in [&mut a, &mut a2] {
        let d = next_of(ws, "delivered").await;
        assert_eq!(
            d,
            json!({"type": "delivered", "conversationId": cid, "userId": "bob", "seq": 2})
        );
    }
    // Not moved (behind the position): answered, nobody told. Beyond the end: the end.
    bws.send(received("r2", 1)).await;
    let ack = next_of(&mut bws, "ack").await;
    assert_eq!((&ack["id"], &ack["moved"]), (&json!("r2"), &json!(false)));
    bws.send(received("r3", 99)).await;
    let ack = next_of(&mut bws, "ack").await;
    assert_eq!(
        (&ack["id"], &ack["deliveredSeq"], &ack["moved"]),
        (&json!("r3"), &json!(3), &json!(true))
    );
    // The next notice alice gets is the move to 3: nothing was told for the one to 1.
    assert_eq!(next_of(&mut a, "delivered").await["seq"], 3);
    // Over HTTP too; a conversation not yours is refused.
    let got = ok(
        &s,
        &bob,
        "POST",
        &format!("/v1/conversations/{cid}/received"),
        Some(json!({"seq": 3})),
    )
    .await;
    assert_eq!(
        got,
        json!({"conversationId": cid, "deliveredSeq": 3, "moved": false})
    );
    let (st, got) = call(
        &s,
        &carol,
        "POST",
        &format!("/v1/conversations/{cid}/received"),
        Some(json!({"seq": 1})),
    )
    .await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (403, Some("not_a_member"))
    );
    // Read positions show it, for one who is offline to catch up on.
    let positions = s
        .get(&alice, &format!("/v1/conversations/{cid}/read-positions"))
        .await;
    assert_eq!(
        positions["positions"],
        json!([{"userId": "bob", "readSeq": 0, "deliveredSeq": 3}])
    );
    // A read delivers too.
    say_to(&mut a, "s4", "m4", cid).await;
    bws.expect("notify").await;
    bws.send(json!({"type": "read", "id": "rd", "conversationId": cid, "seq": 4}))
        .await;
    next_of(&mut bws, "ack").await;
    let positions = s
        .get(&alice, &format!("/v1/conversations/{cid}/read-positions"))
        .await;
    assert_eq!(
        positions["positions"],
        json!([{"userId": "bob", "readSeq": 4, "deliveredSeq": 4}])
    );
}

async fn say_to(ws: &mut Ws, id: &str, cmid: &str, cid: i64) -> Value {
    send_ok(ws, text(id, cmid, conv(cid), "more")).await
}

async fn group_receipts_count_deliveries(b: Backend) {
    let (_db, s) = setup(&b, "group-received", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let dave = s.user("dave").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Receipts", "members": ["bob", "carol", "dave"]}),
        )
        .await,
    );
    // Joining puts the delivered position where the read one is: nothing to move there.
    let got = ok(
        &s,
        &bob,
        "POST",
        &format!("/v1/conversations/{cid}/received"),
        Some(json!({"seq": 1})),
    )
    .await;
    assert_eq!(
        got,
        json!({"conversationId": cid, "deliveredSeq": 1, "moved": false})
    );
    let first = say(&s, &alice, cid, 2, "one").await;
    let second = say(&s, &alice, cid, 2, "two").await;
    // bob's device got both, carol's the first; dave read the first (reading delivers).
    let receive = |u: &User, seq: i64| {
        let (s, u) = (&s, u.clone());
        async move {
            ok(
                s,
                &u,
                "POST",
                &format!("/v1/conversations/{cid}/received"),
                Some(json!({"seq": seq})),
            )
            .await
        }
    };
    receive(&bob, second).await;
    receive(&carol, first).await;
    ok(
        &s,
        &dave,
        "POST",
        &format!("/v1/conversations/{cid}/read"),
        Some(json!({"seq": first})),
    )
    .await;
    let got = ok(
        &s,
        &alice,
        "POST",
        &format!("/v1/groups/{cid}/receipts"),
        Some(json!({"seqs": [first, second]})),
    )
    .await;
    assert_eq!(
        got["receipts"],
        json!([
            {"seq": first, "read": 1, "delivered": 3, "of": 3},
            {"seq": second, "read": 0, "delivered": 1, "of": 3},
        ])
    );
    // No delivery notice in groups: alice's device sees none (her next frame is the
    // notify of carol's message).
    let mut a = s.connect(&alice, "phone").await;
    receive(&carol, second).await;
    say(&s, &carol, cid, 2, "three").await;
    let f = a.next().await.unwrap();
    assert_eq!(
        (&f["type"], &f["senderId"]),
        (&json!("notify"), &json!("carol")),
        "{f}"
    );
}

async fn receipts_switched_off(b: Backend) {
    let (_db, s) = setup(
        &b,
        "receipts-off",
        "[messaging]\ndelivery_receipts = false\n",
    )
    .await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let mut a = s.connect(&alice, "phone").await;
    let mut bws = s.connect(&bob, "phone").await;
    assert_eq!(bws.hello["receipts"], false, "{}", bws.hello);
    let ack = send_ok(&mut a, text("s1", "m1", peer("bob"), "hi")).await;
    let cid = ack["conversationId"].as_i64().unwrap();
    bws.expect("notify").await;
    bws.send(json!({"type": "received", "id": "r1", "conversationId": cid, "seq": 1}))
        .await;
    let ack = next_of(&mut bws, "ack").await;
    assert_eq!(
        ack,
        json!({"type": "ack", "id": "r1", "conversationId": cid, "deliveredSeq": 1, "moved": false})
    );
    // alice is told nothing: her next frame is bob's message.
    send_ok(&mut bws, text("s2", "m2", conv(cid), "hello")).await;
    let f = a.next().await.unwrap();
    assert_eq!(
        (&f["type"], &f["seq"]),
        (&json!("notify"), &json!(2)),
        "{f}"
    );
    let positions = s
        .get(&alice, &format!("/v1/conversations/{cid}/read-positions"))
        .await;
    // bob's own send moved his read position (and so his delivered one); the received
    // frame wrote nothing.
    assert_eq!(
        positions["positions"],
        json!([{"userId": "bob", "readSeq": 2, "deliveredSeq": 2}])
    );
}
