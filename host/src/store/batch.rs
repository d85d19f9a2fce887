//! The group commit: many sends and read-position moves in one transaction, in arrival
//! order. Per conversation, `seq` is allocated under the head row (locked on PostgreSQL,
//! the single writer on SQLite), so the order of seq is the order of commit.

use crate::protocol::{Code, Error};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::social::blocked_pairs;
use super::{Dialect, Store, placeholders, shaped_chunks, tuples};

/// Where a message goes: a known conversation, or the private conversation with a peer
/// (created by the first message between the two).
#[derive(Debug, Clone)]
pub enum Target {
    Conversation(i64),
    Peer(String),
}

#[derive(Debug, Clone)]
pub struct NewMessage {
    pub target: Target,
    pub conversation_type: u8,
    pub sender_id: String,
    pub client_msg_id: String,
    pub content_type: u32,
    /// Normalized by the plugin: JSON text.
    pub payload: String,
    pub counts_unread: bool,
    /// The recall kind: the seq of the sender's message to hide.
    pub recalls: Option<i64>,
}

#[derive(Debug, Clone)]
pub enum Op {
    Send(NewMessage),
    Read {
        user_id: String,
        conversation_id: i64,
        seq: i64,
    },
}

pub use crate::protocol::Stored;

#[derive(Debug, Clone)]
pub enum Outcome {
    Sent {
        message: Arc<Stored>,
        /// A resend of a `clientMsgId` already stored: nothing new was written.
        duplicate: bool,
        /// Members to push to (for a resend, the original again; empty for a resend of a
        /// message in the same batch).
        recipients: Arc<[String]>,
    },
    Read {
        conversation_id: i64,
        conversation_type: u8,
        user_id: String,
        read_seq: i64,
        /// `false`: the position was already at or past the requested seq.
        moved: bool,
        unread: i64,
        members: Arc<[String]>,
    },
    Refused(Refused),
}

/// Why one operation of a batch was refused (the rest of the batch goes on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("you are not a member of conversation {0}")]
    NotAMember(i64),
    #[error("no user {0:?}")]
    UserNotFound(String),
    #[error("a private conversation needs two different users")]
    SelfConversation,
    #[error(
        "there is no conversation with {0:?} yet: a stored message starts one, live kinds need one"
    )]
    NoConversation(String),
    #[error("conversation {conversation_id} has type {actual}, not {given}")]
    ConversationTypeMismatch {
        conversation_id: i64,
        actual: u8,
        given: u8,
    },
    #[error("no message with seq {0} in this conversation")]
    MessageNotFound(i64),
    #[error("message {0} was sent by someone else")]
    RecallNotOwn(i64),
    #[error("message {0} is older than the recall window")]
    RecallWindowExpired(i64),
    #[error("message {0} is already recalled")]
    AlreadyRecalled(i64),
    #[error("message {0} is a recall or a server tip and cannot be recalled")]
    NotRecallable(i64),
    #[error("this user blocked you")]
    Blocked,
    #[error("you are muted in conversation {0}")]
    Muted(i64),
    #[error("{0}")]
    PermissionDenied(&'static str),
    #[error("group {0} was dissolved")]
    GroupDissolved(i64),
}

