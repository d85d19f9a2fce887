//! The server's metrics: every series in one table (`SERIES`, what `/metrics` describes and
//! docs/operations.md lists), recorded through the `metrics` facade into one Prometheus
//! recorder per process. Counters and histograms are recorded where things happen; the
//! gauges of what is there now (connections, outboxes, pools) are set when scraped.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::plugins::meters as plugin;

mod local;
mod repeats;

pub use repeats::{Repeats, Say};

pub const CONNECTIONS: &str = "courier_connections";
pub const USERS_ONLINE: &str = "courier_users_online";
pub const FRAMES_IN: &str = "courier_frames_in_total";
pub const FRAMES_OUT: &str = "courier_frames_out_total";
pub const SENDS: &str = "courier_sends_total";
pub const SEND_ACK_SECONDS: &str = "courier_send_ack_seconds";
pub const COMMIT_BATCH_OPS: &str = "courier_commit_batch_ops";
pub const COMMIT_SECONDS: &str = "courier_commit_seconds";
pub const COMMIT_FAILURES: &str = "courier_commit_failures_total";
pub const COMMIT_PATHS: &str = "courier_commit_paths_total";
pub const PUSH_NOTICES: &str = "courier_push_notices_total";
pub const OUTBOX_FRAMES: &str = "courier_outbox_frames";
pub const OUTBOX_BYTES: &str = "courier_outbox_bytes";
pub const OUTBOX_DROPPED: &str = "courier_outbox_dropped_total";
pub const SLOW_CONSUMERS: &str = "courier_slow_consumer_disconnects_total";
pub const REFUSALS: &str = "courier_refusals_total";
pub const PULL_SECONDS: &str = "courier_pull_seconds";
pub const RECEIPT_PASSES: &str = "courier_receipt_passes_total";
pub const USER_STREAM_EVENTS: &str = "courier_user_stream_events_total";
pub const HTTP_REQUESTS: &str = "courier_http_requests_total";
pub const HTTP_SECONDS: &str = "courier_http_request_seconds";
pub const PLUGIN_ENABLED: &str = "courier_plugin_enabled";
pub const DB_CONNECTIONS: &str = "courier_db_pool_connections";
pub const DB_MAX: &str = "courier_db_pool_max";
pub const BUILD_INFO: &str = "courier_build_info";
pub const CLUSTER_ROUNDS: &str = "courier_cluster_forward_rounds_total";
pub const CLUSTER_PUBLISHES: &str = "courier_cluster_publishes_total";
pub const CLUSTER_LOST: &str = "courier_cluster_lost_total";
pub const CLUSTER_CLOCK_OFFSET: &str = "courier_cluster_clock_offset_seconds";
pub const DEGRADED: &str = "courier_degraded";

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One series: name, kind, its labels, and what it counts.
#[derive(Debug)]
pub struct Series {
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

const fn series(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Series {
    Series {
        name,
        kind,
        labels,
        help,
    }
}

use Kind::{Counter, Gauge, Histogram};

/// Every series `/metrics` exports.
pub const SERIES: &[Series] = &[
    series(
        CONNECTIONS,
        Gauge,
        &[],
        "WebSocket connections open on this node",
    ),
    series(
        USERS_ONLINE,
        Gauge,
        &[],
        "users with at least one connection on this node",
    ),
    series(
        FRAMES_IN,
        Counter,
        &["type"],
        "client frames read, by type (send, read, received, send_to_devices, mailbox_ack, ping; unknown: a type the protocol does not have; invalid: not a frame; binary)",
    ),
    series(
        FRAMES_OUT,
        Counter,
        &["type"],
        "frames written to clients, by type (hello, ack, error, pong, notify, read, delivered, device_message, presence, kicked, …)",
    ),
    series(
        SENDS,
        Counter,
        &["content_type", "outcome"],
        "sends answered (WebSocket and HTTP), by content type (unknown: one no plugin has) and outcome: ok, duplicate (a resend of a stored clientMsgId), or the error code",
    ),
    series(
        SEND_ACK_SECONDS,
        Histogram,
        &["delivery"],
        "from a send's arrival to its answer (stored: after the commit; live: after the push is queued), by stored or live",
    ),
    series(
        COMMIT_BATCH_OPS,
        Histogram,
        &[],
        "sends and reads per commit batch (one transaction)",
    ),
    series(
        COMMIT_SECONDS,
        Histogram,
        &[],
        "time of one commit batch's transaction, retries included",
    ),
    series(
        COMMIT_FAILURES,
        Counter,
        &[],
        "commit batches the database did not accept (every op in them answered store_unavailable)",
    ),
    series(
        COMMIT_PATHS,
        Counter,
        &["path"],
        "commit batches by how they were decided: remembered (from the heads the committer kept, one statement), stale (those heads had moved: run again from the rows), locked (from the rows, read under their locks)",
    ),
    series(
        PUSH_NOTICES,
        Counter,
        &["outcome"],
        "offline notices to the webhook, by outcome: sent (a 2xx answer), retried (an attempt failed, another follows), failed (given up after 4 attempts), dropped (the bridge's queue was full)",
    ),
    series(
        OUTBOX_FRAMES,
        Gauge,
        &[],
        "frames waiting in this node's connection outboxes",
    ),
    series(
        OUTBOX_BYTES,
        Gauge,
        &[],
        "bytes waiting for this node's connections (queued or being written), each frame counted once",
    ),
    series(
        OUTBOX_DROPPED,
        Counter,
        &["class"],
        "frames dropped from outboxes under load, by delivery class (droppable, latest)",
    ),
    series(
        SLOW_CONSUMERS,
        Counter,
        &[],
        "WebSocket connections closed as slow consumers (4008): a persistent or live frame did not fit their outbox",
    ),
    series(
        REFUSALS,
        Counter,
        &["guard"],
        "connections and requests refused or cut off by a limit, by the limit",
    ),
    series(
        PULL_SECONDS,
        Histogram,
        &["what"],
        "pulls over HTTP and their time, by what was pulled (messages, user_stream, overview)",
    ),
    series(
        RECEIPT_PASSES,
        Counter,
        &[],
        "passes over a group's members that group receipts ran (the asks of one group that arrive while a pass runs share the next)",
    ),
    series(
        USER_STREAM_EVENTS,
        Counter,
        &["event"],
        "events appended to users' streams, by event",
    ),
    series(
        HTTP_REQUESTS,
        Counter,
        &["route", "status"],
        "HTTP requests answered, by route (method and path template; unmatched for no route) and status",
    ),
    series(
        HTTP_SECONDS,
        Histogram,
        &["route"],
        "time to answer an HTTP request (to its response head), by route",
    ),
    series(
        plugin::CALLS,
        Counter,
        &["plugin", "outcome"],
        "validate calls of the send path, by plugin and outcome (accepted, rejected, failed, busy)",
    ),
    series(
        plugin::FUEL,
        Counter,
        &["plugin"],
        "fuel used by the send path's validate calls, by plugin",
    ),
    series(
        plugin::CALL_SECONDS,
        Histogram,
        &["plugin"],
        "time of one validate call, by plugin",
    ),
    series(
        plugin::BREAKER_TRIPS,
        Counter,
        &["plugin"],
        "times the circuit breaker switched a plugin off",
    ),
    series(
        PLUGIN_ENABLED,
        Gauge,
        &["plugin"],
        "1 while a plugin is enabled, 0 while it is off (by an operator or its breaker)",
    ),
    series(
        DB_CONNECTIONS,
        Gauge,
        &["pool", "state"],
        "database connections open, by pool (read, write) and state (idle, busy)",
    ),
    series(
        DB_MAX,
        Gauge,
        &["pool"],
        "most connections a database pool opens",
    ),
    series(
        DEGRADED,
        Gauge,
        &[],
        "1 while /healthz says degraded (a cluster node that cannot reach Redis or the bus), else 0",
    ),
    series(
        CLUSTER_ROUNDS,
        Counter,
        &[],
        "cluster mode: rounds of the forwarder that had pushes for other nodes",
    ),
    series(
        CLUSTER_PUBLISHES,
        Counter,
        &[],
        "cluster mode: messages published to the bus",
    ),
    series(
        CLUSTER_LOST,
        Counter,
        &[],
        "cluster mode: pushes and messages for other nodes that could not be sent (devices pull them)",
    ),
    series(
        CLUSTER_CLOCK_OFFSET,
        Gauge,
        &[],
        "cluster mode: how far the time the node keeps (Redis's clock) is ahead of its machine's clock (negative: behind)",
    ),
    series(
        BUILD_INFO,
        Gauge,
        &["version"],
        "always 1; the server's version as a label",
    ),
];

/// Buckets of the histograms in seconds: 0.25 ms to 10 s.
const SECONDS: &[f64] = &[
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Buckets of the commit batch size.
const BATCH: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's recorder, installed on first use (the server calls this at start-up, so
/// what is recorded before the first scrape counts). Another recorder installed first
/// (a test harness's) leaves this one only describing.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(COMMIT_BATCH_OPS.into()), BATCH))
            .expect("bucket lists are not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(local::Local::new(recorder)).is_err() {
            tracing::warn!("another metrics recorder is installed: /metrics stays empty");
        }
        for s in SERIES {
            let help = s.help;
            match s.kind {
                Kind::Counter => metrics::describe_counter!(s.name, help),
                Kind::Gauge => metrics::describe_gauge!(s.name, help),
                Kind::Histogram => metrics::describe_histogram!(s.name, help),
            }
        }
        metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        // The series of fixed labels exist from the start, at 0, so a query of one finds
        // 0 rather than nothing.
        std::sync::LazyLock::force(&HOT);
        handle
    })
}

