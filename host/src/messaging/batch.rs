//! The group commit: many sends and read-position moves in one transaction, in arrival
//! order. Per conversation, `seq` is allocated under the head row (locked on PostgreSQL,
//! the single writer on SQLite), so the order of seq is the order of commit. The rules of
//! each op are decided here; the statements are `store::batch`'s.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::AnyConnection;

pub use super::known::{Decided, Known};
use super::rules::{SendView, may_send};
use crate::protocol::{Refused, ordered};
use crate::store::batch::{
    BatchError, ByConversation, Created, Found, Head, Heads, Members, Pair, Pending,
    RecipientCache, Stored, Writes, acc_at, committing, complete, create_pairs, creation_locks,
    lock_first, pair, read_position, recall_target, recalled_counting, uncreate_pairs, write,
};
use crate::store::social::blocked_pairs_locking;
use crate::store::sync::unread;
use crate::store::{BatchTx, Dialect, Store, Writer};
use crate::telemetry::{self, CommitPath};

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
    /// When the send arrived (for the send→ack metric).
    pub received: std::time::Instant,
}

#[derive(Debug, Clone)]
pub enum Op {
    Send(NewMessage),
    Read {
        user_id: String,
        conversation_id: i64,
        seq: i64,
    },
    /// A device received the conversation up to `seq`: the user's delivered position.
    Received {
        user_id: String,
        conversation_id: i64,
        seq: i64,
    },
}

impl Op {
    /// The conversation named by id (not a send to a peer).
    pub(super) fn conversation(&self) -> Option<i64> {
        match self {
            Op::Send(NewMessage {
                target: Target::Conversation(id),
                ..
            })
            | Op::Read {
                conversation_id: id,
                ..
            }
            | Op::Received {
                conversation_id: id,
                ..
            } => Some(*id),
            Op::Send(_) => None,
        }
    }

    /// Who acts: the sender, reader or receiver.
    pub(super) fn actor(&self) -> &str {
        match self {
            Op::Send(m) => &m.sender_id,
            Op::Read { user_id, .. } | Op::Received { user_id, .. } => user_id,
        }
    }
}

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
    Received {
        conversation_id: i64,
        conversation_type: u8,
        user_id: String,
        /// The position asked for, up to the conversation's end.
        seq: i64,
        /// The user's delivered position after the batch (known once written).
        position: i64,
        /// This op moved it there (of several in one batch, the one that did).
        moved: bool,
        members: Arc<[String]>,
    },
    Refused(Refused),
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

    /// Whether `id` was given out by this node after `last` (an id `next` returned).
    pub fn given_since(&self, last: i64, id: i64) -> bool {
        id > last && (id >> 12) & 0x3ff == self.node
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
    /// PostgreSQL: when the batch, all its attempts, must be answered by
    /// (`storage.answer_timeout_secs`); an attempt on the committer's kept connection gets
    /// one deadline of it, so a second attempt on a new connection has time left.
    pub until: Option<tokio::time::Instant>,
    pub recall_window_ms: i64,
    pub ids: &'a IdGen,
    pub recipients: &'a RecipientCache,
    /// A run again of a batch whose connection broke (`BatchError::Broken`,
    /// `BrokenInCommit`): an id `ids` gave out before its first run. A send found stored
    /// in its own conversation with an id this node gave out since was stored by that
    /// earlier run, whose answer was lost: a conversation's sends go to one committer,
    /// which runs one batch at a time.
    pub rerun_after: Option<i64>,
}

impl BatchContext<'_> {
    /// Whether an earlier run of this batch stored the message `msg_id`.
    fn stored_earlier(&self, msg_id: i64) -> bool {
        self.rerun_after
            .is_some_and(|last| self.ids.given_since(last, msg_id))
    }
}