impl Refused {
    pub fn code(&self) -> Code {
        match self {
            Refused::NotAMember(_) => Code::NotAMember,
            Refused::UserNotFound(_) => Code::UserNotFound,
            Refused::SelfConversation => Code::BadRequest,
            Refused::NoConversation(_) => Code::ConversationNotFound,
            Refused::ConversationTypeMismatch { .. } => Code::ConversationTypeMismatch,
            Refused::MessageNotFound(_) => Code::MessageNotFound,
            Refused::RecallNotOwn(_) => Code::RecallNotOwnMessage,
            Refused::RecallWindowExpired(_) => Code::RecallWindowExpired,
            Refused::AlreadyRecalled(_) => Code::AlreadyRecalled,
            Refused::NotRecallable(_) => Code::MessageNotRecallable,
            Refused::Blocked => Code::Blocked,
            Refused::Muted(_) => Code::Muted,
            Refused::PermissionDenied(_) => Code::PermissionDenied,
            Refused::GroupDissolved(_) => Code::GroupDissolved,
        }
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Error {
        Error::new(r.code(), r.to_string())
    }
}

impl From<BatchError> for Error {
    /// Logged in full; answered `store_unavailable`.
    fn from(e: BatchError) -> Error {
        tracing::error!("database: {e}");
        Error::unavailable("the database did not accept the write; retry")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// Another writer (a second node) got there first; the batch is safe to run again.
    #[error("a concurrent writer changed the same rows")]
    Conflict,
    /// The connection broke before `COMMIT` was sent: nothing was written, and the
    /// transaction may run again on another connection.
    #[error("the database connection broke: {0}")]
    Broken(sqlx::Error),
    /// The connection broke while committing: the transaction may or may not have
    /// committed.
    #[error("the database connection broke while committing: {0}")]
    BrokenInCommit(sqlx::Error),
    #[error("database: {0}")]
    Db(sqlx::Error),
}

impl BatchError {
    /// The database error behind it, if any.
    pub fn source_error(&self) -> Option<&sqlx::Error> {
        match self {
            BatchError::Conflict => None,
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

/// Message ids: milliseconds since 2024 (41 bits), the node (10 bits), a counter (12 bits).
/// They grow with time; unique within a node (past 4096 in one millisecond the clock is
/// borrowed from), and across nodes by `node`.
#[derive(Debug)]
pub struct IdGen {
    state: std::sync::Mutex<(i64, i64)>,
    node: i64,
}

const EPOCH_MS: i64 = 1_704_067_200_000;

impl IdGen {
    pub fn new(node: u16) -> IdGen {
        IdGen {
            state: std::sync::Mutex::new((0, 0)),
            node: i64::from(node & 0x3ff),
        }
    }

    pub fn next(&self, now_ms: i64) -> i64 {
        let mut s = self.state.lock().expect("id state");
        let ms = (now_ms - EPOCH_MS).max(0);
        if ms > s.0 {
            *s = (ms, 0);
        } else if s.1 < 0xfff {
            s.1 += 1;
        } else {
            *s = (s.0 + 1, 0);
        }
        (s.0 << 22) | (self.node << 12) | s.1
    }
}

pub struct BatchContext<'a> {
    pub now: i64,
    pub recall_window_ms: i64,
    pub ids: &'a IdGen,
    pub recipients: &'a RecipientCache,
}

/// The current members of groups and channels by `(version, members)`: every change of
/// a group's members moves its version on, under the head lock a batch holds when it
/// reads the version, so a cached list of the same version is the list in the database.
/// It spares a batch reading every member of a large group for each message.
#[derive(Default)]
pub struct RecipientCache(std::sync::Mutex<HashMap<i64, Versioned>>);

/// A group's version and its current members at that version.
type Versioned = (i64, Arc<[String]>);

impl RecipientCache {
    fn get(&self, conversation_id: i64, version: i64) -> Option<Arc<[String]>> {
        let cache = self.0.lock().expect("recipient cache");
        match cache.get(&conversation_id) {
            Some((v, members)) if *v == version => Some(members.clone()),
            _ => None,
        }
    }

    fn put(&self, conversation_id: i64, version: i64, members: Arc<[String]>) {
        let mut cache = self.0.lock().expect("recipient cache");
        if cache.len() >= 10_000 {
            cache.clear();
        }
        cache.insert(conversation_id, (version, members));
    }
}

struct Head {
    conversation_type: u8,
    last_seq: i64,
    acc: i64,
    dirty: bool,
    /// Groups: everyone but owner and admins is muted.
    mute_all: bool,
    dissolved: bool,
}

#[derive(Default)]
struct Members {
    /// Members now, who get the pushes (private conversations; a group's come cached).
    current: Vec<String>,
    /// Groups and channels: the role and mute of the batch's current members.
    roles: HashMap<String, (i64, i64)>,
    /// Membership rows (every member's in a private conversation, the batch's senders'
    /// and readers' in a group), with the seq their membership ended at.
    any: HashMap<String, Option<i64>>,
    current_arc: Option<Arc<[String]>>,
    /// Private conversations: the member who blocks the other, if any.
    blockers: Vec<String>,
    /// Private conversations: the member whose account was deleted (its alias), if any.
    deleted: Option<String>,
}

/// `members.state` of a private conversation's member whose account was deleted.
pub(crate) const MEMBER_DELETED: i64 = 4;

impl Members {
    fn recipients(&mut self) -> Arc<[String]> {
        self.current_arc
            .get_or_insert_with(|| self.current.clone().into())
            .clone()
    }
}

/// Rows written so far in this transaction but not yet sent to the database.
#[derive(Default)]
struct Pending {
    messages: Vec<(Arc<Stored>, String, bool, i64)>,
    recalls: Vec<(i64, i64, i64)>,
}

impl Store {
    /// Runs `ops` in one transaction, in order; one outcome per op. A refused op does not
    /// stop the others. On `Err` nothing was written.
    pub async fn commit(
        &self,
        ops: &[Op],
        ctx: &BatchContext<'_>,
    ) -> Result<Vec<Outcome>, BatchError> {
        let attempt = async {
            let mut tx = self.write().begin().await?;
            let outcomes = run(self.dialect(), &mut tx, ops, ctx).await?;
            tx.commit().await.map_err(committing)?;
            Ok(outcomes)
        };
        attempt.await.inspect_err(|e: &BatchError| {
            if let Some(e) = e.source_error() {
                self.note(e);
            }
        })
    }
}

/// A lost race with another writer (unique key, deadlock, serialization) is a conflict:
/// the batch rolled back and may run again.
fn classify(e: sqlx::Error) -> BatchError {
    match e.as_database_error() {
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

pub use crate::protocol::{Pair, pair};

async fn run(
    d: Dialect,
    conn: &mut AnyConnection,
    ops: &[Op],
    ctx: &BatchContext<'_>,
) -> Result<Vec<Outcome>, BatchError> {
    // 1. Private conversations named by peer: look up; a first message creates its
    // conversation unless the peer blocks the sender (then it creates nothing).
    let mut by_peer: Vec<(String, String)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Send(m) => match &m.target {
                Target::Peer(p) if p != &m.sender_id => Some((p.clone(), m.sender_id.clone())),
                _ => None,
            },
            Op::Read { .. } => None,
        })
        .collect();
    by_peer.sort();
    by_peer.dedup();
    let mut pairs: Vec<Pair> = by_peer.iter().map(|(p, s)| pair(s, p)).collect();
    pairs.sort();
    pairs.dedup();
    let mut by_pair = find_pairs(d, conn, &pairs).await?;
    let first: Vec<(String, String)> = by_peer
        .into_iter()
        .filter(|(p, s)| !by_pair.contains_key(&pair(s, p)))
        .collect();
    let blocked_by_peer = match first.is_empty() {
        true => HashSet::new(),
        false => blocked_pairs(d, conn, &first).await?,
    };
    let mut create: Vec<Pair> = first
        .iter()
        .filter(|p| !blocked_by_peer.contains(*p))
        .map(|(p, s)| pair(s, p))
        .collect();
    create.sort();
    create.dedup();
    by_pair.extend(create_pairs(d, conn, &create, ctx.now).await?);
    let conversation_of = |m: &NewMessage| -> Result<i64, Refused> {
        match &m.target {
            Target::Conversation(id) => Ok(*id),
            Target::Peer(p) if p == &m.sender_id => Err(Refused::SelfConversation),
            Target::Peer(p) if blocked_by_peer.contains(&(p.clone(), m.sender_id.clone())) => {
                Err(Refused::Blocked)
            }
            Target::Peer(p) => by_pair
                .get(&pair(&m.sender_id, p))
                .copied()
                .ok_or_else(|| Refused::UserNotFound(p.clone())),
        }
    };

    // 2. Resends already stored.
    let mut stored_before = find_stored(d, conn, ops).await?;

    // 3. Head rows (locked) and members of every conversation touched.
    let mut ids: Vec<i64> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Send(m) => conversation_of(m).ok(),
            Op::Read {
                conversation_id, ..
            } => Some(*conversation_id),
        })
        .collect();
    // Resends' conversations too, to push the original again (its first push may have been
    // lost with a crash between commit and push).
    ids.extend(stored_before.values().map(|(m, _)| m.conversation_id));
    ids.sort_unstable();
    ids.dedup();
    let actors: Vec<(i64, &str)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Send(m) => Some((conversation_of(m).ok()?, m.sender_id.as_str())),
            Op::Read {
                user_id,
                conversation_id,
                ..
            } => Some((*conversation_id, user_id.as_str())),
        })
        .collect();
    let (mut heads, mut members) = lock_heads(d, conn, &ids, &actors, ctx.recipients).await?;

