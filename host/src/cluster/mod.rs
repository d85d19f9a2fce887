//! Cluster mode: several nodes share PostgreSQL; Redis holds the device routes and the
//! node leases (`routes`); a bus (NATS, or Redis pub/sub) carries pushes, kicks, closes
//! and cache invalidations to the nodes that need them (`bus`, `wire`).
//!
//! A node delivers to its own devices at once, through its hub. Everything for other
//! nodes goes through one forwarder task: it takes every push queued since its last
//! round (at least a whole commit batch), reads the routes of all their users in one
//! Redis round trip, and publishes one message per node that holds any of those devices,
//! in commit order. The bus is only the fast path: what it loses, devices pull.

mod bus;
mod health;
mod routes;
mod wire;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::future::BoxFuture;
use serde_json::value::RawValue;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::auth::random_bytes;
use crate::config::ClusterConfig;
use crate::gateway::hub::{Device, Hub};
use crate::gateway::links::{Links, PresenceThrottle};
use crate::messaging::{
    ClusterStats, Core, Delivery, Forget, LatestKey, PRESENCE, Push, PushFrame, Reach, Which,
};
use crate::plugins::Delivery as Class;
use crate::protocol::Close;
use crate::social::presence::presence_frame;
use crate::telemetry::{Repeats, Say};
use bus::{Bus, Incoming};
use health::{Health, Part};
use routes::{Refreshed, Routes};

/// How long one Redis call may take before the node treats Redis as away.
const REDIS_WAIT: Duration = Duration::from_secs(2);

/// How long after its last failed Redis call, and after writing its routes back, a node
/// sends every push to every node and takes no one for offline: the other nodes write their
/// routes back within about a tick and a Redis wait of Redis answering again (each asks
/// every second and gives a call up after `REDIS_WAIT`).
const SETTLE: Duration = Duration::from_secs(5);

/// How long a probe of the bus (one a second, `watch_bus`) may take to come back before
/// the node takes the bus for away: a bus that hangs closes nothing, and would otherwise
/// hold what it was given and hand it on minutes later.
const ECHO_WAIT: Duration = Duration::from_secs(3);

/// How long a presence change this node told is kept to be told again if the bus turns
/// out to have been away meanwhile (`note_told`): the time a bus that stops answering takes
/// to be noticed (`ECHO_WAIT`, or NATS's own disconnect), and then some.
const RETELL_WINDOW: Duration = Duration::from_secs(10);

/// How old (by the time the nodes keep, Redis's: `keep_time`) a live push from another
/// node may be when it arrives: older, it is dropped (the moment it was about is over).
const STALE_LIVE_MS: i64 = 3_000;

/// How long a live send's ack waits to hear which other nodes' devices the bus took it
/// for; those it has not heard of by then are not counted.
const COUNT_WAIT: Duration = Duration::from_millis(500);

/// Presence changes kept to be told again while the bus is away, at most.
const REMEMBERED_TELLS: usize = 100_000;

/// How much earlier than its last probe back a node whose bus was away looks for the
/// presence changes the others told (`tell_missed`): a change is recorded before it is
/// published, and the others' publishes need not reach the bus in the order of this
/// node's.
const MISSED_MARGIN: Duration = Duration::from_secs(5);

/// Most users whose presence a node whose bus was away tells its own devices again
/// (`tell_missed`): those told of last.
const MISSED_MOST: usize = 10_000;

/// Registrations answered in time that Redis's clock said came too late (for the log).
static CLOCKS: Repeats = Repeats::new();
/// Rounds of three readings of Redis's clock a starting node tries.
const START_CLOCK_TRIES: usize = 5;
/// How far the offset to Redis's clock must be from the one the log last told for the
/// log to tell it again (ms).
const CLOCK_MOVE_TOLD: i64 = 1_000;

/// Items the forwarder may hold (a commit's pushes, a live push, a kick, a close…);
/// beyond, what is for other nodes is dropped, counted as lost, and pulled.
const FORWARD_QUEUE: usize = 8_192;

/// What the forwarder sends.
enum Out {
    /// One commit's pushes (or one push), kept together in one round.
    Pushes(Vec<Outgoing>),
    /// A message for one node.
    To(u16, Vec<u8>),
    /// A message for every node.
    All(Vec<u8>),
}

struct Outgoing {
    users: Arc<[String]>,
    devices: Option<Vec<String>>,
    /// Made only if another node holds a device it goes to.
    frame: PushFrame,
    class: Class,
    key: Option<LatestKey>,
    except: u64,
    /// Wants the number of devices it reached on other nodes.
    counted: Option<oneshot::Sender<u32>>,
}

impl Outgoing {
    fn new(
        users: &[String],
        frame: &Utf8Bytes,
        class: Class,
        key: Option<LatestKey>,
        except: u64,
    ) -> Outgoing {
        Outgoing {
            users: Arc::from(users),
            devices: None,
            frame: PushFrame::Text(frame.clone()),
            class,
            key,
            except,
            counted: None,
        }
    }
}

/// Counters for the benchmark and the logs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Forwarder rounds that had pushes; a commit's pushes are never split between two.
    pub rounds: AtomicU64,
    /// Messages published to the bus.
    pub publishes: AtomicU64,
    /// Pushes or messages for other nodes lost (queue full, bus away): pulled instead.
    pub lost: AtomicU64,
}

