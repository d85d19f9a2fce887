//! The SQL of the group commit (`messaging::batch` runs it): the rows a batch locks and
//! reads, and the statements that write what it decided. Nothing here decides whether a
//! send may go.

mod heads;
mod messages;
mod pairs;
mod reads;

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::Error;
pub use crate::protocol::{Pair, Stored, pair};
pub use heads::{Found, complete, lock_first};
pub use messages::{Heads, RecallTarget, Writes, Written, recall_target, write};
pub(crate) use pairs::sharing_locks;
pub use pairs::{
    Created, create_pairs, creation_locks, find_pairs, pair_lock, resolve_pairs, uncreate_pairs,
    user_lock,
};
pub use reads::{RECALLED_COUNTING, acc_at, read_position, recalled_counting, recalls_in};

/// A map by conversation id, the key of most of a batch's lookups (its heads, members and
/// versions, and what a committer remembers between batches). Only conversations read
/// from the database go in, whose ids the server assigned, so they are hashed with
/// foldhash, several times faster than std's SipHash. Maps keyed by what clients choose
/// keep SipHash: user ids, `clientMsgId`s, and ids a client names before they are looked
/// up (the route's keys).
pub type ByConversation<V> = foldhash::HashMap<i64, V>;

impl From<BatchError> for Error {
    /// Logged (`store::log_failure`); answered `store_unavailable`.
    fn from(e: BatchError) -> Error {
        super::log_failure(&e);
        Error::unavailable("the database did not accept the write; retry")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// Another writer (a second node) got there first; the batch is safe to run again.
    #[error("a concurrent writer changed the same rows")]
    Conflict,
    /// A head the batch remembered from an earlier one moved since (another writer, or a
    /// change of its members): nothing was written; the batch runs again from the rows.
    #[error("a remembered conversation head moved")]
    Stale,
    /// The connection broke before `COMMIT` was sent: nothing was written, and the
    /// transaction may run again on another connection.
    #[error("the database connection broke: {0}")]
    Broken(sqlx::Error),
    /// The connection broke while committing: the transaction may or may not have
    /// committed.
    #[error("the database connection broke while committing: {0}")]
    BrokenInCommit(sqlx::Error),
    #[error(transparent)]
    Db(sqlx::Error),
}

impl BatchError {
    /// The database error behind it, if any.
    pub fn source_error(&self) -> Option<&sqlx::Error> {
        match self {
            BatchError::Conflict | BatchError::Stale => None,
            BatchError::Broken(e) | BatchError::BrokenInCommit(e) | BatchError::Db(e) => Some(e),
        }
    }
}

/// The error of a transaction's `COMMIT`: a broken connection there leaves the outcome
/// unknown.
pub fn committing(e: sqlx::Error) -> BatchError {
    match classify(e) {
        BatchError::Broken(e) => BatchError::BrokenInCommit(e),
        other => other,
    }
}

impl From<sqlx::Error> for BatchError {
    fn from(e: sqlx::Error) -> BatchError {
        classify(e)
    }
}

/// A lost race with another writer (unique key, deadlock, serialization) is a conflict:
/// the batch rolled back and may run again.
pub(crate) fn classify(e: sqlx::Error) -> BatchError {
    if is_conflict(&e) {
        return BatchError::Conflict;
    }
    match e.as_database_error() {
        // Only a head's last seq is written NULL in a batch, by its check (`write`).
        Some(d) if d.kind() == sqlx::error::ErrorKind::NotNullViolation => BatchError::Stale,
        Some(d)
            if d.is_unique_violation()
                || matches!(d.code().as_deref(), Some("40P01") | Some("40001")) =>
        {
            BatchError::Conflict
        }
        _ if super::is_broken(&e) => BatchError::Broken(e),
        _ => BatchError::Db(e),
    }
}

/// Whether `e` is a lost race with another writer (unique key, deadlock, serialization):
/// the transaction rolled back and may run again.
pub fn is_conflict(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(|d| {
        d.is_unique_violation() || matches!(d.code().as_deref(), Some("40P01") | Some("40001"))
    })
}

/// The current members of groups and channels by `(version, members)`: every change of
/// a group's members moves its version on, under the head lock a batch holds when it
/// reads the version, so a cached list of the same version is the list in the database.
/// It spares a batch reading every member of a large group for each message.
#[derive(Default)]
pub struct RecipientCache(std::sync::Mutex<ByConversation<Versioned>>);

/// A group's version and its current members at that version.
type Versioned = (i64, Arc<[String]>);

impl RecipientCache {
    pub(crate) fn get(&self, conversation_id: i64, version: i64) -> Option<Arc<[String]>> {
        let cache = self.0.lock().expect("recipient cache");
        match cache.get(&conversation_id) {
            Some((v, members)) if *v == version => Some(members.clone()),
            _ => None,
        }
    }

    pub(crate) fn put(&self, conversation_id: i64, version: i64, members: Arc<[String]>) {
        let mut cache = self.0.lock().expect("recipient cache");
        if cache.len() >= 10_000 {
            cache.clear();
        }
        cache.insert(conversation_id, (version, members));
    }
}

pub use super::Head;

#[derive(Default)]
pub struct Members {
    /// Members now, who get the pushes (private conversations; a group's come cached).
    pub current: Vec<String>,
    /// Groups and channels: the role and mute of the batch's current members.
    pub roles: HashMap<String, (i64, i64)>,
    /// Membership rows (every member's in a private conversation, the batch's senders'
    /// and readers' in a group), with the seq their membership ended at.
    pub any: HashMap<String, Option<i64>>,
    pub current_arc: Option<Arc<[String]>>,
    /// Private conversations: the member who blocks the other, if any.
    pub blockers: Vec<String>,
    /// Private conversations: the member whose account was deleted (its alias), if any.
    pub deleted: Option<String>,
}

/// `members.state` of a private conversation's member whose account was deleted.
pub(crate) const MEMBER_DELETED: i64 = 4;

impl Members {
    pub fn recipients(&mut self) -> Arc<[String]> {
        self.current_arc
            .get_or_insert_with(|| self.current.clone().into())
            .clone()
    }
}

/// Rows written so far in this transaction but not yet sent to the database.
#[derive(Default)]
pub struct Pending {
    pub messages: Vec<(Arc<Stored>, String, bool, i64)>,
    pub recalls: Vec<(i64, i64, i64)>,
}