    // 4. Each op in order.
    let mut pending = Pending::default();
    let mut in_batch: HashMap<(String, String), Arc<Stored>> = HashMap::new();
    let mut read_moves: HashMap<(String, i64), (i64, i64)> = HashMap::new();
    let mut outcomes = Vec::with_capacity(ops.len());
    for op in ops {
        let outcome = match op {
            Op::Send(m) => {
                let key = (m.sender_id.clone(), m.client_msg_id.clone());
                let earlier = match (stored_before.get(&key), in_batch.get(&key)) {
                    // Pushed again unless recalled since (its payload is hidden now).
                    (Some((m, recalled)), _) => Some((m.clone(), !recalled)),
                    // Its first copy in this batch is pushed already.
                    (None, Some(m)) => Some((m.clone(), false)),
                    (None, None) => None,
                };
                if let Some((original, push_again)) = earlier {
                    let recipients = match push_again {
                        false => Arc::from([]),
                        // In a group, today's members are not those who could see it: only
                        // the sender's own devices get it again.
                        true if original.conversation_type >= 2 => Arc::from([m.sender_id.clone()]),
                        true => members
                            .get_mut(&original.conversation_id)
                            .map(Members::recipients)
                            .unwrap_or_else(|| Arc::from([])),
                    };
                    Outcome::Sent {
                        message: original,
                        duplicate: true,
                        recipients,
                    }
                } else {
                    match send(
                        d,
                        conn,
                        m,
                        &conversation_of,
                        &mut heads,
                        &mut members,
                        &mut pending,
                        ctx,
                    )
                    .await?
                    {
                        Ok((stored, recipients, acc)) => {
                            read_moves.insert(
                                (m.sender_id.clone(), stored.conversation_id),
                                (stored.seq, acc),
                            );
                            in_batch.insert(key, stored.clone());
                            Outcome::Sent {
                                message: stored,
                                duplicate: false,
                                recipients,
                            }
                        }
                        Err(refused) => Outcome::Refused(refused),
                    }
                }
            }
            Op::Read {
                user_id,
                conversation_id,
                seq,
            } => {
                flush(d, conn, &mut pending).await?;
                read(
                    conn,
                    user_id,
                    *conversation_id,
                    *seq,
                    &heads,
                    &mut members,
                    &mut read_moves,
                )
                .await?
            }
        };
        outcomes.push(outcome);
    }
    stored_before.clear();

