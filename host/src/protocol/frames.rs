//! The JSON frames of the protocol (docs/protocol.md), built once per push and shared by
//! every connection it goes to.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::{Error, Stored, UserEvent};

/// A stored payload as raw JSON (it was checked to be JSON when stored).
pub fn raw(payload: &str) -> Box<RawValue> {
    RawValue::from_string(payload.to_string()).unwrap_or_else(|_| {
        RawValue::from_string(serde_json::to_string(payload).expect("string")).expect("json string")
    })
}

/// Room a frame's buffer starts with: an ack or a push of a short message fits without
/// growing it (`serde_json::to_string` starts at 128 bytes and grows by copying).
const FRAME_CAPACITY: usize = 256;

fn encode(v: &impl Serialize) -> Utf8Bytes {
    let mut out = Vec::with_capacity(FRAME_CAPACITY);
    serde_json::to_writer(&mut out, v).expect("frames serialize");
    utf8(out)
}

/// serde_json writes UTF-8 only.
fn utf8(json: Vec<u8>) -> Utf8Bytes {
    Utf8Bytes::from(String::from_utf8(json).expect("JSON is UTF-8"))
}

/// The one envelope of a pushed message. Stored messages carry seq, msgId and serverTime;
/// live ones do not.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Notify<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    conversation_type: u8,
    conversation_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msg_id: Option<String>,
    sender_id: &'a str,
    content_type: u32,
    payload: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_time: Option<i64>,
}

pub fn notify_stored(m: &Stored) -> Utf8Bytes {
    let payload = raw(&m.payload);
    encode(&Notify {
        kind: "notify",
        conversation_type: m.conversation_type,
        conversation_id: m.conversation_id,
        seq: Some(m.seq),
        msg_id: Some(m.msg_id.to_string()),
        sender_id: &m.sender_id,
        content_type: m.content_type,
        payload: &payload,
        server_time: Some(m.server_time),
    })
}

pub fn notify_live(
    conversation_type: u8,
    conversation_id: i64,
    sender_id: &str,
    content_type: u32,
    payload: &RawValue,
) -> Utf8Bytes {
    encode(&Notify {
        kind: "notify",
        conversation_type,
        conversation_id,
        seq: None,
        msg_id: None,
        sender_id,
        content_type,
        payload,
        server_time: None,
    })
}

/// An event of the user's own stream (conversation type 0).
pub fn notify_user(e: &UserEvent) -> Utf8Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct NotifyUser<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        conversation_type: u8,
        epoch: i64,
        seq: i64,
        event: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        content_type: Option<u32>,
        data: &'a RawValue,
        server_time: i64,
    }
    let data = raw(&e.data);
    encode(&NotifyUser {
        kind: "notify",
        conversation_type: 0,
        epoch: e.epoch,
        seq: e.seq,
        event: &e.event,
        content_type: e.content_type,
        data: &data,
        server_time: e.server_time,
    })
}

/// The answer to a stored send: over WebSocket inside an `ack` frame, over HTTP the body.
#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendAck {
    pub msg_id: String,
    pub conversation_id: i64,
    pub conversation_type: u8,
    pub seq: i64,
    pub server_time: i64,
    pub duplicate: bool,
}

impl SendAck {
    pub fn of(m: &Stored, duplicate: bool) -> SendAck {
        SendAck {
            msg_id: m.msg_id.to_string(),
            conversation_id: m.conversation_id,
            conversation_type: m.conversation_type,
            seq: m.seq,
            server_time: m.server_time,
            duplicate,
        }
    }
}

/// The answer to a live send: nothing stored, pushed to `delivered` online devices.
#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LiveAck {
    pub live: bool,
    pub conversation_id: i64,
    pub conversation_type: u8,
    pub delivered: u32,
}

/// The answer to a read.
#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadAck {
    pub conversation_id: i64,
    pub read_seq: i64,
    pub moved: bool,
    pub unread: i64,
}

/// The answer to a `received`: the position acknowledged (up to the conversation's end),
/// and whether it moved the user's delivered position.
#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceivedAck {
    pub conversation_id: i64,
    pub delivered_seq: i64,
    pub moved: bool,
}

