//! Which committer takes an op. SQLite has one writer, so one committer. On PostgreSQL
//! several committers overlap their commits, each owning a share of the conversations: a
//! conversation's key is a function of the conversation (a private one's is its pair's,
//! any other's its id), so all its ops go to one committer, which commits and pushes its
//! sends in the order they arrived and remembers it between batches.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot};

use crate::protocol::Error;
pub use crate::protocol::{Pair, pair};
use crate::store::Store;

/// Private conversations by pair, and conversations' keys by id, a node keeps at most
/// (each: a forgotten one costs one read the next time an op names it).
const KEPT_MAX: usize = 131_072;

/// A private conversation's key: its pair's (`a` and `b` in either order, nothing
/// allocated), known before the conversation exists.
pub fn pair_key(a: &str, b: &str) -> u64 {
    let mut h = DefaultHasher::new();
    crate::protocol::ordered((a, b)).hash(&mut h);
    h.finish()
}

/// What a node knows of conversations' keys. A message to a peer goes by its pair's key
/// and needs nothing; an op naming a conversation by id needs its key, from here or from
/// a read (`Reads`). Only conversations that exist are kept, in bounded caches, whatever
/// ids or peers clients name; a key forgotten is read again and comes out the same.
pub struct Routes {
    committers: usize,
    kept: Mutex<Kept>,
}

struct Kept {
    /// Private conversations by pair (sends by peer of a live kind look here too).
    pairs: Generations<Pair, i64>,
    /// Conversations' keys by id.
    keys: Generations<i64, u64>,
}

impl Routes {
    pub fn new(committers: usize) -> Routes {
        Routes {
            committers: committers.max(1),
            kept: Mutex::new(Kept {
                pairs: Generations::new(KEPT_MAX),
                keys: Generations::new(KEPT_MAX),
            }),
        }
    }

    pub fn committers(&self) -> usize {
        self.committers
    }

    pub fn committer(&self, key: u64) -> usize {
        (key % self.committers as u64) as usize
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().expect("routes")
    }

    /// Conversation `id`'s key, if known here.
    pub fn key(&self, id: i64) -> Option<u64> {
        self.kept().keys.get(&id)
    }

    /// A conversation a read found (with its pair if private): its key, kept.
    pub fn found(&self, id: i64, pair: Option<Pair>) -> u64 {
        // As `pair` orders them, whatever the order they were stored in.
        let pair = pair.map(crate::protocol::ordered);
        let key = pair.as_ref().map_or(id as u64, |(a, b)| pair_key(a, b));
        let mut kept = self.kept();
        kept.keys.insert(id, key);
        if let Some(pair) = pair {
            kept.pairs.insert(pair, id);
        }
        key
    }

    /// A private conversation known here.
    pub fn private(&self, pair: &Pair) -> Option<i64> {
        self.kept().pairs.get(pair)
    }

    /// After a message to a peer was stored in conversation `id` (or a read found it).
    pub fn learn(&self, pair: Pair, id: i64) {
        self.found(id, Some(pair));
    }

    #[cfg(test)]
    fn kept_len(&self) -> (usize, usize) {
        let kept = self.kept();
        (kept.pairs.len(), kept.keys.len())
    }
}

/// A map of at most `max` entries, in two generations: once the newer holds `max / 2`,
/// the older is dropped and the newer takes its place; an entry found in the older comes
/// back to the newer.
struct Generations<K, V> {
    max: usize,
    newer: HashMap<K, V>,
    older: HashMap<K, V>,
}

impl<K: Hash + Eq + Clone, V: Copy> Generations<K, V> {
    fn new(max: usize) -> Self {
        Generations {
            max,
            newer: HashMap::new(),
            older: HashMap::new(),
        }
    }

    fn get(&mut self, k: &K) -> Option<V> {
        if let Some(v) = self.newer.get(k) {
            return Some(*v);
        }
        let v = self.older.remove(k)?;
        self.insert(k.clone(), v);
        Some(v)
    }

