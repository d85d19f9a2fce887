//! Which committer takes an op. SQLite has one writer, so one committer. On PostgreSQL
//! several committers overlap their commits, each owning a share of the conversations: a
//! conversation's ops in flight are all with one committer, so its sends are committed and
//! pushed in the order they arrived.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::protocol::Error;
pub use crate::protocol::{Pair, pair};
use crate::store::Store;

/// Private conversations by pair a node keeps at most (a forgotten pair costs one read the
/// next time a message names it).
const PAIRS_MAX: usize = 65_536;

/// Keys of conversations stored by a pair's first messages a node keeps at most (a
/// committer remembers 16,384 conversations, `Known`; a forgotten key moves its
/// conversation to the committer of its id, which reads it once under its lock).
const KEYS_MAX: usize = 65_536;

/// Which committer takes an op. A conversation goes by its id, or by the key of the pair
/// whose first messages stored it here, and a first message to a peer whose conversation
/// this node does not know by the pair. A key holds while any op that went by it is in
/// flight (queued or committing, until its answer and pushes are out): a conversation's
/// ops all go to one committer while one of them could still overtake another. What is
/// remembered past that is bounded caches of pairs and keys, whatever ids or peers clients
/// name.
pub struct Routes {
    committers: usize,
    state: Mutex<State>,
}

struct State {
    /// Private conversations by pair, as found in the database or stored here.
    pairs: Generations<Pair, i64>,
    /// The key of a conversation stored by a pair's first messages (the committer that
    /// stored it remembers it).
    keys: Generations<i64, u64>,
    /// Conversations with ops in flight, and the key they went by.
    ids: HashMap<i64, Held>,
    /// Pairs with first messages in flight (their conversation was not known when they
    /// were routed), and the conversation once one of them stored it.
    pending: HashMap<Pair, Pending>,
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

struct Held {
    key: u64,
    ops: usize,
    /// A conversation that a pair's first message stored keeps that pair's key while the
    /// pair has messages in flight.
    pair: Option<Pair>,
}

struct Pending {
    key: u64,
    ops: usize,
    conversation: Option<i64>,
}

/// The key an op was queued by, held until its answer and pushes are out (dropping it
/// releases the key).
pub struct Route {
    pub key: u64,
    hold: Option<(Arc<Routes>, Hold)>,
}

enum Hold {
    Conversation(i64),
    Pair(Pair),
}

impl Route {
    /// The one committer's (nothing to hold).
    pub fn single() -> Route {
        Route { key: 0, hold: None }
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        if let Some((routes, hold)) = self.hold.take() {
            routes.release(hold);
        }
    }
}

/// A pair's key: the same from either side.
fn pair_key(pair: &Pair) -> u64 {
    let mut h = DefaultHasher::new();
    pair.hash(&mut h);
    h.finish()
}

impl Routes {
    pub fn new(committers: usize) -> Routes {
        Routes {
            committers: committers.max(1),
            state: Mutex::new(State {
                pairs: Generations::new(PAIRS_MAX),
                keys: Generations::new(KEYS_MAX),
                ids: HashMap::new(),
                pending: HashMap::new(),
            }),
        }
    }

    pub fn committers(&self) -> usize {
        self.committers
    }

    pub fn committer(&self, key: u64) -> usize {
        (key % self.committers as u64) as usize
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("routes")
    }

    /// An op on conversation `id`.
    pub fn conversation(self: &Arc<Self>, id: i64) -> Route {
        let key = self.state().hold(id);
        self.held(key, Hold::Conversation(id))
    }

    /// A message to a peer, if it can be routed without reading: its pair has messages in
    /// flight, or its conversation is known here. `Err` gives the pair back for a read.
    pub fn pair(self: &Arc<Self>, pair: Pair) -> Result<Route, Pair> {
        let route = self.state().known_pair(pair);
        route.map(|(key, hold)| self.held(key, hold))
    }

    /// A message to a peer after a read found its conversation (`found`) or not: a pair
    /// without one goes by the pair's key until its conversation is known here.
    pub fn pair_read(self: &Arc<Self>, pair: Pair, found: Option<i64>) -> Route {
        let mut state = self.state();
        // Another message may have routed or stored the pair while the read ran.
        let (key, hold) = match (state.known_pair(pair), found) {
            (Ok(route), _) => route,
            (Err(pair), Some(id)) => {
                state.remember(pair, id);
                (state.hold(id), Hold::Conversation(id))
            }
            (Err(pair), None) => {
                let key = pair_key(&pair);
                let pending = Pending {
                    key,
                    ops: 1,
                    conversation: None,
                };
                state.pending.insert(pair.clone(), pending);
                (key, Hold::Pair(pair))
            }
        };
        drop(state);
        self.held(key, hold)
    }

