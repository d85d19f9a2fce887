use crate::bindings::exports::courier::plugin::kind as wit;

/// How the host stores and queues a kind (see the WIT contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Persistent,
    Live,
    Latest,
    Droppable,
}

/// Who may emit a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    User,
    System,
}

/// What a kind is. See the `manifest` record in `wit/v1/plugin.wit`.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub name: &'static str,
    pub version: &'static str,
    pub content_type: u32,
    pub delivery: Delivery,
    pub counts_unread: bool,
    pub conversation_types: &'static [u8],
    pub sender: Sender,
    pub max_payload_bytes: u32,
    pub description: &'static str,
}

/// Who sends, and where to.
#[derive(Debug, Clone)]
pub struct Context {
    pub sender_id: String,
    /// 0 user stream, 1 private, 2 group, 3 channel.
    pub conversation_type: u8,
    pub conversation_id: String,
}

/// Why a payload was refused: a short `[a-z0-9_]` code and one sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: String,
    pub message: String,
}

impl Rejection {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// A payload the plugin declares accepted or rejected.
#[derive(Debug, Clone)]
pub struct Example {
    pub name: &'static str,
    pub conversation_type: u8,
    pub payload: String,
    pub accepted: bool,
}

impl Example {
    /// A payload `validate` must accept in a conversation of `conversation_type`.
    pub fn accept(name: &'static str, conversation_type: u8, payload: impl Into<String>) -> Self {
        Self {
            name,
            conversation_type,
            payload: payload.into(),
            accepted: true,
        }
    }

    /// A payload `validate` must reject in a conversation of `conversation_type`.
    pub fn reject(name: &'static str, conversation_type: u8, payload: impl Into<String>) -> Self {
        Self {
            name,
            conversation_type,
            payload: payload.into(),
            accepted: false,
        }
    }
}

impl From<Manifest> for wit::KindManifest {
    fn from(m: Manifest) -> Self {
        wit::KindManifest {
            name: m.name.into(),
            version: m.version.into(),
            content_type: m.content_type,
            delivery: match m.delivery {
                Delivery::Persistent => wit::Delivery::Persistent,
                Delivery::Live => wit::Delivery::Live,
                Delivery::Latest => wit::Delivery::Latest,
                Delivery::Droppable => wit::Delivery::Droppable,
            },
            counts_unread: m.counts_unread,
            conversation_types: m.conversation_types.to_vec(),
            sender: match m.sender {
                Sender::User => wit::Sender::User,
                Sender::System => wit::Sender::System,
            },
            max_payload_bytes: m.max_payload_bytes,
            description: m.description.into(),
        }
    }
}

impl From<Rejection> for wit::Rejection {
    fn from(r: Rejection) -> Self {
        wit::Rejection {
            code: r.code,
            message: r.message,
        }
    }
}

impl From<Example> for wit::Example {
    fn from(e: Example) -> Self {
        wit::Example {
            name: e.name.into(),
            conversation_type: e.conversation_type,
            payload: e.payload,
            accepted: e.accepted,
        }
    }
}