pub struct Cluster {
    node: u16,
    prefix: String,
    hub: Arc<Hub>,
    routes: Routes,
    bus: Bus,
    health: Arc<Health>,
    out: mpsc::Sender<Out>,
    /// This instance's value in its node lease.
    token: String,
    lease: Duration,
    refresh: Duration,
    /// A Redis call failed: write every route again once Redis answers.
    rewrite: AtomicBool,
    /// The last Redis call failed: a connection's calls fail at once until one works
    /// (`redis_if_up`; the upkeep's calls, every second, always try).
    away: AtomicBool,
    /// Until when the routes in Redis may lack what other nodes hold (`SETTLE` after this
    /// node's last failed Redis call, and after it wrote its routes back): pushes go to
    /// every node meanwhile.
    settling_until: Mutex<Option<Instant>>,
    pub stats: Stats,
    core: OnceLock<Arc<Core>>,
    presence: OnceLock<Arc<PresenceThrottle>>,
    /// The task that keeps the lease (`upkeep`): stopped before the lease is given back,
    /// or its next tick would take it again.
    upkeep_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Users whose only routes were this node's before it restarted: their friends are
    /// told at the first upkeep.
    previous: Mutex<Vec<String>>,
    /// The newest runtime switch of each plugin this node made or heard since it started:
    /// (enabled, when).
    switches: Mutex<HashMap<String, (bool, i64)>>,
    /// When this node started (ms): a switch made before then, told again after a bus
    /// came back, is its config file's to decide.
    started_ms: i64,
    /// Asks for a check of the connections (the bus came back); one asked for while a
    /// check runs is run after it (`recheck`).
    recheck_asked: Notify,
    /// The bus took this node's probes and has not carried them back within `ECHO_WAIT`:
    /// what is published is given up at once (counted lost) until one comes back.
    silent: AtomicBool,
    /// Probes published and not yet back, oldest first: (number, when).
    probes: Mutex<VecDeque<(u64, Instant)>>,
    /// Users whose presence this node told (`must_tell`), with when: those of the last
    /// `RETELL_WINDOW`, and every one while the bus is away, to be told again once it is
    /// back (what the bus lost meanwhile never reached the other nodes).
    told: Mutex<VecDeque<(Instant, String)>>,
    /// When the bus last carried one of this node's probes back in time (at first, when
    /// the node started): what the others published before, it heard.
    heard: Mutex<Instant>,
    /// The bus refused a publish (or gave up on it), or a live send's count from other
    /// nodes did not come within `COUNT_WAIT`: counts are not waited for until the bus
    /// takes a publish or carries a probe back.
    counts_late: AtomicBool,
    /// The newest `tell_missed` (each bus comes back starts one): an older one stops.
    missed_scan: AtomicU64,
    /// While `tell_missed` runs: the coalescing keys of the presence pushes the bus
    /// brought meanwhile. Its own frames for those keys are older: not queued.
    latest_heard: Mutex<Option<HashSet<LatestKey>>>,
}

/// A Redis connection that reconnects by itself and gives up a call after `REDIS_WAIT`.
pub(crate) async fn connect_redis(
    client: &redis::Client,
) -> redis::RedisResult<redis::aio::ConnectionManager> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(REDIS_WAIT))
        .set_response_timeout(Some(REDIS_WAIT))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_secs(1));
    client.get_connection_manager_with_config(config).await
}

impl Cluster {
    /// Connects to Redis and the bus and claims `node_id`. Refuses to start when Redis is
    /// unreachable or a live node holds the number (after waiting out the lease of one
    /// that died). Pushes flow from here; incoming messages from `attach`.
    pub async fn start(
        c: &ClusterConfig,
        listen: std::net::SocketAddr,
        hub: Arc<Hub>,
    ) -> anyhow::Result<(Arc<Cluster>, mpsc::Receiver<Incoming>)> {
        let client = redis::Client::open(c.redis_url.as_str())
            .with_context(|| format!("cluster.redis_url {:?}", c.redis_url))?;
        let redis = tokio::time::timeout(Duration::from_secs(5), connect_redis(&client))
            .await
            .map_err(|_| anyhow::anyhow!("Redis at {} did not answer within 5 s", c.redis_url))?
            .with_context(|| format!("Redis at {} is unreachable", c.redis_url))?;
        let lease = Duration::from_secs(c.lease_secs);
        let routes = Routes::new(
            redis,
            &c.prefix,
            c.node_id,
            Duration::from_secs(c.route_ttl_secs),
        );
        let token = format!(
            "{listen} pid {} {}",
            std::process::id(),
            hex::encode(random_bytes::<6>())
        );
        claim(&routes, c.node_id, &token, lease).await?;
        // Redis answered the claim: the time is read before anything is stamped, a few
        // more tries if a reading fails.
        let mut read = false;
        for _ in 0..START_CLOCK_TRIES {
            read = keep_time(&routes, 3).await;
            if read {
                break;
            }
        }
        if !read {
            tracing::warn!(
                "could not read Redis's clock: this node keeps its machine's time until it \
                 can (its upkeep tries every second)"
            );
        }
        // Routes of this number's earlier life (a restart right after a crash): gone now,
        // not after their expiry; their users' friends are told once presence runs.
        let previous = match routes.take_out_previous().await {
            Ok(offline) => offline,
            Err(e) => {
                tracing::warn!("could not take out this node's earlier routes ({e}); they expire");
                Vec::new()
            }
        };
        if !previous.is_empty() {
            tracing::info!(
                node = c.node_id,
                users = previous.len(),
                "took out this node's routes from before its restart"
            );
        }
        let health = Arc::new(Health::default());
        let (bus, incoming) = match Bus::connect(c, health.clone()).await {
            Ok(b) => b,
            Err(e) => {
                // The number goes back at once: the next start need not wait out the lease.
                let _ = routes.release(&token).await;
                return Err(e).with_context(|| format!("the bus at {}", c.bus_address()));
            }
        };
        let (out, rx) = mpsc::channel(FORWARD_QUEUE);
        let cluster = Arc::new(Cluster {
            node: c.node_id,
            prefix: c.prefix.clone(),
            hub,
            routes,
            bus,
            health,
            out,
            token,
            lease,
            refresh: Duration::from_secs(c.refresh_secs),
            rewrite: AtomicBool::new(false),
            away: AtomicBool::new(false),
            settling_until: Mutex::new(None),
            switches: Mutex::new(HashMap::new()),
            started_ms: crate::clock::now_ms(),
            recheck_asked: Notify::new(),
            silent: AtomicBool::new(false),
            probes: Mutex::new(VecDeque::new()),
            told: Mutex::new(VecDeque::new()),
            heard: Mutex::new(Instant::now()),
            counts_late: AtomicBool::new(false),
            missed_scan: AtomicU64::new(0),
            latest_heard: Mutex::new(None),
            stats: Stats::default(),
            core: OnceLock::new(),
            presence: OnceLock::new(),
            upkeep_task: Mutex::new(None),
            previous: Mutex::new(previous),
        });
        tokio::spawn(cluster.clone().forward(rx));
        tracing::info!(node = c.node_id, bus = ?c.bus, prefix = %c.prefix, "joined the cluster");
        Ok((cluster, incoming))
    }

    /// Starts hearing the other nodes (the core drops what they invalidate) and keeping
    /// the routes and the lease.
    pub fn attach(
        self: &Arc<Self>,
        core: Arc<Core>,
        presence: Arc<PresenceThrottle>,
        incoming: mpsc::Receiver<Incoming>,
    ) {
        let _ = self.core.set(core.clone());
        let _ = self.presence.set(presence);
        tokio::spawn(self.clone().recheck(core.clone()));
        tokio::spawn(self.clone().receive(incoming, core));
        tokio::spawn(self.clone().watch_bus());
        *self.upkeep_task.lock().expect("upkeep task") = Some(tokio::spawn(self.clone().upkeep()));
    }