/// An `ack` frame: `type` and `id` first, then the fields of `body`, which serializes as a
/// JSON object. The body is written after them with its opening brace turned into a comma,
/// instead of through serde's `flatten`, which sends every field through a map serializer.
pub fn ack<T: Serialize>(id: Option<&str>, body: &T) -> Utf8Bytes {
    let mut out = ack_opening(id);
    let body_at = out.len();
    serde_json::to_writer(&mut out, body).expect("frames serialize");
    assert_eq!(
        out.get(body_at),
        Some(&b'{'),
        "an ack's body is a JSON object"
    );
    if out.len() == body_at + 2 {
        // `{}`: nothing to add.
        out.truncate(body_at);
        out.push(b'}');
    } else {
        out[body_at] = b',';
    }
    utf8(out)
}

/// `ack` of a stored send, the commonest answer, written field by field instead of
/// through serde (which escaped each key and value byte by byte, a third of the frame's
/// cost): the same bytes as `ack(id, a)`, which the tests hold it to.
pub fn send_ack(id: Option<&str>, a: &SendAck) -> Utf8Bytes {
    let mut out = ack_opening(id);
    out.extend_from_slice(br#","msgId":"#);
    json_str(&mut out, &a.msg_id);
    let mut n = itoa::Buffer::new();
    for (key, value) in [
        (&br#","conversationId":"#[..], a.conversation_id),
        (br#","conversationType":"#, i64::from(a.conversation_type)),
        (br#","seq":"#, a.seq),
        (br#","serverTime":"#, a.server_time),
    ] {
        out.extend_from_slice(key);
        out.extend_from_slice(n.format(value).as_bytes());
    }
    out.extend_from_slice(match a.duplicate {
        true => br#","duplicate":true}"#,
        false => br#","duplicate":false}"#,
    });
    utf8(out)
}

/// An `ack` frame's `type` and `id`, the fields of every ack's body to follow.
fn ack_opening(id: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_CAPACITY);
    out.extend_from_slice(br#"{"type":"ack""#);
    if let Some(id) = id {
        out.extend_from_slice(br#","id":"#);
        json_str(&mut out, id);
    }
    out
}

/// A JSON string: as it is when nothing in it needs escaping, else as serde_json escapes it.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        serde_json::to_writer(&mut *out, s).expect("a string serializes");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

pub fn error(id: Option<&str>, e: &Error) -> Utf8Bytes {
    #[derive(Serialize)]
    struct Error<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        code: &'a str,
        message: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'a str>,
    }
    encode(&Error {
        kind: "error",
        id,
        code: e.code.as_str(),
        message: &e.message,
        reason: e.reason.as_deref(),
    })
}

/// A read position moved: to the reader's other devices (with their unread count) and,
/// in a private conversation, to the peer (a read receipt, without it).
pub fn read(conversation_id: i64, user_id: &str, read_seq: i64, unread: Option<i64>) -> Utf8Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Read<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        conversation_id: i64,
        user_id: &'a str,
        read_seq: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        unread: Option<i64>,
    }
    encode(&Read {
        kind: "read",
        conversation_id,
        user_id,
        read_seq,
        unread,
    })
}

/// A member's devices received a private conversation up to `seq` (the delivery notice
/// to the other member).
pub fn delivered(conversation_id: i64, user_id: &str, seq: i64) -> Utf8Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Delivered<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        conversation_id: i64,
        user_id: &'a str,
        seq: i64,
    }
    encode(&Delivered {
        kind: "delivered",
        conversation_id,
        user_id,
        seq,
    })
}

pub fn pong(id: Option<&str>, server_time: i64) -> Utf8Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Pong<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<&'a str>,
        server_time: i64,
    }
    encode(&Pong {
        kind: "pong",
        id,
        server_time,
    })
}

/// What a connection is told first: who it is and what the server expects of it.
pub struct HelloFrame<'a> {
    pub user_id: &'a str,
    pub device_id: &'a str,
    pub session: u64,
    pub heartbeat_secs: u64,
    pub max_frame: usize,
    /// The server keeps delivered positions (`received` frames count).
    pub receipts: bool,
}

