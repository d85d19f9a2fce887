//! End-to-end encryption support as a client sees it: the key directory (uploads checked,
//! one-time prekeys handed out once even to racing claimers, the last-resort key after,
//! claims rate-limited, `keys.low`, signed prekey rotation), per-device mailboxes (pushed,
//! pulled, acknowledged, resent, bounded, expiring, gone with their device), and the
//! runnable example (`examples/e2e`): two users, two devices each, X3DH, mailboxes and
//! group sender keys with real cryptography — after which the database holds no
//! plaintext. The real binary on loopback, on SQLite and on PostgreSQL.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::server::{Backend, Db, Server, User, call, ok, setup};
use curve25519_dalek::montgomery::MontgomeryPoint;
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{Value, json};

on_both!(
    uploads_are_checked,
    racing_claimers_never_share_a_one_time_prekey,
    a_retried_upload_never_offers_a_handed_out_prekey_again,
    claims_are_limited_and_low_keys_are_told,
    a_rotated_signed_prekey_stays_for_its_grace,
    mailboxes_push_pull_and_forget,
    racing_resends_store_once_and_a_connection_s_sends_keep_their_order,
    a_device_removed_while_sent_to_or_uploading_keeps_nothing,
    mailbox_entries_expire,
    the_example_leaves_no_plaintext_in_the_database,
);

const E2E: &str = "[e2e]\nclaims_per_minute = 1000\n";

fn random32() -> [u8; 32] {
    std::array::from_fn(|_| fastrand::u8(..))
}

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// An X25519 public key (of a random private one).
fn x25519() -> [u8; 32] {
    MontgomeryPoint::mul_base_clamped(random32()).to_bytes()
}

/// A device's signing key and identity key.
struct Keys {
    signing: SigningKey,
    identity: [u8; 32],
}

impl Keys {
    fn new() -> Keys {
        Keys {
            signing: SigningKey::from_bytes(&random32()),
            identity: x25519(),
        }
    }

    fn sign(&self, context: &[u8], parts: &[&[u8]]) -> String {
        let mut m = context.to_vec();
        for p in parts {
            m.extend_from_slice(p);
        }
        b64(&self.signing.sign(&m).to_bytes())
    }

    fn prekey(&self, context: &[u8], id: i64) -> Value {
        let key = x25519();
        json!({"keyId": id, "publicKey": b64(&key),
            "signature": self.sign(context, &[&id.to_be_bytes(), &key])})
    }

    /// A full upload: identity, a signed prekey `spk`, a last-resort one, one-time
    /// prekeys with `ids`.
    fn upload(&self, spk: i64, ids: std::ops::Range<i64>) -> Value {
        let mut body = self.identity_part();
        body["signedPrekey"] = self.prekey(b"courier:signed-prekey:v1", spk);
        body["lastResortPrekey"] = self.prekey(b"courier:last-resort-prekey:v1", 1_000_000);
        body["oneTimePrekeys"] = one_time(ids);
        body
    }

    fn identity_part(&self) -> Value {
        json!({
            "identityKey": b64(&self.identity),
            "signingKey": b64(self.signing.verifying_key().as_bytes()),
            "identitySignature": self.sign(b"courier:identity-key:v1", &[&self.identity]),
        })
    }
}

fn one_time(ids: std::ops::Range<i64>) -> Value {
    ids.map(|id| json!({"keyId": id, "publicKey": b64(&x25519())}))
        .collect()
}

/// Registers `device` of `u` and uploads `body` for it.
async fn publish(s: &Server, u: &User, device: &str, body: &Value) -> Value {
    ok(
        s,
        u,
        "POST",
        "/v1/devices",
        Some(json!({ "deviceId": device })),
    )
    .await;
    ok(
        s,
        u,
        "PUT",
        &format!("/v1/devices/{device}/keys"),
        Some(body.clone()),
    )
    .await
}

