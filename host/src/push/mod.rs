//! Offline push: a bridge, not a push service. When a stored message that counts toward
//! unread reaches a user none of whose devices is online anywhere, the deployer's webhook
//! gets one signed notice per user and burst (the user's push tokens, the conversation,
//! seq, sender, unread badge and a preview), off the send path: the committer hands over
//! what it committed and never waits; a bounded queue, a bounded number of POSTs in flight,
//! retries after 1 s, 2 s and 4 s, then the notice is given up and counted.

mod webhook;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Notify, Semaphore, mpsc};

use crate::clock::now_ms;
use crate::config::PushConfig;
use crate::messaging::{Committed, Delivery, Offline};
use crate::plugins::PluginRegistry;
use crate::protocol::Stored;
use crate::store::Store;
use crate::store::devices::PushTarget;
use crate::telemetry::{self, PushOutcome};
pub use webhook::Webhook;

/// The kind whose payloads are never previewed.
const ENCRYPTED: &str = "encrypted";

/// After a failed POST, the waits before the next attempts; then the notice is given up.
const RETRIES: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// Users whose notices are prepared at once.
const ROUND: usize = 500;

/// Batches of committed messages waiting for the bridge's task (which never waits on the
/// webhook, so this is only the time it takes to sort them).
const INBOX: usize = 256;

/// What the committer calls: hands a batch's messages to the bridge's task, or counts
/// their notices dropped when it is behind.
pub struct Bridge {
    inbox: mpsc::Sender<Vec<Committed>>,
}

impl Bridge {
    /// The bridge of `cfg`, running; `None` when no webhook is set.
    pub fn start(
        cfg: &PushConfig,
        store: &Store,
        registry: &Arc<PluginRegistry>,
        delivery: Arc<dyn Delivery>,
    ) -> Option<Arc<dyn Offline>> {
        let (url, secret) = (cfg.webhook_url.as_ref()?, cfg.webhook_secret.as_ref()?);
        let webhook = match Webhook::new(url, secret, Duration::from_secs(cfg.timeout_secs)) {
            Ok(w) => Arc::new(w),
            Err(e) => {
                tracing::error!("offline push is off: {e}");
                return None;
            }
        };
        let (tx, rx) = mpsc::channel(INBOX);
        let worker = Worker {
            sender: Arc::new(Sender {
                store: store.clone(),
                registry: registry.clone(),
                delivery,
                webhook,
                in_flight: Arc::new(Semaphore::new(cfg.concurrency)),
            }),
            coalesce: Duration::from_millis(cfg.coalesce_ms),
            queue: cfg.queue,
            round_over: Arc::new(Notify::new()),
            sending: false,
            pending: HashMap::new(),
            order: VecDeque::new(),
        };
        tokio::spawn(worker.run(rx));
        Some(Arc::new(Bridge { inbox: tx }))
    }
}

impl Offline for Bridge {
    fn committed(&self, messages: Vec<Committed>) {
        if let Err(mpsc::error::TrySendError::Full(lost)) = self.inbox.try_send(messages) {
            let users: usize = lost.iter().map(|c| c.members.len().saturating_sub(1)).sum();
            telemetry::push(PushOutcome::Dropped, users as u64);
        }
    }
}

/// One user's notice while it waits: each conversation's part of its burst (at most
/// `CONVERSATIONS` conversations, the one whose newest message is oldest forgotten).
struct Pending {
    by_conversation: HashMap<i64, Burst>,
}

/// A conversation's part of a burst: its newest messages (at most `KEPT`, the newest last),
/// any of which the notice may name when those after it were recalled, and how many came.
struct Burst {
    newest: VecDeque<Committed>,
    count: u32,
}

/// Conversations one pending notice remembers.
const CONVERSATIONS: usize = 16;
/// Messages of a conversation one pending notice remembers.
const KEPT: usize = 8;

impl Burst {
    fn newest_time(&self) -> i64 {
        self.newest.back().map_or(0, |c| c.message.server_time)
    }
}

impl Pending {
    fn add(&mut self, c: &Committed) {
        let id = c.message.conversation_id;
        if !self.by_conversation.contains_key(&id) && self.by_conversation.len() >= CONVERSATIONS {
            let oldest = self
                .by_conversation
                .iter()
                .min_by_key(|(_, b)| b.newest_time())
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                self.by_conversation.remove(&oldest);
            }
        }
        let burst = self.by_conversation.entry(id).or_insert_with(|| Burst {
            newest: VecDeque::with_capacity(1),
            count: 0,
        });
        if burst.newest.len() == KEPT {
            burst.newest.pop_front();
        }
        burst.newest.push_back(c.clone());
        burst.count += 1;
    }
}