pub fn hello(h: &HelloFrame<'_>) -> Utf8Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Hello<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        user_id: &'a str,
        device_id: &'a str,
        session_id: String,
        heartbeat_secs: u64,
        max_frame_bytes: usize,
        receipts: bool,
    }
    encode(&Hello {
        kind: "hello",
        user_id: h.user_id,
        device_id: h.device_id,
        session_id: format!("{:016x}", h.session),
        heartbeat_secs: h.heartbeat_secs,
        max_frame_bytes: h.max_frame,
        receipts: h.receipts,
    })
}

pub fn kicked(reason: &str, message: &str) -> Utf8Bytes {
    #[derive(Serialize)]
    struct Kicked<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        reason: &'a str,
        message: &'a str,
    }
    encode(&Kicked {
        kind: "kicked",
        reason,
        message,
    })
}

/// The fields every client frame may carry; the rest is read per type.
#[derive(Deserialize)]
pub struct Peek {
    /// A string for a frame of a type (any other value is read, so the frame's `id` is
    /// still answered).
    #[serde(rename = "type")]
    pub kind: Option<serde_json::Value>,
    pub id: Option<serde_json::Value>,
}

/// The longest `id` a client frame may carry, in bytes.
pub const MAX_ID_BYTES: usize = 64;

impl Peek {
    /// The frame's `id`: `None` when it is not a string of at most 64 bytes (`bad_frame`),
    /// `Some(None)` when the frame has none.
    pub fn id(&self) -> Option<Option<&str>> {
        match &self.id {
            Some(serde_json::Value::String(s)) if s.len() <= MAX_ID_BYTES => Some(Some(s.as_str())),
            None => Some(None),
            Some(_) => None,
        }
    }
}

/// `send`, over WebSocket (with `type` and `id`) and as the HTTP send body.
#[derive(Deserialize, Debug, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendFrame {
    #[serde(default, rename = "type")]
    #[schema(ignore)]
    pub _kind: Option<String>,
    #[serde(default)]
    #[schema(ignore)]
    pub id: Option<String>,
    pub client_msg_id: String,
    pub conversation_type: u8,
    #[serde(default)]
    pub conversation_id: Option<i64>,
    #[serde(default)]
    pub peer_id: Option<String>,
    pub content_type: u32,
    /// The kind's payload, a JSON object.
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadFrame {
    #[serde(default, rename = "type")]
    pub _kind: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    pub conversation_id: i64,
    pub seq: i64,
}

/// One target of a send to devices: the device and its own payload.
#[derive(Deserialize, Debug, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceTarget {
    pub user_id: String,
    pub device_id: String,
    /// The kind's payload for this device, a JSON object.
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
}

/// `send_to_devices`, over WebSocket (with `type` and `id`) and as the HTTP body (with
/// `deviceId`, the sending device).
#[derive(Deserialize, Debug, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceSendFrame {
    #[serde(default, rename = "type")]
    #[schema(ignore)]
    pub _kind: Option<String>,
    #[serde(default)]
    #[schema(ignore)]
    pub id: Option<String>,
    /// HTTP only: the sending device (the WebSocket's is its connection's).
    #[serde(default)]
    pub device_id: Option<String>,
    pub client_msg_id: String,
    pub content_type: u32,
    pub messages: Vec<DeviceTarget>,
}

/// Where one target of a send to devices was stored.
#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceEntry {
    pub user_id: String,
    pub device_id: String,
    pub seq: i64,
}

/// The answer to a send to devices: each target's seq in its mailbox, in the order sent.
#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSendAck {
    pub client_msg_id: String,
    pub entries: Vec<DeviceEntry>,
    /// A resend of a `clientMsgId` already sent: nothing new was stored.
    pub duplicate: bool,
}

/// `mailbox_ack`: this connection's device processed its mailbox up to `seq`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MailboxAckFrame {
    #[serde(default, rename = "type")]
    pub _kind: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    pub seq: i64,
}

/// The answer to a mailbox acknowledgement.
#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailboxAck {
    pub device_id: String,
    /// Entries deleted.
    pub deleted: u64,
}