    fn insert(&mut self, k: K, v: V) {
        if self.newer.len() >= self.max / 2 && !self.newer.contains_key(&k) {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(k, v);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.newer.len() + self.older.len()
    }
}

/// A question and where its answer goes.
type Asked<Q, A> = (Q, oneshot::Sender<Result<Option<A>, Error>>);

/// The most questions one read asks.
const PER_READ: usize = 1024;

/// Reads gathered: the questions asked while one read runs go together in the next, one
/// statement for all of them. A burst of ops naming conversations this node does not know
/// costs a handful of reads, not one an op.
pub struct Reads<Q, A>(mpsc::Sender<Asked<Q, A>>);

impl<Q, A> Reads<Q, A>
where
    Q: Hash + Eq + Ord + Clone + Send + 'static,
    A: Clone + Send + 'static,
{
    /// `read` answers the questions it is given with what it found (nothing for the
    /// others).
    pub fn start<F, Fut>(store: Store, read: F) -> Reads<Q, A>
    where
        F: Fn(Store, Vec<Q>) -> Fut + Send + 'static,
        Fut: Future<Output = sqlx::Result<HashMap<Q, A>>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(PER_READ * 4);
        tokio::spawn(answer(rx, store, read));
        Reads(tx)
    }

    /// The answer to `q`, if the read found one.
    pub async fn get(&self, q: Q) -> Result<Option<A>, Error> {
        let gone = || Error::unavailable("the server is shutting down");
        let (tx, rx) = oneshot::channel();
        self.0.send((q, tx)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

/// Answers what `Reads` is asked, a read at a time.
async fn answer<Q, A, F, Fut>(mut rx: mpsc::Receiver<Asked<Q, A>>, store: Store, read: F)
where
    Q: Hash + Eq + Ord + Clone,
    A: Clone,
    F: Fn(Store, Vec<Q>) -> Fut,
    Fut: Future<Output = sqlx::Result<HashMap<Q, A>>>,
{
    let mut asked = Vec::with_capacity(PER_READ);
    while rx.recv_many(&mut asked, PER_READ).await > 0 {
        let mut questions: Vec<Q> = asked.iter().map(|(q, _)| q.clone()).collect();
        questions.sort_unstable();
        questions.dedup();
        let found = read(store.clone(), questions)
            .await
            .map_err(crate::store::unavailable);
        for (q, reply) in asked.drain(..) {
            let _ = reply.send(match &found {
                Ok(found) => Ok(found.get(&q).cloned()),
                Err(e) => Err(e.clone()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_conversation_goes_by_its_pair_whoever_names_it_and_however() {
        let r = Routes::new(4);
        let p = pair("bob", "alice");
        assert_eq!(p, pair("alice", "bob"));
        // Both sides' first messages, before the conversation exists, go by the pair.
        let key = pair_key("alice", "bob");
        assert_eq!(key, pair_key("bob", "alice"));
        // Stored as conversation 42: named by its id, it goes by the same key.
        r.learn(p.clone(), 42);
        assert_eq!(r.key(42), Some(key));
        assert_eq!(r.private(&p), Some(42));
        // On a node that did not store it, a read finds the pair and the same key.
        let other = Routes::new(4);
        assert_eq!(other.key(42), None);
        let (lo, hi) = p.clone();
        assert_eq!(other.found(42, Some((hi, lo))), key);
        assert_eq!(other.private(&p), Some(42));
        // A group goes by its id.
        assert_eq!(other.found(7, None), 7);
        assert_eq!(other.key(7), Some(7));
    }

    #[test]
    fn what_is_kept_is_bounded_and_what_is_used_stays() {
        let mut g: Generations<i64, i64> = Generations::new(100);
        g.insert(-1, -1);
        for n in 0..1_000 {
            g.insert(n, n);
            // Used all along, it is never dropped.
            assert_eq!(g.get(&-1), Some(-1));
            assert!(g.len() <= 100, "{} kept", g.len());
        }
        assert_eq!(g.get(&0), None);
        assert_eq!(g.get(&999), Some(999));
        let r = Routes::new(2);
        for n in 0..KEPT_MAX as i64 + 10 {
            r.learn(pair("alice", &format!("u{n}")), n);
        }
        let (pairs, keys) = r.kept_len();
        assert!(
            pairs <= KEPT_MAX && keys <= KEPT_MAX,
            "{pairs} pairs, {keys} keys"
        );
        // A key forgotten is read again, and is the same.
        assert_eq!(r.key(0), None);
        let p = pair("alice", "u0");
        assert_eq!(r.found(0, Some(p)), pair_key("alice", "u0"));
    }
}
