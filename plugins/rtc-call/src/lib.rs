//! `rtc-call` (content type 6): call signalling between devices. Live: pushed to online
//! devices, never stored, never dropped while the connection lives.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, IntoDeserializer, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

const MAX_SDP: usize = 32 * 1024;

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Media {
    Audio,
    Video,
}

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Action {
    Invite,
    Accept,
    Reject,
    Cancel,
    Hangup,
    Offer,
    Answer,
    Ice,
}

/// A signal: `action` says which of the other fields it has. Read as one flat struct and
/// checked by action in `validate`, not as a `#[serde(tag = "action")]` enum: that reads
/// every field into serde's buffer before it looks at the tag, and then again, and was
/// more than half of this plugin's instructions per call signal. A field is `None` when
/// absent and `Some(None)` when `null` (where the action's field may be `null`); the
/// normalized signal has neither an empty `reason` nor a `null`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Signal {
    #[serde(deserialize_with = "name")]
    action: Action,
    call_id: String,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    media: Option<Media>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    reason: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    duration_ms: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    sdp: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    candidate: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    sdp_mid: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    sdp_m_line_index: Option<Option<u32>>,
}

/// An enum read from its name only (a derived enum also reads `{"accept": null}`), without
/// copying the name.
fn name<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    struct Name<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Name<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            T::deserialize(v.into_deserializer())
        }
    }
    d.deserialize_str(Name(PhantomData))
}

/// A field that is there, as its own type (which says whether `null` is allowed).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl Signal {
    /// The fields besides `action` and `callId`, by name, and whether this signal gives
    /// them.
    fn given(&self) -> [(&'static str, bool); 7] {
        [
            ("media", self.media.is_some()),
            ("reason", self.reason.is_some()),
            ("durationMs", self.duration_ms.is_some()),
            ("sdp", self.sdp.is_some()),
            ("candidate", self.candidate.is_some()),
            ("sdpMid", self.sdp_mid.is_some()),
            ("sdpMLineIndex", self.sdp_m_line_index.is_some()),
        ]
    }
}

impl Action {
    /// The fields besides `action` and `callId` a signal of this action must have, then
    /// those it may have.
    fn fields(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            Action::Invite => (&["media"], &[]),
            Action::Accept | Action::Cancel => (&[], &[]),
            Action::Reject => (&[], &["reason"]),
            Action::Hangup => (&[], &["durationMs"]),
            Action::Offer | Action::Answer => (&["sdp"], &[]),
            Action::Ice => (&["candidate"], &["sdpMid", "sdpMLineIndex"]),
        }
    }
}

/// The fields of `s` are those of its action (`invalid_field`, as a field of the wrong
/// type is).
fn fields_of_action(s: &Signal) -> Result<(), Rejection> {
    let (needed, optional) = s.action.fields();
    for (field, there) in s.given() {
        if there && !needed.contains(&field) && !optional.contains(&field) {
            return Err(Rejection::new(
                "invalid_field",
                format!("unknown field `{field}` for this action"),
            ));
        }
        if !there && needed.contains(&field) {
            return Err(Rejection::new(
                "invalid_field",
                format!("missing field `{field}`"),
            ));
        }
    }
    Ok(())
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

    fn validate(_ctx: &Context, mut s: Signal) -> Result<Signal, Rejection> {
        fields_of_action(&s)?;
        check::id("callId", &s.call_id, 64)?;
        if let Some(d) = &s.sdp {
            sdp(d)?;
        }
        if let Some(candidate) = &s.candidate
            && (candidate.len() > 1024
                || !(candidate.is_empty() || candidate.starts_with("candidate:")))
        {
            return Err(Rejection::new(
                "bad_candidate",
                "candidate must be empty (end of candidates) or start with candidate:, at most 1024 bytes",
            ));
        }
        if let Some(Some(mid)) = &s.sdp_mid
            && mid.len() > 64
        {
            return Err(Rejection::new(
                "bad_candidate",
                "sdpMid is at most 64 bytes",
            ));
        }
        if let Some(Some(d)) = s.duration_ms {
            check::range("durationMs", d, 0, 7 * 24 * 3_600_000)?;
        }
        if let Some(reason) = &s.reason {
            let reason = check::optional_text("reason", reason, 200)?;
            s.reason = Some(reason).filter(|r| !r.is_empty());
        }
        // A `null` is normalized away.
        s.duration_ms = s.duration_ms.flatten().map(Some);
        s.sdp_mid = s.sdp_mid.flatten().map(Some);
        s.sdp_m_line_index = s.sdp_m_line_index.flatten().map(Some);
        Ok(s)
    }

    fn preview(s: &Signal) -> String {
        match (s.action, s.media) {
            (Action::Invite, Some(Media::Video)) => "incoming video call".into(),
            (Action::Invite, _) => "incoming voice call".into(),
            (Action::Cancel, _) => "missed call".into(),
            (Action::Hangup, _) => "call ended".into(),
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
            Example::reject(
                "field-of-another-action",
                1,
                r#"{"action":"accept","callId":"c-1","media":"audio"}"#,
            ),
            Example::reject(
                "null-reason",
                1,
                r#"{"action":"reject","callId":"c-1","reason":null}"#,
            ),
            Example::reject("no-sdp", 1, r#"{"action":"offer","callId":"c-1"}"#),
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
