//! The committer: takes every send and read queued since its last commit, runs them in
//! one transaction, then answers each (ack or error) and pushes what was stored — in that
//! order, and never before the commit.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::Settings;
use super::batch::{BatchContext, IdGen, Known, Op, Outcome, Target};
use super::delivery::{Committed, Push, Respond};
use super::route::{Routes, pair};
use crate::clock::now_ms;
use crate::protocol::Error;
use crate::protocol::frames::{self, ReadAck, ReceivedAck, SendAck};
use crate::store::batch::{BatchError, RecipientCache};
use crate::store::{Store, Writer};
use crate::telemetry::{self, Repeats, Say, SendOutcome};

/// Failed commit batches, for the log (a full disk fails every one; the metrics count each).
static FAILURES: Repeats = Repeats::new();

/// A stored send's or a read's answer, for the HTTP endpoints.
#[derive(Debug)]
pub enum Answer {
    Sent(SendAck),
    Read(ReadAck),
    Received(ReceivedAck),
}

/// Where the answer goes: a connection's responder (with the request's `id`), or an HTTP
/// handler waiting for it.
pub enum Reply {
    Socket {
        to: Arc<dyn Respond>,
        id: Option<String>,
    },
    Http(oneshot::Sender<Result<Answer, Error>>),
}

