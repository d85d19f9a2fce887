//! Write a Courier message kind as a WebAssembly component.
//!
//! Implement [`Plugin`] for a type whose `Payload` is a serde type, then call
//! [`export_plugin!`]. The SDK parses the JSON text the host passes in, calls your
//! `validate`, and serializes the normalized payload back; the WIT bindings stay hidden.
//!
//! ```ignore
//! use courier_plugin_sdk::{export_plugin, Context, Delivery, Example, Manifest, Plugin, Rejection, Sender};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Poll { question: String }
//!
//! struct PollKind;
//!
//! impl Plugin for PollKind {
//!     type Payload = Poll;
//!     fn manifest() -> Manifest { /* … */ }
//!     fn validate(_ctx: &Context, p: Poll) -> Result<Poll, Rejection> { Ok(p) }
//!     fn preview(p: &Poll) -> String { p.question.clone() }
//!     fn examples() -> Vec<Example> { vec![] }
//! }
//!
//! export_plugin!(PollKind);
//! ```

pub mod check;
mod types;

pub use serde;
pub use serde_json;
pub use types::{Context, Delivery, Example, Manifest, Rejection, Sender};

/// The generated WIT bindings. Not part of the SDK's API: use [`export_plugin!`].
#[doc(hidden)]
#[allow(unsafe_code, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/v1",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "courier_plugin_sdk::bindings",
    });
}

/// One message kind.
pub trait Plugin {
    /// The payload as the plugin sees it. Parsed from the JSON text the client sent;
    /// the value `validate` returns is serialized back as the normalized payload.
    type Payload: serde::Serialize + serde::de::DeserializeOwned;

    /// What this kind is. Called once when the host loads the plugin.
    fn manifest() -> Manifest;

    /// Checks a parsed payload and returns its normalized form, or a rejection.
    /// Must be deterministic and idempotent (validating its own output returns it unchanged).
    fn validate(ctx: &Context, payload: Self::Payload) -> Result<Self::Payload, Rejection>;

    /// One line for conversation lists and notifications.
    fn preview(payload: &Self::Payload) -> String;

    /// Payloads this kind accepts and rejects; the contract suite replays them.
    fn examples() -> Vec<Example>;
}

/// Writes a line to the host's log, tagged with the plugin's name.
pub mod log {
    use crate::bindings::courier::plugin::log::{Level, log};

    pub fn debug(message: &str) {
        log(Level::Debug, message);
    }
    pub fn info(message: &str) {
        log(Level::Info, message);
    }
    pub fn warn(message: &str) {
        log(Level::Warn, message);
    }
    pub fn error(message: &str) {
        log(Level::Error, message);
    }
}

/// Glue between the WIT exports and a [`Plugin`]. Used by [`export_plugin!`].
#[doc(hidden)]
pub mod adapter {
    use crate::bindings::exports::courier::plugin::kind as wit;
    use crate::{Context, Plugin, Rejection};

    pub fn manifest<P: Plugin>() -> wit::KindManifest {
        P::manifest().into()
    }

    pub fn validate<P: Plugin>(
        ctx: wit::Context,
        payload: String,
    ) -> Result<String, wit::Rejection> {
        let ctx = Context {
            sender_id: ctx.sender_id,
            conversation_type: ctx.conversation_type,
            conversation_id: ctx.conversation_id,
        };
        let parsed = parse::<P>(&payload).map_err(wit::Rejection::from)?;
        let normalized = P::validate(&ctx, parsed).map_err(wit::Rejection::from)?;
        serde_json::to_string(&normalized).map_err(|e| {
            wit::Rejection::from(Rejection::new(
                "internal",
                format!("cannot serialize payload: {e}"),
            ))
        })
    }

    pub fn preview<P: Plugin>(payload: String) -> String {
        match parse::<P>(&payload) {
            Ok(p) => one_line(&P::preview(&p)),
            Err(_) => String::new(),
        }
    }

    pub fn examples<P: Plugin>() -> Vec<wit::Example> {
        P::examples().into_iter().map(Into::into).collect()
    }

    /// The payload as `P` reads it. A payload is a JSON object (docs/protocol.md): serde
    /// would also read a struct from an array of its fields.
    fn parse<P: Plugin>(payload: &str) -> Result<P::Payload, Rejection> {
        use serde_json::error::Category;
        let malformed =
            |e| Rejection::new("malformed_json", format!("payload is not valid JSON: {e}"));
        // Whether the payload is JSON at all (asked only when it is refused).
        let json = || serde_json::from_str::<serde::de::IgnoredAny>(payload);
        let first = payload
            .bytes()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
        if first != Some(b'{') {
            return Err(match json() {
                Ok(_) => Rejection::new("invalid_field", "payload must be a JSON object"),
                Err(e) => malformed(e),
            });
        }
        serde_json::from_str(payload).map_err(|e| match e.classify() {
            // serde_json calls some values a type cannot read syntax errors (`null` or a
            // number where a derived enum is read, a number too large for any type,
            // nesting deeper than 128): the payload is JSON, a field of it is wrong.
            Category::Syntax if json().is_ok() => Rejection::new(
                "invalid_field",
                format!("a field's value is not one its type allows: {e}"),
            ),
            Category::Syntax | Category::Eof | Category::Io => malformed(e),
            Category::Data => Rejection::new("invalid_field", e.to_string()),
        })
    }

