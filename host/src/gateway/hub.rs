//! Who is online: every connected device of every user, on this node. A connection is
//! (user, device, session); a second connection of the same device replaces the first,
//! and every removal compares session ids, so a late close or kick never removes the
//! newer connection.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::outbox::{Close, Frame, NodeBudget, Outbox, Queued};
use crate::auth::TokenId;
use crate::messaging::{
    Delivery, Held, LatestKey, PRESENCE, Push, PushFrame, Reach, Respond, Which,
};
use crate::plugins::Delivery as Class;

pub struct Device {
    pub user_id: String,
    pub device_id: String,
    pub session: u64,
    /// Its place among its device's connections across nodes (Unix milliseconds): when it
    /// was made, raised past the connection its route replaced (cluster mode).
    pub at: AtomicU64,
    /// The token the connection was opened with (logout closes its connections).
    pub token: TokenId,
    pub outbox: Outbox,
    /// Requests read from this connection and not answered yet.
    pub in_flight: AtomicUsize,
    /// Hears its friends' presence (it asked to on connecting).
    pub presence: bool,
    /// When its token was issued (Unix seconds), if it says.
    pub issued_at: Option<i64>,
    /// The last of its sends to devices, which the next waits for: a connection's sends
    /// to devices commit in the order it sent them.
    pub device_sends: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Device {
    /// A connection opened with `token`, whose outbox holds at most `outbox_frames` frames
    /// and `outbox_bytes` bytes, counted toward the hub's node budget.
    pub fn new(
        hub: &Hub,
        user_id: String,
        device_id: String,
        token: TokenId,
        outbox_frames: usize,
        outbox_bytes: usize,
    ) -> Device {
        Device {
            user_id,
            device_id,
            token,
            session: Hub::new_session(),
            at: AtomicU64::new(u64::try_from(crate::clock::now_ms()).unwrap_or(0)),
            outbox: Outbox::new(outbox_frames, outbox_bytes, hub.budget.clone()),
            in_flight: AtomicUsize::new(0),
            presence: false,
            issued_at: None,
            device_sends: Mutex::new(None),
        }
    }

    /// Runs `send` after every send to devices this connection read before it.
    pub fn in_turn(&self, send: impl Future<Output = ()> + Send + 'static) {
        let mut last = self.device_sends.lock().unwrap_or_else(|e| e.into_inner());
        let before = last.take();
        *last = Some(tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            send.await;
        }));
    }

    /// Whether the connection may read another request: its unanswered requests and
    /// queued frames stay under half its outbox, so its own answers can never overflow it.
    /// A client that pipelines more simply waits (TCP backpressure).
    pub fn may_read(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) + self.outbox.queued() < self.outbox.limit() / 2
    }
}

impl Respond for Device {
    /// Queues the answer to a request (never dropped), which ends its flight.
    fn answer(&self, frame: Utf8Bytes) {
        self.outbox.reply(frame);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn session(&self) -> u64 {
        self.session
    }
}

/// A connection as the routes know it.
#[derive(Debug, Clone)]
pub struct Connection {
    pub user: String,
    pub device: String,
    pub session: u64,
    /// `Device::at`.
    pub at: u64,
}

const SHARDS: usize = 32;

/// Keyed by user id, which users choose: SipHash (std's), which resists crafted collisions.
type Shard = Mutex<HashMap<String, Vec<Arc<Device>>>>;

/// A snapshot of a hub (`Hub::load`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Load {
    pub connections: usize,
    pub users: usize,
    pub outbox_frames: usize,
    pub outbox_bytes: usize,
}

pub struct Hub {
    shards: Box<[Shard]>,
    /// Picks a user's shard: foldhash, several times faster than SipHash on a short id. A
    /// crafted set of ids could at worst crowd one shard's lock, not slow its map.
    hasher: foldhash::fast::RandomState,
    online: AtomicU64,
    /// The bytes waiting in every outbox of this node.
    budget: Arc<NodeBudget>,
}

impl Hub {
    /// `node_outbox_bytes`: the bytes every outbox of this node may hold together.
    pub fn new(node_outbox_bytes: usize) -> Hub {
        Hub {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            online: AtomicU64::new(0),
            budget: NodeBudget::new(node_outbox_bytes),
        }
    }

    /// Bytes waiting in this node's outboxes.
    pub fn outbox_bytes(&self) -> usize {
        self.budget.bytes()
    }

    fn shard(&self, user: &str) -> &Shard {
        &self.shards[self.hasher.hash_one(user) as usize % SHARDS]
    }

    /// A fresh session id (random, so ids from different nodes never collide in practice).
    pub fn new_session() -> u64 {
        fastrand::u64(1..)
    }