/// Runs `ops` in one transaction, in order; one outcome per op. A refused op does not
/// stop the others. On `Err` nothing was written.
///
/// When `known` remembers every conversation the ops touch (their heads and members, as
/// the committer's last batch of each left them), the batch is decided from that and
/// written by one statement that checks each head's last seq and version are unchanged —
/// one round trip, no lock taken before it. When one moved (another writer, a change of
/// members), nothing was written, and the batch runs again from the rows, under their
/// locks.
pub async fn commit(
    store: &Store,
    writer: &mut Writer,
    known: &mut Known,
    ops: &[Op],
    ctx: &BatchContext<'_>,
) -> Result<Vec<Outcome>, BatchError> {
    if let Some(remembered) = known.take(ops) {
        match attempt(store, writer, ops, ctx, Some(remembered)).await {
            Ok((outcomes, decided)) => {
                telemetry::commit_path(CommitPath::Remembered);
                known.keep(decided);
                return Ok(outcomes);
            }
            Err(BatchError::Stale | BatchError::Conflict) => {
                telemetry::commit_path(CommitPath::Stale);
            }
            Err(e) => return Err(e),
        }
    }
    telemetry::commit_path(CommitPath::Locked);
    known.forget(ops);
    let (outcomes, decided) = attempt(store, writer, ops, ctx, None).await?;
    known.keep(decided);
    Ok(outcomes)
}

/// One attempt at a batch: decided from `remembered` (heads checked by its write), or from
/// the rows read under their locks.
async fn attempt(
    store: &Store,
    writer: &mut Writer,
    ops: &[Op],
    ctx: &BatchContext<'_>,
    remembered: Option<Decided>,
) -> Result<(Vec<Outcome>, Decided), BatchError> {
    let pooled = !writer.connected();
    let work = async {
        let mut tx = store.begin_batch(writer, remembered.is_none()).await?;
        match run(store.dialect(), &mut tx, ops, ctx, remembered).await {
            Ok((outcomes, decided, committed)) => {
                tx.finish(committed).await.map_err(committing)?;
                Ok((outcomes, decided))
            }
            Err(e @ (BatchError::Broken(_) | BatchError::BrokenInCommit(_))) => {
                tx.discard();
                Err(e)
            }
            Err(e) => {
                tx.abort().await;
                Err(e)
            }
        }
    };
    // PostgreSQL: a connection that stops answering fails the attempt by its deadline
    // (`BatchContext::until`), and is closed. Whether its commit was made
    // is not known (`BrokenInCommit`): the batch may run again, where resends find what
    // it stored.
    let until = match (ctx.until, store.answer_timeout()) {
        (Some(until), Some(answer)) if !pooled => {
            Some(until.min(tokio::time::Instant::now() + answer))
        }
        (until, _) => until,
    };
    let answered = store.answered_by(until, work).await;
    let result = match answered {
        Ok(result) => result,
        Err(silent) => {
            writer.close();
            Err(BatchError::BrokenInCommit(silent))
        }
    };
    result.inspect_err(|e: &BatchError| {
        if let Some(e) = e.source_error() {
            store.note(e);
        }
    })
}

/// The private conversations a batch names by peer, and the first messages a peer's block
/// refused.
struct Targets {
    by_pair: HashMap<Pair, i64>,
    /// `(peer, sender)` of first messages the peer blocks: they create nothing.
    blocked_by_peer: HashSet<(String, String)>,
}