/// The Prometheus text of everything recorded.
pub fn render() -> String {
    let handle = install();
    local::flush();
    handle.render()
}

/// Folds what the threads hold (`local`) into the recorder, and what histograms recorded
/// into their buckets, now and then, so memory stays bounded however seldom the server is
/// scraped. Runs for the process's life.
pub async fn upkeep() {
    let handle = install();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        local::flush();
        handle.run_upkeep();
    }
}

// What the layers above record, one function per series, so a name and its labels are
// written once. The hot ones (every frame, every send) use handles looked up once: a
// lookup by name and labels costs more than the count itself (host/benches/metrics.rs).

/// The client frame types counted, and the handles of `FRAMES_IN` and `FRAMES_OUT`.
const IN_TYPES: [&str; 9] = [
    "send",
    "read",
    "received",
    "send_to_devices",
    "mailbox_ack",
    "ping",
    "unknown",
    "invalid",
    "binary",
];
/// Where `unknown` is in `IN_TYPES`.
const IN_UNKNOWN: usize = 6;

struct Hot {
    frames_in: [metrics::Counter; IN_TYPES.len()],
    /// By `SERVER_FRAME_TYPES`, then `other`.
    frames_out: Vec<metrics::Counter>,
    ack_stored: metrics::Histogram,
    ack_live: metrics::Histogram,
    batch_ops: metrics::Histogram,
    commit_seconds: metrics::Histogram,
    /// `OUTBOX_DROPPED` of `latest` and of `droppable` frames (counted under the outbox's
    /// lock).
    dropped_latest: metrics::Counter,
    dropped_droppable: metrics::Counter,
    commit_failures: metrics::Counter,
    /// `COMMIT_PATHS` by `CommitPath`.
    commit_paths: [metrics::Counter; 3],
    /// `PUSH_NOTICES` by `PushOutcome`.
    push_notices: [metrics::Counter; 4],
    /// `PULL_SECONDS` by `Pulled`.
    pulls: [metrics::Histogram; 3],
    receipt_passes: metrics::Counter,
}