    /// Registers a connection; the one it replaces (same user and device) is told to close.
    /// Whether it is the user's first device on this node.
    pub fn register(&self, device: Arc<Device>) -> bool {
        let (old, first) = {
            let mut shard = self.shard(&device.user_id).lock().expect("hub lock");
            let list = shard.entry(device.user_id.clone()).or_default();
            let old = list
                .iter()
                .position(|d| d.device_id == device.device_id)
                .map(|i| list.swap_remove(i));
            let first = list.is_empty();
            list.push(device);
            (old, first)
        };
        match old {
            Some(old) => old.outbox.close(Close::Replaced),
            None => {
                self.online.fetch_add(1, Ordering::Relaxed);
            }
        }
        first
    }

    /// Removes a connection if it is still the device's current one: `None` if it is not,
    /// else whether it was the user's last device on this node.
    pub fn unregister(&self, user_id: &str, device_id: &str, session: u64) -> Option<bool> {
        let mut shard = self.shard(user_id).lock().expect("hub lock");
        let list = shard.get_mut(user_id)?;
        let i = list
            .iter()
            .position(|d| d.device_id == device_id && d.session == session)?;
        list.swap_remove(i);
        let last = list.is_empty();
        if last {
            shard.remove(user_id);
        }
        self.online.fetch_sub(1, Ordering::Relaxed);
        Some(last)
    }

    /// Every connection on this node.
    pub fn connections(&self) -> Vec<Connection> {
        self.each(|d| Connection {
            user: d.user_id.clone(),
            device: d.device_id.clone(),
            session: d.session,
            at: d.at.load(Ordering::Relaxed),
        })
    }

    /// Every connection on this node, with the token it was opened with.
    pub fn held(&self) -> Vec<Held> {
        self.each(|d| Held {
            user_id: d.user_id.clone(),
            device_id: d.device_id.clone(),
            token: d.token,
            issued_at: d.issued_at,
        })
    }

    /// `f` of every connection on this node.
    fn each<T>(&self, f: impl Fn(&Device) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(self.online.load(Ordering::Relaxed) as usize);
        for shard in self.shards.iter() {
            out.extend(
                shard
                    .lock()
                    .expect("hub lock")
                    .values()
                    .flatten()
                    .map(|d| f(d)),
            );
        }
        out
    }

    /// What is connected to this node now, and what waits for it.
    pub fn load(&self) -> Load {
        let mut load = Load {
            outbox_bytes: self.outbox_bytes(),
            ..Load::default()
        };
        for shard in self.shards.iter() {
            let shard = shard.lock().expect("hub lock");
            load.users += shard.len();
            for d in shard.values().flatten() {
                load.connections += 1;
                load.outbox_frames += d.outbox.queued();
            }
        }
        load
    }

    /// Every push of one commit (or one bus message), in order; each device's task is
    /// woken once after all are queued, however many of them it got.
    pub fn push_batch(&self, pushes: &[Push]) {
        let mut wake = Vec::new();
        for p in pushes {
            self.queue(&p.users, &p.frame, p.class, p.key, p.except, &mut wake);
        }
        for d in wake {
            d.outbox.wake();
        }
    }

    /// Queues `frame` for every online device of `users`, except the session `except`;
    /// the devices whose task must be woken go to `wake`. The frame is made (and counted
    /// toward the node's budget, once however many devices it waits for) only if a
    /// device takes it.
    fn queue(
        &self,
        users: &[String],
        frame: &PushFrame,
        class: Class,
        key: Option<LatestKey>,
        except: u64,
        wake: &mut Vec<Arc<Device>>,
    ) -> Reach {
        let mut reach = Reach::default();
        let mut made: Option<Frame> = None;
        let presence = key.is_some_and(|k| k.2 == PRESENCE);
        for user in users {
            let shard = self.shard(user).lock().expect("hub lock");
            let Some(list) = shard.get(user) else {
                continue;
            };
            for d in list
                .iter()
                .filter(|d| d.session != except && (d.presence || !presence))
            {
                let frame =
                    made.get_or_insert_with(|| Frame::new(frame.text().clone(), &self.budget));
                let (queued, woken) = d.outbox.queue(frame.clone(), class, key);
                match queued {
                    Queued::Yes | Queued::Coalesced => reach.queued += 1,
                    Queued::Dropped | Queued::Overflow | Queued::Closed => reach.dropped += 1,
                }
                if woken {
                    wake.push(d.clone());
                }
            }
        }
        reach
    }

    /// Whether `user_id` has a device connected to this node.
    pub fn has(&self, user_id: &str) -> bool {
        self.shard(user_id)
            .lock()
            .expect("hub lock")
            .contains_key(user_id)
    }
}

