//! `text` (content type 1): a plain text message, optionally mentioning users.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

const MAX_CHARS: usize = 4000;
const MAX_MENTIONS: usize = 50;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Text {
    text: String,
    /// User ids mentioned; `"all"` mentions everyone in a group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mentions: Vec<String>,
}

struct TextKind;

impl Plugin for TextKind {
    type Payload = Text;

    fn manifest() -> Manifest {
        Manifest {
            name: "text",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 1,
            delivery: Delivery::Persistent,
            counts_unread: true,
            conversation_types: &[1, 2, 3],
            sender: Sender::User,
            max_payload_bytes: 16 * 1024,
            description: "Plain text, up to 4000 characters, with optional mentions",
        }
    }

    fn validate(ctx: &Context, p: Text) -> Result<Text, Rejection> {
        let text = check::text("text", &p.text, MAX_CHARS)?;
        if p.mentions.len() > MAX_MENTIONS {
            return Err(Rejection::new(
                "too_many_mentions",
                format!("at most {MAX_MENTIONS} users may be mentioned"),
            ));
        }
        if !p.mentions.is_empty() && ctx.conversation_type == 1 {
            return Err(Rejection::new(
                "mentions_not_allowed",
                "mentions are for groups and channels",
            ));
        }
        let mentions = check::user_ids("mentions[]", p.mentions)?;
        Ok(Text { text, mentions })
    }

    fn preview(p: &Text) -> String {
        p.text.clone()
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept("plain", 1, r#"{"text":"hello"}"#),
            Example::accept("trimmed", 2, r#"{"text":"  hi there \n"}"#),
            Example::accept("unicode", 1, r#"{"text":"你好 👋 — ça va?"}"#),
            Example::accept(
                "mentions",
                2,
                r#"{"text":"@bob look","mentions":["bob","bob","all"]}"#,
            ),
            Example::accept(
                "dotted-mentions",
                2,
                r#"{"text":"hi","mentions":["dot.user","mail@example.com"]}"#,
            ),
            Example::reject("empty", 1, r#"{"text":"   "}"#),
            Example::reject("missing-text", 1, r#"{}"#),
            Example::reject("number", 1, r#"{"text":42}"#),
            Example::reject("unknown-field", 1, r#"{"text":"a","color":"red"}"#),
            Example::reject(
                "too-long",
                1,
                format!(r#"{{"text":"{}"}}"#, "a".repeat(MAX_CHARS + 1)),
            ),
            Example::reject("control-char", 1, r#"{"text":"a\u0007b"}"#),
            Example::reject(
                "mentions-in-private",
                1,
                r#"{"text":"a","mentions":["bob"]}"#,
            ),
            Example::reject("bad-mention", 2, r#"{"text":"a","mentions":["bob smith"]}"#),
        ]
    }
}

export_plugin!(TextKind);