/// An entry of a device's mailbox, pushed to it (and as a pull lists it).
#[derive(Serialize, Debug, Clone, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMessage<'a> {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub kind: Option<&'static str>,
    pub device_id: &'a str,
    pub seq: i64,
    pub sender_id: &'a str,
    pub sender_device_id: &'a str,
    pub content_type: u32,
    #[schema(value_type = Object)]
    pub payload: &'a RawValue,
    pub server_time: i64,
    pub expires_at: i64,
}

/// A `device_message` frame.
pub fn device_message(m: &DeviceMessage<'_>) -> Utf8Bytes {
    encode(m)
}

/// A friend came online or went offline (live: never stored).
pub fn presence(user_id: &str, online: bool, at: i64) -> Utf8Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Presence<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        user_id: &'a str,
        online: bool,
        server_time: i64,
    }
    encode(&Presence {
        kind: "presence",
        user_id,
        online,
        server_time: at,
    })
}

/// Every `type` of a frame the server writes.
pub const SERVER_FRAME_TYPES: [&str; 10] = [
    "notify",
    "ack",
    "error",
    "read",
    "delivered",
    "pong",
    "hello",
    "kicked",
    "presence",
    "device_message",
];

/// The `type` of a frame the server wrote (each starts `{"type":"…"`), for the metrics;
/// `other` for anything else.
pub fn type_of(frame: &str) -> &'static str {
    let name = frame
        .strip_prefix(r#"{"type":""#)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("");
    SERVER_FRAME_TYPES
        .iter()
        .find(|t| **t == name)
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod type_tests {
    use super::*;

    #[test]
    fn the_type_of_every_frame_is_read_from_its_start() {
        let e = Error::new(super::super::Code::BadFrame, "x");
        for (frame, kind) in [
            (
                hello(&HelloFrame {
                    user_id: "u",
                    device_id: "d",
                    session: 1,
                    heartbeat_secs: 60,
                    max_frame: 1000,
                    receipts: true,
                }),
                "hello",
            ),
            (delivered(1, "u", 2), "delivered"),
            (ack(Some("1"), &serde_json::json!({})), "ack"),
            (error(None, &e), "error"),
            (pong(None, 1), "pong"),
            (read(1, "u", 2, None), "read"),
            (kicked("replaced", "m"), "kicked"),
            (presence("u", true, 1), "presence"),
        ] {
            assert_eq!(type_of(frame.as_str()), kind, "{frame}");
        }
        assert_eq!(type_of(r#"{"seq":1}"#), "other");
    }

    #[test]
    fn a_send_ack_is_written_as_serde_writes_the_ack() {
        for (id, msg_id, duplicate) in [
            (None, "1", false),
            (Some("c-1"), "7340032812345", true),
            (
                Some("quote \" back \\ tab \t nul \u{0} del \u{7f} ü 👋"),
                "12",
                false,
            ),
            (Some(""), "", true),
        ] {
            let a = SendAck {
                msg_id: msg_id.into(),
                conversation_id: i64::MAX,
                conversation_type: u8::MAX,
                seq: 0,
                server_time: -1,
                duplicate,
            };
            let written = send_ack(id, &a);
            assert_eq!(written.as_str(), ack(id, &a).as_str());
            let read: serde_json::Value = serde_json::from_str(written.as_str()).unwrap();
            assert_eq!(read["id"].as_str(), id);
        }
    }

    #[test]
    fn an_ack_carries_its_id_then_the_fields_of_its_body() {
        let body = LiveAck {
            live: true,
            conversation_id: 7,
            conversation_type: 1,
            delivered: 2,
        };
        assert_eq!(
            ack(Some("a\"b"), &body).as_str(),
            r#"{"type":"ack","id":"a\"b","live":true,"conversationId":7,"conversationType":1,"delivered":2}"#
        );
        assert_eq!(
            ack(None, &body).as_str(),
            r#"{"type":"ack","live":true,"conversationId":7,"conversationType":1,"delivered":2}"#
        );
        assert_eq!(
            ack(Some("1"), &serde_json::json!({})).as_str(),
            r#"{"type":"ack","id":"1"}"#
        );
        assert_eq!(
            ack(None, &serde_json::json!({})).as_str(),
            r#"{"type":"ack"}"#
        );
    }
}