impl Delivery for Hub {
    /// Closes the device's connection only if `session` is still the current one.
    fn kick(&self, user_id: &str, device_id: &str, session: u64, why: Close) -> bool {
        let shard = self.shard(user_id).lock().expect("hub lock");
        let Some(d) = shard.get(user_id).and_then(|l| {
            l.iter()
                .find(|d| d.device_id == device_id && d.session == session)
        }) else {
            return false;
        };
        d.outbox.close(why);
        true
    }

    /// Queues `frame` for every online device of `users`, except the session `except`.
    fn push(
        &self,
        users: &[String],
        frame: &Utf8Bytes,
        class: Class,
        key: Option<LatestKey>,
        except: u64,
    ) -> Reach {
        let mut wake = Vec::new();
        let frame = PushFrame::Text(frame.clone());
        let reach = self.queue(users, &frame, class, key, except, &mut wake);
        for d in wake {
            d.outbox.wake();
        }
        reach
    }

    /// Every push of one commit, each device's task woken once after all are queued.
    fn push_all(&self, pushes: Vec<Push>) {
        self.push_batch(&pushes);
    }

    fn push_devices(
        &self,
        user_id: &str,
        device_ids: &[&str],
        frame: &Utf8Bytes,
        class: Class,
    ) -> Reach {
        let mut reach = Reach::default();
        let frame = Frame::new(frame.clone(), &self.budget);
        let shard = self.shard(user_id).lock().expect("hub lock");
        for d in shard
            .get(user_id)
            .into_iter()
            .flatten()
            .filter(|d| device_ids.contains(&d.device_id.as_str()))
        {
            match d.outbox.push(frame.clone(), class, None) {
                Queued::Yes | Queued::Coalesced => reach.queued += 1,
                Queued::Dropped | Queued::Overflow | Queued::Closed => reach.dropped += 1,
            }
        }
        reach
    }

    fn online(&self, user_id: &str) -> Vec<String> {
        let shard = self.shard(user_id).lock().expect("hub lock");
        let mut devices: Vec<String> = shard
            .get(user_id)
            .into_iter()
            .flatten()
            .map(|d| d.device_id.clone())
            .collect();
        devices.sort();
        devices
    }

    /// Connected devices on this node.
    fn online_devices(&self) -> u64 {
        self.online.load(Ordering::Relaxed)
    }

    /// Closes the connections of `user_id` that `which` picks; how many.
    fn close(&self, user_id: &str, which: Which<'_>, why: Close) -> usize {
        let shard = self.shard(user_id).lock().expect("hub lock");
        let mut closed = 0;
        let picked = |d: &&Arc<Device>| match which {
            Which::All => true,
            Which::Token(t) => d.token == t,
            Which::Device(id) => d.device_id == id,
        };
        for d in shard.get(user_id).into_iter().flatten().filter(picked) {
            d.outbox.close(why);
            closed += 1;
        }
        closed
    }

    /// Asks every connection to close (shutdown).
    fn close_all(&self) {
        for shard in self.shards.iter() {
            for d in shard.lock().expect("hub lock").values().flatten() {
                d.outbox.close(Close::Shutdown);
            }
        }
    }

    fn presence<'a>(&'a self, users: &'a [String]) -> BoxFuture<'a, Option<Vec<bool>>> {
        let online = users.iter().map(|u| self.has(u)).collect();
        Box::pin(std::future::ready(Some(online)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(hub: &Hub, user: &str, id: &str) -> Arc<Device> {
        let d = Arc::new(Device::new(
            hub,
            user.into(),
            id.into(),
            [0; 16],
            16,
            1 << 20,
        ));
        hub.register(d.clone());
        d
    }

    #[tokio::test]
    async fn pushes_reach_users_or_named_devices_and_online_says_who_is_there() {
        let hub = Hub::new(1 << 30);
        let phone = device(&hub, "alice", "phone");
        let laptop = device(&hub, "alice", "laptop");
        let bob = device(&hub, "bob", "phone");
        assert_eq!(hub.online("alice"), ["laptop", "phone"]);
        assert!(hub.online("carol").is_empty());
        let frame = Utf8Bytes::from_static("{}");
        let to_all = hub.push(&["alice".into()], &frame, Class::Persistent, None, 0);
        assert_eq!(to_all.queued, 2);
        let to_one = hub.push_devices("alice", &["laptop"], &frame, Class::Persistent);
        assert_eq!(to_one.queued, 1);
        let (mut p, mut l) = (Vec::new(), Vec::new());
        phone.outbox.next(&mut p).await;
        laptop.outbox.next(&mut l).await;
        assert_eq!((p.len(), l.len()), (1, 2));
        assert_eq!(bob.outbox.queued(), 0);
        assert_eq!(hub.unregister("alice", "phone", phone.session), Some(false));
        assert_eq!(hub.unregister("alice", "phone", phone.session), None);
        assert_eq!(hub.online("alice"), ["laptop"]);
    }
}