impl Targets {
    /// The pairs a batch's sends name by peer, as `(peer, sender)`.
    fn wanted(ops: &[Op]) -> Vec<(String, String)> {
        let mut by_peer: Vec<(String, String)> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Send(m) => match &m.target {
                    Target::Peer(p) if p != &m.sender_id => Some((p.clone(), m.sender_id.clone())),
                    _ => None,
                },
                Op::Read { .. } | Op::Received { .. } => None,
            })
            .collect();
        by_peer.sort();
        by_peer.dedup();
        by_peer
    }

    /// For each `clientMsgId` a batch sends by peer and has not `stored` already, the
    /// peers its sends name, as `(peer, sender)`, in the order of its sends: only the
    /// first of them not refused is stored to, and the later ones are resends of it, which
    /// make nothing (naming another peer must not make that conversation). A send of the
    /// key by conversation id ends its list: that conversation exists.
    fn creatable(
        ops: &[Op],
        stored: &HashMap<(String, String), (Arc<Stored>, bool)>,
    ) -> Vec<Vec<(String, String)>> {
        let by_peer = |op: &Op| matches!(op, Op::Send(m) if matches!(m.target, Target::Peer(_)));
        if !ops.iter().any(by_peer) {
            return Vec::new();
        }
        let mut keys: HashMap<(&str, &str), usize> = HashMap::new();
        // Per key: its peers, and whether a send by conversation id ended the list.
        let mut lists: Vec<(Vec<(String, String)>, bool)> = Vec::new();
        for op in ops {
            let Op::Send(m) = op else { continue };
            let key = (m.sender_id.as_str(), m.client_msg_id.as_str());
            let at = match keys.get(&key) {
                Some(at) => *at,
                None => {
                    let resend = !stored.is_empty()
                        && stored.contains_key(&(key.0.to_string(), key.1.to_string()));
                    lists.push((Vec::new(), resend));
                    keys.insert(key, lists.len() - 1);
                    lists.len() - 1
                }
            };
            let (list, ended) = &mut lists[at];
            match &m.target {
                _ if *ended => {}
                Target::Conversation(_) => *ended = true,
                Target::Peer(p) if p != &m.sender_id => list.push((p.clone(), m.sender_id.clone())),
                Target::Peer(_) => {}
            }
        }
        lists
            .into_iter()
            .map(|(list, _)| list)
            .filter(|list| !list.is_empty())
            .collect()
    }

    /// Private conversations named by peer: those `found` by the batch's first statement;
    /// the first message of a key (`creatable`) creates its conversation unless the peer
    /// blocks the sender or does not exist (then it creates nothing, and the key's next
    /// peer is tried). With what was created (`Created`: on PostgreSQL the new heads and
    /// members).
    async fn resolve(
        d: Dialect,
        conn: &mut AnyConnection,
        keys: Vec<Vec<(String, String)>>,
        mut by_pair: HashMap<Pair, i64>,
        now: i64,
    ) -> Result<(Targets, Created), BatchError> {
        let mut blocked_by_peer = HashSet::new();
        let mut created = Created::default();
        // Per key, the peer its first send not yet refused names.
        let mut at = vec![0usize; keys.len()];
        // Pairs a round asked for and did not get: the peer does not exist.
        let mut missing: HashSet<Pair> = HashSet::new();
        loop {
            let mut first: Vec<(String, String)> = Vec::new();
            for (list, at) in keys.iter().zip(at.iter_mut()) {
                while let Some((peer, sender)) = list.get(*at) {
                    let p = pair(sender, peer);
                    if by_pair.contains_key(&p) {
                        break;
                    }
                    if missing.contains(&p)
                        || blocked_by_peer.contains(&(peer.clone(), sender.clone()))
                    {
                        *at += 1;
                        continue;
                    }
                    first.push((peer.clone(), sender.clone()));
                    break;
                }
            }
            if first.is_empty() {
                break;
            }
            first.sort();
            first.dedup();
            // The creation locks of the pairs first (`creation_locks`), with the blocks:
            // the statements that read which users exist and create the pairs follow them.
            let pairs: Vec<Pair> = first.iter().map(|(p, s)| pair(s, p)).collect();
            let blocked = blocked_pairs_locking(d, conn, &first, &creation_locks(&pairs)).await?;
            let mut create: Vec<Pair> = first
                .iter()
                .filter(|p| !blocked.contains(*p))
                .map(|(p, s)| pair(s, p))
                .collect();
            blocked_by_peer.extend(blocked);
            create.sort();
            create.dedup();
            let mut made = create_pairs(d, conn, &create, now).await?;
            missing.extend(
                create
                    .iter()
                    .filter(|p| !made.ids.contains_key(*p))
                    .cloned(),
            );
            // A block that committed while the statement above waited for the pairs'
            // locks is missed by it (its snapshot is older) and copied into the new member
            // rows by the creating statement: a pair whose every first send here its peer
            // blocks is for refused sends only, and is undone (PostgreSQL; rare).
            // Only a new pair with a blocker is looked at (almost never), so the common
            // batch pays one look per new pair.
            let of = |p: &Pair, (peer, sender): &(String, String)| {
                ordered((sender.as_str(), peer.as_str())) == (p.0.as_str(), p.1.as_str())
            };
            let late: Vec<(Pair, i64)> = made
                .ids
                .iter()
                .filter_map(|(p, id)| {
                    let blockers = &made.members.get(id)?.blockers;
                    let refused_only = !blockers.is_empty()
                        && first
                            .iter()
                            .filter(|s| of(p, s))
                            .all(|(peer, _)| blockers.contains(peer));
                    refused_only.then(|| (p.clone(), *id))
                })
                .collect();
            if !late.is_empty() {
                let ids: Vec<i64> = late.iter().map(|(_, id)| *id).collect();
                uncreate_pairs(conn, &ids).await?;
                for (p, id) in &late {
                    made.ids.remove(p);
                    made.heads.remove(id);
                    made.members.remove(id);
                }
                blocked_by_peer.extend(
                    first
                        .iter()
                        .filter(|s| late.iter().any(|(p, _)| of(p, s)))
                        .cloned(),
                );
            }
            by_pair.extend(made.ids.drain());
            created.heads.extend(made.heads);
            created.members.extend(made.members);
        }
        let targets = Targets {
            by_pair,
            blocked_by_peer,
        };
        Ok((targets, created))
    }

    /// The conversation a send goes to.
    fn conversation_of(&self, m: &NewMessage) -> Result<i64, Refused> {
        match &m.target {
            Target::Conversation(id) => Ok(*id),
            Target::Peer(p) if p == &m.sender_id => Err(Refused::SelfConversation),
            Target::Peer(p)
                if !self.blocked_by_peer.is_empty()
                    && self
                        .blocked_by_peer
                        .contains(&(p.clone(), m.sender_id.clone())) =>
            {
                Err(Refused::Blocked)
            }
            Target::Peer(p) => self
                .by_pair
                .get(&pair(&m.sender_id, p))
                .copied()
                .ok_or_else(|| Refused::UserNotFound(p.clone())),
        }
    }
}

