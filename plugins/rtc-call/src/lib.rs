//! `rtc-call` (content type 6): call signalling between devices. Live: pushed to online
//! devices, never stored, never dropped while the connection lives.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

const MAX_SDP: usize = 32 * 1024;

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Media {
    Audio,
    Video,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase", deny_unknown_fields)]
enum Signal {
    #[serde(rename_all = "camelCase")]
    Invite { call_id: String, media: Media },
    #[serde(rename_all = "camelCase")]
    Accept { call_id: String },
    #[serde(rename_all = "camelCase")]
    Reject {
        call_id: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
    },
    #[serde(rename_all = "camelCase")]
    Cancel { call_id: String },
    #[serde(rename_all = "camelCase")]
    Hangup {
        call_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
    },
    #[serde(rename_all = "camelCase")]
    Offer { call_id: String, sdp: String },
    #[serde(rename_all = "camelCase")]
    Answer { call_id: String, sdp: String },
    #[serde(rename_all = "camelCase")]
    Ice {
        call_id: String,
        candidate: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sdp_mid: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sdp_m_line_index: Option<u32>,
    },
}

fn call_id(s: &Signal) -> &str {
    match s {
        Signal::Invite { call_id, .. }
        | Signal::Accept { call_id }
        | Signal::Reject { call_id, .. }
        | Signal::Cancel { call_id }
        | Signal::Hangup { call_id, .. }
        | Signal::Offer { call_id, .. }
        | Signal::Answer { call_id, .. }
        | Signal::Ice { call_id, .. } => call_id,
    }
}

fn sdp(s: &str) -> Result<(), Rejection> {
    if s.is_empty() || s.len() > MAX_SDP {
        return Err(Rejection::new(
            "bad_sdp",
            format!("sdp must be 1 to {MAX_SDP} bytes"),
        ));
    }
    if !s.starts_with("v=0") {
        return Err(Rejection::new("bad_sdp", "sdp must start with v=0"));
    }
    Ok(())
}

struct RtcCallKind;

impl Plugin for RtcCallKind {
    type Payload = Signal;

    fn manifest() -> Manifest {
        Manifest {
            name: "rtc-call",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 6,
            delivery: Delivery::Live,
            counts_unread: false,
            conversation_types: &[1, 2],
            sender: Sender::User,
            max_payload_bytes: 40 * 1024,
            description: "Call signalling: invite, accept, reject, cancel, hangup, sdp offer/answer, ice candidate",
        }
    }

    fn validate(_ctx: &Context, s: Signal) -> Result<Signal, Rejection> {
        check::id("callId", call_id(&s), 64)?;
        match &s {
            Signal::Offer { sdp: d, .. } | Signal::Answer { sdp: d, .. } => sdp(d)?,
            Signal::Ice {
                candidate, sdp_mid, ..
            } => {
                if candidate.len() > 1024
                    || !(candidate.is_empty() || candidate.starts_with("candidate:"))
                {
                    return Err(Rejection::new(
                        "bad_candidate",
                        "candidate must be empty (end of candidates) or start with candidate:, at most 1024 bytes",
                    ));
                }
                if sdp_mid.as_ref().is_some_and(|m| m.len() > 64) {
                    return Err(Rejection::new(
                        "bad_candidate",
                        "sdpMid is at most 64 bytes",
                    ));
                }
            }
            Signal::Reject { call_id, reason } => {
                let reason = check::optional_text("reason", reason, 200)?;
                return Ok(Signal::Reject {
                    call_id: call_id.clone(),
                    reason,
                });
            }
            Signal::Hangup {
                duration_ms: Some(d),
                ..
            } => check::range("durationMs", *d, 0, 7 * 24 * 3_600_000)?,
            _ => {}
        }
        Ok(s)
    }

    fn preview(s: &Signal) -> String {
        match s {
            Signal::Invite {
                media: Media::Video,
                ..
            } => "incoming video call".into(),
            Signal::Invite {
                media: Media::Audio,
                ..
            } => "incoming voice call".into(),
            Signal::Cancel { .. } => "missed call".into(),
            Signal::Hangup { .. } => "call ended".into(),
            _ => String::new(),
        }
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept(
                "invite",
                1,
                r#"{"action":"invite","callId":"c-1","media":"video"}"#,
            ),
            Example::accept("accept", 1, r#"{"action":"accept","callId":"c-1"}"#),
            Example::accept(
                "reject",
                1,
                r#"{"action":"reject","callId":"c-1","reason":"busy"}"#,
            ),
            Example::accept("cancel", 2, r#"{"action":"cancel","callId":"c-1"}"#),
            Example::accept(
                "hangup",
                1,
                r#"{"action":"hangup","callId":"c-1","durationMs":61000}"#,
            ),
            Example::accept(
                "offer",
                1,
                r#"{"action":"offer","callId":"c-1","sdp":"v=0\r\no=- 46117 2 IN IP4 127.0.0.1\r\ns=-\r\n"}"#,
            ),
            Example::accept(
                "answer",
                1,
                r#"{"action":"answer","callId":"c-1","sdp":"v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\n"}"#,
            ),
            Example::accept(
                "ice",
                1,
                r#"{"action":"ice","callId":"c-1","candidate":"candidate:1 1 udp 2122260223 192.0.2.1 54400 typ host","sdpMid":"0","sdpMLineIndex":0}"#,
            ),
            Example::accept(
                "end-of-candidates",
                1,
                r#"{"action":"ice","callId":"c-1","candidate":""}"#,
            ),
            Example::reject("unknown-action", 1, r#"{"action":"dance","callId":"c-1"}"#),
            Example::reject("no-action", 1, r#"{"callId":"c-1"}"#),
            Example::reject(
                "bad-media",
                1,
                r#"{"action":"invite","callId":"c-1","media":"hologram"}"#,
            ),
            Example::reject(
                "bad-sdp",
                1,
                r#"{"action":"offer","callId":"c-1","sdp":"hello"}"#,
            ),
            Example::reject("bad-call-id", 1, r#"{"action":"accept","callId":"a b"}"#),
            Example::reject(
                "bad-candidate",
                1,
                r#"{"action":"ice","callId":"c-1","candidate":"x"}"#,
            ),
        ]
    }
}

export_plugin!(RtcCallKind);