async fn uploads_are_checked(b: Backend) {
    let (_db, s) = setup(&b, "e2e-uploads", E2E).await;
    let alice = s.user("alice").await;
    let k = Keys::new();
    ok(
        &s,
        &alice,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "phone"})),
    )
    .await;
    let path = "/v1/devices/phone/keys";
    let good = k.upload(1, 0..5);
    let with = |f: &dyn Fn(&mut Value)| -> Option<Value> {
        let mut b = good.clone();
        f(&mut b);
        Some(b)
    };
    let other = Keys::new();
    let small_order = b64(&[0u8; 32]);
    let t = Some(alice.token.as_str());
    s.expect_errors(&[
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["identityKey"] = json!("not base64!")),
            400,
            "keys_invalid",
        ),
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["identityKey"] = json!(b64(&[1u8; 31]))),
            400,
            "keys_invalid",
        ),
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["identityKey"] = json!(small_order)),
            400,
            "keys_invalid",
        ),
        // Signed by another key.
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| {
                b["identitySignature"] = other.identity_part()["identitySignature"].clone()
            }),
            400,
            "keys_invalid",
        ),
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["signedPrekey"] = other.prekey(b"courier:signed-prekey:v1", 1)),
            400,
            "keys_invalid",
        ),
        // A signature over the wrong context (a signed prekey's as the last resort's).
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| {
                b["lastResortPrekey"] = k.prekey(b"courier:signed-prekey:v1", 1_000_000)
            }),
            400,
            "keys_invalid",
        ),
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["oneTimePrekeys"][0]["publicKey"] = json!(small_order)),
            400,
            "keys_invalid",
        ),
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["oneTimePrekeys"][1]["keyId"] = json!(0)),
            400,
            "keys_invalid",
        ),
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["oneTimePrekeys"][0]["keyId"] = json!(-1)),
            400,
            "keys_invalid",
        ),
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| {
                b.as_object_mut().unwrap().remove("lastResortPrekey");
            }),
            400,
            "keys_invalid",
        ),
        // Only public keys: a private one has no field to go in.
        (
            t,
            "PUT",
            path,
            with(&|b: &mut Value| b["identityPrivateKey"] = json!(b64(&random32()))),
            400,
            "bad_request",
        ),
        (
            t,
            "PUT",
            "/v1/devices/tablet/keys",
            Some(good.clone()),
            404,
            "device_not_found",
        ),
        (None, "PUT", path, Some(good.clone()), 401, "unauthorized"),
    ])
    .await;
    let status = ok(&s, &alice, "PUT", path, Some(good.clone())).await;
    assert_eq!(
        (
            &status["uploaded"],
            &status["oneTimePrekeys"],
            &status["signedPrekeyId"],
            &status["lastResortId"]
        ),
        (&json!(true), &json!(5), &json!(1), &json!(1_000_000)),
        "{status}"
    );
    // Again: harmless. More one-time prekeys: added. The same id with another key, other
    // identity keys, or past the most a device holds: refused.
    ok(&s, &alice, "PUT", path, Some(good.clone())).await;
    let mut more = k.identity_part();
    more["oneTimePrekeys"] = one_time(5..10);
    let status = ok(&s, &alice, "PUT", path, Some(more)).await;
    assert_eq!(status["oneTimePrekeys"], 10, "{status}");
    let mut taken = k.identity_part();
    taken["oneTimePrekeys"] = one_time(3..4);
    let mut too_many = k.identity_part();
    too_many["oneTimePrekeys"] = one_time(10..101);
    s.expect_errors(&[
        (t, "PUT", path, Some(taken), 409, "prekey_id_taken"),
        (
            t,
            "PUT",
            path,
            Some(Keys::new().upload(1, 0..1)),
            409,
            "identity_key_changed",
        ),
        (t, "PUT", path, Some(too_many), 409, "too_many_prekeys"),
    ])
    .await;
    let status = s.get(&alice, path).await;
    assert_eq!(status["oneTimePrekeys"], 10, "{status}");
    // A signed or last-resort prekey's id names one key, the previous signed prekey's too
    // while the bundles carry it (after a rotation, for the grace period).
    let mut same_id = k.identity_part();
    same_id["signedPrekey"] = k.prekey(b"courier:signed-prekey:v1", 1);
    s.expect_error(
        "PUT",
        path,
        t,
        Some(same_id.clone()),
        409,
        "prekey_id_taken",
    )
    .await;
    let mut rotate = k.identity_part();
    rotate["signedPrekey"] = k.prekey(b"courier:signed-prekey:v1", 2);
    let status = ok(&s, &alice, "PUT", path, Some(rotate)).await;
    assert_eq!(status["previousSignedPrekeyId"], 1, "{status}");
    let refused = s
        .expect_error("PUT", path, t, Some(same_id), 409, "prekey_id_taken")
        .await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("signed prekey 1 ")),
        "{refused}"
    );
    // Across the three: a signed prekey with the last-resort prekey's id (or with the
    // previous one's), a last-resort prekey with a signed one's, or an upload's own two
    // with one id and two keys.
    let signed = |id: i64| k.prekey(b"courier:signed-prekey:v1", id);
    let last_resort = |id: i64| k.prekey(b"courier:last-resort-prekey:v1", id);
    let mut crossed = Vec::new();
    for (spk, lrk) in [
        (Some(1_000_000), None),
        (None, Some(2)),
        (None, Some(1)),
        (Some(7), Some(7)),
    ] {
        let mut body = k.identity_part();
        if let Some(id) = spk {
            body["signedPrekey"] = signed(id);
        }
        if let Some(id) = lrk {
            body["lastResortPrekey"] = last_resort(id);
        }
        crossed.push((t, "PUT", path, Some(body), 409, "prekey_id_taken"));
    }
    s.expect_errors(&crossed).await;
    let status = s.get(&alice, path).await;
    assert_eq!(
        (
            &status["signedPrekeyId"],
            &status["previousSignedPrekeyId"],
            &status["lastResortId"]
        ),
        (&json!(2), &json!(1), &json!(1_000_000)),
        "{status}"
    );
}