    /// After a message to a peer was stored in conversation `id`, while its route is
    /// held: the pair is known here (for live sends too), and if the pair has first
    /// messages in flight, the conversation keeps their key, held until they are out and
    /// remembered after. Ops that went by its id first keep theirs, unless this batch
    /// `created` the conversation: then they named an id that did not exist yet.
    pub fn learn(&self, pair: Pair, id: i64, created: bool) {
        let mut state = self.state();
        let State {
            ids, pending, keys, ..
        } = &mut *state;
        if let Some(p) = pending.get_mut(&pair) {
            p.conversation = Some(id);
            let key = p.key;
            let held = Held {
                key,
                ops: 0,
                pair: Some(pair.clone()),
            };
            match ids.entry(id) {
                Entry::Vacant(e) => {
                    e.insert(held);
                }
                Entry::Occupied(mut e) if created => {
                    let h = e.get_mut();
                    (h.key, h.pair) = (held.key, held.pair);
                }
                Entry::Occupied(_) => return state.remember(pair, id),
            }
            keys.insert(id, key);
        }
        state.remember(pair, id);
    }

    /// A private conversation known here (live sends by `peerId` look too).
    pub fn private(&self, pair: &Pair) -> Option<i64> {
        self.state().pairs.get(pair)
    }

    pub fn remember_private(&self, pair: Pair, id: i64) {
        self.state().remember(pair, id);
    }

    fn held(self: &Arc<Self>, key: u64, hold: Hold) -> Route {
        Route {
            key,
            hold: Some((self.clone(), hold)),
        }
    }

    fn release(&self, hold: Hold) {
        let mut state = self.state();
        let State { ids, pending, .. } = &mut *state;
        match hold {
            Hold::Conversation(id) => {
                if let Entry::Occupied(mut e) = ids.entry(id) {
                    let h = e.get_mut();
                    h.ops -= 1;
                    if h.ops == 0 {
                        match h.pair.as_ref().and_then(|p| pending.get_mut(p)) {
                            // Kept while the pair's messages are in flight: the last of
                            // them lets it go.
                            Some(p) => p.conversation = Some(id),
                            None => {
                                e.remove();
                            }
                        }
                    }
                }
            }
            Hold::Pair(pair) => {
                if let Entry::Occupied(mut e) = pending.entry(pair) {
                    e.get_mut().ops -= 1;
                    if e.get().ops == 0
                        && let Some(id) = e.remove().conversation
                        && ids.get(&id).is_some_and(|h| h.ops == 0)
                    {
                        ids.remove(&id);
                    }
                }
            }
        }
    }

    /// Pairs and keys remembered, conversations and pairs in flight.
    #[cfg(test)]
    fn remembered(&self) -> (usize, usize, usize, usize) {
        let state = self.state();
        let (pairs, keys) = (state.pairs.len(), state.keys.len());
        (pairs, keys, state.ids.len(), state.pending.len())
    }
}

impl State {
    /// Holds conversation `id` for one more op: the key its ops in flight went by, or the
    /// one it keeps, or its id.
    fn hold(&mut self, id: i64) -> u64 {
        if let Some(h) = self.ids.get_mut(&id) {
            h.ops += 1;
            return h.key;
        }
        let key = self.keys.get(&id).unwrap_or(id as u64);
        let held = Held {
            key,
            ops: 1,
            pair: None,
        };
        self.ids.insert(id, held);
        key
    }

    /// A pair's route without a read: its messages in flight, or its conversation known.
    fn known_pair(&mut self, pair: Pair) -> Result<(u64, Hold), Pair> {
        if let Some(p) = self.pending.get_mut(&pair) {
            p.ops += 1;
            return Ok((p.key, Hold::Pair(pair)));
        }
        match self.pairs.get(&pair) {
            Some(id) => Ok((self.hold(id), Hold::Conversation(id))),
            None => Err(pair),
        }
    }

