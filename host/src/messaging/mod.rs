//! The send path and everything around it: limits, the plugin's verdict, then either the
//! committer (stored kinds: one transaction per batch, ack after commit, push after ack)
//! or a push to online devices (live kinds, never stored).

mod accounts;
pub mod batch;
mod commit;
mod delivery;
mod devices;
mod known;
mod route;
mod rules;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use crate::auth::{Tokens, valid_user_id};
use crate::limits::Guards;
use crate::plugins::{Delivery as Class, PluginRegistry, SendContext, SenderKind, ValidateError};
use crate::protocol::Refused;
use crate::protocol::frames::{self, LiveAck, SendAck, SendFrame};
use crate::protocol::{Code, Error};
use crate::store::batch::RecipientCache;
use crate::store::sync::LiveMembers;
use crate::store::{Dialect, Store};
use crate::telemetry::{self, SendOutcome};
use batch::{IdGen, NewMessage, Op, Target};
use route::{Reads, Routes};

pub(crate) use accounts::deleted as account_deleted;
pub use accounts::{Held, Session};
pub use commit::{Answer, Reply};
pub use delivery::{
    ClusterStats, Committed, Delivery, Forget, LatestKey, Offline, PRESENCE, Push, PushFrame,
    Reach, Respond, Which, user_key,
};
pub use devices::{DeviceInfo, valid_label};

/// Settings of the send path, from the config at start-up.
#[derive(Debug, Clone)]
pub struct Settings {
    pub recall_window_ms: i64,
    pub batch_max: usize,
    /// Committers on PostgreSQL (SQLite has one).
    pub committers: usize,
    /// This node's number in message ids.
    pub node_id: u16,
    pub max_frame_bytes: usize,
    pub heartbeat_secs: u64,
    pub send_rate_per_sec: u32,
    pub send_burst: u32,
    pub outbox_frames: usize,
    pub outbox_bytes: usize,
    pub node_outbox_bytes: usize,
    pub handshake_secs: u64,
    pub registration: bool,
    pub max_group_members: u32,
    /// Most devices a user may have registered.
    pub max_devices: u32,
    /// Delivered positions are kept (`received` frames count).
    pub receipts: bool,
    /// The key directory's and the mailboxes' bounds.
    pub e2e: crate::config::E2eConfig,
    /// Cluster mode: what this node caches of members and accounts is read again after
    /// this long, even if no invalidation arrived (the bus may have lost it).
    pub cache_max_age: Option<std::time::Duration>,
}

/// A send the plugin accepted.
pub enum Prepared {
    Stored(NewMessage),
    Live(LiveSend),
}

pub struct LiveSend {
    target: Target,
    conversation_type: u8,
    content_type: u32,
    delivery: Class,
    payload: Box<RawValue>,
    received: std::time::Instant,
}

/// A conversation as live sends see it, and its members to push to.
type Members = (Arc<LiveMembers>, Arc<[String]>);

/// A cached value and when it was read.
struct Cached<T> {
    value: T,
    read_at: std::time::Instant,
}

impl<T> Cached<T> {
    fn new(value: T) -> Cached<T> {
        Cached {
            value,
            read_at: std::time::Instant::now(),
        }
    }

    /// The value, unless it is older than `max_age`.
    fn fresh(&self, max_age: Option<std::time::Duration>) -> Option<&T> {
        match max_age {
            Some(age) if self.read_at.elapsed() > age => None,
            _ => Some(&self.value),
        }
    }
}

/// The messaging core: what the gateway and the HTTP API share.
pub struct Core {
    pub store: Store,
    pub registry: Arc<PluginRegistry>,
    /// The connections: pushes, closes, who is online.
    pub delivery: Arc<dyn Delivery>,
    pub tokens: Tokens,
    pub settings: Settings,
    /// What the server refused or cut off, counted for the logs (and the metrics).
    pub guards: Arc<Guards>,
    /// Commit batches run since start-up (every committer's).
    pub batches: Arc<AtomicU64>,
    /// One queue per committer.
    commits: Vec<mpsc::Sender<commit::Job>>,
    routes: Arc<Routes>,
    /// The private conversations of pairs this node does not know (sends by peer of a
    /// live kind).
    pair_reads: Reads<route::Pair, i64>,
    /// Which conversations exist, with their pairs, of ids this node does not know the
    /// key of (several committers).
    id_reads: Reads<i64, Option<route::Pair>>,
    /// Members by conversation, for live sends, with their roles, mutes and blocks; dropped
    /// by every change this node commits to them. Keyed by conversation ids, which the
    /// server assigns, so hashed with foldhash (faster than std's SipHash).
    members: Mutex<foldhash::HashMap<i64, Cached<Members>>>,
    /// What this node read of each account seen in a token (`accounts.rs`).
    accounts: Mutex<HashMap<String, Cached<accounts::Account>>>,
    /// Message ids (the committers' and the server's tips).
    pub(crate) ids: Arc<IdGen>,
    /// Moves on with every change of the member cache, so a read that raced a change does
    /// not cache what it read.
    generation: AtomicU64,
    /// When devices connected or went away, written in rounds.
    last_seen: Arc<devices::LastSeen>,
    /// Key bundles claimed, by (claimer, target user).
    pub(crate) key_claims: crate::limits::Limiter<(String, String)>,
}