    fn queue(&self, item: Out) {
        if self.out.try_send(item).is_err() {
            self.stats.lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn broadcast(&self, message: wire::Message<'_>) {
        self.queue(Out::All(wire::encode(self.node, message)));
    }

    /// Checks this node's connections again against the database each time the bus
    /// comes back, and closes those ended meanwhile (`Core::no_longer_admitted`): one pass
    /// at a time (a reconnect during a pass asks for one more after it), each run again
    /// after a database error until one completes.
    async fn recheck(self: Arc<Self>, core: Arc<Core>) {
        loop {
            self.recheck_asked.notified().await;
            let mut wait = Duration::from_millis(500);
            loop {
                match core.no_longer_admitted(&self.hub.held()).await {
                    Ok(ended) => {
                        for (h, why) in ended {
                            let which = match why {
                                Close::Revoked => Which::Token(h.token),
                                Close::DeviceRemoved => Which::Device(&h.device_id),
                                _ => Which::All,
                            };
                            self.hub.close(&h.user_id, which, why);
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(
                            "connections not checked again after the bus came back: {}; again in {wait:?}",
                            e.message
                        );
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(30));
                    }
                }
            }
        }
    }

    /// Asks the other nodes for the runtime plugin switches they know, and tells them
    /// those this node knows (after its bus came back).
    fn resync_switches(&self) {
        self.broadcast(wire::Message::Resync);
        self.tell_switches();
    }

    /// Tells every node the newest runtime switch of each plugin this node knows.
    fn tell_switches(&self) {
        let known: Vec<(String, bool, i64)> = self
            .switches
            .lock()
            .expect("switches")
            .iter()
            .map(|(name, (enabled, at))| (name.clone(), *enabled, *at))
            .collect();
        if !known.is_empty() {
            self.broadcast(wire::Message::Switches(known));
        }
    }

    /// Records a switch made on this node at `at`, and returns when it is said to be
    /// made: after every switch of the plugin this node knows of, even one stamped a
    /// moment later by another node (the clocks agree only to within a round trip to
    /// Redis), since it was made after this node heard of those.
    fn switch_made(&self, name: &str, enabled: bool, at: i64) -> i64 {
        let mut switches = self.switches.lock().expect("switches");
        let at = match switches.get(name) {
            Some((_, known)) => at.max(known + 1),
            None => at,
        };
        switches.insert(name.to_string(), (enabled, at));
        at
    }

    /// Notes a runtime switch; whether this node should apply it: made at `since` or
    /// later, and the newest it knows of the plugin (one from a node that gives no time,
    /// 0, always applies).
    fn switch_heard(&self, name: &str, enabled: bool, at: i64, since: i64) -> bool {
        if at == 0 {
            return true;
        }
        if at < since {
            return false;
        }
        let mut switches = self.switches.lock().expect("switches");
        match switches.get(name) {
            Some((_, known)) if *known >= at => false,
            _ => {
                switches.insert(name.to_string(), (enabled, at));
                true
            }
        }
    }

    /// Closes `older`, a connection of the device whose route a newer one holds now
    /// (`replaced`), on whichever node holds it; a no-op if it is gone already.
    fn close_replaced(&self, user: &str, device: &str, older: &routes::Route) {
        if older.node == self.node {
            self.hub.kick(user, device, older.session, Close::Replaced);
            return;
        }
        let kick = wire::Message::Kick {
            user,
            device,
            session: older.session,
        };
        self.queue(Out::To(older.node, wire::encode(self.node, kick)));
    }

    fn presence_changed(&self, user: &str) {
        if let Some(p) = self.presence.get() {
            p.changed(user);
        }
    }

    /// A Redis call failed: Redis may have lost the routes (restarted empty), or missed
    /// changes of them. Every route of this node is written again at the next tick that
    /// reaches Redis, and until `SETTLE` after that, pushes go to every node.
    fn routes_unsure(&self) {
        self.away.store(true, Ordering::Release);
        self.rewrite.store(true, Ordering::Release);
        self.settle_from(Instant::now());
    }

    /// The routes may lack some other node's until `SETTLE` after `t`.
    fn settle_from(&self, t: Instant) {
        *self.settling_until.lock().expect("settling") = Some(t + SETTLE);
    }

    /// As `redis`, but while the last call failed, fails at once without trying: a connect,
    /// a close or a presence read does not wait out a Redis that hangs (`REDIS_WAIT`) each
    /// time. The upkeep tries every second and tells when it works again.
    async fn redis_if_up<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Option<T> {
        if self.away.load(Ordering::Acquire) {
            self.routes_unsure();
            return None;
        }
        self.redis(call).await
    }

    async fn redis<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Option<T> {
        match tokio::time::timeout(REDIS_WAIT, call).await {
            Ok(Ok(v)) => {
                self.away.store(false, Ordering::Release);
                self.health.recover(Part::Routes);
                Some(v)
            }
            Ok(Err(e)) => {
                self.routes_unsure();
                self.health.fail(Part::Routes, &e.to_string());
                None
            }
            Err(_) => {
                self.routes_unsure();
                self.health
                    .fail(Part::Routes, "Redis did not answer within 2 s");
                None
            }
        }
    }

    /// The forwarder: one round per wake-up, in the order things were queued.
    async fn forward(self: Arc<Self>, mut rx: mpsc::Receiver<Out>) {
        let mut buf = Vec::with_capacity(4096);
        let mut pushes = Vec::new();
        while rx.recv_many(&mut buf, 4096).await > 0 {
            for item in buf.drain(..) {
                match item {
                    Out::Pushes(p) => pushes.extend(p),
                    other => {
                        if !pushes.is_empty() {
                            self.round(std::mem::take(&mut pushes)).await;
                        }
                        let (subject, bytes) = match other {
                            Out::To(node, bytes) => (bus::node_subject(&self.prefix, node), bytes),
                            Out::All(bytes) => (bus::all_subject(&self.prefix), bytes),
                            Out::Pushes(_) => unreachable!(),
                        };
                        self.publish(subject, bytes).await;
                    }
                }
            }
            if !pushes.is_empty() {
                self.round(std::mem::take(&mut pushes)).await;
            }
        }
    }

    /// Whether the bus took it (never while it is `silent`: a bus that hangs would hand
    /// it on when it goes on, a push minutes late, a live signal long over).
    async fn publish(&self, subject: String, bytes: Vec<u8>) -> bool {
        let published = if self.silent.load(Ordering::Acquire) {
            Err("the bus is not carrying messages".to_string())
        } else {
            self.bus.publish(subject, bytes).await
        };
        match published {
            Ok(()) => {
                self.stats.publishes.fetch_add(1, Ordering::Relaxed);
                self.counts_late.store(false, Ordering::Release);
                true
            }
            Err(e) => {
                self.stats.lost.fetch_add(1, Ordering::Relaxed);
                // Whatever the cause (a bus away, a message it refuses): counts are not
                // waited for until the next publish it takes, or a probe back (≤ 1 s).
                self.counts_late.store(true, Ordering::Release);
                tracing::debug!("a bus message was lost ({e}); devices will pull");
                false
            }
        }
    }

    /// Whether the routes may still lack some other node's (`settling_until`).
    fn settling(&self) -> bool {
        self.settling_until
            .lock()
            .expect("settling")
            .is_some_and(|t| Instant::now() < t)
    }

    /// Reads the routes of every user of `pushes` at once and publishes one message to
    /// each other node that holds any of their devices. Without the routes (Redis away, or
    /// just back and the other nodes' routes maybe not written yet), one message to every
    /// node: each pushes to whatever devices it holds.
    async fn round(&self, mut pushes: Vec<Outgoing>) {
        self.stats.rounds.fetch_add(1, Ordering::Relaxed);
        let counters: Vec<Option<oneshot::Sender<u32>>> =
            pushes.iter_mut().map(|p| p.counted.take()).collect();
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut users: Vec<&str> = Vec::new();
        for p in &pushes {
            for u in p.users.iter() {
                index.entry(u.as_str()).or_insert_with(|| {
                    users.push(u.as_str());
                    users.len() - 1
                });
            }
        }
        let routes = if self.settling() {
            None
        } else {
            self.redis(self.routes.lookup(&users)).await
        };
        let Some(routes) = routes else {
            let all: Vec<wire::Push<'_>> = pushes
                .iter()
                .filter_map(|p| {
                    Some(wire_push(
                        p,
                        p.users.iter().map(String::as_str).collect(),
                        wire_frame(p)?,
                    ))
                })
                .collect();
            self.publish(
                bus::all_subject(&self.prefix),
                wire::encode(self.node, wire::Message::Push(all)),
            )
            .await;
            for tx in counters.into_iter().flatten() {
                let _ = tx.send(0);
            }
            return;
        };
        let mut by_node: HashMap<u16, Vec<wire::Push<'_>>> = HashMap::new();
        // Devices each counted push reaches on each node, told once the node's message is
        // out (a message the bus did not take reached no one).
        let mut reached: Vec<(usize, u16, u32)> = Vec::new();
        for (i, p) in pushes.iter().enumerate() {
            let mut here: HashMap<u16, Vec<&str>> = HashMap::new();
            let mut counted: Vec<(usize, u16, u32)> = Vec::new();
            for u in p.users.iter() {
                for (device, route) in &routes[index[u.as_str()]] {
                    if route.node == self.node || route.session == p.except {
                        continue;
                    }
                    if p.devices.as_ref().is_some_and(|d| !d.contains(device)) {
                        continue;
                    }
                    if counters[i].is_some() {
                        counted.push((i, route.node, 1));
                    }
                    let list = here.entry(route.node).or_default();
                    if list.last() != Some(&u.as_str()) {
                        list.push(u.as_str());
                    }
                }
            }
            if here.is_empty() {
                continue;
            }
            // Its frame is made only now that another node needs it.
            let Some(frame) = wire_frame(p) else { continue };
            reached.extend(counted);
            for (node, users) in here {
                by_node
                    .entry(node)
                    .or_default()
                    .push(wire_push(p, users, frame));
            }
        }
        let mut sent = Vec::with_capacity(by_node.len());
        for (node, list) in by_node {
            let published = self
                .publish(
                    bus::node_subject(&self.prefix, node),
                    wire::encode(self.node, wire::Message::Push(list)),
                )
                .await;
            if published {
                sent.push(node);
            }
        }
        let mut totals = vec![0u32; counters.len()];
        for (i, node, n) in reached {
            if sent.contains(&node) {
                totals[i] += n;
            }
        }
        for (tx, total) in counters.into_iter().zip(totals) {
            if let Some(tx) = tx {
                let _ = tx.send(total);
            }
        }
    }

    /// What other nodes said.
    async fn receive(self: Arc<Self>, mut incoming: mpsc::Receiver<Incoming>, core: Arc<Core>) {
        while let Some(item) = incoming.recv().await {
            let bytes = match item {
                Incoming::Message(bytes) => bytes,
                Incoming::Reconnected => {
                    // A new connection: earlier probes went with the old one (and may
                    // have been found late since the connection said it was back).
                    self.probes.lock().expect("probes").clear();
                    if self.silent.swap(false, Ordering::AcqRel) {
                        self.health.recover(Part::Bus);
                    }
                    let heard = *self.heard.lock().expect("heard");
                    self.bus_back(&core, heard);
                    continue;
                }
            };
            let envelope = match wire::decode(&bytes) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!("an unreadable bus message was ignored: {e}");
                    continue;
                }
            };
            if envelope.from == self.node {
                if let wire::Message::Probe(n) = envelope.message {
                    self.echoed(n, &core);
                }
                continue;
            }
            // A live push (typing, call signals, presence) handed on late, by a bus that
            // hung or a node that read it late, says what is over: dropped. Stored messages'
            // pushes go on (a device applies them by their seq).
            let stale = envelope.at > 0 && crate::clock::now_ms() - envelope.at > STALE_LIVE_MS;
            match envelope.message {
                wire::Message::Push(list) => {
                    for p in list {
                        if stale && p.class != Class::Persistent {
                            tracing::debug!(
                                "a live push from node {} came too late",
                                envelope.from
                            );
                            continue;
                        }
                        let frame = Utf8Bytes::from(p.frame.get().to_string());
                        match &p.devices {
                            Some(devices) => {
                                self.hub.push_devices(p.users[0], devices, &frame, p.class);
                            }
                            None => {
                                let users: Vec<String> =
                                    p.users.iter().map(|u| u.to_string()).collect();
                                // A presence push is noted and queued under one lock
                                // (`latest_heard`).
                                let mut heard = p
                                    .key
                                    .is_some_and(|k| k.2 == PRESENCE)
                                    .then(|| self.latest_heard.lock().expect("latest heard"));
                                if let (Some(Some(keys)), Some(key)) = (heard.as_deref_mut(), p.key)
                                {
                                    keys.insert(key);
                                }
                                self.hub.push(&users, &frame, p.class, p.key, p.except);
                                drop(heard);
                            }
                        }
                    }
                }
                wire::Message::Kick {
                    user,
                    device,
                    session,
                } => {
                    self.hub.kick(user, device, session, Close::Replaced);
                }
                wire::Message::Close {
                    user,
                    token,
                    device,
                    why,
                } => {
                    let which = match (token.as_deref().map(hex::decode), device) {
                        (_, Some(device)) => Which::Device(device),
                        (None, None) => Which::All,
                        (Some(Ok(bytes)), None) => match <[u8; 16]>::try_from(bytes.as_slice()) {
                            Ok(t) => Which::Token(t),
                            Err(_) => continue,
                        },
                        (Some(Err(_)), None) => continue,
                    };
                    self.hub.close(user, which, why);
                }
                wire::Message::Forget(Forget::Plugin { name, enabled, at }) => {
                    if self.switch_heard(&name, enabled, at, i64::MIN) {
                        core.drop_cached(&Forget::Plugin { name, enabled, at });
                    }
                }
                wire::Message::Forget(f) => core.drop_cached(&f),
                wire::Message::Resync => self.tell_switches(),
                wire::Message::Probe(_) => {}
                // Switches made before this node started are its config file's to decide.
                wire::Message::Switches(known) => {
                    for (name, enabled, at) in known {
                        if self.switch_heard(&name, enabled, at, self.started_ms) {
                            core.drop_cached(&Forget::Plugin { name, enabled, at });
                        }
                    }
                }
            }
        }
    }