impl Reply {
    pub fn error(self, e: &Error) {
        match self {
            Reply::Socket { to, id } => {
                to.answer(frames::error(id.as_deref(), e));
            }
            Reply::Http(tx) => {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }

    pub(super) fn answer(self, a: Answer) {
        match self {
            Reply::Socket { to, id } => {
                let frame = match &a {
                    Answer::Sent(ack) => frames::send_ack(id.as_deref(), ack),
                    Answer::Read(ack) => frames::ack(id.as_deref(), ack),
                    Answer::Received(ack) => frames::ack(id.as_deref(), ack),
                };
                to.answer(frame);
            }
            Reply::Http(tx) => {
                let _ = tx.send(Ok(a));
            }
        }
    }

    /// The session that asked (not pushed its own message), 0 for HTTP.
    fn session(&self) -> u64 {
        match self {
            Reply::Socket { to, .. } => to.session(),
            Reply::Http(_) => 0,
        }
    }
}

pub struct Job {
    pub op: Op,
    pub reply: Reply,
}

/// Attempts of a batch that met a concurrent writer (another node).
const CONFLICT_RETRIES: usize = 5;

/// Attempts of a batch whose connection broke (the database terminated it, restarted, or
/// the network dropped it). Safe even when the broken attempt did commit: a send's
/// `clientMsgId` makes the retry return the original, and read positions only move
/// forward.
const BROKEN_RETRIES: usize = 1;

/// What every committer shares.
pub struct Shared {
    pub store: Store,
    pub delivery: Arc<dyn super::Delivery>,
    pub ids: Arc<IdGen>,
    pub routes: Arc<Routes>,
    pub recipients: Arc<RecipientCache>,
    pub settings: Settings,
    /// Batches committed (or failed) since start-up.
    pub batches: Arc<std::sync::atomic::AtomicU64>,
    /// The push bridge, if offline notices are on.
    pub offline: Option<Arc<dyn super::Offline>>,
}

pub async fn run(mut rx: mpsc::Receiver<Job>, shared: Arc<Shared>) {
    let Shared {
        store,
        delivery,
        ids,
        routes,
        recipients,
        settings,
        batches,
        offline,
    } = &*shared;
    let mut writer = Writer::default();
    let mut known = Known::default();
    let mut jobs: Vec<Job> = Vec::with_capacity(settings.batch_max);
    let mut ops: Vec<Op> = Vec::with_capacity(settings.batch_max);
    let mut replies: Vec<Reply> = Vec::with_capacity(settings.batch_max);
    loop {
        // Idle with SQLite's writer connection, the committer gives it to a writer who
        // asks (`store::Writer`).
        let received = tokio::select! {
            biased;
            n = rx.recv_many(&mut jobs, settings.batch_max) => n,
            () = store.writer_asked(), if writer.holds() => {
                store.release_if_asked(&mut writer);
                continue;
            }
        };
        if received == 0 {
            break;
        }
        for job in jobs.drain(..) {
            ops.push(job.op);
            replies.push(job.reply);
        }
        let started = std::time::Instant::now();
        let result = commit_with_retries(
            store,
            &mut writer,
            &mut known,
            &ops,
            ids,
            recipients,
            settings.recall_window_ms,
        )
        .await;
        store.release_if_asked(&mut writer);
        batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        telemetry::commit(ops.len(), started.elapsed(), result.is_err());
        tracing::debug!(
            ops = ops.len(),
            micros = started.elapsed().as_micros() as u64,
            "batch committed"
        );
        match result {
            Ok(outcomes) => {
                if let Some(failed) = FAILURES.worked() {
                    tracing::info!(failures = failed, "commits work again");
                }
                let mut pushes = Vec::with_capacity(outcomes.len());
                let mut committed = Vec::new();
                for ((op, reply), outcome) in ops.drain(..).zip(replies.drain(..)).zip(outcomes) {
                    if offline.is_some()
                        && let (
                            Op::Send(m),
                            Outcome::Sent {
                                message,
                                duplicate: false,
                                recipients,
                            },
                        ) = (&op, &outcome)
                        && m.counts_unread
                    {
                        committed.push(Committed {
                            message: message.clone(),
                            members: recipients.clone(),
                        });
                    }
                    if let (
                        Op::Send(m),
                        Outcome::Sent {
                            message,
                            duplicate: false,
                            ..
                        },
                    ) = (&op, &outcome)
                        && let Target::Peer(peer) = &m.target
                    {
                        routes.learn(pair(&m.sender_id, peer), message.conversation_id);
                    }
                    count(&op, &outcome);
                    deliver(reply, outcome, &mut pushes);
                }
                // After every answer of the batch, all its pushes at once; then what may
                // need an offline notice.
                delivery.push_all(pushes);
                if let Some(offline) = offline
                    && !committed.is_empty()
                {
                    offline.committed(committed);
                }
            }
            Err(e) => {
                match FAILURES.failed() {
                    Say::First => tracing::error!(batch = ops.len(), "commit failed: {e}"),
                    Say::Again(n) => tracing::error!(
                        failures = n,
                        "{n} commit batches failed since the last line: {e}"
                    ),
                    Say::Quiet => {}
                }
                let err = Error::unavailable("the database did not accept the write; retry");
                for op in ops.drain(..) {
                    count_refused(&op, &err);
                }
                for reply in replies.drain(..) {
                    reply.error(&err);
                }
            }
        }
    }
}

async fn commit_with_retries(
    store: &Store,
    writer: &mut Writer,
    known: &mut Known,
    ops: &[Op],
    ids: &IdGen,
    recipients: &RecipientCache,
    recall_window_ms: i64,
) -> Result<Vec<Outcome>, BatchError> {
    let (mut conflicts, mut broken) = (0, 0);
    // An id of now: greater than every id this node gave out before (in this process or,
    // with the clock moving forward, an earlier one).
    let last_id = ids.next(now_ms());
    // PostgreSQL: one budget for the batch and its runs again.
    let until = store
        .batch_budget()
        .map(|budget| tokio::time::Instant::now() + budget);
    loop {
        let ctx = BatchContext {
            now: now_ms(),
            until,
            recall_window_ms,
            ids,
            recipients,
            rerun_after: (broken > 0).then_some(last_id),
        };
        match super::batch::commit(store, writer, known, ops, &ctx).await {
            Err(BatchError::Conflict) if conflicts < CONFLICT_RETRIES => {
                conflicts += 1;
                tokio::time::sleep(Duration::from_millis(2 << conflicts)).await;
            }
            // The store now closes the connections opened before the break and pings the
            // others (`store::Health`), so the retry runs on a live one.
            Err(BatchError::Broken(e) | BatchError::BrokenInCommit(e))
                if broken < BROKEN_RETRIES && time_for_another(store, until) =>
            {
                broken += 1;
                tracing::warn!(
                    batch = ops.len(),
                    "a database connection broke ({e}); running the batch again"
                );
            }
            other => return other,
        }
    }
}

/// Whether a batch's run again has time left before `until`: half a deadline at least
/// (after a miss on the committer's kept connection one whole is left; after one on a new
/// connection, none).
fn time_for_another(store: &Store, until: Option<tokio::time::Instant>) -> bool {
    match (until, store.answer_timeout()) {
        (Some(until), Some(answer)) => tokio::time::Instant::now() + answer / 2 < until,
        _ => true,
    }
}

/// Counts a send's answer (reads are not sends).
fn count(op: &Op, outcome: &Outcome) {
    let Op::Send(m) = op else { return };
    let took = m.received.elapsed();
    let answer = match outcome {
        Outcome::Sent {
            duplicate: false, ..
        } => SendOutcome::Ok { live: false, took },
        Outcome::Sent {
            duplicate: true, ..
        } => SendOutcome::Duplicate { took },
        Outcome::Refused(r) => SendOutcome::Refused(r.code().as_str()),
        Outcome::Read { .. } | Outcome::Received { .. } => return,
    };
    telemetry::send(Some(m.content_type), answer);
}

/// Counts a send answered with `e` before (or instead of) its commit.
pub(super) fn count_refused(op: &Op, e: &Error) {
    if let Op::Send(m) = op {
        telemetry::send(Some(m.content_type), SendOutcome::Refused(e.code.as_str()));
    }
}

/// Answers one op and adds what it changed to the batch's pushes.
fn deliver(reply: Reply, outcome: Outcome, pushes: &mut Vec<Push>) {
    let except = reply.session();
    match outcome {
        Outcome::Sent {
            message,
            duplicate,
            recipients,
        } => {
            reply.answer(Answer::Sent(SendAck::of(&message, duplicate)));
            // A resend pushes the original again: devices ignore a seq they have, and one
            // whose first push was lost (a crash between commit and push) gets it now.
            if !recipients.is_empty() {
                pushes.push(Push::stored(recipients, message, except));
            }
        }
        Outcome::Read {
            conversation_id,
            conversation_type,
            user_id,
            read_seq,
            moved,
            unread,
            members,
        } => {
            reply.answer(Answer::Read(ReadAck {
                conversation_id,
                read_seq,
                moved,
                unread,
            }));
            if moved {
                let own = frames::read(conversation_id, &user_id, read_seq, Some(unread));
                pushes.push(Push::persistent(Arc::from([user_id.clone()]), own, except));
                if conversation_type == 1 {
                    let peers: Arc<[String]> =
                        members.iter().filter(|m| **m != user_id).cloned().collect();
                    let receipt = frames::read(conversation_id, &user_id, read_seq, None);
                    pushes.push(Push::persistent(peers, receipt, 0));
                }
            }
        }
        Outcome::Received {
            conversation_id,
            conversation_type,
            user_id,
            position,
            moved,
            members,
            ..
        } => {
            reply.answer(Answer::Received(ReceivedAck {
                conversation_id,
                delivered_seq: position,
                moved,
            }));
            // The delivery notice: in a private conversation, to the other member.
            if moved && conversation_type == 1 {
                let peers: Arc<[String]> =
                    members.iter().filter(|m| **m != user_id).cloned().collect();
                let notice = frames::delivered(conversation_id, &user_id, position);
                pushes.push(Push::persistent(peers, notice, 0));
            }
        }
        Outcome::Refused(r) => reply.error(&r.into()),
    }
}