    /// Previews are one line: newlines become spaces, and the text is capped at 120 characters.
    fn one_line(s: &str) -> String {
        let flat: String = s
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let trimmed = flat.trim();
        if trimmed.chars().count() > 120 {
            let mut out: String = trimmed.chars().take(119).collect();
            out.push('…');
            out
        } else {
            trimmed.to_string()
        }
    }
}

/// Exports a [`Plugin`] implementation as the component's `courier:plugin/kind` interface.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: () = {
            struct CourierExport;

            impl $crate::bindings::exports::courier::plugin::kind::Guest for CourierExport {
                fn manifest() -> $crate::bindings::exports::courier::plugin::kind::KindManifest {
                    $crate::adapter::manifest::<$plugin>()
                }
                fn validate(
                    ctx: $crate::bindings::exports::courier::plugin::kind::Context,
                    payload: String,
                ) -> Result<String, $crate::bindings::exports::courier::plugin::kind::Rejection>
                {
                    $crate::adapter::validate::<$plugin>(ctx, payload)
                }
                fn preview(payload: String) -> String {
                    $crate::adapter::preview::<$plugin>(payload)
                }
                fn examples() -> Vec<$crate::bindings::exports::courier::plugin::kind::Example> {
                    $crate::adapter::examples::<$plugin>()
                }
            }

    $crate::bindings::__export_plugin_world!(CourierExport with_types_in $crate::bindings);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::bindings::exports::courier::plugin::kind as wit;
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Note {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mood: Option<Mood>,
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Mood {
        Happy,
    }

    struct NoteKind;

    impl Plugin for NoteKind {
        type Payload = Note;
        fn manifest() -> Manifest {
            Manifest {
                name: "note",
                version: "1.0.0",
                content_type: 1000,
                delivery: Delivery::Persistent,
                counts_unread: true,
                conversation_types: &[1],
                sender: Sender::User,
                max_payload_bytes: 100,
                description: "a note",
            }
        }
        fn validate(_ctx: &Context, p: Note) -> Result<Note, Rejection> {
            Ok(Note {
                text: check::text("text", &p.text, 10)?,
                mood: p.mood,
            })
        }
        fn preview(p: &Note) -> String {
            p.text.clone()
        }
        fn examples() -> Vec<Example> {
            vec![]
        }
    }

    fn validate(payload: &str) -> Result<String, (String, String)> {
        let ctx = wit::Context {
            sender_id: "u".into(),
            conversation_type: 1,
            conversation_id: "c".into(),
        };
        adapter::validate::<NoteKind>(ctx, payload.into()).map_err(|r| (r.code, r.message))
    }

    #[test]
    fn the_adapter_parses_validates_and_normalizes() {
        assert_eq!(
            validate(r#"{ "text" : "  hi " }"#),
            Ok(r#"{"text":"hi"}"#.into())
        );
        assert_eq!(validate(r#"{"text":"hi"}"#), Ok(r#"{"text":"hi"}"#.into()));
        assert_eq!(validate("{").unwrap_err().0, "malformed_json");
        assert_eq!(validate(r#"{"text":"hi""#).unwrap_err().0, "malformed_json");
        assert_eq!(
            validate(r#"{"text":"hi"} x"#).unwrap_err().0,
            "malformed_json"
        );
        // A struct is read from an object only, not from an array of its fields.
        assert_eq!(
            validate(r#" ["hi"]"#).unwrap_err(),
            (
                "invalid_field".into(),
                "payload must be a JSON object".into()
            )
        );
        assert_eq!(
            validate(r#"{"text":"hi","mood":"happy"}"#),
            Ok(r#"{"text":"hi","mood":"happy"}"#.into())
        );
        // A value of the wrong kind for an enum is a wrong field, not broken JSON.
        for wrong in ["7", "true", "[]", r#""sad""#] {
            assert_eq!(
                validate(&format!(r#"{{"text":"hi","mood":{wrong}}}"#))
                    .unwrap_err()
                    .0,
                "invalid_field",
                "{wrong}"
            );
        }
        assert_eq!(validate(r#"{"text":1}"#).unwrap_err().0, "invalid_field");
        assert_eq!(
            validate(r#"{"text":"a","x":1}"#).unwrap_err().0,
            "invalid_field"
        );
        assert_eq!(
            validate(r#"{"text":""}"#).unwrap_err(),
            ("empty".into(), "text must not be empty".into())
        );
    }

    #[test]
    fn previews_are_one_short_line() {
        assert_eq!(
            adapter::preview::<NoteKind>(r#"{"text":"a\nb"}"#.into()),
            "a b"
        );
        let long = format!(r#"{{"text":"{}"}}"#, "é".repeat(200));
        let p = adapter::preview::<NoteKind>(long);
        assert_eq!(p.chars().count(), 120);
        assert!(p.ends_with('…'));
        assert_eq!(adapter::preview::<NoteKind>("not json".into()), "");
    }
}