std::thread_local! {
    /// `SENDS` by content type and outcome, as they come: each thread's own, so a send
    /// takes no lock that another core holds. The keys are the server's own (the content
    /// types of its plugins, its outcomes), so they are hashed with foldhash, not SipHash.
    static SENDS_SEEN: std::cell::RefCell<
        foldhash::HashMap<(Option<u32>, &'static str), metrics::Counter>,
    > = std::cell::RefCell::default();
}

/// Taken by `install` (a use before it, in a process without the server, counts nothing).
static HOT: std::sync::LazyLock<Hot> = std::sync::LazyLock::new(|| {
    use crate::protocol::frames::SERVER_FRAME_TYPES;
    Hot {
        frames_in: IN_TYPES.map(|t| metrics::counter!(FRAMES_IN, "type" => t)),
        frames_out: SERVER_FRAME_TYPES
            .iter()
            .chain(&["other"])
            .map(|t| metrics::counter!(FRAMES_OUT, "type" => *t))
            .collect(),
        ack_stored: metrics::histogram!(SEND_ACK_SECONDS, "delivery" => "stored"),
        ack_live: metrics::histogram!(SEND_ACK_SECONDS, "delivery" => "live"),
        batch_ops: metrics::histogram!(COMMIT_BATCH_OPS),
        commit_seconds: metrics::histogram!(COMMIT_SECONDS),
        dropped_latest: metrics::counter!(OUTBOX_DROPPED, "class" => "latest"),
        dropped_droppable: metrics::counter!(OUTBOX_DROPPED, "class" => "droppable"),
        commit_failures: metrics::counter!(COMMIT_FAILURES),
        commit_paths: ["remembered", "stale", "locked"]
            .map(|path| metrics::counter!(COMMIT_PATHS, "path" => path)),
        push_notices: ["sent", "retried", "failed", "dropped"]
            .map(|outcome| metrics::counter!(PUSH_NOTICES, "outcome" => outcome)),
        pulls: ["messages", "user_stream", "overview"]
            .map(|what| metrics::histogram!(PULL_SECONDS, "what" => what)),
        receipt_passes: metrics::counter!(RECEIPT_PASSES),
    }
});

/// A client frame read, by its type (one of `IN_TYPES`).
pub fn frame_in(kind: &'static str) {
    let i = IN_TYPES
        .iter()
        .position(|t| *t == kind)
        .unwrap_or(IN_UNKNOWN);
    HOT.frames_in[i].increment(1);
}

/// A frame written to a client.
pub fn frame_out(frame: &str) {
    let kind = crate::protocol::frames::type_of(frame);
    let types = &crate::protocol::frames::SERVER_FRAME_TYPES;
    let i = types.iter().position(|t| *t == kind).unwrap_or(types.len());
    HOT.frames_out[i].increment(1);
}

/// How a send was answered.
#[derive(Debug, Clone, Copy)]
pub enum SendOutcome {
    /// Stored (or pushed, for a live kind), after `took` from its arrival.
    Ok { live: bool, took: Duration },
    /// A resend of a stored `clientMsgId`: the original's ack.
    Duplicate { took: Duration },
    /// Refused with this code.
    Refused(&'static str),
}

/// A send answered; `content_type` is `None` for one no plugin has.
pub fn send(content_type: Option<u32>, outcome: SendOutcome) {
    let hot = &*HOT;
    let label = match outcome {
        SendOutcome::Ok { live: true, took } => {
            hot.ack_live.record(took);
            "ok"
        }
        SendOutcome::Ok { live: false, took } => {
            hot.ack_stored.record(took);
            "ok"
        }
        SendOutcome::Duplicate { took } => {
            hot.ack_stored.record(took);
            "duplicate"
        }
        SendOutcome::Refused(code) => code,
    };
    SENDS_SEEN.with_borrow_mut(|seen| {
        seen.entry((content_type, label))
            .or_insert_with(|| {
                let shown = content_type.map_or_else(|| "unknown".to_string(), |ct| ct.to_string());
                metrics::counter!(SENDS, "content_type" => shown, "outcome" => label)
            })
            .increment(1)
    });
}

/// One commit batch of `ops` sends and reads, its transaction `took`; `failed` when the
/// database did not accept it.
pub fn commit(ops: usize, took: Duration, failed: bool) {
    HOT.batch_ops.record(ops as f64);
    HOT.commit_seconds.record(took);
    if failed {
        HOT.commit_failures.increment(1);
    }
}

/// How a commit batch was decided.
#[derive(Debug, Clone, Copy)]
pub enum CommitPath {
    /// From the heads its committer remembered, written by one statement.
    Remembered,
    /// A remembered head had moved: nothing was written, the batch ran again locked.
    Stale,
    /// From the rows, read under their locks.
    Locked,
}

/// A commit batch decided one way (a stale one is counted twice: stale, then locked).
pub fn commit_path(path: CommitPath) {
    HOT.commit_paths[path as usize].increment(1);
}

/// What became of offline notices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    Sent,
    Retried,
    Failed,
    Dropped,
}

/// `n` offline notices had this outcome.
pub fn push(outcome: PushOutcome, n: u64) {
    HOT.push_notices[outcome as usize].increment(n);
}

/// A frame an outbox dropped, by the frame's delivery class.
pub fn outbox_dropped(class: crate::plugins::Delivery) {
    match class {
        crate::plugins::Delivery::Latest => &HOT.dropped_latest,
        _ => &HOT.dropped_droppable,
    }
    .increment(1);
}

/// What a pull read.
#[derive(Debug, Clone, Copy)]
pub enum Pulled {
    Messages,
    UserStream,
    Overview,
}

/// A pull served in `took`.
pub fn pull(what: Pulled, took: Duration) {
    HOT.pulls[what as usize].record(took);
}

/// A pass over a group's members for receipts.
pub fn receipt_pass() {
    HOT.receipt_passes.increment(1);
}

/// An event appended to a user's stream.
pub fn user_stream_event(event: &str) {
    metrics::counter!(USER_STREAM_EVENTS, "event" => event.to_string()).increment(1);
}

/// An HTTP request answered: its route (`GET /v1/…` template, or `unmatched`), status and
/// time to the response head.
pub fn http(route: &str, status: u16, took: Duration) {
    metrics::counter!(HTTP_REQUESTS, "route" => route.to_string(), "status" => status.to_string())
        .increment(1);
    metrics::histogram!(HTTP_SECONDS, "route" => route.to_string()).record(took);
}