impl Core {
    pub fn start(
        store: Store,
        registry: Arc<PluginRegistry>,
        tokens: Tokens,
        settings: Settings,
        delivery: Arc<dyn Delivery>,
        offline: Option<Arc<dyn Offline>>,
    ) -> Arc<Core> {
        let committers = match store.dialect() {
            Dialect::Sqlite => 1,
            Dialect::Postgres => settings.committers,
        };
        let routes = Arc::new(Routes::new(committers));
        let ids = Arc::new(IdGen::new(settings.node_id));
        let recipients = Arc::new(RecipientCache::default());
        let batches = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(commit::Shared {
            store: store.clone(),
            delivery: delivery.clone(),
            ids: ids.clone(),
            routes: routes.clone(),
            recipients,
            settings: settings.clone(),
            batches: batches.clone(),
            offline,
        });
        let last_seen = Arc::new(devices::LastSeen::default());
        tokio::spawn(devices::record_last_seen(last_seen.clone(), store.clone()));
        tokio::spawn(purge_mailboxes(store.clone()));
        let key_claims = crate::limits::Limiter::new(
            settings.e2e.claims_per_minute,
            std::time::Duration::from_secs(60),
            100_000,
        );
        let mut commits = Vec::new();
        for _ in 0..routes.committers() {
            let (tx, rx) = mpsc::channel(settings.batch_max * 8);
            commits.push(tx);
            tokio::spawn(commit::run(rx, shared.clone()));
        }
        Arc::new(Core {
            pair_reads: Reads::start(store.clone(), |store, pairs| async move {
                store.private_conversations(&pairs).await
            }),
            id_reads: Reads::start(store.clone(), |store, ids| async move {
                store.conversation_pairs(&ids).await
            }),
            store,
            registry,
            delivery,
            tokens,
            settings,
            guards: Arc::new(Guards::default()),
            batches,
            commits,
            routes,
            members: Mutex::new(foldhash::HashMap::default()),
            accounts: Mutex::new(HashMap::new()),
            ids,
            generation: AtomicU64::new(0),
            last_seen,
            key_claims,
        })
    }

    /// Limits and the plugin's verdict. Runs the plugin on the caller's thread (its fuel
    /// bounds the time). A refusal here is the send's answer (and counted as such).
    pub fn prepare(&self, sender: &str, req: SendFrame) -> Result<Prepared, Error> {
        let content_type = req.content_type;
        self.check_send(sender, req).inspect_err(|e| {
            let known = self.registry.get(content_type).map(|_| content_type);
            telemetry::send(known, SendOutcome::Refused(e.code.as_str()));
        })
    }

