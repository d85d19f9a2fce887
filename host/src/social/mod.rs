//! The social graph: friend requests, friendships, blocks, groups and channels.
//!
//! Each change is one transaction on the write pool: it reads the users it names (`named`,
//! ordering it with their accounts' deletions), locks what orders it (a group's
//! head row, then the affected users' stream heads), checks the rules, writes the state,
//! the tips (through their plugins, as the system) and the user-stream events, and commits.
//! Only then are the tips and events pushed (`Effects`). A transaction that lost a race
//! with another writer (PostgreSQL: deadlock, unique key) runs again.

mod accounts;
mod friends;
mod groups;
pub mod presence;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use serde_json::Value;

pub use accounts::deleted_answer;
pub use friends::Decision;
pub use groups::{GroupPatch, NewGroup, info as groups_info};

use crate::clock::now_ms;
use crate::messaging::{Core, Push};
use crate::plugins::{SendContext, SenderKind};
use crate::protocol::UserEvent;
use crate::protocol::frames;
use crate::protocol::{Code, Error};
use crate::store::Dialect;
use crate::store::batch::{BatchError, Stored, committing};
use crate::store::stream::StreamWriter;

/// Why a change did not commit: refused by a rule, or the database.
pub(crate) enum OpError {
    Refused(Error),
    Db(BatchError),
}

impl From<Error> for OpError {
    fn from(e: Error) -> OpError {
        OpError::Refused(e)
    }
}

impl From<crate::protocol::Refused> for OpError {
    fn from(r: crate::protocol::Refused) -> OpError {
        OpError::Refused(r.into())
    }
}

impl From<sqlx::Error> for OpError {
    fn from(e: sqlx::Error) -> OpError {
        OpError::Db(e.into())
    }
}

impl From<BatchError> for OpError {
    fn from(e: BatchError) -> OpError {
        OpError::Db(e)
    }
}

/// What a committed change pushes.
#[derive(Default)]
pub(crate) struct Effects {
    /// Tips and who gets them.
    pub tips: Vec<(Arc<Stored>, Vec<String>)>,
    pub events: Vec<UserEvent>,
    /// A conversation whose members (or their roles and mutes) changed.
    pub members_changed: Option<i64>,
}

/// Attempts of a change that met a concurrent writer.
const RETRIES: u32 = 5;

/// A change in progress: its transaction, the user streams it writes to, and what it
/// publishes once committed.
pub(crate) struct Change {
    pub tx: sqlx::Transaction<'static, sqlx::Any>,
    pub streams: StreamWriter,
    pub fx: Effects,
    /// The change's time (its rows', tips' and events').
    pub now: i64,
    dialect: Dialect,
}

impl Change {
    /// Locks the user-stream heads of `users` (after the conversation head, if any).
    pub async fn lock_streams(&mut self, users: &[&str]) -> sqlx::Result<()> {
        self.streams.lock(self.dialect, &mut self.tx, users).await
    }

    /// The users the change names, read first (`store::social::lock_users`): `actor` must
    /// be able to act (its account not deleted; a deleted account's alias is its deletion
    /// acting), and of `others`, those whose accounts exist and are not deleted come back.
    pub async fn named(
        &mut self,
        actor: &str,
        others: &[&str],
    ) -> Result<HashSet<String>, OpError> {
        named(self.dialect, &mut self.tx, actor, others).await
    }

    /// Writes the events and commits.
    async fn commit(mut self) -> Result<Effects, OpError> {
        self.fx.events = self.streams.finish(self.dialect, &mut self.tx).await?;
        self.tx.commit().await.map_err(committing)?;
        Ok(self.fx)
    }
}

/// `Change::named`, on the change's transaction.
pub(crate) async fn named(
    d: Dialect,
    tx: &mut sqlx::AnyConnection,
    actor: &str,
    others: &[&str],
) -> Result<HashSet<String>, OpError> {
    let mut users: Vec<&str> = others.to_vec();
    users.push(actor);
    let named = crate::store::social::lock_users(d, tx, &users).await?;
    if !named.live.contains(actor) && !named.aliases.contains(actor) {
        return Err(crate::messaging::account_deleted().into());
    }
    Ok(named.live)
}