    /// The bus is back (reconnected, or carrying this node's probes again): what was said
    /// while it was away is lost. Everything cached is read again, the connections another
    /// node closed meanwhile are closed (a logout, a revoke-all, a deleted account, a
    /// removed device), the plugin switches are told and asked for, and the presence
    /// changes told meanwhile are told again: this node's to every node, and the other
    /// nodes' since it last `heard` them to its own devices (`tell_missed`).
    fn bus_back(self: &Arc<Self>, core: &Core, heard: Instant) {
        core.drop_all_cached();
        self.recheck_asked.notify_one();
        // The plugin switches: this node asks for those it missed, and says those it knows
        // (a node whose bus came back before this one's asked while this one could not
        // hear); once more a little later, for a node whose bus came back at about the same
        // moment and was not listening yet. The presence changes only then: told once.
        self.resync_switches();
        // Taken now: a change told in the next 2 s, over the bus that is back, would
        // otherwise drop those of the outage from the window it keeps.
        let mut users = self.take_told();
        let this = self.clone();
        let scan = self.missed_scan.fetch_add(1, Ordering::AcqRel) + 1;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            this.resync_switches();
            users.extend(this.take_told());
            if let Some(p) = this.presence.get() {
                p.retell(&users);
            }
            this.tell_missed(scan, heard, &users).await;
        });
    }

    /// Tells this node's devices the presence of the users whose friends were told of it
    /// by any node since `heard` (less `MISSED_MARGIN`), as they were last told (what the
    /// other nodes' devices heard; where that expired, as the routes say now), but of
    /// those this node tells everyone again (`retold`): the bus was away for this node
    /// and may have lost those frames, even while it carried them for the others (who
    /// then do not tell them again). At most `MISSED_MOST` users, those told of last; it
    /// stops at a failed read, and when a newer `bus_back` starts another (`scan`). What
    /// was told is read just before the frames are queued, a chunk at a time, and a frame
    /// for a user whose presence the bus brought meanwhile is not queued (`latest_heard`).
    async fn tell_missed(&self, scan: u64, heard: Instant, retold: &HashSet<String>) {
        let Some(core) = self.core.get() else { return };
        let within = heard.elapsed() + MISSED_MARGIN;
        let Some(told) = self
            .redis_if_up(self.routes.told_since(within, MISSED_MOST))
            .await
        else {
            tracing::warn!("the presence told while the bus was away could not be read");
            return;
        };
        let users: Vec<String> = told.into_iter().filter(|u| !retold.contains(u)).collect();
        if users.is_empty() {
            return;
        }
        *self.latest_heard.lock().expect("latest heard") = Some(HashSet::new());
        let queued = self.tell_missed_chunks(core, scan, &users).await;
        if self.missed_scan.load(Ordering::Acquire) == scan {
            *self.latest_heard.lock().expect("latest heard") = None;
        }
        match queued {
            Some(n) => tracing::info!(
                users = n,
                "presence told while the bus was away was told again on this node"
            ),
            None => tracing::warn!(
                "presence told while the bus was away was not all told again on this node"
            ),
        }
    }

    /// `tell_missed`'s frames, `LOOKUP_CHUNK` users at a time: how many were queued, or
    /// `None` if it stopped.
    async fn tell_missed_chunks(&self, core: &Core, scan: u64, users: &[String]) -> Option<usize> {
        let mut queued = 0;
        for chunk in users.chunks(routes::LOOKUP_CHUNK) {
            let mut heard_by = Vec::with_capacity(chunk.len());
            for user in chunk {
                if self.missed_scan.load(Ordering::Acquire) != scan {
                    return None;
                }
                let to = core.presence_audience(user).await?;
                if !to.is_empty() {
                    heard_by.push((user.clone(), to));
                }
            }
            let users: Vec<String> = heard_by.iter().map(|(u, _)| u.clone()).collect();
            let mut online = self.redis_if_up(self.routes.told_values(&users)).await?;
            let expired: Vec<String> = users
                .iter()
                .zip(&online)
                .filter(|(_, o)| o.is_none())
                .map(|(u, _)| u.clone())
                .collect();
            if !expired.is_empty() {
                let mut now = Delivery::presence(self, &expired).await?.into_iter();
                for o in online.iter_mut().filter(|o| o.is_none()) {
                    *o = now.next();
                }
            }
            let latest_heard = self.latest_heard.lock().expect("latest heard");
            for ((user, to), online) in heard_by.iter().zip(online) {
                let Some(online) = online else { continue };
                let (frame, key) = presence_frame(user, online);
                if latest_heard.as_ref().is_some_and(|k| k.contains(&key)) {
                    continue;
                }
                self.hub.push(to, &frame, Class::Latest, Some(key), 0);
                queued += 1;
            }
        }
        Some(queued)
    }

    /// The users whose presence was told and kept (`note_told`), forgotten.
    fn take_told(&self) -> HashSet<String> {
        std::mem::take(&mut *self.told.lock().expect("told"))
            .into_iter()
            .map(|(_, user)| user)
            .collect()
    }

    /// Presence told of `user` now: kept to be told again should the bus turn out to be
    /// away (`RETELL_WINDOW`; while it is away, every one, up to `REMEMBERED_TELLS`).
    fn note_told(&self, user: &str) {
        let now = Instant::now();
        let away = self.silent.load(Ordering::Acquire) || self.health.failing(Part::Bus);
        let mut told = self.told.lock().expect("told");
        if !away {
            while told
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > RETELL_WINDOW)
            {
                told.pop_front();
            }
        }
        if told.len() >= REMEMBERED_TELLS {
            told.pop_front();
        }
        told.push_back((now, user.to_string()));
    }

    /// Publishes a probe to this node every second, and takes the bus for away when one
    /// has not come back within `ECHO_WAIT` (a bus that closed its connection is noticed
    /// by the connection already; this is for one that hangs). A probe the bus refused
    /// counts as sent: a NATS that hangs takes publishes into its client's buffer, a Redis
    /// that hangs lets each one time out.
    async fn watch_bus(self: Arc<Self>) {
        let subject = bus::node_subject(&self.prefix, self.node);
        for n in 1u64.. {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let sent = Instant::now();
            let probe = wire::encode(self.node, wire::Message::Probe(n));
            let _ = self.bus.publish(subject.clone(), probe).await;
            {
                let mut probes = self.probes.lock().expect("probes");
                if probes.len() >= 64 {
                    probes.pop_front();
                }
                probes.push_back((n, sent));
            }
            let late = self
                .probes
                .lock()
                .expect("probes")
                .front()
                .is_some_and(|(_, at)| at.elapsed() >= ECHO_WAIT);
            if late && !self.silent.swap(true, Ordering::AcqRel) {
                self.health.fail(
                    Part::Bus,
                    &format!("the bus has not carried this node's messages for {ECHO_WAIT:?}"),
                );
            }
        }
    }

    /// Probe `n` came back: the bus carries messages, unless a later one is late already
    /// (an echo read late, from before the bus stopped).
    fn echoed(self: &Arc<Self>, n: u64, core: &Core) {
        let late = {
            let mut probes = self.probes.lock().expect("probes");
            probes.retain(|(sent, _)| *sent > n);
            probes
                .front()
                .is_some_and(|(_, at)| at.elapsed() >= ECHO_WAIT)
        };
        if late {
            return;
        }
        let heard = std::mem::replace(&mut *self.heard.lock().expect("heard"), Instant::now());
        self.counts_late.store(false, Ordering::Release);
        if self.silent.swap(false, Ordering::AcqRel) && self.health.recover(Part::Bus) {
            self.bus_back(core, heard);
        }
    }

    /// Keeps the lease and the routes, and takes out the routes of nodes that died. Every
    /// second it refreshes the lease, which also tells whether Redis answers; after any
    /// failed Redis call (a Redis that restarted keeps nothing) the next tick that reaches
    /// Redis writes every route of this node again.
    async fn upkeep(self: Arc<Self>) {
        let mut refreshed = Instant::now();
        let mut reaped = Instant::now();
        let reap_every = (self.lease / 3).max(Duration::from_millis(500));
        let previous = std::mem::take(&mut *self.previous.lock().expect("previous routes"));
        for user in previous {
            self.presence_changed(&user);
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let leased = match self
                .redis(self.routes.keep_lease(&self.token, self.lease))
                .await
            {
                Some(true) => {
                    self.health.recover(Part::Lease);
                    true
                }
                Some(false) => {
                    self.health.fail(
                        Part::Lease,
                        &format!("another instance holds cluster.node_id {}", self.node),
                    );
                    false
                }
                None => continue,
            };
            keep_time(&self.routes, 1).await;
            let rewrite = self.rewrite.swap(false, Ordering::AcqRel);
            if rewrite || refreshed.elapsed() >= self.refresh {
                // After Redis was away: the routes of connections that closed meanwhile
                // go (their removal failed), and their users' friends are told. Not while
                // another instance holds this node's number: the routes under it are its.
                if rewrite && leased {
                    let hub = self.hub.clone();
                    if let Some(offline) = self.redis(self.routes.prune(|| hub.connections())).await
                    {
                        for user in offline {
                            self.presence_changed(&user);
                        }
                    }
                }
                let connections = self.hub.connections();
                let Some(found) = self.redis(self.routes.refresh(&connections)).await else {
                    continue;
                };
                refreshed = Instant::now();
                if rewrite {
                    self.settle_from(refreshed);
                }
                // A route written again was gone: its friends may have been told the user
                // went offline (another node took this one for dead), or never told it came
                // online (it connected while Redis was away). Telling what is true again
                // is a no-op where they were told so already. A connection that closed
                // since the list was read had taken its route out: written again, it goes.
                let mut now: Option<HashSet<(String, String, u64)>> = None;
                let mut users = Vec::new();
                for (c, found) in connections.iter().zip(found) {
                    match found {
                        Refreshed::Held => {}
                        Refreshed::Lost => {
                            self.hub
                                .kick(&c.user, &c.device, c.session, Close::Replaced);
                        }
                        Refreshed::TookOver(older) => {
                            self.close_replaced(&c.user, &c.device, &older);
                        }
                        Refreshed::Written => {
                            // By session: `at` may have moved since (a registration).
                            let now = now.get_or_insert_with(|| {
                                self.hub
                                    .connections()
                                    .into_iter()
                                    .map(|c| (c.user, c.device, c.session))
                                    .collect()
                            });
                            if !now.contains(&(c.user.clone(), c.device.clone(), c.session)) {
                                let _ = self
                                    .redis(self.routes.unregister(&c.user, &c.device, c.session))
                                    .await;
                            }
                            users.push(c.user.as_str());
                        }
                    }
                }
                users.sort_unstable();
                users.dedup();
                for user in users {
                    self.presence_changed(user);
                }
            }
            // Changes told while Redis was away could not be read then: with the routes
            // written back, they are read again.
            if let Some(p) = self.presence.get() {
                p.settle();
            }
            if reaped.elapsed() < reap_every {
                continue;
            }
            reaped = Instant::now();
            let Some(dead) = self.redis(self.routes.dead_nodes()).await else {
                continue;
            };
            for node in dead {
                if let Some(offline) = self.redis(self.routes.reap(node)).await {
                    if !offline.is_empty() {
                        tracing::info!(
                            node,
                            users = offline.len(),
                            "took out a dead node's routes"
                        );
                    }
                    for user in offline {
                        self.presence_changed(&user);
                    }
                }
            }
        }
    }
}