    fn check_send(&self, sender: &str, req: SendFrame) -> Result<Prepared, Error> {
        let received = std::time::Instant::now();
        check_client_msg_id(&req.client_msg_id)?;
        let target = match (req.conversation_id, req.peer_id) {
            (Some(id), None) => Target::Conversation(id),
            (None, Some(peer)) if req.conversation_type == 1 => {
                if !valid_user_id(&peer) {
                    return Err(Error::bad_request("peerId is not a valid user id"));
                }
                Target::Peer(peer)
            }
            (None, Some(_)) => {
                return Err(Error::bad_request(
                    "peerId addresses private conversations (conversationType 1) only",
                ));
            }
            _ => {
                return Err(Error::bad_request(
                    "give exactly one of conversationId and peerId",
                ));
            }
        };
        let conversation_id = match &target {
            Target::Conversation(id) => id.to_string(),
            Target::Peer(_) => String::new(),
        };
        let ctx = SendContext {
            sender_id: sender,
            sender: SenderKind::User,
            conversation_type: req.conversation_type,
            conversation_id: &conversation_id,
        };
        let v = self
            .registry
            .validate(req.content_type, &ctx, req.payload.get().as_bytes())?;
        let m = &v.plugin.manifest;
        if m.delivery.is_stored() {
            let recalls = if m.name == "recall" {
                let seq = serde_json::from_str::<serde_json::Value>(v.payload.get())
                    .ok()
                    .and_then(|p| p.get("seq").and_then(|s| s.as_i64()));
                Some(seq.ok_or_else(|| {
                    Error::bad_request("a recall names the seq of the message to recall")
                })?)
            } else {
                None
            };
            Ok(Prepared::Stored(NewMessage {
                target,
                conversation_type: req.conversation_type,
                sender_id: sender.to_string(),
                client_msg_id: req.client_msg_id,
                content_type: req.content_type,
                counts_unread: m.counts_unread,
                payload: v.into_text(),
                recalls,
                received,
            }))
        } else {
            Ok(Prepared::Live(LiveSend {
                target,
                conversation_type: req.conversation_type,
                content_type: req.content_type,
                delivery: m.delivery,
                payload: v.payload,
                received,
            }))
        }
    }

    /// The routing key of an op: its conversation's (`route`). A message to a peer goes
    /// by the pair; with several committers, an op naming a conversation whose key this
    /// node does not know waits for a read to find it (`Reads`: one for all the ids asked
    /// for meanwhile). An id that is no conversation goes by itself (the op is refused).
    async fn route_key(&self, op: &Op) -> Result<u64, Error> {
        if self.routes.committers() == 1 {
            return Ok(0);
        }
        match op {
            Op::Read {
                conversation_id, ..
            }
            | Op::Received {
                conversation_id, ..
            }
            | Op::Send(NewMessage {
                target: Target::Conversation(conversation_id),
                ..
            }) => {
                let id = *conversation_id;
                if let Some(key) = self.routes.key(id) {
                    return Ok(key);
                }
                Ok(match self.id_reads.get(id).await? {
                    Some(pair) => self.routes.found(id, pair),
                    None => id as u64,
                })
            }
            Op::Send(NewMessage {
                target: Target::Peer(peer),
                sender_id,
                ..
            }) => Ok(route::pair_key(sender_id, peer)),
        }
    }

    /// Queues a stored send or a read for its committer; the reply comes after commit.
    pub async fn submit(&self, op: Op, reply: Reply) {
        let key = match self.route_key(&op).await {
            Ok(key) => key,
            Err(e) => {
                commit::count_refused(&op, &e);
                return reply.error(&e);
            }
        };
        let queue = &self.commits[self.routes.committer(key)];
        if let Err(mpsc::error::SendError(job)) = queue.send(commit::Job { op, reply }).await {
            let e = Error::unavailable("the server is shutting down");
            commit::count_refused(&job.op, &e);
            job.reply.error(&e);
        }
    }

    /// A device received a conversation up to `seq`: the committer moves its user's
    /// delivered position; with receipts off it is answered at once, nothing written.
    pub async fn receive(&self, user_id: &str, conversation_id: i64, seq: i64, reply: Reply) {
        if !self.settings.receipts {
            return reply.answer(commit::Answer::Received(frames::ReceivedAck {
                conversation_id,
                delivered_seq: seq.max(0),
                moved: false,
            }));
        }
        let op = Op::Received {
            user_id: user_id.to_string(),
            conversation_id,
            seq,
        };
        self.submit(op, reply).await;
    }

    /// Submits and waits (HTTP).
    pub async fn submit_and_wait(&self, op: Op) -> Result<commit::Answer, Error> {
        let (tx, rx) = oneshot::channel();
        self.submit(op, Reply::Http(tx)).await;
        rx.await
            .map_err(|_| Error::unavailable("the server is shutting down"))?
    }

    /// Pushes a live kind to the conversation's online devices; nothing is stored. The
    /// answer is counted.
    pub async fn deliver_live(
        &self,
        sender: &str,
        live: LiveSend,
        except: u64,
    ) -> Result<LiveAck, Error> {
        let (content_type, received) = (live.content_type, live.received);
        let answer = self.push_live(sender, live, except).await;
        let outcome = match &answer {
            Ok(_) => SendOutcome::Ok {
                live: true,
                took: received.elapsed(),
            },
            Err(e) => SendOutcome::Refused(e.code.as_str()),
        };
        telemetry::send(Some(content_type), outcome);
        answer
    }