    // 5. The rest of the writes.
    flush(d, conn, &mut pending).await?;
    update_heads(d, conn, &heads, ctx.now).await?;
    upsert_read_positions(d, conn, &read_moves, ctx.now).await?;
    Ok(outcomes)
}

#[allow(clippy::too_many_arguments)]
async fn send(
    d: Dialect,
    conn: &mut AnyConnection,
    m: &NewMessage,
    conversation_of: &impl Fn(&NewMessage) -> Result<i64, Refused>,
    heads: &mut HashMap<i64, Head>,
    members: &mut HashMap<i64, Members>,
    pending: &mut Pending,
    ctx: &BatchContext<'_>,
) -> Result<Result<(Arc<Stored>, Arc<[String]>, i64), Refused>, BatchError> {
    let conversation_id = match conversation_of(m) {
        Ok(id) => id,
        Err(r) => return Ok(Err(r)),
    };
    let (Some(head), Some(mem)) = (
        heads.get_mut(&conversation_id),
        members.get_mut(&conversation_id),
    ) else {
        return Ok(Err(Refused::NotAMember(conversation_id)));
    };
    if head.dissolved && mem.any.contains_key(&m.sender_id) {
        return Ok(Err(Refused::GroupDissolved(conversation_id)));
    }
    if mem.any.get(&m.sender_id) != Some(&None) {
        return Ok(Err(Refused::NotAMember(conversation_id)));
    }
    if head.conversation_type != m.conversation_type {
        return Ok(Err(Refused::ConversationTypeMismatch {
            conversation_id,
            actual: head.conversation_type,
            given: m.conversation_type,
        }));
    }
    if let Some(&(role, muted_until)) = mem.roles.get(&m.sender_id)
        && let Some(r) = group_refusal(head, conversation_id, role, muted_until, ctx.now)
    {
        return Ok(Err(r));
    }
    if mem.blockers.iter().any(|u| u != &m.sender_id) {
        return Ok(Err(Refused::Blocked));
    }
    if let Some(alias) = &mem.deleted {
        return Ok(Err(Refused::UserNotFound(alias.clone())));
    }
    if let Some(target) = m.recalls {
        flush(d, conn, pending).await?;
        let row = sqlx::query(
            "SELECT sender_id, server_time, recalled_by, content_type, system FROM messages \
             WHERE conversation_id = $1 AND seq = $2",
        )
        .bind(conversation_id)
        .bind(target)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Ok(Err(Refused::MessageNotFound(target)));
        };
        let sender: String = row.try_get(0)?;
        let sent_at: i64 = row.try_get(1)?;
        let recalled_by: i64 = row.try_get(2)?;
        let content_type: i64 = row.try_get(3)?;
        let system: i64 = row.try_get(4)?;
        if sender != m.sender_id {
            return Ok(Err(Refused::RecallNotOwn(target)));
        }
        if content_type == i64::from(m.content_type) || system != 0 {
            return Ok(Err(Refused::NotRecallable(target)));
        }
        if recalled_by != 0 {
            return Ok(Err(Refused::AlreadyRecalled(target)));
        }
        if ctx.now - sent_at > ctx.recall_window_ms {
            return Ok(Err(Refused::RecallWindowExpired(target)));
        }
    }
    head.last_seq += 1;
    head.acc += i64::from(m.counts_unread);
    head.dirty = true;
    let stored = Arc::new(Stored {
        conversation_id,
        conversation_type: head.conversation_type,
        seq: head.last_seq,
        msg_id: ctx.ids.next(ctx.now),
        sender_id: m.sender_id.clone(),
        content_type: m.content_type,
        payload: m.payload.clone(),
        server_time: ctx.now,
    });
    if let Some(target) = m.recalls {
        pending.recalls.push((conversation_id, target, stored.seq));
    }
    pending.messages.push((
        stored.clone(),
        m.client_msg_id.clone(),
        m.counts_unread,
        head.acc,
    ));
    Ok(Ok((stored, mem.recipients(), head.acc)))
}