/// A push's frame as the bus carries it (every frame the server makes is JSON).
fn wire_frame(p: &Outgoing) -> Option<&RawValue> {
    serde_json::from_str::<&RawValue>(p.frame.text().as_str()).ok()
}

fn wire_push<'a>(p: &'a Outgoing, users: Vec<&'a str>, frame: &'a RawValue) -> wire::Push<'a> {
    wire::Push {
        users,
        devices: p
            .devices
            .as_ref()
            .map(|d| d.iter().map(String::as_str).collect()),
        frame,
        class: p.class,
        key: p.key,
        except: p.except,
    }
}
/// The offset to Redis's clock this node keeps: Redis's clock less this process's
/// monotonic clock (ms), within `bound` ms either way as of `at` (half the round trip of
/// the reading it came from), a bound that widens with age by `DRIFT_PER_SEC` (clocks
/// drift).
struct Kept {
    offset: i64,
    bound: i64,
    at: Instant,
    /// How far the time kept was from the machine's clock when the log last said it.
    told: i64,
}

/// How far two clocks may drift apart in a second (ms): 500 ppm, well past what a
/// quartz clock drifts.
const DRIFT_PER_SEC: f64 = 0.5;

/// The offset kept, once read.
static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

/// Keeps Redis's time (`crate::clock::keep`) from the quickest of `tries` readings of
/// Redis's clock. A reading is taken when it is tighter than the offset kept (whose bound
/// widens with age), or when the two ranges do not overlap (Redis's clock was set);
/// otherwise the offset stays, so `now_ms` does not wander by a reading's noise. Every
/// node of the deployment so stamps, orders and measures by the one clock, its machine's
/// off by whatever. Tells the log when the time kept is a second or more further from the
/// machine's clock than when it last told (at start: than 0). Whether a reading came.
async fn keep_time(routes: &Routes, tries: usize) -> bool {
    let mut best: Option<(i64, Duration)> = None;
    for _ in 0..tries {
        if let Ok((offset, took)) = routes.clock_offset().await
            && best.is_none_or(|(_, quickest)| took < quickest)
        {
            best = Some((offset, took));
        }
    }
    let Some((offset, took)) = best else {
        return false;
    };
    let bound = took.as_millis() as i64 / 2 + 1;
    let mut kept = KEPT.lock().expect("kept time");
    let taken = kept.as_ref().is_none_or(|k| {
        let widened = k.bound + (k.at.elapsed().as_secs_f64() * DRIFT_PER_SEC) as i64;
        bound <= widened || (offset - k.offset).abs() > bound + widened
    });
    if taken {
        let told = kept.as_ref().map_or(0, |k| k.told);
        *kept = Some(Kept {
            offset,
            bound,
            at: Instant::now(),
            told,
        });
        crate::clock::keep(offset);
    }
    // The machine's clock may have been set meanwhile, whether or not Redis's moved.
    let behind = crate::clock::offset();
    let Some(k) = kept.as_mut() else { return true };
    if (behind - k.told).abs() < CLOCK_MOVE_TOLD {
        return true;
    }
    k.told = behind;
    drop(kept);
    tracing::warn!(
        "this machine's clock is {:.1} s {} Redis's: the node keeps Redis's time \
         (synchronise the clocks: NTP)",
        behind.abs() as f64 / 1000.0,
        if behind > 0 { "behind" } else { "ahead of" }
    );
    true
}

