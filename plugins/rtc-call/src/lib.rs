//! `rtc-call` (content type 6): call signalling between devices. Live: pushed to online
//! devices, never stored, never dropped while the connection lives.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use std::fmt;

use serde::de::{self, Error as _, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const MAX_SDP: usize = 32 * 1024;

#[derive(Clone, Copy, PartialEq)]
enum Media {
    Audio,
    Video,
}

impl Named for Media {
    const NAMES: &'static [(&'static str, Media)] =
        &[("audio", Media::Audio), ("video", Media::Video)];
}

/// A signal as the plugin checks it: each action with its own fields.
enum Signal {
    Invite {
        call_id: String,
        media: Media,
    },
    Accept {
        call_id: String,
    },
    Reject {
        call_id: String,
        reason: String,
    },
    Cancel {
        call_id: String,
    },
    Hangup {
        call_id: String,
        duration_ms: Option<u64>,
    },
    Offer {
        call_id: String,
        sdp: String,
    },
    Answer {
        call_id: String,
        sdp: String,
    },
    Ice {
        call_id: String,
        candidate: String,
        sdp_mid: Option<String>,
        sdp_m_line_index: Option<u32>,
    },
}

#[derive(Clone, Copy, PartialEq)]
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

/// A signal as JSON: one object whose `action` says which other fields it may have. Read
/// as one flat struct and then sorted by action, not as a `#[serde(tag = "action")]`
/// enum, which buffers every field before it looks at the tag (that read was two thirds
/// of the plugin's work on a call signal). A field is `None` when absent and
/// `Some(None)` when `null`, where the action's field may be `null`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    action: Action,
    call_id: String,
    #[serde(default, deserialize_with = "present")]
    media: Option<Media>,
    #[serde(default, deserialize_with = "present")]
    reason: Option<String>,
    #[serde(default, deserialize_with = "present")]
    duration_ms: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    sdp: Option<String>,
    #[serde(default, deserialize_with = "present")]
    candidate: Option<String>,
    #[serde(default, deserialize_with = "present")]
    sdp_mid: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    sdp_m_line_index: Option<Option<u32>>,
}

/// A field that is there, as its own type (which says whether `null` is allowed).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl Named for Action {
    const NAMES: &'static [(&'static str, Action)] = &[
        ("invite", Action::Invite),
        ("accept", Action::Accept),
        ("reject", Action::Reject),
        ("cancel", Action::Cancel),
        ("hangup", Action::Hangup),
        ("offer", Action::Offer),
        ("answer", Action::Answer),
        ("ice", Action::Ice),
    ];
}

impl Action {
    /// The fields besides `action` and `callId` a signal of this action may have.
    fn fields(self) -> &'static [&'static str] {
        match self {
            Action::Invite => &["media"],
            Action::Accept | Action::Cancel => &[],
            Action::Reject => &["reason"],
            Action::Hangup => &["durationMs"],
            Action::Offer | Action::Answer => &["sdp"],
            Action::Ice => &["candidate", "sdpMid", "sdpMLineIndex"],
        }
    }
}

/// An enum written as one of a few strings. Read from a string only: `null` or a number
/// is a field of the wrong type (`invalid_field`), where serde's derived enums would call
/// it malformed JSON.
trait Named: Copy + PartialEq + 'static {
    const NAMES: &'static [(&'static str, Self)];

    fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("", |(n, _)| n)
    }
}

struct NameVisitor<T>(std::marker::PhantomData<T>);

impl<T: Named> Visitor<'_> for NameVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("one of")?;
        for (i, (n, _)) in T::NAMES.iter().enumerate() {
            write!(f, "{} `{n}`", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        T::NAMES
            .iter()
            .find(|(n, _)| *n == v)
            .map(|(_, t)| *t)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

macro_rules! named_serde {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                d.deserialize_str(NameVisitor(std::marker::PhantomData))
            }
        }
    )*};
}

