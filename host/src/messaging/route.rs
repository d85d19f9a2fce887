//! Which committer takes an op. SQLite has one writer, so one committer. On PostgreSQL
//! several committers overlap their commits, each owning a share of the conversations: a
//! conversation always goes to the same committer, so its sends are committed and pushed
//! in the order they arrived.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot};

use crate::protocol::Error;
pub use crate::protocol::{Pair, pair};
use crate::store::Store;

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

/// A pair whose private conversation is asked for, and where its id goes.
type Asked = (Pair, oneshot::Sender<Result<Option<i64>, Error>>);

/// The most pairs one read asks for.
const PAIRS_PER_READ: usize = 1024;

/// Reads of the private conversations of pairs this node has not routed yet, gathered:
/// the pairs asked for while one read runs go together in the next, one statement for all
/// of them. A burst of first messages costs a handful of reads, not one a message.
pub struct PairReads(mpsc::Sender<Asked>);

impl PairReads {
    pub fn start(store: Store) -> PairReads {
        let (tx, rx) = mpsc::channel(PAIRS_PER_READ * 4);
        tokio::spawn(read_pairs(rx, store));
        PairReads(tx)
    }

    /// The private conversation of `pair`, if it exists.
    pub async fn get(&self, pair: Pair) -> Result<Option<i64>, Error> {
        let gone = || Error::unavailable("the server is shutting down");
        let (tx, rx) = oneshot::channel();
        self.0.send((pair, tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

/// Answers what `PairReads` is asked, a read at a time.
async fn read_pairs(mut rx: mpsc::Receiver<Asked>, store: Store) {
    let mut asked = Vec::with_capacity(PAIRS_PER_READ);
    while rx.recv_many(&mut asked, PAIRS_PER_READ).await > 0 {
        let mut pairs: Vec<Pair> = asked.iter().map(|(p, _)| p.clone()).collect();
        pairs.sort_unstable();
        pairs.dedup();
        let found = store
            .private_conversations(&pairs)
            .await
            .map_err(crate::store::unavailable);
        for (pair, reply) in asked.drain(..) {
            let _ = reply.send(match &found {
                Ok(found) => Ok(found.get(&pair).copied()),
                Err(e) => Err(e.clone()),
            });
        }
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