async fn a_retried_upload_never_offers_a_handed_out_prekey_again(b: Backend) {
    let (_db, s) = setup(&b, "e2e-retried", E2E).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let k = Keys::new();
    let upload = k.upload(1, 0..3);
    publish(&s, &bob, "phone", &upload).await;
    let claim = || async {
        ok(&s, &alice, "GET", "/v1/keys/bob", None).await["devices"][0]["prekey"].clone()
    };
    assert_eq!(claim().await["keyId"], 0);
    // The same upload again, as after a lost answer: key 0 stays handed out.
    let status = ok(&s, &bob, "PUT", "/v1/devices/phone/keys", Some(upload)).await;
    assert_eq!(status["oneTimePrekeys"], 2, "{status}");
    let ids: Vec<Value> = [claim().await, claim().await, claim().await]
        .iter()
        .map(|p| json!([p["keyId"], p["lastResort"]]))
        .collect();
    assert_eq!(
        ids,
        [
            json!([1, false]),
            json!([2, false]),
            json!([1_000_000, true])
        ]
    );
    // A block refuses claims; asking for your own user's bundles can leave out your device.
    ok(&s, &bob, "PUT", "/v1/blocks/alice", None).await;
    s.expect_error(
        "GET",
        "/v1/keys/bob",
        Some(&alice.token),
        None,
        403,
        "blocked",
    )
    .await;
    publish(&s, &bob, "laptop", &Keys::new().upload(1, 0..3)).await;
    let own = ok(&s, &bob, "GET", "/v1/keys/bob?exceptDeviceId=laptop", None).await;
    let devices: Vec<&str> = own["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["deviceId"].as_str().unwrap())
        .collect();
    assert_eq!(devices, ["phone"]);
    s.expect_error(
        "GET",
        "/v1/keys/bob?exceptDeviceId=..",
        Some(&bob.token),
        None,
        400,
        "bad_request",
    )
    .await;
    assert_eq!(
        s.get(&bob, "/v1/devices/laptop/keys").await["oneTimePrekeys"],
        3,
        "the device left out lost no prekey"
    );
}

async fn racing_claimers_never_share_a_one_time_prekey(b: Backend) {
    let (_db, s) = setup(&b, "e2e-race", E2E).await;
    let bob = s.user("bob").await;
    let k = Keys::new();
    let upload = k.upload(1, 0..8);
    publish(&s, &bob, "phone", &upload).await;
    let mut claimers = Vec::new();
    for i in 0..16 {
        claimers.push(s.user(&format!("claimer{i}")).await);
    }
    // Sixteen claims at once, each on a connection of its own.
    let server = &s;
    let bundles = futures_util::future::join_all(
        claimers
            .iter()
            .map(|c| async move { ok(server, c, "GET", "/v1/keys/bob", None).await }),
    )
    .await;
    let mut handed = HashSet::new();
    let mut last_resort = 0;
    for b in &bundles {
        let p = &b["devices"][0]["prekey"];
        match p["lastResort"].as_bool() {
            Some(false) => {
                assert!(
                    handed.insert(p["keyId"].as_i64().unwrap()),
                    "handed out twice: {p}"
                );
            }
            Some(true) => {
                assert_eq!(p["keyId"], 1_000_000, "{p}");
                assert!(p["signature"].is_string(), "{p}");
                last_resort += 1;
            }
            None => panic!("no prekey: {b}"),
        }
    }
    assert_eq!(handed, (0..8).collect::<HashSet<i64>>());
    assert_eq!(last_resort, 8);
    assert_eq!(
        s.get(&bob, "/v1/devices/phone/keys").await["oneTimePrekeys"],
        0
    );
    // The device was told once that it runs low (under the default 10), and the same
    // upload again, as after a lost answer, offers none of the keys handed out.
    let events = s.get(&bob, "/v1/user-stream?limit=500").await;
    let low: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == "keys.low")
        .collect();
    assert_eq!(low.len(), 1, "{low:?}");
    assert_eq!(low[0]["data"]["remaining"], 7, "the first claim's count");
    let status = ok(&s, &bob, "PUT", "/v1/devices/phone/keys", Some(upload)).await;
    assert_eq!(status["oneTimePrekeys"], 0, "{status}");
}