/// Claims `node` in Redis, waiting out the lease of an instance that died holding it.
async fn claim(routes: &Routes, node: u16, token: &str, lease: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + lease + Duration::from_secs(1);
    let mut logged = false;
    loop {
        let holder = match routes.claim(token, lease).await? {
            Ok(()) => return Ok(()),
            Err(holder) => holder,
        };
        if Instant::now() >= deadline {
            anyhow::bail!(
                "cluster.node_id {node} is held by a live node ({holder}); give every node its own cluster.node_id"
            );
        }
        if !logged {
            tracing::warn!(
                node, holder = %holder,
                "cluster.node_id is held; waiting up to {} s for a node that died to release it",
                lease.as_secs() + 1
            );
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl Delivery for Cluster {
    /// This node's devices now; every other node's in one round of the forwarder.
    fn push_all(&self, pushes: Vec<Push>) {
        if pushes.is_empty() {
            return;
        }
        self.hub.push_batch(&pushes);
        let mut round = Vec::with_capacity(pushes.len());
        for p in pushes {
            round.push(Outgoing {
                users: p.users,
                devices: None,
                frame: p.frame,
                class: p.class,
                key: p.key,
                except: p.except,
                counted: None,
            });
        }
        self.queue(Out::Pushes(round));
    }

    fn push(
        &self,
        users: &[String],
        frame: &Utf8Bytes,
        class: Class,
        key: Option<LatestKey>,
        except: u64,
    ) -> Reach {
        let reach = self.hub.push(users, frame, class, key, except);
        self.queue(Out::Pushes(vec![Outgoing::new(
            users, frame, class, key, except,
        )]));
        reach
    }

    fn push_devices(
        &self,
        user_id: &str,
        device_ids: &[&str],
        frame: &Utf8Bytes,
        class: Class,
    ) -> Reach {
        let reach = self.hub.push_devices(user_id, device_ids, frame, class);
        let mut out = Outgoing::new(&[user_id.to_string()], frame, class, None, 0);
        out.devices = Some(device_ids.iter().map(|d| d.to_string()).collect());
        self.queue(Out::Pushes(vec![out]));
        reach
    }

    fn push_counted<'a>(
        &'a self,
        users: &'a [String],
        frame: &'a Utf8Bytes,
        class: Class,
        key: Option<LatestKey>,
        except: u64,
    ) -> BoxFuture<'a, Reach> {
        let local = self.hub.push(users, frame, class, key, except);
        let mut out = Outgoing::new(users, frame, class, key, except);
        // The sender's connection waits for the count, and holds its later frames: a bus
        // that holds its publishes (one that hangs, before it is noticed) costs one ack
        // its count and `COUNT_WAIT`, and the acks after it their count alone.
        let rx = if self.counts_late.load(Ordering::Acquire) {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            out.counted = Some(tx);
            Some(rx)
        };
        self.queue(Out::Pushes(vec![out]));
        Box::pin(async move {
            let remote = match rx {
                Some(rx) => match tokio::time::timeout(COUNT_WAIT, rx).await {
                    Ok(Ok(n)) => n,
                    Ok(Err(_)) => 0,
                    Err(_) => {
                        self.counts_late.store(true, Ordering::Release);
                        0
                    }
                },
                None => 0,
            };
            Reach {
                queued: local.queued + remote,
                dropped: local.dropped,
            }
        })
    }

    /// This node's devices of `user_id`.
    fn online(&self, user_id: &str) -> Vec<String> {
        self.hub.online(user_id)
    }

    /// Closes the user's connections on every node; how many on this one.
    fn close(&self, user_id: &str, which: Which<'_>, why: Close) -> usize {
        let closed = self.hub.close(user_id, which, why);
        let (token, device) = match which {
            Which::All => (None, None),
            Which::Token(t) => (Some(hex::encode(t)), None),
            Which::Device(d) => (None, Some(d)),
        };
        self.broadcast(wire::Message::Close {
            user: user_id,
            token,
            device,
            why,
        });
        closed
    }

    /// Closes the device's connection `session`, wherever it is.
    fn kick(&self, user_id: &str, device_id: &str, session: u64, why: Close) -> bool {
        if self.hub.kick(user_id, device_id, session, why) {
            return true;
        }
        self.broadcast(wire::Message::Kick {
            user: user_id,
            device: device_id,
            session,
        });
        false
    }

    fn online_devices(&self) -> u64 {
        self.hub.online_devices()
    }

    fn close_all(&self) {
        self.hub.close_all();
    }

    /// What the routes say, with this node's own connections.
    fn devices_online<'a>(&'a self, user_id: &'a str) -> BoxFuture<'a, Option<Vec<String>>> {
        Box::pin(async move {
            let routes = self.redis_if_up(self.routes.lookup(&[user_id])).await?;
            let mut devices: Vec<String> = routes
                .into_iter()
                .flatten()
                .map(|(device, _)| device)
                .chain(self.hub.online(user_id))
                .collect();
            devices.sort();
            devices.dedup();
            Some(devices)
        })
    }

    fn presence<'a>(&'a self, users: &'a [String]) -> BoxFuture<'a, Option<Vec<bool>>> {
        Box::pin(async move {
            let refs: Vec<&str> = users.iter().map(String::as_str).collect();
            let routes = self.redis_if_up(self.routes.lookup(&refs)).await?;
            let online: Vec<bool> = users
                .iter()
                .zip(routes)
                .map(|(u, r)| !r.is_empty() || self.hub.has(u))
                .collect();
            // Just after Redis was away, a user without routes may be on a node that has
            // not written its routes back yet: not known, rather than offline.
            if self.settling() && online.contains(&false) {
                return None;
            }
            Some(online)
        })
    }

    fn announce(&self, forget: &Forget) {
        let forget = match forget {
            Forget::Plugin { name, enabled, at } => Forget::Plugin {
                name: name.clone(),
                enabled: *enabled,
                at: self.switch_made(name, *enabled, *at),
            },
            other => other.clone(),
        };
        self.broadcast(wire::Message::Forget(forget));
    }

    /// What friends were last told is kept in Redis, so a change one node told is not
    /// told again by another; without Redis, this node's own memory decides.
    fn must_tell<'a>(
        &'a self,
        user_id: &'a str,
        online: bool,
        last: Option<bool>,
        again: bool,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let tell = match self
                .redis_if_up(self.routes.told(user_id, online, again))
                .await
            {
                Some(previous) => again || previous != Some(online),
                None => again || last != Some(online),
            };
            if tell {
                self.note_told(user_id);
            }
            tell
        })
    }

    fn degraded(&self) -> Vec<String> {
        self.health.reasons()
    }

    fn cluster(&self) -> Option<ClusterStats> {
        Some(ClusterStats {
            node_id: self.node,
            rounds: self.stats.rounds.load(Ordering::Relaxed),
            publishes: self.stats.publishes.load(Ordering::Relaxed),
            lost: self.stats.lost.load(Ordering::Relaxed),
        })
    }
}

