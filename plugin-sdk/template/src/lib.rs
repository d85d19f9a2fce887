//! `sticker` (content type 1100): a sticker from a named pack. Template for new kinds:
//! rename, change the payload type, the manifest and the checks, keep the examples honest.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

/// The payload: parsed from the client's JSON, serialized back as the normalized form.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Sticker {
    pack: String,
    sticker_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    alt: String,
}

struct StickerKind;

impl Plugin for StickerKind {
    type Payload = Sticker;

    fn manifest() -> Manifest {
        Manifest {
            name: "sticker",
            version: env!("CARGO_PKG_VERSION"),
            // 1-999 are the bundled kinds'; pick a number of your own above them.
            content_type: 1100,
            delivery: Delivery::Persistent,
            counts_unread: true,
            conversation_types: &[1, 2],
            sender: Sender::User,
            max_payload_bytes: 1024,
            description: "A sticker from a named pack",
        }
    }

    fn validate(_ctx: &Context, s: Sticker) -> Result<Sticker, Rejection> {
        check::id("pack", &s.pack, 64)?;
        check::id("stickerId", &s.sticker_id, 64)?;
        let alt = check::optional_text("alt", &s.alt, 100)?;
        Ok(Sticker { alt, ..s })
    }

    fn preview(s: &Sticker) -> String {
        if s.alt.is_empty() { "[sticker]".into() } else { format!("[sticker] {}", s.alt) }
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept("plain", 1, r#"{"pack":"cats","stickerId":"wave"}"#),
            Example::accept("with-alt", 2, r#"{"pack":"cats","stickerId":"wave","alt":" a cat waving "}"#),
            Example::reject("no-pack", 1, r#"{"stickerId":"wave"}"#),
            Example::reject("bad-id", 1, r#"{"pack":"cats","stickerId":"wave hello"}"#),
        ]
    }
}

export_plugin!(StickerKind);