    async fn push_live(&self, sender: &str, live: LiveSend, except: u64) -> Result<LiveAck, Error> {
        let conversation_id = match &live.target {
            Target::Conversation(id) => *id,
            Target::Peer(peer) => self.private_conversation(sender, peer).await?,
        };
        // No current member at all (as in a dissolved group) or not the sender: the rules
        // decide from the sender's past membership.
        let current = match self.members_of(conversation_id).await {
            Err(e) if e.code == Code::NotAMember => None,
            found => Some(found?),
        };
        let Some((live_members, members)) =
            current.filter(|(_, members)| members.iter().any(|m| m == sender))
        else {
            return Err(self
                .refuse_outsider(conversation_id, sender, live.conversation_type)
                .await);
        };
        let conversation_type = live_members.conversation_type;
        // The rules of a stored send hold for live kinds too. The cache lists current
        // members only; a group's members without a role or mute are not in `roles`.
        let view = rules::SendView {
            conversation_id,
            conversation_type,
            dissolved: false,
            mute_all: live_members.mute_all,
            membership: Some(None),
            role: (conversation_type >= 2)
                .then(|| live_members.roles.get(sender).copied().unwrap_or((0, 0))),
            blockers: &live_members.blockers,
            deleted: live_members.deleted.as_deref(),
        };
        rules::may_send(
            &view,
            sender,
            live.conversation_type,
            crate::clock::now_ms(),
        )?;
        let frame = frames::notify_live(
            conversation_type,
            conversation_id,
            sender,
            live.content_type,
            &live.payload,
        );
        let key = (conversation_id, user_key(sender), live.content_type);
        let reach = self
            .delivery
            .push_counted(&members, &frame, live.delivery, Some(key), except)
            .await;
        Ok(LiveAck {
            live: true,
            conversation_id,
            conversation_type,
            delivered: reach.queued,
        })
    }

    async fn private_conversation(&self, a: &str, b: &str) -> Result<i64, Error> {
        if a == b {
            return Err(Refused::SelfConversation.into());
        }
        let key = route::pair(a, b);
        if let Some(id) = self.routes.private(&key) {
            return Ok(id);
        }
        // Live kinds store nothing, not even a conversation: only a stored message creates
        // one.
        let id = self
            .pair_reads
            .get(key.clone())
            .await?
            .ok_or_else(|| Refused::NoConversation(b.to_string()))?;
        self.routes.learn(key, id);
        Ok(id)
    }

    /// Drops what `forget` names from this node's caches and tells the other nodes to.
    pub(crate) fn forget(&self, forget: Forget) {
        self.drop_cached(&forget);
        self.delivery.announce(&forget);
    }

    /// Drops what `forget` names from this node's caches (another node changed it).
    pub fn drop_cached(&self, forget: &Forget) {
        match forget {
            Forget::Members(id) => {
                let mut cache = self.members.lock().expect("members");
                self.generation.fetch_add(1, Ordering::AcqRel);
                cache.remove(id);
            }
            Forget::AllMembers => {
                let mut cache = self.members.lock().expect("members");
                self.generation.fetch_add(1, Ordering::AcqRel);
                cache.clear();
            }
            Forget::Account(user) => {
                self.accounts.lock().expect("accounts").remove(user);
            }
            Forget::Plugin { name, enabled, .. } => {
                if self.registry.set_enabled(name, *enabled).is_some() {
                    tracing::info!(plugin = %name, enabled, "plugin switched on another node");
                }
            }
        }
    }

    /// Drops every cached member list and account (the bus was away: what changed
    /// meanwhile was not heard).
    pub fn drop_all_cached(&self) {
        self.drop_cached(&Forget::AllMembers);
        self.accounts.lock().expect("accounts").clear();
    }

    /// The refusal of a live send from `sender`, who is no current member of the
    /// conversation: read from the database (a refusal, not the path of every signal), so
    /// that the rules answer as they would for a stored kind (a past member of a dissolved
    /// group hears `group_dissolved`, anyone else `not_a_member`).
    async fn refuse_outsider(&self, conversation_id: i64, sender: &str, asked: u8) -> Error {
        let (group, member) = match tokio::try_join!(
            self.store.group(conversation_id),
            self.store.member(conversation_id, sender),
        ) {
            Ok(read) => read,
            Err(e) => return crate::store::unavailable(e),
        };
        let view = rules::SendView {
            conversation_id,
            conversation_type: group.as_ref().map_or(asked, |g| g.conversation_type),
            dissolved: group.is_some_and(|g| g.dissolved),
            mute_all: false,
            membership: member.map(|m| m.left_at_seq),
            role: None,
            blockers: &[],
            deleted: None,
        };
        match rules::may_send(&view, sender, asked, crate::clock::now_ms()) {
            Err(refused) => refused.into(),
            // A member since the cache was read: not one when the send was decided. The
            // entry goes, so their next send reads the members again.
            Ok(()) => {
                self.members
                    .lock()
                    .expect("members")
                    .remove(&conversation_id);
                Refused::NotAMember(conversation_id).into()
            }
        }
    }

