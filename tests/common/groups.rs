//! Shared by the group and channel tests (`tests/groups_*.rs`): creating a group, texts into
//! it over HTTP and WebSocket, the user stream, the overview, `GET /v1/groups` and the member
//! list as a client reads them.

use serde_json::{Value, json};

use super::server::{Server, User, call, ok, text};

/// `POST /v1/groups`: the group info.
pub async fn create(s: &Server, owner: &User, body: Value) -> Value {
    ok(s, owner, "POST", "/v1/groups", Some(body)).await
}

pub fn id_of(info: &Value) -> i64 {
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
pub async fn say(s: &Server, u: &User, cid: i64, ctype: i64, body: &str) -> i64 {
    let (st, got) = post_text(s, u, cid, ctype, body).await;
    assert_eq!(st, 200, "{} says {body:?}: {got}", u.id);
    got["seq"].as_i64().unwrap()
}

/// A text that must be refused with `status` and `code`.
pub async fn say_fails(s: &Server, u: &User, cid: i64, ctype: i64, status: u16, code: &str) {
    let (st, got) = post_text(s, u, cid, ctype, "refused?").await;
    assert_eq!(
        (st, got["error"]["code"].as_str()),
        (status, Some(code)),
        "{} sending into {cid}: {got}",
        u.id
    );
}

/// A WebSocket `send` frame of a text into a group or channel.
pub fn gtext(id: &str, cid: i64, ctype: i64, body: &str) -> Value {
    text(
        id,
        &fresh(),
        json!({"conversationId": cid, "conversationType": ctype}),
        body,
    )
}

/// The user stream's `lastSeq`.
pub async fn position(s: &Server, u: &User) -> i64 {
    s.get(u, "/v1/user-stream?limit=0").await["lastSeq"]
        .as_i64()
        .expect("lastSeq")
}

/// The user stream's events after `after` (current epoch), paging to the end.
pub async fn events_after(s: &Server, u: &User, after: i64) -> Vec<Value> {
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
pub fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// `data` without `by` (compared separately where the doc names it).
pub fn without_by(d: &Value) -> Value {
    let mut d = d.clone();
    if let Some(o) = d.as_object_mut() {
        o.remove("by");
    }
    d
}

pub fn seqs(items: &[Value]) -> Vec<i64> {
    items.iter().map(|m| m["seq"].as_i64().unwrap()).collect()
}

/// The user's overview entry of a conversation.
pub async fn overview(s: &Server, u: &User, cid: i64) -> Value {
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
pub async fn my_group(s: &Server, u: &User, cid: i64) -> Value {
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
pub async fn members(s: &Server, u: &User, cid: i64) -> Vec<(String, String, i64)> {
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

pub fn m(user: &str, role: &str, muted: i64) -> (String, String, i64) {
    (user.to_string(), role.to_string(), muted)
}
