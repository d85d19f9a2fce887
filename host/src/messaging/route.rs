//! Which committer takes an op. SQLite has one writer, so one committer. On PostgreSQL
//! several committers overlap their commits, each owning a share of the conversations: a
//! conversation always goes to the same committer, so its sends are committed and pushed
//! in the order they arrived.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

pub type Pair = (String, String);

/// The pair of two users, in order.
pub fn pair(a: &str, b: &str) -> Pair {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

pub struct Routes {
    committers: usize,
    /// Private conversations by pair (they never change).
    pairs: Mutex<HashMap<Pair, i64>>,
    /// Conversations created by a message addressed to a peer keep the key that message
    /// was routed by, so the sends that follow by id go to the same committer.
    keys: Mutex<HashMap<i64, u64>>,
}

impl Routes {
    pub fn new(committers: usize) -> Routes {
        Routes {
            committers: committers.max(1),
            pairs: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
        }
    }

    pub fn committers(&self) -> usize {
        self.committers
    }

    pub fn committer(&self, key: u64) -> usize {
        (key % self.committers as u64) as usize
    }

    pub fn conversation_key(&self, id: i64) -> u64 {
        self.keys
            .lock()
            .expect("routes")
            .get(&id)
            .copied()
            .unwrap_or(id as u64)
    }

    /// The key of a private conversation not created yet (the same from either side).
    pub fn pair_key(pair: &Pair) -> u64 {
        let mut h = DefaultHasher::new();
        pair.hash(&mut h);
        h.finish()
    }

    pub fn private(&self, pair: &Pair) -> Option<i64> {
        self.pairs.lock().expect("routes").get(pair).copied()
    }

    pub fn remember_private(&self, pair: Pair, id: i64) {
        self.pairs.lock().expect("routes").insert(pair, id);
    }

    /// After a message to a peer committed in conversation `id`, routed by `key`.
    pub fn learn(&self, pair: Pair, id: i64, key: u64) {
        self.remember_private(pair, id);
        self.keys.lock().expect("routes").entry(id).or_insert(key);
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
        let key = Routes::pair_key(&p);
        r.learn(p.clone(), 42, key);
        assert_eq!(r.conversation_key(42), key);
        assert_eq!(r.private(&p), Some(42));
        assert_eq!(r.conversation_key(7), 7);
    }
}
