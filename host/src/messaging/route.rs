//! Which committer takes an op. SQLite has one writer, so one committer. On PostgreSQL
//! several committers overlap their commits, each owning a share of the conversations: a
//! conversation always goes to the same committer, so its sends are committed and pushed
//! in the order they arrived.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

pub use crate::protocol::{Pair, pair};

pub struct Routes {
    committers: usize,
    /// Private conversations by pair (they never change).
    pairs: Mutex<HashMap<Pair, i64>>,
    /// A conversation's key, fixed the first time the conversation is routed: its id, or,
    /// for one created by a message to a peer, the pair's key.
    keys: Mutex<HashMap<i64, u64>>,
    /// Pairs routed before their conversation existed here, with the key they got; both
    /// sides' first messages and the conversation they create all take it.
    pending: Mutex<HashMap<Pair, u64>>,
}

impl Routes {
    pub fn new(committers: usize) -> Routes {
        Routes {
            committers: committers.max(1),
            pairs: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
        }
    }

    pub fn committers(&self) -> usize {
        self.committers
    }

    pub fn committer(&self, key: u64) -> usize {
        (key % self.committers as u64) as usize
    }

    /// The conversation's key; the first call fixes it.
    pub fn conversation_key(&self, id: i64) -> u64 {
        *self
            .keys
            .lock()
            .expect("routes")
            .entry(id)
            .or_insert(id as u64)
    }

    /// The key of a private conversation not known here yet: the same from either side,
    /// and kept until the conversation is.
    pub fn pair_key(&self, pair: &Pair) -> u64 {
        *self
            .pending
            .lock()
            .expect("routes")
            .entry(pair.clone())
            .or_insert_with(|| {
                let mut h = DefaultHasher::new();
                pair.hash(&mut h);
                h.finish()
            })
    }

    /// A key a pair was routed by before its conversation was known, if any.
    pub fn pending_key(&self, pair: &Pair) -> Option<u64> {
        self.pending.lock().expect("routes").get(pair).copied()
    }

    pub fn private(&self, pair: &Pair) -> Option<i64> {
        self.pairs.lock().expect("routes").get(pair).copied()
    }

    pub fn remember_private(&self, pair: Pair, id: i64) {
        self.pairs.lock().expect("routes").insert(pair, id);
    }

    /// After a message to a peer was stored in conversation `id`, routed by `key`: the
    /// conversation keeps the key (unless it was routed by id before).
    pub fn learn(&self, pair: Pair, id: i64, key: u64) {
        self.keys.lock().expect("routes").entry(id).or_insert(key);
        self.remember_private(pair, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_created_by_peer_keeps_its_committer() {
        let r = Routes::new(4);
        let p = pair("bob", "alice");
        assert_eq!(p, pair("alice", "bob"));
        let key = r.pair_key(&p);
        // The other side's first message, before the conversation exists, gets the same.
        assert_eq!(r.pending_key(&p), Some(key));
        r.learn(p.clone(), 42, key);
        assert_eq!(r.conversation_key(42), key);
        assert_eq!(r.private(&p), Some(42));
        assert_eq!(r.conversation_key(7), 7);
        // A key once given is kept.
        r.learn(pair("x", "y"), 7, 99);
        assert_eq!(r.conversation_key(7), 7);
    }
}