/// What sorts the notices: the users waiting, and whether a round of them is being sent.
struct Worker {
    sender: Arc<Sender>,
    coalesce: Duration,
    queue: usize,
    /// Told when the round being sent has handed all its notices to POSTs.
    round_over: Arc<Notify>,
    sending: bool,
    pending: HashMap<String, Pending>,
    /// The users of `pending` as their notices began, the longest waiting first.
    order: VecDeque<(Instant, String)>,
}

/// What sends a round of notices: reads what they tell, then POSTs them, at most
/// `in_flight` at once (each with its retries).
struct Sender {
    store: Store,
    registry: Arc<PluginRegistry>,
    delivery: Arc<dyn Delivery>,
    webhook: Arc<Webhook>,
    in_flight: Arc<Semaphore>,
}

/// A device a notice goes to.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NoticeDevice<'a> {
    device_id: &'a str,
    provider: &'a str,
    token: &'a str,
}

/// The body of a notice (docs/operations.md, Offline push).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Notice<'a> {
    notice_id: &'a str,
    user_id: &'a str,
    devices: Vec<NoticeDevice<'a>>,
    conversation_id: i64,
    conversation_type: u8,
    seq: i64,
    sender_id: &'a str,
    content_type: u32,
    /// Messages of the burst this notice stands for.
    messages: u32,
    /// The user's unread count over all conversations.
    badge: i64,
    /// A line of the newest message; `null` for an encrypted one.
    preview: Option<String>,
    server_time: i64,
}

impl Worker {
    /// Sorts what the committers hand over into the notices waiting, and sends those whose
    /// burst is over, a round at a time in a task of its own. It never waits for the
    /// database or the webhook: while a round is being sent, notices wait (at most `queue`
    /// users) and the rest are dropped.
    async fn run(mut self, mut inbox: mpsc::Receiver<Vec<Committed>>) {
        loop {
            let due = self.order.front().map(|(since, _)| *since + self.coalesce);
            tokio::select! {
                batch = inbox.recv() => match batch {
                    Some(batch) => self.take(batch),
                    None => return,
                },
                () = sleep_until(due), if !self.sending => self.dispatch(),
                () = self.round_over.notified(), if self.sending => self.sending = false,
            }
        }
    }

    /// Adds a batch's messages to the notices waiting, one per recipient but the sender.
    fn take(&mut self, batch: Vec<Committed>) {
        let mut dropped = 0;
        for c in batch {
            for user in c.members.iter().filter(|u| **u != c.message.sender_id) {
                let full = self.pending.len() >= self.queue;
                match self.pending.get_mut(user) {
                    Some(p) => p.add(&c),
                    None if full => dropped += 1,
                    None => {
                        let mut p = Pending {
                            by_conversation: HashMap::new(),
                        };
                        p.add(&c);
                        self.pending.insert(user.clone(), p);
                        self.order.push_back((Instant::now(), user.clone()));
                    }
                }
            }
        }
        if dropped > 0 {
            telemetry::push(PushOutcome::Dropped, dropped);
        }
    }

    /// Starts sending the notices whose burst is over (a round of them, the longest
    /// waiting first).
    fn dispatch(&mut self) {
        let now = Instant::now();
        let mut notices: Vec<(String, Pending)> = Vec::new();
        while notices.len() < ROUND {
            match self.order.front() {
                Some((since, _)) if *since + self.coalesce <= now => {}
                _ => break,
            }
            let Some((_, user)) = self.order.pop_front() else {
                break;
            };
            if let Some(p) = self.pending.remove(&user) {
                notices.push((user, p));
            }
        }
        if notices.is_empty() {
            return;
        }
        self.sending = true;
        let (sender, over) = (self.sender.clone(), self.round_over.clone());
        tokio::spawn(async move {
            if let Err(e) = sender.prepare_and_send(notices).await {
                tracing::warn!("offline notices not sent: {e}");
            }
            over.notify_one();
        });
    }
}

