//! What a committer remembers of the conversations its batches wrote, so that the next
//! batch to them is decided without reading them again — and written only if nothing it
//! was decided by moved (`store::batch::write` checks each head's last seq and version).

use std::collections::HashMap;

use super::batch::{NewMessage, Op, Target};
use crate::store::batch::{ByConversation, Head, Members, Pair, pair};

/// The heads and members a batch decided by, and the private conversations it found by
/// pair: what the committer remembers after it committed.
#[derive(Default)]
pub struct Decided {
    pub(super) heads: ByConversation<Head>,
    pub(super) members: ByConversation<Members>,
    pub(super) pairs: HashMap<Pair, i64>,
}

/// What a committer remembers of the conversations its batches wrote: each head and its
/// members as its last batch left them, and private conversations by pair. Never trusted
/// on its own: a batch decided from it writes only if every head it names still has the
/// last seq and version remembered (the version moves with every change of members or of
/// a group's settings, `migrations/*/0005_head_versions.sql`, but for a private
/// conversation's members inserted with its head, before anyone can read it: `0012`).
#[derive(Default)]
pub struct Known {
    conversations: ByConversation<(Head, Members)>,
    pairs: HashMap<Pair, i64>,
}

/// Conversations a committer remembers at most; past it, it starts again empty.
const KNOWN_MAX: usize = 16_384;

impl Known {
    /// The conversation `m` goes to, if remembered, and the pair it was found by (a
    /// message to a peer).
    fn conversation_of(&self, m: &NewMessage) -> Option<(i64, Option<Pair>)> {
        match &m.target {
            Target::Conversation(id) => Some((*id, None)),
            Target::Peer(p) if p != &m.sender_id => {
                let key = pair(&m.sender_id, p);
                let id = *self.pairs.get(&key)?;
                Some((id, Some(key)))
            }
            Target::Peer(_) => None,
        }
    }

    /// Everything `ops` need, taken out, if every op is a send (not a recall) to a
    /// remembered conversation whose membership row of the sender is remembered too.
    pub(super) fn take(&mut self, ops: &[Op]) -> Option<Decided> {
        let mut ids = Vec::with_capacity(ops.len());
        let mut pairs = Vec::new();
        for op in ops {
            let id = match op {
                Op::Send(m) if m.recalls.is_none() => {
                    let (id, key) = self.conversation_of(m)?;
                    pairs.extend(key.map(|key| (key, id)));
                    id
                }
                Op::Received {
                    conversation_id, ..
                } => *conversation_id,
                Op::Send(_) | Op::Read { .. } => return None,
            };
            let (_, members) = self.conversations.get(&id)?;
            if !members.any.contains_key(op.actor()) {
                return None;
            }
            ids.push(id);
        }
        let mut decided = Decided {
            heads: ByConversation::with_capacity_and_hasher(ids.len(), Default::default()),
            members: ByConversation::with_capacity_and_hasher(ids.len(), Default::default()),
            pairs: HashMap::with_capacity(pairs.len()),
        };
        decided.pairs.extend(pairs);
        for id in ids {
            if let Some((head, members)) = self.conversations.remove(&id) {
                decided.heads.insert(id, head);
                decided.members.insert(id, members);
            }
        }
        Some(decided)
    }

    /// Forgets the conversations `ops` name (before they are read again).
    pub(super) fn forget(&mut self, ops: &[Op]) {
        for op in ops {
            let id = match op {
                Op::Send(m) => self.conversation_of(m).map(|(id, _)| id),
                Op::Read { .. } | Op::Received { .. } => op.conversation(),
            };
            if let Some(id) = id {
                self.conversations.remove(&id);
            }
        }
    }

    /// Remembers what a committed batch decided by, as it left it.
    pub(super) fn keep(&mut self, decided: Decided) {
        if self.conversations.len() + decided.heads.len() > KNOWN_MAX {
            self.conversations.clear();
            self.pairs.clear();
        }
        let Decided {
            heads,
            mut members,
            pairs,
        } = decided;
        self.pairs.extend(pairs);
        for (id, mut head) in heads {
            let Some(mut mem) = members.remove(&id) else {
                continue;
            };
            head.base_seq = head.last_seq;
            head.dirty = false;
            // A group's rows are its senders' only: those of an earlier batch of the same
            // version still hold.
            if let Some((before, old)) = self.conversations.remove(&id)
                && before.version == head.version
            {
                for (user, left_at) in old.any {
                    mem.any.entry(user).or_insert(left_at);
                }
                for (user, role) in old.roles {
                    mem.roles.entry(user).or_insert(role);
                }
            }
            mem.recipients();
            self.conversations.insert(id, (head, mem));
        }
    }
}