async fn claims_are_limited_and_low_keys_are_told(b: Backend) {
    let (_db, s) = setup(
        &b,
        "e2e-limits",
        "[e2e]\nclaims_per_minute = 3\none_time_prekeys_low = 2\n",
    )
    .await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    publish(&s, &bob, "phone", &Keys::new().upload(1, 0..4)).await;

    let low = |page: &Value| -> Vec<Value> {
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event"] == "keys.low")
            .map(|e| e["data"].clone())
            .collect()
    };
    for _ in 0..3 {
        ok(&s, &alice, "GET", "/v1/keys/bob", None).await;
    }
    // Down to one: told once.
    assert_eq!(
        low(&s.get(&bob, "/v1/user-stream?limit=500").await),
        vec![json!({"deviceId": "phone", "remaining": 1})]
    );
    // alice's allowance for bob is spent; carol's is her own.
    let (st, got) = call(&s, &alice, "GET", "/v1/keys/bob", None).await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (429, Some("rate_limited")),
        "{got}"
    );
    ok(&s, &carol, "GET", "/v1/keys/bob", None).await;
    let events = s.get(&bob, "/v1/user-stream?limit=500").await;
    assert_eq!(low(&events).len(), 1, "told once until an upload");
    s.expect_error(
        "GET",
        "/v1/keys/nobody",
        Some(&carol.token),
        None,
        404,
        "user_not_found",
    )
    .await;
    // A user without keys has no bundles.
    let none = ok(&s, &carol, "GET", "/v1/keys/alice", None).await;
    assert_eq!(none, json!({"userId": "alice", "devices": []}));
}

