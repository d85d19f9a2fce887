//! What messaging and social need of the connections, behind one seam: push frames to
//! users' devices, close connections, say who is online. The local hub (`gateway::hub`)
//! implements it on one node; in cluster mode hub, routes and bus together do. Answers to
//! a request go to its `Respond`, whatever carried the request.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::auth::TokenId;
use crate::plugins::Delivery as Class;
use crate::protocol::{Close, Stored, frames};

/// Coalescing key of a `latest` frame: conversation, sender, content type.
pub type LatestKey = (i64, u64, u32);

/// The content type of presence frames' coalescing key (no kind has it): only the
/// connections that asked for presence get them.
pub const PRESENCE: u32 = u32::MAX;

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
pub enum Which<'a> {
    All,
    /// Those opened with this token.
    Token(TokenId),
    /// The device's, whatever its session.
    Device(&'a str),
}

/// What a node's caches may hold that a change made elsewhere makes wrong. A node drops
/// it from its own caches and announces it to the others (cluster mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Forget {
    /// A conversation's members, roles, mutes or blocks changed.
    Members(i64),
    /// Every conversation's (an account was renamed in all of them).
    AllMembers,
    /// An account's tokens or state changed (logout, revoke-all, deletion).
    Account(String),
    /// A plugin was switched on or off at runtime, at `at` (ms since the epoch, the
    /// switching node's clock; 0 from a node that does not say).
    Plugin {
        name: String,
        enabled: bool,
        #[serde(default)]
        at: i64,
    },
}

/// One push of a commit's (`Delivery::push_all`).
#[derive(Debug, Clone)]
pub struct Push {
    pub users: Arc<[String]>,
    pub frame: PushFrame,
    pub class: Class,
    pub key: Option<LatestKey>,
    /// The session not to push to (the one that sent it), 0: none.
    pub except: u64,
}

impl Push {
    /// A tip or an event for `users`.
    pub fn persistent(users: Arc<[String]>, frame: Utf8Bytes, except: u64) -> Push {
        Push::of(users, PushFrame::Text(frame), except)
    }

    /// A stored message for `users`: its `notify` is made when a device takes it.
    pub fn stored(users: Arc<[String]>, message: Arc<Stored>, except: u64) -> Push {
        Push::of(users, PushFrame::Notify(message, OnceLock::new()), except)
    }

    fn of(users: Arc<[String]>, frame: PushFrame, except: u64) -> Push {
        Push {
            users,
            frame,
            class: Class::Persistent,
            key: None,
            except,
        }
    }
}

/// A push's frame: made already, or a stored message's `notify`, made the first time a
/// device (here or on another node) is there to take it and then shared. A message to
/// users with no device online (most of a burst to offline users) costs no encoding.
#[derive(Debug, Clone)]
pub enum PushFrame {
    Text(Utf8Bytes),
    Notify(Arc<Stored>, OnceLock<Utf8Bytes>),
}

impl PushFrame {
    pub fn text(&self) -> &Utf8Bytes {
        match self {
            PushFrame::Text(text) => text,
            PushFrame::Notify(message, text) => text.get_or_init(|| frames::notify_stored(message)),
        }
    }
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

    /// Every push one commit made, in order. In cluster mode the other nodes get them in
    /// one bus message per node, never one per push.
    fn push_all(&self, pushes: Vec<Push>) {
        for p in pushes {
            self.push(&p.users, p.frame.text(), p.class, p.key, p.except);
        }
    }

    /// Queues `frame` for the named devices of one user only (their connections, if
    /// online).
    fn push_devices(
        &self,
        user_id: &str,
        device_ids: &[&str],
        frame: &Utf8Bytes,
        class: Class,
    ) -> Reach;

    /// The devices of `user_id` connected now (to this node).
    fn online(&self, user_id: &str) -> Vec<String>;

    /// The devices of `user_id` connected anywhere (in cluster mode, what the routes
    /// say); `None` when that cannot be known now (Redis unreachable).
    fn devices_online<'a>(&'a self, user_id: &'a str) -> BoxFuture<'a, Option<Vec<String>>> {
        Box::pin(std::future::ready(Some(self.online(user_id))))
    }

    /// Closes the connections of `user_id` that `which` picks, telling them `why`; how
    /// many.
    fn close(&self, user_id: &str, which: Which<'_>, why: Close) -> usize;

    /// Closes one device's connection, only if `session` is still its current one.
    fn kick(&self, user_id: &str, device_id: &str, session: u64, why: Close) -> bool;

    /// Connected devices.
    fn online_devices(&self) -> u64;

    /// Asks every connection to close (shutdown).
    fn close_all(&self);

    /// Like `push`, and waits to count the devices reached on every node (a live send's
    /// ack says how many).
    fn push_counted<'a>(
        &'a self,
        users: &'a [String],
        frame: &'a Utf8Bytes,
        class: Class,
        key: Option<LatestKey>,
        except: u64,
    ) -> BoxFuture<'a, Reach> {
        let reach = self.push(users, frame, class, key, except);
        Box::pin(std::future::ready(reach))
    }

    /// Whether each of `users` has a device online anywhere, in order; `None` when that
    /// cannot be known now (cluster mode with Redis unreachable, or just back and a user
    /// reads offline: its node may not have written its routes back yet).
    fn presence<'a>(&'a self, users: &'a [String]) -> BoxFuture<'a, Option<Vec<bool>>>;

    /// Whether a user's friends must be told it is `online` (or not) now: not if they were
    /// last told exactly that — by this node (`last`), or in a cluster by any node — unless
    /// `again` (what was told may not have reached them: the bus was away). Saying yes
    /// records it as told.
    fn must_tell<'a>(
        &'a self,
        _user_id: &'a str,
        online: bool,
        last: Option<bool>,
        again: bool,
    ) -> BoxFuture<'a, bool> {
        Box::pin(std::future::ready(again || last != Some(online)))
    }

    /// Tells the other nodes to drop what `forget` names from their caches (cluster mode;
    /// a node alone has no one to tell).
    fn announce(&self, _forget: &Forget) {}

    /// What of the deployment's services this node cannot reach now (`/healthz`).
    fn degraded(&self) -> Vec<String> {
        Vec::new()
    }

    /// Cluster mode: this node's number and what it sent to the others.
    fn cluster(&self) -> Option<ClusterStats> {
        None
    }
}

/// What a cluster node forwarded since start-up.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStats {
    pub node_id: u16,
    /// Rounds of the forwarder that had pushes (each at least one commit batch's).
    pub rounds: u64,
    /// Messages published to the bus.
    pub publishes: u64,
    /// Pushes or messages for other nodes lost (queue full, bus away); devices pull them.
    pub lost: u64,
}

/// A stored message that counts toward unread, just committed, and who may be offline.
#[derive(Debug, Clone)]
pub struct Committed {
    pub message: Arc<Stored>,
    /// Its conversation's members then (the sender among them).
    pub members: Arc<[String]>,
}

/// Where committed messages go that may need an offline notice (the push bridge). It must
/// not wait: it is called on the committer's task, after the pushes.
pub trait Offline: Send + Sync {
    fn committed(&self, messages: Vec<Committed>);
}

/// Where the answer to one request goes (a connection's queue): it is never dropped.
pub trait Respond: Send + Sync {
    fn answer(&self, frame: Utf8Bytes);

    /// The session that asked, so a push of its own request skips it.
    fn session(&self) -> u64;
}