/// What a group or channel refuses of a current member's send.
fn group_refusal(
    head: &Head,
    conversation_id: i64,
    role: i64,
    muted_until: i64,
    now: i64,
) -> Option<Refused> {
    let privileged = role >= 1;
    if head.conversation_type == 3 && !privileged {
        return Some(Refused::PermissionDenied(
            "only the owner and admins post in a channel",
        ));
    }
    if muted_until > now || (head.mute_all && !privileged) {
        return Some(Refused::Muted(conversation_id));
    }
    None
}

async fn read(
    conn: &mut AnyConnection,
    user_id: &str,
    conversation_id: i64,
    seq: i64,
    heads: &HashMap<i64, Head>,
    members: &mut HashMap<i64, Members>,
    read_moves: &mut HashMap<(String, i64), (i64, i64)>,
) -> Result<Outcome, BatchError> {
    let (Some(head), Some(mem)) = (
        heads.get(&conversation_id),
        members.get_mut(&conversation_id),
    ) else {
        return Ok(Outcome::Refused(Refused::NotAMember(conversation_id)));
    };
    let Some(left_at) = mem.any.get(user_id).copied() else {
        return Ok(Outcome::Refused(Refused::NotAMember(conversation_id)));
    };
    let key = (user_id.to_string(), conversation_id);
    let (mut read_seq, mut read_acc) = match read_moves.get(&key) {
        Some(p) => *p,
        None => sqlx::query(
            "SELECT read_seq, read_acc FROM read_positions WHERE user_id = $1 AND conversation_id = $2",
        )
        .bind(user_id)
        .bind(conversation_id)
        .fetch_optional(&mut *conn)
        .await?
        .map(|r| Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?)))
        .transpose()?
        .unwrap_or((0, 0)),
    };
    let end = left_at.map_or(head.last_seq, |l| l.min(head.last_seq));
    let target = seq.clamp(0, end);
    let moved = target > read_seq;
    if moved {
        let acc: i64 =
            sqlx::query("SELECT unread_acc FROM messages WHERE conversation_id = $1 AND seq = $2")
                .bind(conversation_id)
                .bind(target)
                .fetch_one(&mut *conn)
                .await?
                .try_get(0)?;
        read_seq = target;
        read_acc = acc;
        read_moves.insert(key, (read_seq, read_acc));
    }
    let end_acc = if end == head.last_seq {
        head.acc
    } else {
        sqlx::query("SELECT unread_acc FROM messages WHERE conversation_id = $1 AND seq = $2")
            .bind(conversation_id)
            .bind(end)
            .fetch_optional(&mut *conn)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?
            .unwrap_or(0)
    };
    let recalled = recalled_counting(conn, conversation_id, read_seq, end).await?;
    Ok(Outcome::Read {
        conversation_id,
        conversation_type: head.conversation_type,
        user_id: user_id.to_string(),
        read_seq,
        moved,
        unread: (end_acc - read_acc - recalled).max(0),
        members: mem.recipients(),
    })
}

/// Recalled messages that counted toward unread, in `(after, upto]`: what unread
/// subtracts from the running counts.
pub(crate) async fn recalled_counting(
    conn: &mut AnyConnection,
    conversation_id: i64,
    after: i64,
    upto: i64,
) -> sqlx::Result<i64> {
    sqlx::query(
        "SELECT COUNT(*) FROM messages WHERE conversation_id = $1 AND seq > $2 \
         AND seq <= $3 AND recalled_by <> 0 AND counts_unread = 1",
    )
    .bind(conversation_id)
    .bind(after)
    .bind(upto)
    .fetch_one(conn)
    .await?
    .try_get(0)
}

