//! The wire protocol (docs/protocol.md), below every other layer: the JSON frames, the
//! error codes and the one error value, the WebSocket close codes, the message as it is
//! stored and sent, and what the listener tells a request of its connection. Nothing here
//! knows HTTP statuses, SQL or sockets.

mod error;
pub mod frames;
mod refused;

use std::sync::Arc;

pub use error::{Code, Error};
pub use refused::Refused;

/// A message as stored.
#[derive(Debug, Clone)]
pub struct Stored {
    pub conversation_id: i64,
    pub conversation_type: u8,
    pub seq: i64,
    pub msg_id: i64,
    pub sender_id: String,
    pub content_type: u32,
    pub payload: String,
    pub server_time: i64,
}

/// One recorded change, as stored and as pushed.
#[derive(Debug, Clone)]
pub struct UserEvent {
    pub user_id: String,
    pub epoch: i64,
    pub seq: i64,
    pub event: String,
    /// The kind whose plugin checked `data` (friend-request), if any.
    pub content_type: Option<u32>,
    /// JSON text.
    pub data: String,
    pub server_time: i64,
}

/// Two users of a private conversation, in order.
pub type Pair = (String, String);

/// The pair of two users, the same from either side.
pub fn pair(a: &str, b: &str) -> Pair {
    let (lo, hi) = ordered((a, b));
    (lo.to_string(), hi.to_string())
}

/// Two user ids as `pair` orders them.
pub fn ordered<T: PartialOrd>((a, b): (T, T)) -> (T, T) {
    if a <= b { (a, b) } else { (b, a) }
}

/// Why the server closes a connection. The code goes in the WebSocket close frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Close {
    /// A newer connection of the same device took over.
    Replaced,
    /// The outbound queue overflowed (frames or bytes) with frames that may not be dropped.
    SlowConsumer,
    /// Nothing heard from the device within the heartbeat.
    Heartbeat,
    /// The server is shutting down.
    Shutdown,
    /// A frame above four times the frame limit.
    TooBig,
    /// Bytes that are not the WebSocket protocol.
    Protocol,
    /// A text frame that is not UTF-8.
    NotUtf8,
    /// The token the connection was opened with was revoked (logout, revoke-all).
    Revoked,
    /// The account was deleted.
    Deleted,
    /// Its user removed this device (`DELETE /v1/devices/{id}`).
    DeviceRemoved,
}

impl Close {
    pub fn code(self) -> u16 {
        match self {
            Close::Replaced => 4001,
            Close::SlowConsumer => 4008,
            Close::Heartbeat => 4000,
            Close::Shutdown => 1001,
            Close::TooBig => 1009,
            Close::Protocol => 1002,
            Close::NotUtf8 => 1007,
            Close::Revoked => 4003,
            Close::Deleted => 4004,
            Close::DeviceRemoved => 4009,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Close::Replaced => "replaced",
            Close::SlowConsumer => "slow_consumer",
            Close::Heartbeat => "heartbeat_timeout",
            Close::Shutdown => "shutdown",
            Close::TooBig => "frame_too_large",
            Close::Protocol => "protocol_error",
            Close::NotUtf8 => "invalid_utf8",
            Close::Revoked => "token_revoked",
            Close::Deleted => "account_deleted",
            Close::DeviceRemoved => "device_removed",
        }
    }
}

/// The token of an `Authorization: Bearer` header.
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// What the listener knows of a request's connection. Absent for requests that did not
/// come through it (tests calling the router directly).
#[derive(Clone)]
pub struct Peer {
    pub addr: std::net::SocketAddr,
    /// When the request's head had arrived (the WebSocket handshake deadline runs from
    /// it).
    pub head_at: std::time::Instant,
    /// Holds the connection's place under the connection caps while it is held: an
    /// upgraded WebSocket keeps it for its whole life.
    pub admitted: Arc<dyn std::any::Any + Send + Sync>,
}

/// A request body that did not arrive within `server.body_timeout_secs`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the body timeout")]
pub struct BodyTimeout;