async fn a_rotated_signed_prekey_stays_for_its_grace(b: Backend) {
    let (_db, s) = setup(
        &b,
        "e2e-rotation",
        "[e2e]\nclaims_per_minute = 1000\nsigned_prekey_grace_secs = 2\n",
    )
    .await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let k = Keys::new();
    publish(&s, &bob, "phone", &k.upload(1, 0..2)).await;
    let first = ok(&s, &alice, "GET", "/v1/keys/bob", None).await["devices"][0].clone();
    let mut rotate = k.identity_part();
    rotate["signedPrekey"] = k.prekey(b"courier:signed-prekey:v1", 2);
    ok(&s, &bob, "PUT", "/v1/devices/phone/keys", Some(rotate)).await;
    let bundle = ok(&s, &alice, "GET", "/v1/keys/bob", None).await["devices"][0].clone();
    assert_eq!(bundle["signedPrekey"]["keyId"], 2);
    let previous = &bundle["previousSignedPrekey"];
    assert_eq!(
        (&previous["keyId"], &previous["publicKey"]),
        (&json!(1), &first["signedPrekey"]["publicKey"]),
        "{bundle}"
    );
    assert!(previous["until"].as_i64().unwrap() > 0);
    // After the grace period it is gone (safety net 20 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = s.get(&bob, "/v1/devices/phone/keys").await;
        if status.get("previousSignedPrekeyId").is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        tokio::task::yield_now().await;
    }
}

/// An `encrypted` payload, as the plugin takes it.
fn envelope(from_device: &str, to_device: &str) -> Value {
    json!({"v": 1, "type": "message", "senderDeviceId": from_device,
        "recipientDeviceId": to_device, "header": b64(&random32()),
        "ciphertext": b64(&random32())})
}