/// The private conversations of `pairs` that exist.
async fn find_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    pairs: &[Pair],
) -> Result<HashMap<Pair, i64>, BatchError> {
    let mut found = HashMap::new();
    if pairs.is_empty() {
        return Ok(found);
    }
    let sql = format!(
        "SELECT user_lo, user_hi, conversation_id FROM private_pairs WHERE (user_lo, user_hi) IN (VALUES {})",
        tuples(d, pairs.len(), 2)
    );
    let mut q = sqlx::query(&sql);
    for (lo, hi) in pairs {
        q = q.bind(lo.as_str()).bind(hi.as_str());
    }
    for row in q.fetch_all(&mut *conn).await? {
        found.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
    }
    Ok(found)
}

/// The private conversations of `pairs`, creating the missing ones (of known users).
pub(crate) async fn resolve_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    pairs: &[Pair],
    now: i64,
) -> Result<HashMap<Pair, i64>, BatchError> {
    let mut found = find_pairs(d, conn, pairs).await?;
    let missing: Vec<Pair> = pairs
        .iter()
        .filter(|p| !found.contains_key(*p))
        .cloned()
        .collect();
    found.extend(create_pairs(d, conn, &missing, now).await?);
    Ok(found)
}

/// Creates the private conversations of `missing` (pairs without one, of known users that
/// were not deleted).
async fn create_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    missing: &[Pair],
    now: i64,
) -> Result<HashMap<Pair, i64>, BatchError> {
    let mut found = HashMap::new();
    if missing.is_empty() {
        return Ok(found);
    }
    let mut users: Vec<&str> = missing
        .iter()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    users.sort_unstable();
    users.dedup();
    let sql = format!(
        "SELECT user_id FROM users WHERE user_id IN ({}) AND deleted_at IS NULL",
        placeholders(d, 1, users.len())
    );
    let mut q = sqlx::query(&sql);
    for u in &users {
        q = q.bind(*u);
    }
    let known: HashSet<String> = q
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    for (lo, hi) in missing {
        if !known.contains(lo) || !known.contains(hi) {
            continue;
        }
        let id: i64 = sqlx::query(
            "INSERT INTO conversations (conversation_type, last_seq, unread_acc, last_time, created_at) \
             VALUES (1, 0, 0, $1, $1) RETURNING conversation_id",
        )
        .bind(now)
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
        let claimed = sqlx::query(
            "INSERT INTO private_pairs (user_lo, user_hi, conversation_id) VALUES ($1, $2, $3) \
             ON CONFLICT (user_lo, user_hi) DO NOTHING",
        )
        .bind(lo.as_str())
        .bind(hi.as_str())
        .bind(id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if claimed == 0 {
            // Another node created it between our look-up and now: run the batch again.
            return Err(BatchError::Conflict);
        }
        sqlx::query(
            "INSERT INTO members (conversation_id, user_id, joined_after_seq, left_at_seq, joined_at) \
             VALUES ($1, $2, 0, NULL, $4), ($1, $3, 0, NULL, $4)",
        )
        .bind(id)
        .bind(lo.as_str())
        .bind(hi.as_str())
        .bind(now)
        .execute(&mut *conn)
        .await?;
        // Blocks made before the conversation existed.
        sqlx::query(
            "UPDATE members SET blocks_peer = 1 WHERE conversation_id = $1 AND EXISTS \
             (SELECT 1 FROM blocks b JOIN members p ON p.conversation_id = members.conversation_id \
             AND p.user_id = b.blocked WHERE b.blocker = members.user_id AND b.active = 1)",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
        found.insert((lo.clone(), hi.clone()), id);
    }
    Ok(found)
}

fn stored_from(row: &AnyRow) -> sqlx::Result<Stored> {
    Ok(Stored {
        conversation_id: row.try_get(2)?,
        conversation_type: row.try_get::<i64, _>(3)? as u8,
        seq: row.try_get(4)?,
        msg_id: row.try_get(5)?,
        sender_id: row.try_get(0)?,
        content_type: row.try_get::<i64, _>(6)? as u32,
        payload: row.try_get(7)?,
        server_time: row.try_get(8)?,
    })
}

async fn find_stored(
    d: Dialect,
    conn: &mut AnyConnection,
    ops: &[Op],
) -> Result<HashMap<(String, String), (Arc<Stored>, bool)>, BatchError> {
    let keys: Vec<(&str, &str)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Send(m) => Some((m.sender_id.as_str(), m.client_msg_id.as_str())),
            Op::Read { .. } => None,
        })
        .collect();
    let mut found = HashMap::new();
    for chunk in shaped_chunks(&keys) {
        let sql = format!(
            "SELECT m.sender_id, m.client_msg_id, m.conversation_id, c.conversation_type, m.seq, \
             m.msg_id, m.content_type, m.payload, m.server_time, m.recalled_by \
             FROM messages m JOIN conversations c ON c.conversation_id = m.conversation_id \
             WHERE (m.sender_id, m.client_msg_id) IN (VALUES {})",
            tuples(d, chunk.len(), 2)
        );
        let mut q = sqlx::query(&sql);
        for (s, c) in chunk {
            q = q.bind(*s).bind(*c);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let recalled = row.try_get::<i64, _>(9)? != 0;
            found.insert(
                (row.try_get(0)?, row.try_get(1)?),
                (Arc::new(stored_from(&row)?), recalled),
            );
        }
    }
    Ok(found)
}