named_serde!(Action, Media);

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Signal, D::Error> {
        let w = Wire::deserialize(d)?;
        let there = [
            ("media", w.media.is_some()),
            ("reason", w.reason.is_some()),
            ("durationMs", w.duration_ms.is_some()),
            ("sdp", w.sdp.is_some()),
            ("candidate", w.candidate.is_some()),
            ("sdpMid", w.sdp_mid.is_some()),
            ("sdpMLineIndex", w.sdp_m_line_index.is_some()),
        ];
        let action = w.action;
        if let Some((field, _)) = there
            .iter()
            .find(|(f, present)| *present && !action.fields().contains(f))
        {
            return Err(D::Error::custom(format_args!(
                "unknown field `{field}` for action `{}`",
                action.name()
            )));
        }
        let call_id = w.call_id;
        Ok(match action {
            Action::Invite => Signal::Invite {
                call_id,
                media: needed(w.media, "media")?,
            },
            Action::Accept => Signal::Accept { call_id },
            Action::Reject => Signal::Reject {
                call_id,
                reason: w.reason.unwrap_or_default(),
            },
            Action::Cancel => Signal::Cancel { call_id },
            Action::Hangup => Signal::Hangup {
                call_id,
                duration_ms: w.duration_ms.flatten(),
            },
            Action::Offer => Signal::Offer {
                call_id,
                sdp: needed(w.sdp, "sdp")?,
            },
            Action::Answer => Signal::Answer {
                call_id,
                sdp: needed(w.sdp, "sdp")?,
            },
            Action::Ice => Signal::Ice {
                call_id,
                candidate: needed(w.candidate, "candidate")?,
                sdp_mid: w.sdp_mid.flatten(),
                sdp_m_line_index: w.sdp_m_line_index.flatten(),
            },
        })
    }
}

/// A field the action must have.
fn needed<T, E: serde::de::Error>(v: Option<T>, field: &'static str) -> Result<T, E> {
    v.ok_or_else(|| E::missing_field(field))
}

/// The JSON of a signal: `action` first, then the action's fields, absent ones left out.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireOut<'a> {
    action: Action,
    call_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    media: Option<Media>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sdp: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidate: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sdp_mid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sdp_m_line_index: Option<u32>,
}

impl Serialize for Signal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut w = WireOut {
            action: self.action(),
            call_id: call_id(self),
            media: None,
            reason: None,
            duration_ms: None,
            sdp: None,
            candidate: None,
            sdp_mid: None,
            sdp_m_line_index: None,
        };
        match self {
            Signal::Invite { media, .. } => w.media = Some(*media),
            Signal::Reject { reason, .. } => {
                w.reason = Some(reason.as_str()).filter(|r| !r.is_empty())
            }
            Signal::Hangup { duration_ms, .. } => w.duration_ms = *duration_ms,
            Signal::Offer { sdp, .. } | Signal::Answer { sdp, .. } => w.sdp = Some(sdp),
            Signal::Ice {
                candidate,
                sdp_mid,
                sdp_m_line_index,
                ..
            } => {
                w.candidate = Some(candidate);
                w.sdp_mid = sdp_mid.as_deref();
                w.sdp_m_line_index = *sdp_m_line_index;
            }
            Signal::Accept { .. } | Signal::Cancel { .. } => {}
        }
        w.serialize(s)
    }
}

impl Signal {
    fn action(&self) -> Action {
        match self {
            Signal::Invite { .. } => Action::Invite,
            Signal::Accept { .. } => Action::Accept,
            Signal::Reject { .. } => Action::Reject,
            Signal::Cancel { .. } => Action::Cancel,
            Signal::Hangup { .. } => Action::Hangup,
            Signal::Offer { .. } => Action::Offer,
            Signal::Answer { .. } => Action::Answer,
            Signal::Ice { .. } => Action::Ice,
        }
    }
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
