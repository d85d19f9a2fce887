//! `typing` (content type 5): "is typing" indicators. Live only, coalesced: a slow
//! queue keeps just the newest per sender and conversation.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, export_plugin,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum State {
    Typing,
    Paused,
    Stopped,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Typing {
    state: State,
}

struct TypingKind;

impl Plugin for TypingKind {
    type Payload = Typing;

    fn manifest() -> Manifest {
        Manifest {
            name: "typing",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 5,
            delivery: Delivery::Latest,
            counts_unread: false,
            conversation_types: &[1, 2],
            sender: Sender::User,
            max_payload_bytes: 256,
            description: "Typing indicator: typing, paused or stopped; never stored",
        }
    }

    fn validate(_ctx: &Context, p: Typing) -> Result<Typing, Rejection> {
        Ok(p)
    }

    fn preview(p: &Typing) -> String {
        match p.state {
            State::Typing => "typing…".into(),
            State::Paused | State::Stopped => String::new(),
        }
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept("typing", 1, r#"{"state":"typing"}"#),
            Example::accept("stopped", 2, r#"{"state":"stopped"}"#),
            Example::reject("unknown-state", 1, r#"{"state":"shouting"}"#),
            Example::reject("bool", 1, r#"{"state":true}"#),
            Example::reject("extra", 1, r#"{"state":"typing","at":1}"#),
        ]
    }
}

export_plugin!(TypingKind);