/// The head rows (locked) and the members of every conversation a batch touches — its
/// sends' and reads', and its resends' (to push the original again) — with the private
/// conversations its sends name by peer and the resends already stored. One statement
/// when every private conversation exists and every resend is of a conversation the batch
/// names; a first message or another resend locks its conversation after (a second writer
/// meeting that order the other way round deadlocks, and the batch runs again).
async fn lock_touched(
    d: Dialect,
    conn: &mut AnyConnection,
    opening: &str,
    ops: &[Op],
    ctx: &BatchContext<'_>,
) -> Result<(Targets, Found), BatchError> {
    let mut ids: Vec<i64> = ops.iter().filter_map(Op::conversation).collect();
    ids.sort_unstable();
    ids.dedup();
    let by_peer = Targets::wanted(ops);
    let mut pairs: Vec<Pair> = by_peer.iter().map(|(p, s)| pair(s, p)).collect();
    pairs.sort();
    pairs.dedup();
    let keys: Vec<(&str, &str)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Send(m) => Some((m.sender_id.as_str(), m.client_msg_id.as_str())),
            Op::Read { .. } | Op::Received { .. } => None,
        })
        .collect();
    let mut found = lock_first(d, conn, opening, &ids, &pairs, &keys).await?;
    let creatable = Targets::creatable(ops, &found.stored);
    let (targets, created) = Targets::resolve(
        d,
        conn,
        creatable,
        std::mem::take(&mut found.pairs),
        ctx.now,
    )
    .await?;
    found.heads.extend(created.heads);
    found.members.extend(created.members);
    // Conversations created by a first message (SQLite: read like the others), and those
    // of resends the batch does not name otherwise.
    let mut later: Vec<i64> = targets
        .by_pair
        .values()
        .copied()
        .chain(found.stored.values().map(|(m, _)| m.conversation_id))
        .filter(|id| !found.heads.contains_key(id))
        .collect();
    later.sort_unstable();
    later.dedup();
    if !later.is_empty() {
        let more = lock_first(d, conn, "", &later, &[], &[]).await?;
        found.heads.extend(more.heads);
        found.members.extend(more.members);
    }
    let actors: Vec<(i64, &str)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Send(m) => Some((targets.conversation_of(m).ok()?, m.sender_id.as_str())),
            Op::Read { .. } | Op::Received { .. } => Some((op.conversation()?, op.actor())),
        })
        .collect();
    complete(
        d,
        conn,
        &actors,
        ctx.recipients,
        &mut found.heads,
        &mut found.members,
    )
    .await?;
    Ok((targets, found))
}

