//! `encrypted` (content type 10): an end-to-end encrypted message. The server only sees an
//! envelope (protocol version, message type, device ids, base64 header and ciphertext) and
//! checks its shape and sizes; it never sees the plaintext.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

const MAX_HEADER: usize = 1024;
const MAX_CIPHERTEXT: usize = 48 * 1024;

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Kind {
    /// First message of a session (X3DH prekey message).
    Prekey,
    /// A ratchet message in an established session.
    Message,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Envelope {
    v: u8,
    #[serde(rename = "type")]
    kind: Kind,
    sender_device_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    recipient_device_id: Option<String>,
    header: String,
    ciphertext: String,
}

fn base64_field(field: &str, value: &str, max: usize) -> Result<(), Rejection> {
    let bytes = STANDARD.decode(value).map_err(|e| {
        Rejection::new(
            "bad_base64",
            format!("{field} is not standard padded base64: {e}"),
        )
    })?;
    if bytes.is_empty() || bytes.len() > max {
        return Err(Rejection::new(
            "bad_size",
            format!("{field} must decode to 1 to {max} bytes"),
        ));
    }
    Ok(())
}

struct EncryptedKind;

impl Plugin for EncryptedKind {
    type Payload = Envelope;

    fn manifest() -> Manifest {
        Manifest {
            name: "encrypted",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 10,
            delivery: Delivery::Persistent,
            counts_unread: true,
            conversation_types: &[1, 2],
            sender: Sender::User,
            max_payload_bytes: 72 * 1024,
            description: "End-to-end encrypted envelope: version, type, device ids, base64 header and ciphertext",
        }
    }

    fn validate(_ctx: &Context, e: Envelope) -> Result<Envelope, Rejection> {
        if e.v != 1 {
            return Err(Rejection::new(
                "unsupported_version",
                format!("envelope version {} is not supported, use 1", e.v),
            ));
        }
        check::device_id("senderDeviceId", &e.sender_device_id)?;
        if let Some(r) = &e.recipient_device_id {
            check::device_id("recipientDeviceId", r)?;
        }
        base64_field("header", &e.header, MAX_HEADER)?;
        base64_field("ciphertext", &e.ciphertext, MAX_CIPHERTEXT)?;
        Ok(e)
    }

    fn preview(_e: &Envelope) -> String {
        "[encrypted message]".into()
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept(
                "prekey",
                1,
                r#"{"v":1,"type":"prekey","senderDeviceId":"phone-1","recipientDeviceId":"laptop","header":"AAECAwQFBgc=","ciphertext":"c2VjcmV0IG1lc3NhZ2U="}"#,
            ),
            Example::accept(
                "dotted-device-ids",
                1,
                r#"{"v":1,"type":"message","senderDeviceId":"my.phone","recipientDeviceId":"ipad:2","header":"AQ==","ciphertext":"AAAA"}"#,
            ),
            Example::accept(
                "message",
                2,
                r#"{"v":1,"type":"message","senderDeviceId":"phone-1","header":"AQ==","ciphertext":"AAAA"}"#,
            ),
            Example::reject(
                "dot-segment-device-id",
                1,
                r#"{"v":1,"type":"message","senderDeviceId":"..","header":"AQ==","ciphertext":"AAAA"}"#,
            ),
            Example::reject(
                "not-base64",
                1,
                r#"{"v":1,"type":"message","senderDeviceId":"p","header":"AQ==","ciphertext":"not base64!"}"#,
            ),
            Example::reject(
                "unpadded",
                1,
                r#"{"v":1,"type":"message","senderDeviceId":"p","header":"AQ","ciphertext":"AAAA"}"#,
            ),
            Example::reject(
                "empty-ciphertext",
                1,
                r#"{"v":1,"type":"message","senderDeviceId":"p","header":"AQ==","ciphertext":""}"#,
            ),
            Example::reject(
                "version-2",
                1,
                r#"{"v":2,"type":"message","senderDeviceId":"p","header":"AQ==","ciphertext":"AAAA"}"#,
            ),
            Example::reject(
                "plaintext-field",
                1,
                r#"{"v":1,"type":"message","senderDeviceId":"p","header":"AQ==","ciphertext":"AAAA","text":"oops"}"#,
            ),
        ]
    }
}

export_plugin!(EncryptedKind);