impl Sender {
    /// Reads what a round's notices tell and hands each to a POST, waiting for a free one.
    async fn prepare_and_send(&self, notices: Vec<(String, Pending)>) -> Result<(), String> {
        // Offline anywhere: a user the cluster cannot tell about is taken as offline (a
        // notice too many rather than one missing).
        let users: Vec<String> = notices.iter().map(|(u, _)| u.clone()).collect();
        let online = self.delivery.presence(&users).await;
        let offline: Vec<(String, Pending)> = notices
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !online.as_ref().is_some_and(|o| o[*i]))
            .map(|(_, n)| n)
            .collect();
        if offline.is_empty() {
            return Ok(());
        }
        let refs: Vec<&str> = offline.iter().map(|(u, _)| u.as_str()).collect();
        let targets = self
            .store
            .push_targets(&refs)
            .await
            .map_err(|e| e.to_string())?;
        let offline: Vec<(String, Pending)> = offline
            .into_iter()
            .filter(|(u, _)| targets.contains_key(u))
            .collect();
        // What a notice may not tell: a conversation its user muted, a message recalled
        // since (its payload is hidden now).
        let pairs: Vec<(&str, i64)> = offline
            .iter()
            .flat_map(|(u, p)| p.by_conversation.keys().map(move |c| (u.as_str(), *c)))
            .collect();
        let muted = self
            .store
            .push_muted(&pairs)
            .await
            .map_err(|e| e.to_string())?;
        let mut seqs: Vec<(i64, i64)> = offline
            .iter()
            .flat_map(|(_, p)| p.by_conversation.values())
            .flat_map(|b| &b.newest)
            .map(|c| (c.message.conversation_id, c.message.seq))
            .collect();
        // A group's message is in the notice of every member it reached.
        seqs.sort_unstable();
        seqs.dedup();
        let recalled = self
            .store
            .recalled(&seqs)
            .await
            .map_err(|e| e.to_string())?;
        let users: Vec<&str> = offline.iter().map(|(u, _)| u.as_str()).collect();
        let badges = self
            .store
            .unread_totals(&users)
            .await
            .map_err(|e| e.to_string())?;
        for (user, p) in offline {
            let Some(devices) = targets.get(&user) else {
                continue;
            };
            let told: Vec<&Burst> = p
                .by_conversation
                .iter()
                .filter(|(id, _)| !muted.contains(&(user.clone(), **id)))
                .map(|(_, b)| b)
                .collect();
            let is_recalled = |m: &Stored| recalled.contains(&(m.conversation_id, m.seq));
            let kept = || told.iter().flat_map(|b| &b.newest).map(|c| &*c.message);
            let came: u32 = told.iter().map(|b| b.count).sum();
            let messages = came - kept().filter(|m| is_recalled(m)).count() as u32;
            let Some(m) = kept()
                .filter(|m| !is_recalled(m))
                .max_by_key(|m| (m.server_time, m.seq))
            else {
                continue;
            };
            let badge = badges.get(&user).copied().unwrap_or(0);
            let encrypted = self
                .registry
                .get(m.content_type)
                .is_some_and(|k| k.manifest.name == ENCRYPTED);
            let preview = (!encrypted).then(|| self.registry.preview(m.content_type, &m.payload));
            let notice_id = format!("{}-{}-{}", m.conversation_id, m.seq, user);
            let body = serde_json::to_vec(&Notice {
                notice_id: &notice_id,
                user_id: &user,
                devices: devices_of(devices),
                conversation_id: m.conversation_id,
                conversation_type: m.conversation_type,
                seq: m.seq,
                sender_id: &m.sender_id,
                content_type: m.content_type,
                messages,
                badge,
                preview,
                server_time: m.server_time,
            })
            .map_err(|e| e.to_string())?;
            // At most `concurrency` POSTs (with their retries) at once; the round waits
            // for a free one (the semaphore is never closed).
            let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
                telemetry::push(PushOutcome::Dropped, 1);
                continue;
            };
            let webhook = self.webhook.clone();
            tokio::spawn(async move {
                let outcome = deliver(&webhook, &body, &notice_id).await;
                telemetry::push(outcome, 1);
                drop(permit);
            });
        }
        Ok(())
    }
}

fn devices_of(targets: &[PushTarget]) -> Vec<NoticeDevice<'_>> {
    targets
        .iter()
        .map(|t| NoticeDevice {
            device_id: &t.device_id,
            provider: &t.provider,
            token: &t.token,
        })
        .collect()
}

/// POSTs a notice, retrying after 1 s, 2 s and 4 s.
async fn deliver(webhook: &Webhook, body: &[u8], notice_id: &str) -> PushOutcome {
    let mut waits = RETRIES.iter();
    loop {
        match webhook.post(body, notice_id, now_ms()).await {
            Ok(()) => return PushOutcome::Sent,
            Err(e) => match waits.next() {
                Some(wait) => {
                    telemetry::push(PushOutcome::Retried, 1);
                    tracing::debug!(notice = notice_id, "webhook: {e}; again in {wait:?}");
                    tokio::time::sleep(*wait).await;
                }
                None => {
                    tracing::warn!(notice = notice_id, "webhook: {e}; notice given up");
                    return PushOutcome::Failed;
                }
            },
        }
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
