//! `recall` (content type 4): the sender takes back one of their messages.
//! The host checks ownership and the recall window; this kind checks the shape.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Recall {
    /// The seq of the recalled message in this conversation.
    seq: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reason: String,
}

struct RecallKind;

impl Plugin for RecallKind {
    type Payload = Recall;

    fn manifest() -> Manifest {
        Manifest {
            name: "recall",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 4,
            delivery: Delivery::Persistent,
            counts_unread: false,
            conversation_types: &[1, 2, 3],
            sender: Sender::User,
            max_payload_bytes: 1024,
            description: "Recalls an earlier message of the sender's, by seq",
        }
    }

    fn validate(_ctx: &Context, p: Recall) -> Result<Recall, Rejection> {
        check::range("seq", p.seq, 1, i64::MAX as u64)?;
        let reason = check::optional_text("reason", &p.reason, 200)?;
        Ok(Recall { seq: p.seq, reason })
    }

    fn preview(_p: &Recall) -> String {
        "a message was recalled".into()
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept("recall", 1, r#"{"seq":17}"#),
            Example::accept("with-reason", 2, r#"{"seq":3,"reason":"typo"}"#),
            Example::reject("zero", 1, r#"{"seq":0}"#),
            Example::reject("negative", 1, r#"{"seq":-4}"#),
            Example::reject("string-seq", 1, r#"{"seq":"17"}"#),
            Example::reject("missing-seq", 1, r#"{"reason":"x"}"#),
        ]
    }
}

export_plugin!(RecallKind);