impl Links for Cluster {
    /// Writes the device's route (the new connection wins) and tells the node of the
    /// connection it replaced, which closes it only if it is still that session.
    fn connected<'a>(&'a self, device: &'a Device, first: bool) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let given_up =
                u64::try_from(crate::clock::now_ms()).unwrap_or(0) + REDIS_WAIT.as_millis() as u64;
            let registered = self
                .redis_if_up(self.routes.register(
                    &device.user_id,
                    &device.device_id,
                    device.session,
                    device.at.load(Ordering::Relaxed),
                    given_up,
                ))
                .await;
            let Some(Some(r)) = registered else {
                // Redis is away (or ran the call after this node gave it up): the refresh
                // writes the route when it is back.
                if registered.is_some() {
                    // Answered in time, yet late by Redis's clock: it was set more than
                    // REDIS_WAIT ahead since this node last read it (`keep_time`).
                    if let Say::First | Say::Again(_) = CLOCKS.failed() {
                        tracing::warn!(
                            "Redis's clock moved more than {} s ahead of the time this node \
                             keeps (read again each second): routes are written only by the \
                             refresh meanwhile; synchronise the clocks (NTP)",
                            REDIS_WAIT.as_secs()
                        );
                    }
                    self.routes_unsure();
                }
                if first {
                    self.presence_changed(&device.user_id);
                }
                return;
            };
            device.at.store(r.at, Ordering::Relaxed);
            if let Some(old) = &r.replaced
                && old.node != self.node
            {
                self.close_replaced(&device.user_id, &device.device_id, old);
            }
            if r.replaced.is_none() && r.others == 0 {
                self.presence_changed(&device.user_id);
            }
        })
    }

    /// Takes the route out if it is still this connection's.
    fn disconnected<'a>(&'a self, device: &'a Device, last: bool) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let left = self
                .redis_if_up(self.routes.unregister(
                    &device.user_id,
                    &device.device_id,
                    device.session,
                ))
                .await;
            match left {
                Some(Some(0)) => self.presence_changed(&device.user_id),
                Some(_) => {}
                None if last => self.presence_changed(&device.user_id),
                None => {}
            }
        })
    }

    /// Gives the node's number back (the routes of its connections went with them), once
    /// nothing keeps it any more. A lease refresh already sent goes first: Redis runs one
    /// connection's calls in order.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let upkeep = self.upkeep_task.lock().expect("upkeep task").take();
            if let Some(task) = upkeep {
                task.abort();
                let _ = task.await;
            }
            let _ = self.redis(self.routes.release(&self.token)).await;
        })
    }
}