    fn remember(&mut self, pair: Pair, id: i64) {
        self.pairs.insert(pair, id);
    }
}

/// A pair whose private conversation is asked for, and where its id goes.
type Asked = (Pair, oneshot::Sender<Result<Option<i64>, Error>>);

/// The most pairs one read asks for.
const PAIRS_PER_READ: usize = 1024;

/// Reads of the private conversations of pairs this node does not know, gathered:
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
    fn a_conversation_stored_by_a_first_message_keeps_its_key() {
        let r = Arc::new(Routes::new(4));
        let p = pair("bob", "alice");
        assert_eq!(p, pair("alice", "bob"));
        // Not known here: a read first, which finds nothing.
        let p = r.pair(p).err().expect("a read first");
        let first = r.pair_read(p.clone(), None);
        let key = first.key;
        assert_eq!(key, pair_key(&p));
        // The other side's first message, before the conversation exists, gets the same.
        let other = r.pair(pair("alice", "bob")).expect("in flight");
        assert_eq!(other.key, key);
        // Stored as conversation 42: an op naming it goes by the pair's key, while the
        // pair's messages are in flight and after.
        r.learn(p.clone(), 42, true);
        let read = r.conversation(42);
        assert_eq!(read.key, key);
        drop((first, other));
        let send = r.conversation(42);
        assert_eq!(send.key, key);
        drop((read, send));
        assert_eq!(r.remembered(), (1, 1, 0, 0));
        assert_eq!(r.conversation(42).key, key);
        assert_eq!(r.pair(p).expect("known").key, key);
        assert_eq!(r.remembered(), (1, 1, 0, 0));
    }

    #[test]
    fn a_conversation_routed_by_id_first_keeps_its_id() {
        let r = Arc::new(Routes::new(4));
        let read = r.conversation(7);
        assert_eq!(read.key, 7);
        let p = pair("x", "y");
        let first = r.pair_read(p.clone(), None);
        assert_eq!(first.key, pair_key(&p));
        r.learn(p.clone(), 7, false);
        assert_eq!(r.conversation(7).key, 7);
        // The pair's messages in flight keep theirs until they are out.
        assert_eq!(r.pair(p.clone()).expect("in flight").key, pair_key(&p));
        drop((read, first));
        assert_eq!(r.pair(p).expect("known").key, 7);
        assert_eq!(r.remembered(), (1, 0, 0, 0));
    }

    #[test]
    fn ops_on_an_id_guessed_before_its_conversation_existed_do_not_keep_their_key() {
        let r = Arc::new(Routes::new(4));
        // A read naming the id the next conversation will get, in flight.
        let guess = r.conversation(9);
        let p = pair("alice", "bob");
        let first = r.pair_read(p.clone(), None);
        let key = first.key;
        assert_ne!(key, 9);
        // The first message created conversation 9: sends by its id go with the first
        // messages still in flight.
        r.learn(p.clone(), 9, true);
        assert_eq!(r.conversation(9).key, key);
        drop((guess, first));
        assert_eq!(r.conversation(9).key, key);
        assert_eq!(r.remembered(), (1, 1, 0, 0));
    }

    #[test]
    fn a_conversation_held_past_its_pairs_messages_is_let_go() {
        let r = Arc::new(Routes::new(4));
        let p = pair("alice", "bob");
        let first = r.pair_read(p.clone(), None);
        r.learn(p.clone(), 5, true);
        let by_id = r.conversation(5);
        drop(first);
        // A read that found nothing before the conversation was stored, answered after
        // the pair was forgotten: a pair's messages in flight again, which store nothing.
        r.state().pairs = Generations::new(PAIRS_MAX);
        let late = r.pair_read(p.clone(), None);
        drop(by_id);
        assert_eq!(r.conversation(5).key, late.key);
        drop(late);
        assert_eq!(r.remembered(), (0, 1, 0, 0));
    }

    #[test]
    fn made_up_ids_and_peers_leave_nothing_behind() {
        let r = Arc::new(Routes::new(2));
        for id in 0..10_000 {
            let route = r.conversation(id);
            assert_eq!(route.key, id as u64);
        }
        for n in 0..1_000 {
            // A first message to a user that does not exist: refused, never learned.
            let p = r
                .pair(pair("alice", &format!("nobody{n}")))
                .err()
                .expect("unknown");
            drop(r.pair_read(p, None));
        }
        assert_eq!(r.remembered(), (0, 0, 0, 0));
    }

    #[test]
    fn what_is_remembered_is_bounded_and_what_is_used_stays() {
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
        let r = Arc::new(Routes::new(2));
        for n in 0..PAIRS_MAX as i64 + 10 {
            r.learn(pair("alice", &format!("u{n}")), n, false);
        }
        let (pairs, keys, ids, pending) = r.remembered();
        assert!(pairs <= PAIRS_MAX, "{pairs} pairs kept");
        assert_eq!((keys, ids, pending), (0, 0, 0));
    }
}
