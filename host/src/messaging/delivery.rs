//! What messaging and social need of the connections, behind one seam: push frames to
//! users' devices, close connections, say who is online. The local hub (`gateway::hub`)
//! implements it on one node; in cluster mode hub, routes and bus together do. Answers to
//! a request go to its `Respond`, whatever carried the request.

use std::hash::{Hash, Hasher};

use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::auth::TokenId;
use crate::plugins::Delivery as Class;
use crate::protocol::Close;

/// Coalescing key of a `latest` frame: conversation, sender, content type.
pub type LatestKey = (i64, u64, u32);

/// A stable 64-bit key for a user id (for coalescing keys).
pub fn user_key(user_id: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    user_id.hash(&mut h);
    h.finish()
}

/// What a push reached.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub queued: u32,
    pub dropped: u32,
}

/// Which of a user's connections to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    All,
    /// Those opened with this token.
    Token(TokenId),
}

/// Frames to devices, and their connections.
pub trait Delivery: Send + Sync {
    /// Queues `frame` for every online device of `users`, except the session `except`
    /// (0: none), honouring its delivery class.
    fn push(
        &self,
        users: &[String],
        frame: &Utf8Bytes,
        class: Class,
        key: Option<LatestKey>,
        except: u64,
    ) -> Reach;

    /// Queues `frame` for the named devices of one user only (their connections, if
    /// online).
    fn push_devices(
        &self,
        user_id: &str,
        device_ids: &[&str],
        frame: &Utf8Bytes,
        class: Class,
    ) -> Reach;

    /// The devices of `user_id` connected now.
    fn online(&self, user_id: &str) -> Vec<String>;

    /// Closes the connections of `user_id` that `which` picks, telling them `why`; how
    /// many.
    fn close(&self, user_id: &str, which: Which, why: Close) -> usize;

    /// Closes one device's connection, only if `session` is still its current one.
    fn kick(&self, user_id: &str, device_id: &str, session: u64, why: Close) -> bool;

    /// Connected devices.
    fn online_devices(&self) -> u64;

    /// Asks every connection to close (shutdown).
    fn close_all(&self);
}

/// Where the answer to one request goes (a connection's queue): it is never dropped.
pub trait Respond: Send + Sync {
    fn answer(&self, frame: Utf8Bytes);

    /// The session that asked, so a push of its own request skips it.
    fn session(&self) -> u64;
}