/// Locks the head rows of `ids` (in id order, so two writers never deadlock) and reads
/// them with the membership rows that matter: every member of a private conversation; of a
/// group, the rows of `actors` (its senders and readers in this batch) and the current
/// members, from the cache when the group's version has not moved.
async fn lock_heads(
    d: Dialect,
    conn: &mut AnyConnection,
    ids: &[i64],
    actors: &[(i64, &str)],
    cache: &RecipientCache,
) -> Result<(HashMap<i64, Head>, HashMap<i64, Members>), BatchError> {
    let mut heads = HashMap::new();
    let mut members: HashMap<i64, Members> = HashMap::new();
    let mut versions: HashMap<i64, i64> = HashMap::new();
    for chunk in shaped_chunks(ids) {
        let lock = match d {
            Dialect::Postgres => " FOR UPDATE OF c",
            // The single writer connection already excludes every other writer.
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "SELECT c.conversation_id, c.conversation_type, c.last_seq, c.unread_acc, \
             m.user_id, m.left_at_seq, \
             m.blocks_peer, m.state \
             FROM conversations c \
             LEFT JOIN members m ON m.conversation_id = c.conversation_id AND c.conversation_type = 1 \
             WHERE c.conversation_id IN ({}) ORDER BY c.conversation_id{lock}",
            placeholders(d, 1, chunk.len())
        );
        let mut q = sqlx::query(&sql);
        for id in chunk {
            q = q.bind(*id);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let id: i64 = row.try_get(0)?;
            heads.entry(id).or_insert(Head {
                conversation_type: row.try_get::<i64, _>(1)? as u8,
                last_seq: row.try_get(2)?,
                acc: row.try_get(3)?,
                dirty: false,
                mute_all: false,
                dissolved: false,
            });
            let entry = members.entry(id).or_default();
            if let Some(user) = row.try_get::<Option<String>, _>(4)? {
                let left_at = row.try_get::<Option<i64>, _>(5)?;
                if left_at.is_none() {
                    entry.current.push(user.clone());
                }
                if row.try_get::<Option<i64>, _>(6)?.unwrap_or(0) != 0 {
                    entry.blockers.push(user.clone());
                }
                if row.try_get::<Option<i64>, _>(7)? == Some(MEMBER_DELETED) {
                    entry.deleted = Some(user.clone());
                }
                entry.any.insert(user, left_at);
            }
        }
    }
    // Groups: their settings, read after the lock is held (a statement that waited for
    // the lock would see the rows it joined as they were before the wait).
    let groups: Vec<i64> = heads
        .iter()
        .filter(|(_, h)| h.conversation_type >= 2)
        .map(|(id, _)| *id)
        .collect();
    for chunk in shaped_chunks(&groups) {
        let sql = format!(
            "SELECT conversation_id, mute_all, state, version FROM group_info \
             WHERE conversation_id IN ({})",
            placeholders(d, 1, chunk.len())
        );
        let mut q = sqlx::query(&sql);
        for id in chunk {
            q = q.bind(*id);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let id: i64 = row.try_get(0)?;
            if let Some(h) = heads.get_mut(&id) {
                h.mute_all = row.try_get::<i64, _>(1)? != 0;
                h.dissolved = row.try_get::<i64, _>(2)? != 0;
            }
            versions.insert(id, row.try_get(3)?);
        }
    }
    // Groups: the actors' own rows.
    let mut pairs: Vec<(i64, &str)> = actors
        .iter()
        .filter(|(id, _)| versions.contains_key(id))
        .copied()
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    for chunk in shaped_chunks(&pairs) {
        let sql = format!(
            "SELECT conversation_id, user_id, left_at_seq, role, muted_until FROM members \
             WHERE (conversation_id, user_id) IN (VALUES {})",
            tuples(d, chunk.len(), 2)
        );
        let mut q = sqlx::query(&sql);
        for (id, user) in chunk {
            q = q.bind(*id).bind(*user);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let entry = members.entry(row.try_get(0)?).or_default();
            let user: String = row.try_get(1)?;
            let left_at = row.try_get::<Option<i64>, _>(2)?;
            if left_at.is_none() {
                entry
                    .roles
                    .insert(user.clone(), (row.try_get(3)?, row.try_get(4)?));
            }
            entry.any.insert(user, left_at);
        }
    }
    // Groups: who gets the pushes.
    for (&id, &version) in &versions {
        let current = match cache.get(id, version) {
            Some(c) => c,
            None => {
                let list: Vec<String> = sqlx::query(
                    "SELECT user_id FROM members WHERE conversation_id = $1 AND left_at_seq IS NULL",
                )
                .bind(id)
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
                let list: Arc<[String]> = list.into();
                cache.put(id, version, list.clone());
                list
            }
        };
        members.entry(id).or_default().current_arc = Some(current);
    }
    Ok((heads, members))
}