/// Runs the batch in `tx`, decided from `remembered` or from the rows it locks; its
/// outcomes, what it decided by, and whether its last statement committed.
async fn run(
    d: Dialect,
    tx: &mut BatchTx<'_>,
    ops: &[Op],
    ctx: &BatchContext<'_>,
    remembered: Option<Decided>,
) -> Result<(Vec<Outcome>, Decided, bool), BatchError> {
    let (opening, closing) = (tx.opening(), tx.closing());
    let conn = tx.conn();
    // 1. The head rows (locked), the private conversations named by peer, the resends
    // already stored; or what the committer remembers of them (a resend of a message
    // stored earlier then fails the write, and the batch runs again from the rows).
    let (targets, mut heads, mut members, mut stored_before, checked) = match remembered {
        Some(r) => {
            let targets = Targets {
                by_pair: r.pairs,
                blocked_by_peer: HashSet::new(),
            };
            (targets, r.heads, r.members, HashMap::new(), Heads::Checked)
        }
        None => {
            let (targets, found) = lock_touched(d, conn, opening, ops, ctx).await?;
            let Found {
                heads,
                members,
                stored,
                ..
            } = found;
            (targets, heads, members, stored, Heads::Moved)
        }
    };
    let opening = match checked {
        Heads::Checked => opening,
        Heads::Moved => "",
    };

    // 2. Each op in order.
    let mut pending = Pending::default();
    // At most an entry a send: made at that size, never grown by rehashing.
    let mut in_batch: HashMap<(String, String), Arc<Stored>> = HashMap::with_capacity(ops.len());
    let mut read_moves: HashMap<(String, i64), (i64, i64)> = HashMap::with_capacity(ops.len());
    let mut delivered: HashMap<(String, i64), i64> = HashMap::new();
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
                    // Stored by an earlier run of this batch whose answer was lost: this
                    // send's own message, answered and pushed as new (its offline notice
                    // too); a later send with its key in this batch is a resend of it.
                    let own = push_again
                        && ctx.stored_earlier(original.msg_id)
                        && targets.conversation_of(m) == Ok(original.conversation_id);
                    if own {
                        stored_before.remove(&key);
                        in_batch.insert(key, original.clone());
                    }
                    let recipients = match push_again {
                        false => Arc::from([]),
                        // In a group, today's members are not those who could see it: only
                        // the sender's own devices get it again.
                        true if original.conversation_type >= 2 && !own => {
                            Arc::from([m.sender_id.clone()])
                        }
                        true => members
                            .get_mut(&original.conversation_id)
                            .map(Members::recipients)
                            .unwrap_or_else(|| Arc::from([])),
                    };
                    Outcome::Sent {
                        message: original,
                        duplicate: !own,
                        recipients,
                    }
                } else {
                    match send(
                        d,
                        conn,
                        m,
                        &targets,
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
                flush(d, conn, &mut pending, ctx.now).await?;
                read(
                    d,
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
            Op::Received {
                user_id,
                conversation_id,
                seq,
            } => received(
                user_id,
                *conversation_id,
                *seq,
                &heads,
                &mut members,
                &mut delivered,
            ),
        };
        outcomes.push(outcome);
    }
    stored_before.clear();
    // 3. The rest of the writes, in one statement.
    let mut written = write(
        d,
        conn,
        Writes {
            pending: &mut pending,
            heads: (&heads, checked),
            reads: &read_moves,
            delivered: &delivered,
            now: ctx.now,
        },
        opening,
        closing,
    )
    .await?;
    // Where each `received` left the position and whether it moved it, now that the
    // write said: of several for one conversation, the one whose seq it moved to.
    for outcome in &mut outcomes {
        if let Outcome::Received {
            conversation_id,
            user_id,
            seq,
            position,
            moved,
            ..
        } = outcome
        {
            let key = (std::mem::take(user_id), *conversation_id);
            *position = written.positions.get(&key).copied().unwrap_or(*seq);
            *moved = written.delivered.get(&key) == Some(seq)
                && written.delivered.remove(&key).is_some();
            *user_id = key.0;
        }
    }
    let committed = written.committed;
    // The heads this transaction created take their versions from the write; one it did
    // not write is not remembered (the next batch reads it).
    for (id, version) in written.versions {
        if let Some(h) = heads.get_mut(&id) {
            h.version = version;
            h.created = false;
        }
    }
    heads.retain(|_, h| !h.created);
    let decided = Decided {
        heads,
        members,
        pairs: targets.by_pair,
    };
    Ok((outcomes, decided, committed))
}