async fn mailboxes_push_pull_and_forget(b: Backend) {
    let (_db, s) = setup(&b, "e2e-mailboxes", "[e2e]\nmailbox_max_entries = 3\n").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    for (u, d) in [
        (&alice, "phone"),
        (&bob, "phone"),
        (&bob, "laptop"),
        (&carol, "phone"),
    ] {
        ok(&s, u, "POST", "/v1/devices", Some(json!({ "deviceId": d }))).await;
    }
    let mut a = s.connect(&alice, "phone").await;
    let mut bob_phone = s.connect(&bob, "phone").await;
    let send = |id: &str, targets: &[(&str, &str)]| {
        json!({"type": "send_to_devices", "id": id, "clientMsgId": id, "contentType": 10,
            "messages": targets.iter().map(|(u, d)| json!({"userId": u, "deviceId": d,
                "payload": envelope("phone", d)})).collect::<Vec<_>>()})
    };
    let frame = send("m1", &[("bob", "phone"), ("bob", "laptop")]);
    a.send(frame.clone()).await;
    let ack = a.until(|f| f["id"] == "m1").await.0;
    assert_eq!(
        (&ack["type"], &ack["duplicate"], &ack["entries"]),
        (
            &json!("ack"),
            &json!(false),
            &json!([{"userId": "bob", "deviceId": "phone", "seq": 1},
                    {"userId": "bob", "deviceId": "laptop", "seq": 1}])
        ),
        "{ack}"
    );
    // The online device gets its own entry pushed; the other pulls it.
    let pushed = bob_phone.until(|f| f["type"] == "device_message").await.0;
    assert_eq!(
        (
            &pushed["deviceId"],
            &pushed["seq"],
            &pushed["senderId"],
            &pushed["senderDeviceId"]
        ),
        (&json!("phone"), &json!(1), &json!("alice"), &json!("phone")),
        "{pushed}"
    );
    assert_eq!(pushed["payload"]["recipientDeviceId"], "phone");
    let page = s.get(&bob, "/v1/devices/laptop/mailbox?afterSeq=0").await;
    assert_eq!(
        (
            &page["lastSeq"],
            &page["hasMore"],
            page["entries"].as_array().unwrap().len()
        ),
        (&json!(1), &json!(false), 1),
        "{page}"
    );
    assert_eq!(page["entries"][0]["payload"]["recipientDeviceId"], "laptop");
    // A resend stores nothing new and gets the same seqs.
    a.send(frame).await;
    let again = a.until(|f| f["id"] == "m1").await.0;
    assert_eq!(
        (&again["duplicate"], &again["entries"]),
        (&json!(true), &ack["entries"])
    );
    let page = s.get(&bob, "/v1/devices/laptop/mailbox?afterSeq=0").await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 1, "{page}");
    // Acknowledged entries go (the connection's device over the WebSocket).
    bob_phone
        .send(json!({"type": "mailbox_ack", "id": "k", "seq": 1}))
        .await;
    let acked = bob_phone.until(|f| f["id"] == "k").await.0;
    assert_eq!(
        acked,
        json!({"type": "ack", "id": "k", "deviceId": "phone", "deleted": 1})
    );
    let page = s.get(&bob, "/v1/devices/phone/mailbox").await;
    assert_eq!(
        (&page["entries"], &page["lastSeq"]),
        (&json!([]), &json!(1)),
        "{page}"
    );
    // Bounded: the laptop holds 1; two more fill it; the next send to it is refused whole.
    for id in ["m2", "m3"] {
        a.send(send(id, &[("bob", "laptop")])).await;
        assert_eq!(a.until(|f| f["id"] == id).await.0["type"], "ack");
    }
    let t = Some(alice.token.as_str());
    let http = |targets: &[(&str, &str)], kind: u32| {
        let mut f = send("h", targets);
        let o = f.as_object_mut().unwrap();
        o.remove("type");
        o.remove("id");
        o.insert("deviceId".into(), json!("phone"));
        o.insert("contentType".into(), json!(kind));
        o.insert(
            "clientMsgId".into(),
            json!(format!("h-{}", fastrand::u32(..))),
        );
        Some(f)
    };
    let path = "/v1/device-messages";
    s.expect_errors(&[
        (
            t,
            "POST",
            path,
            http(&[("bob", "phone"), ("bob", "laptop")], 10),
            409,
            "mailbox_full",
        ),
        (
            t,
            "POST",
            path,
            http(&[("bob", "tablet")], 10),
            404,
            "device_not_found",
        ),
        (
            t,
            "POST",
            path,
            http(&[("bob", "phone")], 1),
            403,
            "content_type_forbidden",
        ),
        (t, "POST", path, http(&[], 10), 400, "bad_request"),
        (
            t,
            "POST",
            path,
            http(&[("bob", "phone"), ("bob", "phone")], 10),
            400,
            "bad_request",
        ),
        // A target that is no id is a bad request, not a device not found.
        (
            t,
            "POST",
            path,
            http(&[("bob", "..")], 10),
            400,
            "bad_request",
        ),
        (
            t,
            "POST",
            path,
            http(&[("b o b", "phone")], 10),
            400,
            "bad_request",
        ),
        (
            Some(bob.token.as_str()),
            "GET",
            "/v1/devices/tablet/mailbox",
            None,
            404,
            "device_not_found",
        ),
    ])
    .await;
    // Nothing of the refused send was stored: the phone's mailbox is still empty.
    let page = s.get(&bob, "/v1/devices/phone/mailbox").await;
    assert_eq!(page["lastSeq"], 1, "{page}");
    // A user who blocks the sender gets nothing from them.
    ok(&s, &carol, "PUT", "/v1/blocks/alice", None).await;
    s.expect_error(
        "POST",
        path,
        t,
        http(&[("carol", "phone")], 10),
        403,
        "blocked",
    )
    .await;
    // A removed device's mailbox goes with it.
    ok(&s, &bob, "DELETE", "/v1/devices/laptop", None).await;
    s.expect_error(
        "GET",
        "/v1/devices/laptop/mailbox",
        Some(&bob.token),
        None,
        404,
        "device_not_found",
    )
    .await;
    ok(
        &s,
        &bob,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "laptop"})),
    )
    .await;
    let page = s.get(&bob, "/v1/devices/laptop/mailbox").await;
    assert_eq!(
        (&page["entries"], &page["lastSeq"]),
        (&json!([]), &json!(3)),
        "registered again, its seqs go on: {page}"
    );
    // Device ids with dots and colons are device ids in an envelope too; over the
    // WebSocket the connection's device sends.
    ok(
        &s,
        &bob,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "ipad:2"})),
    )
    .await;
    let body = json!({"deviceId": "phone", "clientMsgId": "dots", "contentType": 10,
        "messages": [{"userId": "bob", "deviceId": "ipad:2",
            "payload": envelope("phone", "ipad:2")}]});
    let ack = ok(&s, &alice, "POST", "/v1/device-messages", Some(body)).await;
    assert_eq!(ack["entries"][0]["seq"], 1, "{ack}");
    let mut spoof = send("w", &[("bob", "phone")]);
    spoof["deviceId"] = json!("laptop");
    a.send(spoof).await;
    let e = a.until(|f| f["id"] == "w").await.0;
    assert_eq!(
        (&e["type"], &e["code"]),
        (&json!("error"), &json!("bad_frame")),
        "{e}"
    );
}