/// Writes the messages and recall marks collected so far, so the statements that follow
/// in this transaction see them.
async fn flush(
    d: Dialect,
    conn: &mut AnyConnection,
    pending: &mut Pending,
) -> Result<(), BatchError> {
    for chunk in shaped_chunks(&pending.messages) {
        let sql = format!(
            "INSERT INTO messages (conversation_id, seq, msg_id, sender_id, client_msg_id, \
             content_type, payload, server_time, counts_unread, unread_acc) VALUES {}",
            tuples(d, chunk.len(), 10)
        );
        let mut q = sqlx::query(&sql);
        for (m, client_msg_id, counts, acc) in chunk {
            q = q
                .bind(m.conversation_id)
                .bind(m.seq)
                .bind(m.msg_id)
                .bind(m.sender_id.as_str())
                .bind(client_msg_id.as_str())
                .bind(i64::from(m.content_type))
                .bind(m.payload.as_str())
                .bind(m.server_time)
                .bind(i64::from(*counts))
                .bind(*acc);
        }
        q.execute(&mut *conn).await.map_err(classify)?;
    }
    pending.messages.clear();
    for (conversation_id, target, by) in pending.recalls.drain(..) {
        sqlx::query("UPDATE messages SET recalled_by = $1 WHERE conversation_id = $2 AND seq = $3")
            .bind(by)
            .bind(conversation_id)
            .bind(target)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

async fn update_heads(
    d: Dialect,
    conn: &mut AnyConnection,
    heads: &HashMap<i64, Head>,
    now: i64,
) -> Result<(), BatchError> {
    let dirty: Vec<(&i64, &Head)> = heads.iter().filter(|(_, h)| h.dirty).collect();
    for chunk in shaped_chunks(&dirty) {
        let sql = format!(
            "UPDATE conversations SET last_seq = v.column2, unread_acc = v.column3, last_time = v.column4 \
             FROM (VALUES {}) AS v WHERE conversations.conversation_id = v.column1",
            tuples(d, chunk.len(), 4)
        );
        let mut q = sqlx::query(&sql);
        for (id, h) in chunk {
            q = q.bind(**id).bind(h.last_seq).bind(h.acc).bind(now);
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}

async fn upsert_read_positions(
    d: Dialect,
    conn: &mut AnyConnection,
    moves: &HashMap<(String, i64), (i64, i64)>,
    now: i64,
) -> Result<(), BatchError> {
    let rows: Vec<_> = moves.iter().collect();
    for chunk in shaped_chunks(&rows) {
        let sql = format!(
            "INSERT INTO read_positions (user_id, conversation_id, read_seq, read_acc, updated_at) \
             VALUES {} ON CONFLICT (user_id, conversation_id) DO UPDATE SET \
             read_seq = excluded.read_seq, read_acc = excluded.read_acc, updated_at = excluded.updated_at \
             WHERE excluded.read_seq > read_positions.read_seq",
            tuples(d, chunk.len(), 5)
        );
        let mut q = sqlx::query(&sql);
        for ((user, conversation), (seq, acc)) in chunk {
            q = q
                .bind(user.as_str())
                .bind(*conversation)
                .bind(*seq)
                .bind(*acc)
                .bind(now);
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}