impl Core {
    /// Every social change: begin → the body (lock the conversation head, then the user
    /// streams; check the rules; write the state, the tips and the user events) → write
    /// the events → commit → publish. Runs again when it lost a race with another writer,
    /// or when its connection broke before `COMMIT`.
    /// The body gets the change and hands it back with its value; an error drops it (the
    /// transaction rolls back). On PostgreSQL each run ends by the deadline for the
    /// database's answers (`Store::pooled`).
    pub(crate) async fn change<'a, T>(
        &self,
        body: impl FnMut(Change) -> BoxFuture<'a, Result<(T, Change), OpError>>,
    ) -> Result<T, Error> {
        self.change_within(true, body).await
    }

    /// `change`, `bounded` by the deadline or not: an account's rename rewrites every row
    /// the account touched, for as long as that takes.
    pub(crate) async fn change_within<'a, T>(
        &self,
        bounded: bool,
        mut body: impl FnMut(Change) -> BoxFuture<'a, Result<(T, Change), OpError>>,
    ) -> Result<T, Error> {
        let (mut attempt, mut broken) = (0, false);
        loop {
            let once = async {
                let now = now_ms();
                let c = Change {
                    tx: self.store.write().begin().await?,
                    streams: StreamWriter::new(now),
                    fx: Effects::default(),
                    now,
                    dialect: self.store.dialect(),
                };
                let (value, c) = body(c).await?;
                Ok::<_, OpError>((value, c.commit().await?))
            };
            // No answer by the deadline: whether its COMMIT was made is not known.
            let answered = if bounded {
                self.store.pooled(once).await
            } else {
                Ok(once.await)
            };
            let outcome = match answered {
                Ok(outcome) => outcome,
                Err(silent) => Err(OpError::Db(BatchError::BrokenInCommit(silent))),
            };
            match outcome {
                Ok((value, effects)) => {
                    self.publish(effects);
                    return Ok(value);
                }
                Err(OpError::Db(BatchError::Conflict)) if attempt < RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(2 << attempt)).await;
                }
                // Broken before COMMIT: nothing was written; run it once more (the store
                // retires the connections opened before the break now: `store::Health`).
                // Broken in COMMIT is not retried: the change may have been made.
                Err(OpError::Db(BatchError::Broken(e))) if !broken => {
                    broken = true;
                    self.store.note(&e);
                    tracing::warn!("a database connection broke ({e}); running the change again");
                }
                Err(OpError::Db(e)) => {
                    if let Some(e) = e.source_error() {
                        self.store.note(e);
                    }
                    return Err(Error::from(e));
                }
                Err(OpError::Refused(e)) => return Err(e),
            }
        }
    }

    /// Pushes what a committed change produced.
    fn publish(&self, fx: Effects) {
        if let Some(id) = fx.members_changed {
            self.forget(crate::messaging::Forget::Members(id));
        }
        let mut pushes = Vec::with_capacity(fx.tips.len() + fx.events.len());
        for (tip, recipients) in fx.tips {
            pushes.push(Push::stored(recipients.into(), tip, 0));
        }
        for e in &fx.events {
            crate::telemetry::user_stream_event(&e.event);
            let frame = frames::notify_user(e);
            pushes.push(Push::persistent(Arc::from([e.user_id.clone()]), frame, 0));
        }
        self.delivery.push_all(pushes);
    }

    /// A payload the server emits, checked by its kind's plugin as the system: the kind's
    /// content type and the normalized JSON. A disabled kind refuses the change
    /// (`content_type_disabled`); a kind no plugin provides, `content_type_unknown`.
    pub(crate) fn system_payload(
        &self,
        kind: SystemKind,
        conversation_type: u8,
        conversation_id: i64,
        payload: &Value,
    ) -> Result<(u32, String), Error> {
        let content_type = self
            .registry
            .by_name(kind.name())
            .map(|p| p.manifest.content_type)
            .ok_or_else(|| {
                Error::new(
                    Code::ContentTypeUnknown,
                    format!("no plugin named {} is loaded", kind.name()),
                )
            })?;
        let id = conversation_id.to_string();
        let ctx = SendContext {
            sender_id: "system",
            sender: SenderKind::System,
            conversation_type,
            conversation_id: &id,
        };
        // The plugin call blocks its thread (a busy plugin up to its wait limit): tell the
        // runtime, so this worker's other tasks move elsewhere meanwhile.
        let text = payload.to_string();
        let v = tokio::task::block_in_place(|| {
            self.registry.validate(content_type, &ctx, text.as_bytes())
        })?;
        Ok((content_type, v.into_text()))
    }
}

/// The kinds only the server emits, found by their plugins' manifest names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SystemKind {
    /// A friend request and its outcome; the "you are now friends" tip.
    FriendRequest,
    /// "X removed Y" in a group.
    GroupKick,
    /// Every other group or channel tip.
    GroupUpdate,
}

impl SystemKind {
    pub fn name(self) -> &'static str {
        match self {
            SystemKind::FriendRequest => "friend-request",
            SystemKind::GroupKick => "group-kick",
            SystemKind::GroupUpdate => "group-update",
        }
    }
}

/// The JSON value of a payload a plugin normalized.
pub(crate) fn value(payload: &str) -> Value {
    serde_json::from_str(payload).unwrap_or(Value::Null)
}