    async fn members_of(&self, conversation_id: i64) -> Result<Members, Error> {
        if let Some(m) = self
            .members
            .lock()
            .expect("members")
            .get(&conversation_id)
            .and_then(|c| c.fresh(self.settings.cache_max_age))
        {
            return Ok(m.clone());
        }
        // A change that commits while we read must not leave its old members cached.
        let generation = self.generation.load(Ordering::Acquire);
        let live = self
            .store
            .live_members(conversation_id)
            .await
            .map_err(crate::store::unavailable)?
            .ok_or(Refused::NotAMember(conversation_id))?;
        let members = Arc::<[String]>::from(live.members.clone());
        let entry = (Arc::new(live), members);
        let mut cache = self.members.lock().expect("members");
        if self.generation.load(Ordering::Acquire) == generation {
            cache.insert(conversation_id, Cached::new(entry.clone()));
        }
        Ok(entry)
    }

    /// Handles a send of `sender` from a connection: errors and acks go to `to`.
    pub async fn send_from(&self, sender: &str, to: Arc<dyn Respond>, req: SendFrame) {
        let id = req.id.clone();
        match self.prepare(sender, req) {
            Err(e) => {
                to.answer(frames::error(id.as_deref(), &e));
            }
            Ok(Prepared::Stored(m)) => {
                self.submit(Op::Send(m), Reply::Socket { to, id }).await;
            }
            Ok(Prepared::Live(live)) => {
                let frame = match self.deliver_live(sender, live, to.session()).await {
                    Ok(ack) => frames::ack(id.as_deref(), &ack),
                    Err(e) => frames::error(id.as_deref(), &e),
                };
                to.answer(frame);
            }
        }
    }
}

/// A `clientMsgId`: 1 to 64 bytes without control characters.
pub fn check_client_msg_id(cmid: &str) -> Result<(), Error> {
    if cmid.is_empty() || cmid.len() > 64 || cmid.chars().any(char::is_control) {
        return Err(Error::bad_request(
            "clientMsgId must be 1 to 64 bytes without control characters",
        ));
    }
    Ok(())
}

/// Deletes expired mailbox entries once a minute.
async fn purge_mailboxes(store: Store) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = store.purge_mailboxes(crate::clock::now_ms()).await {
            tracing::warn!("could not purge expired mailbox entries: {e}");
        }
    }
}

/// A send's answer as the HTTP endpoint returns it.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub enum SendAnswer {
    Stored(SendAck),
    Live(LiveAck),
}

/// A plugin's verdict as the client sees it: the code the plugin host names (every one is
/// a documented `Code`), its message, and the plugin's own rejection code.
impl From<ValidateError> for Error {
    fn from(e: ValidateError) -> Error {
        let code = Code::from_name(e.code()).unwrap_or(Code::Internal);
        Error {
            reason: e.reason().map(str::to_string),
            ..Error::new(code, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::CallFailure;

    #[test]
    fn every_code_the_plugin_host_names_is_documented() {
        let n = || "k".to_string();
        let failure = || CallFailure::Trap("t".into());
        for e in [
            ValidateError::Unknown(1),
            ValidateError::Disabled {
                content_type: 1,
                name: n(),
            },
            ValidateError::Forbidden {
                content_type: 1,
                name: n(),
            },
            ValidateError::ConversationType {
                name: n(),
                conversation_type: 3,
                allowed: vec![1],
            },
            ValidateError::TooLarge {
                name: n(),
                size: 2,
                max: 1,
            },
            ValidateError::Invalid {
                code: "empty".into(),
                message: "m".into(),
            },
            ValidateError::PluginFailed {
                name: n(),
                content_type: 1,
                failure: failure(),
            },
            ValidateError::Busy {
                name: n(),
                content_type: 1,
                failure: failure(),
            },
        ] {
            let code = e.code();
            assert_eq!(
                Error::from(e).code.as_str(),
                code,
                "{code} is no documented code"
            );
        }
    }
}