async fn racing_resends_store_once_and_a_connection_s_sends_keep_their_order(b: Backend) {
    let (_db, s) = setup(&b, "e2e-mailbox-races", E2E).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    ok(
        &s,
        &alice,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "phone"})),
    )
    .await;
    ok(
        &s,
        &bob,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "phone"})),
    )
    .await;
    // Eight copies of one send at once, each on a connection of its own: one is stored,
    // and every answer names its entry.
    let (server, sender) = (&s, &alice);
    for round in 0..5 {
        let body = json!({"deviceId": "phone", "clientMsgId": format!("race-{round}"),
            "contentType": 10, "messages": [{"userId": "bob", "deviceId": "phone",
                "payload": envelope("phone", "phone")}]});
        let acks = futures_util::future::join_all((0..8).map(|_| {
            let body = body.clone();
            async move { ok(server, sender, "POST", "/v1/device-messages", Some(body)).await }
        }))
        .await;
        let firsts = acks.iter().filter(|a| a["duplicate"] == false).count();
        assert_eq!(firsts, 1, "round {round}: {acks:?}");
        let seqs: HashSet<&Value> = acks.iter().map(|a| &a["entries"][0]["seq"]).collect();
        assert_eq!(
            seqs,
            HashSet::from([&json!(round + 1)]),
            "round {round}: {acks:?}"
        );
    }
    // Forty sends pipelined on one connection: their entries are in the order sent.
    let mut a = s.connect(&alice, "phone").await;
    let frames: Vec<Value> = (0..40)
        .map(|i| {
            json!({"type": "send_to_devices", "id": format!("p{i}"),
                "clientMsgId": format!("pipe-{i}"), "contentType": 10,
                "messages": [{"userId": "bob", "deviceId": "phone",
                    "payload": envelope("phone", "phone")}]})
        })
        .collect();
    a.send_together(&frames).await;
    let mut seqs = vec![0; 40];
    let mut answered = 0;
    while answered < 40 {
        let f = a.next().await.expect("an answer");
        let Some(i) = f["id"].as_str().and_then(|id| id.strip_prefix('p')) else {
            continue;
        };
        assert_eq!(f["type"], "ack", "{f}");
        seqs[i.parse::<usize>().unwrap()] = f["entries"][0]["seq"].as_i64().unwrap();
        answered += 1;
    }
    assert_eq!(seqs, (6..46).collect::<Vec<i64>>());
    let page = s.get(&bob, "/v1/devices/phone/mailbox?limit=500").await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 45, "{page}");
}

/// A device removed at the moment others send to it and it uploads keys: registered again,
/// it has no entries and no keys, whichever came first (a send before the removal is
/// dropped with the mailbox, one after it is `device_not_found`).
async fn a_device_removed_while_sent_to_or_uploading_keeps_nothing(b: Backend) {
    let (_db, s) = setup(&b, "e2e-removal-races", E2E).await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    ok(
        &s,
        &alice,
        "POST",
        "/v1/devices",
        Some(json!({"deviceId": "phone"})),
    )
    .await;
    let (server, sender, owner) = (&s, &alice, &bob);
    for round in 0..10 {
        let device = format!("r{round}");
        ok(
            &s,
            &bob,
            "POST",
            "/v1/devices",
            Some(json!({"deviceId": device})),
        )
        .await;
        let path = format!("/v1/devices/{device}");
        let sends = futures_util::future::join_all((0..3).map(|i| {
            let body = json!({"deviceId": "phone", "clientMsgId": format!("{device}-{i}"),
                "contentType": 10, "messages": [{"userId": "bob", "deviceId": device,
                    "payload": envelope("phone", &device)}]});
            async move { call(server, sender, "POST", "/v1/device-messages", Some(body)).await }
        }));
        let keys_path = format!("{path}/keys");
        let upload = call(
            server,
            owner,
            "PUT",
            &keys_path,
            Some(Keys::new().upload(1, 0..3)),
        );
        let removal = call(server, owner, "DELETE", &path, None);
        let (sent, uploaded, removed) = tokio::join!(sends, upload, removal);
        assert_eq!(removed.0, 200, "{removed:?}");
        for (status, body) in sent.iter().chain([&uploaded]) {
            assert!(
                *status == 200 || body["error"]["code"] == "device_not_found",
                "round {round}: {status} {body}"
            );
        }
        ok(
            &s,
            &bob,
            "POST",
            "/v1/devices",
            Some(json!({"deviceId": device})),
        )
        .await;
        let mailbox = s.get(&bob, &format!("{path}/mailbox")).await;
        assert_eq!(mailbox["entries"], json!([]), "round {round}: {mailbox}");
        let keys = s.get(&bob, &format!("{path}/keys")).await;
        assert_eq!(keys["uploaded"], false, "round {round}: {keys}");
    }
}