/// Writes the batch's messages so far, for a statement that reads them (a read's position,
/// a recall's target).
async fn flush(
    d: Dialect,
    conn: &mut AnyConnection,
    pending: &mut Pending,
    now: i64,
) -> Result<(), BatchError> {
    let (heads, reads, delivered) = (ByConversation::default(), HashMap::new(), HashMap::new());
    let writes = Writes {
        pending,
        heads: (&heads, Heads::Moved),
        reads: &reads,
        delivered: &delivered,
        now,
    };
    write(d, conn, writes, "", "").await?;
    Ok(())
}

/// Whether `m` (a recall) may hide message `target`: the sender's own, not a recall or a
/// tip, not recalled already, within the recall window.
async fn may_recall(
    conn: &mut AnyConnection,
    m: &NewMessage,
    conversation_id: i64,
    target: i64,
    ctx: &BatchContext<'_>,
) -> Result<Result<(), Refused>, BatchError> {
    let Some(t) = recall_target(conn, conversation_id, target).await? else {
        return Ok(Err(Refused::MessageNotFound(target)));
    };
    Ok(if t.sender_id != m.sender_id {
        Err(Refused::RecallNotOwn(target))
    } else if t.content_type == m.content_type || t.system {
        Err(Refused::NotRecallable(target))
    } else if t.recalled_by != 0 {
        Err(Refused::AlreadyRecalled(target))
    } else if ctx.now - t.server_time > ctx.recall_window_ms {
        Err(Refused::RecallWindowExpired(target))
    } else {
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
async fn send(
    d: Dialect,
    conn: &mut AnyConnection,
    m: &NewMessage,
    targets: &Targets,
    heads: &mut ByConversation<Head>,
    members: &mut ByConversation<Members>,
    pending: &mut Pending,
    ctx: &BatchContext<'_>,
) -> Result<Result<(Arc<Stored>, Arc<[String]>, i64), Refused>, BatchError> {
    let conversation_id = match targets.conversation_of(m) {
        Ok(id) => id,
        Err(r) => return Ok(Err(r)),
    };
    let (Some(head), Some(mem)) = (
        heads.get_mut(&conversation_id),
        members.get_mut(&conversation_id),
    ) else {
        return Ok(Err(Refused::NotAMember(conversation_id)));
    };
    let view = SendView {
        conversation_id,
        conversation_type: head.conversation_type,
        dissolved: head.dissolved,
        mute_all: head.mute_all,
        membership: mem.any.get(&m.sender_id).copied(),
        role: mem.roles.get(&m.sender_id).copied(),
        blockers: &mem.blockers,
        deleted: mem.deleted.as_deref(),
    };
    if let Err(r) = may_send(&view, &m.sender_id, m.conversation_type, ctx.now) {
        return Ok(Err(r));
    }
    if let Some(target) = m.recalls {
        // The recall reads its target: the rows this batch wrote so far go first.
        flush(d, conn, pending, ctx.now).await?;
        if let Err(r) = may_recall(conn, m, conversation_id, target, ctx).await? {
            return Ok(Err(r));
        }
    }
    head.last_seq += 1;
    head.unread_acc += i64::from(m.counts_unread);
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
        head.unread_acc,
    ));
    Ok(Ok((stored, mem.recipients(), head.unread_acc)))
}

#[allow(clippy::too_many_arguments)]
async fn read(
    d: Dialect,
    conn: &mut AnyConnection,
    user_id: &str,
    conversation_id: i64,
    seq: i64,
    heads: &ByConversation<Head>,
    members: &mut ByConversation<Members>,
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
        None => read_position(conn, user_id, conversation_id).await?,
    };
    let end = left_at.map_or(head.last_seq, |l| l.min(head.last_seq));
    let target = seq.clamp(0, end);
    let moved = target > read_seq;
    if moved {
        let acc = acc_at(conn, conversation_id, target)
            .await?
            .ok_or(sqlx::Error::RowNotFound)?;
        read_seq = target;
        read_acc = acc;
        read_moves.insert(key, (read_seq, read_acc));
    }
    let end_acc = if end == head.last_seq {
        head.unread_acc
    } else {
        acc_at(conn, conversation_id, end).await?.unwrap_or(0)
    };
    let recalled = recalled_counting(d, conn, conversation_id, read_seq, end).await?;
    Ok(Outcome::Read {
        conversation_id,
        conversation_type: head.conversation_type,
        user_id: user_id.to_string(),
        read_seq,
        moved,
        unread: unread(end_acc, read_acc, recalled),
        members: mem.recipients(),
    })
}

/// A device received a conversation up to `seq`: the user's delivered position moves
/// there (up to the conversation's end, or where the user's membership ended), if it is
/// not there already — which the write tells.
fn received(
    user_id: &str,
    conversation_id: i64,
    seq: i64,
    heads: &ByConversation<Head>,
    members: &mut ByConversation<Members>,
    delivered: &mut HashMap<(String, i64), i64>,
) -> Outcome {
    let (Some(head), Some(mem)) = (
        heads.get(&conversation_id),
        members.get_mut(&conversation_id),
    ) else {
        return Outcome::Refused(Refused::NotAMember(conversation_id));
    };
    let Some(left_at) = mem.any.get(user_id).copied() else {
        return Outcome::Refused(Refused::NotAMember(conversation_id));
    };
    let end = left_at.map_or(head.last_seq, |l| l.min(head.last_seq));
    let seq = seq.clamp(0, end);
    let position = delivered
        .entry((user_id.to_string(), conversation_id))
        .or_insert(0);
    *position = (*position).max(seq);
    Outcome::Received {
        conversation_id,
        conversation_type: head.conversation_type,
        user_id: user_id.to_string(),
        seq,
        position: seq,
        moved: false,
        members: mem.recipients(),
    }
}