async fn mailbox_entries_expire(b: Backend) {
    let (_db, s) = setup(&b, "e2e-expiry", "[e2e]\nmailbox_ttl_secs = 1\n").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    for u in [&alice, &bob] {
        ok(
            &s,
            u,
            "POST",
            "/v1/devices",
            Some(json!({"deviceId": "phone"})),
        )
        .await;
    }
    let body = json!({"deviceId": "phone", "clientMsgId": "x1", "contentType": 10,
        "messages": [{"userId": "bob", "deviceId": "phone", "payload": envelope("phone", "phone")}]});
    let ack = ok(&s, &alice, "POST", "/v1/device-messages", Some(body)).await;
    let page = s.get(&bob, "/v1/devices/phone/mailbox").await;
    let entry = &page["entries"][0];
    assert_eq!(entry["seq"], ack["entries"][0]["seq"], "{page}");
    let ttl = entry["expiresAt"].as_i64().unwrap() - entry["serverTime"].as_i64().unwrap();
    assert_eq!(ttl, 1000, "{entry}");
    // Not acknowledged, it is gone once it expired (safety net 20 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = s.get(&bob, "/v1/devices/phone/mailbox").await;
        if page["entries"] == json!([]) {
            assert_eq!(page["lastSeq"], 1, "{page}");
            break;
        }
        assert!(Instant::now() < deadline, "{page}");
        tokio::task::yield_now().await;
    }
}

/// Runs `examples/e2e/e2e.py` against a server; its output, or why it was skipped.
fn run_example(addr: &str, marker: &str) -> Result<String, String> {
    let has = std::process::Command::new("python3")
        .args(["-c", "import cryptography"])
        .output();
    match has {
        Ok(o) if o.status.success() => {}
        _ => return Err("python3 with the cryptography package is not here".into()),
    }
    let out = std::process::Command::new("python3")
        .arg(common::repo_root().join("examples/e2e/e2e.py"))
        .arg(format!("http://{addr}"))
        .args(["--marker", marker])
        .output()
        .expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the example failed:\n{text}");
    Ok(text)
}

async fn the_example_leaves_no_plaintext_in_the_database(b: Backend) {
    let db = Db::new(&b, "e2e-example").await;
    let s = Server::start(&db, &format!("{}{E2E}", common::server::FAST)).await;
    let marker = format!("marker{:016x}", fastrand::u64(..));
    let output = match run_example(&s.addr, &marker) {
        Ok(o) => o,
        Err(why) => {
            eprintln!("the_example_leaves_no_plaintext_in_the_database: skipped: {why}");
            return;
        }
    };
    assert!(output.contains("all decrypted"), "{output}");
    // Every plaintext carried the marker; the server never had one.
    let found = db.search(&marker).await;
    assert!(found.is_empty(), "plaintext in the database: {found:?}");
    // The envelopes it did carry are there: the search looks where they are.
    assert!(
        !db.search("\"ciphertext\"").await.is_empty(),
        "the search found no envelope at all"
    );
}
