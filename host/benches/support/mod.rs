//! What the benchmarks share: tokens, requests, connections and frames as a client makes
//! them, percentiles, the phase switch, and the group fan-out (members spread over one or
//! more nodes). Included by each bench with `#[path]`, beside the tests' `common`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::common::server::{ADMIN_TOKEN, JWT_SECRET, http_at, request};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Figures of the group fan-out.
pub struct FanOut {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// The first message sent: until its ack, and until every other device had it, ms.
    pub first_ack: f64,
    pub first: f64,
    /// Messages sent, and those every other device got.
    pub messages: usize,
    pub complete: usize,
    /// (device, seq) pairs not received exactly once, plus notifies of seqs never acked.
    pub mismatches: usize,
    /// Member devices per node (the sender's included).
    pub per_node: Vec<usize>,
    /// The metered server's CPU per delivery (per message and device), from just before
    /// the first send until every device had every message: the fan-out's own cost,
    /// without connecting the devices and making the group.
    pub cpu: Option<Cpu>,
}

pub fn token(user: &str) -> String {
    courier::auth::Tokens::new(JWT_SECRET.as_bytes(), 3600)
        .issue(user)
        .0
}

pub async fn http(addr: &str, method: &str, path: &str, user: &str, body: &str) -> (u16, Value) {
    http_at(addr, method, path, Some(&token(user)), body).await
}

/// A request that must answer 200; otherwise the exact request and answer are the report.
pub async fn must(addr: &str, method: &str, path: &str, user: &str, body: &str) -> Value {
    let (st, answer) = http(addr, method, path, user, body).await;
    assert_eq!(
        st, 200,
        "{method} {path} on {addr} as {user} with {body} answered {st}: {answer}"
    );
    answer
}

pub async fn connect(addr: &str, user: &str, device: &str) -> Ws {
    let url = format!("ws://{addr}/v1/ws?deviceId={device}&token={}", token(user));
    let (mut ws, _) = tokio::time::timeout(
        Duration::from_secs(30),
        tokio_tungstenite::connect_async(url),
    )
    .await
    .unwrap_or_else(|_| panic!("connect {user} to {addr}: no answer within 30 s"))
    .unwrap_or_else(|e| panic!("connect {user} to {addr}: {e}"));
    let _hello = tokio::time::timeout(Duration::from_secs(30), ws.next()).await;
    ws
}

pub fn frame(cmid: &str, to: &Value, content_type: u32, payload: Value) -> Message {
    let mut f = json!({"type": "send", "id": cmid, "clientMsgId": cmid, "conversationType": 1,
        "contentType": content_type, "payload": payload});
    f.as_object_mut()
        .unwrap()
        .extend(to.as_object().unwrap().clone());
    Message::Text(f.to_string().into())
}

/// Makes `b` known on `addr` (a user is known once a token of theirs was used), then opens
/// the private conversation of `a` and `b` there; its id.
pub async fn open_known(addr: &str, a: &str, b: &str) -> i64 {
    http(addr, "GET", "/v1/conversations", b, "").await;
    open(addr, a, b).await
}

/// Opens the private conversation of `a` and `b` (one message, sent on `addr`) and returns
/// its id.
pub async fn open(addr: &str, a: &str, b: &str) -> i64 {
    let ack = must(
        addr,
        "POST",
        "/v1/messages",
        a,
        &json!({"clientMsgId": format!("open-{a}-{b}"), "conversationType": 1, "peerId": b,
            "contentType": 1, "payload": {"text": "open"}})
        .to_string(),
    )
    .await;
    ack["conversationId"].as_i64().unwrap()
}

/// The CPU time a process used so far, user and system, all its threads (those that
/// ended included), in µs: `/proc/PID/stat`'s `utime` and `stime`, in 10 ms ticks.
pub fn cpu_micros(pid: u32) -> u64 {
    let [user, system] = cpu_split(pid);
    user + system
}

/// `cpu_micros` in its two parts: [user, system]. The system part is the kernel's work
/// for the process: its system calls, and on loopback TCP also the receiving side's
/// processing of what it sends, which runs inside the sender's call (on a kernel without
/// `CONFIG_IRQ_TIME_ACCOUNTING`, which charges that to the process it interrupted).
pub fn cpu_split(pid: u32) -> [u64; 2] {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis start at the state (field 3).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime is field 14, stime 15; USER_HZ is 100 on Linux.
    [tick(11) * 10_000, tick(12) * 10_000]
}

/// A process's resident memory now, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The server's CPU over one phase: started before it, read after with the messages the
/// phase delivered; and the whole machine's over the same span (`machine`).
pub struct CpuMeter {
    pid: u32,
    /// The server's [user, system] CPU, µs.
    start: [u64; 2],
    db_start: u64,
    /// This load generator's CPU, µs.
    own_start: u64,
    /// `machine_ticks()`.
    ticks_start: [u64; 3],
    /// `run_waits(pid)`.
    waits_start: HashMap<u32, (usize, u64)>,
    /// Under callgrind (`BENCH_CALLGRIND`): where it writes its counts.
    callgrind: Option<std::path::PathBuf>,
}

/// CPU per delivered message, µs: the server's, and PostgreSQL's processes' on the same
/// machine (0 on SQLite, which runs inside the server).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    pub server: f64,
    /// Of `server`, the kernel's (`cpu_split`'s system part).
    pub kernel: f64,
    pub db: f64,
    /// Under callgrind: the server's instructions per message (user space only: the
    /// kernel's work for its system calls is not counted).
    pub instructions: Option<f64>,
}

impl Cpu {
    pub fn mean(all: &[Cpu]) -> Cpu {
        let n = all.len().max(1) as f64;
        let counted: Vec<f64> = all.iter().filter_map(|c| c.instructions).collect();
        Cpu {
            server: all.iter().map(|c| c.server).sum::<f64>() / n,
            kernel: all.iter().map(|c| c.kernel).sum::<f64>() / n,
            db: all.iter().map(|c| c.db).sum::<f64>() / n,
            instructions: (!counted.is_empty())
                .then(|| counted.iter().sum::<f64>() / counted.len() as f64),
        }
    }

    /// `12.3 (kernel 8.1)`, or `12.3 (kernel 8.1) + 4.5 PostgreSQL` when the database's
    /// own CPU is counted; under callgrind followed by the instructions,
    /// `12.3 (kernel 8.1) (45.6k instructions)`.
    pub fn shown(&self, postgres: bool) -> String {
        let server = format!("{:.1} (kernel {:.1})", self.server, self.kernel);
        let cpu = match postgres {
            true => format!("{server} + {:.1} PostgreSQL", self.db),
            false => server,
        };
        match self.instructions {
            Some(i) => format!("{cpu} ({:.1}k instructions)", i / 1000.0),
            None => cpu,
        }
    }
}

impl CpuMeter {
    pub fn start(pid: u32) -> CpuMeter {
        let callgrind = crate::common::callgrind_dir();
        if callgrind.is_some() {
            callgrind_control(pid, "--instr=on");
            callgrind_control(pid, "--zero");
        }
        CpuMeter {
            pid,
            start: cpu_split(pid),
            db_start: postgres_cpu_micros(),
            own_start: cpu_micros(std::process::id()),
            ticks_start: machine_ticks(),
            waits_start: run_waits(pid),
            callgrind,
        }
    }

    /// µs of CPU per delivered message since `start` (under callgrind, and the
    /// instructions; counting stops here).
    pub fn per(&self, delivered: u64) -> Cpu {
        let n = delivered.max(1) as f64;
        let instructions = self.callgrind.as_deref().map(|dir| {
            callgrind_control(self.pid, "--dump");
            callgrind_control(self.pid, "--instr=off");
            last_dump_total(dir, self.pid) as f64 / n
        });
        let [user, system] = cpu_split(self.pid);
        let system = system.saturating_sub(self.start[1]);
        Cpu {
            server: (user.saturating_sub(self.start[0]) + system) as f64 / n,
            kernel: system as f64 / n,
            db: postgres_cpu_micros().saturating_sub(self.db_start) as f64 / n,
            instructions,
        }
    }

    /// What the machine did since `start` besides the server, PostgreSQL and this load
    /// generator (`/proc/stat`: ticks of 10 ms, summed over the CPUs).
    pub fn machine(&self) -> Machine {
        let [busy, iowait, steal] = machine_ticks();
        let [busy0, iowait0, steal0] = self.ticks_start;
        let ours = cpu_micros(self.pid).saturating_sub(self.start[0] + self.start[1])
            + postgres_cpu_micros().saturating_sub(self.db_start)
            + cpu_micros(std::process::id()).saturating_sub(self.own_start);
        Machine {
            waited_ms: waited_ms(&self.waits_start, &run_waits(self.pid)),
            others_ms: (busy.saturating_sub(busy0) * 10_000).saturating_sub(ours) / 1000,
            iowait_ms: iowait.saturating_sub(iowait0) * 10,
            steal_ms: steal.saturating_sub(steal0) * 10,
        }
    }
}

/// Runs `callgrind_control OPTION PID`, which returns once the server has done it.
fn callgrind_control(pid: u32, option: &str) {
    let status = std::process::Command::new("callgrind_control")
        .arg(option)
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "callgrind_control {option} {pid} failed"
    );
}

/// The instructions counted in the newest of the server's callgrind dumps (`totals:`).
fn last_dump_total(dir: &std::path::Path, pid: u32) -> u64 {
    let prefix = format!("callgrind.{pid}.");
    let newest = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u64 = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n);
    let Some((_, path)) = newest else {
        panic!("no callgrind dump of {pid} in {}", dir.display())
    };
    std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no totals in {}", path.display()))
}

/// A run's machine, ms summed over the CPUs: the CPU none of ours used (what the machine
/// was busy with minus the server's, PostgreSQL's and the load generator's: other
/// processes, the kernel's own threads and interrupts, the disk's among them), time the
/// CPUs were idle waiting for the disk, and time the hypervisor gave them to another
/// machine, which both the server and the load generator lost.
pub struct Machine {
    /// Time runnable but waiting for a CPU, summed over the threads alive at the end: the
    /// server's, PostgreSQL's processes' and this load generator's (`waited_ms`).
    pub waited_ms: [u64; 3],
    pub others_ms: u64,
    pub iowait_ms: u64,
    pub steal_ms: u64,
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "others {} ms CPU, iowait {} ms, steal {} ms; waited for a CPU: server {} ms, \
             PostgreSQL {} ms, load generator {} ms",
            self.others_ms,
            self.iowait_ms,
            self.steal_ms,
            self.waited_ms[0],
            self.waited_ms[1],
            self.waited_ms[2]
        )
    }
}

/// Each thread's time runnable but not running so far, ns (the second field of
/// `/proc/…/schedstat`), by thread id, with whose it is: 0 the server's (`pid`), 1 a
/// `postgres` process's, 2 this load generator's.
fn run_waits(pid: u32) -> HashMap<u32, (usize, u64)> {
    let mut waits = HashMap::new();
    let mut threads = |pid: u32, whose: usize| {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) {
                waits.insert(tid, (whose, schedstat_wait(&t.path())));
            }
        }
    };
    threads(pid, 0);
    for p in postgres_pids() {
        threads(p, 1);
    }
    threads(std::process::id(), 2);
    waits
}

/// What the threads alive at the end of a span waited for a CPU within it, ms, summed by
/// whose they are (`run_waits`): a thread that ended meanwhile is not counted, one that
/// began is counted whole.
fn waited_ms(start: &HashMap<u32, (usize, u64)>, end: &HashMap<u32, (usize, u64)>) -> [u64; 3] {
    let mut sums = [0u64; 3];
    for (tid, (whose, ns)) in end {
        let before = start.get(tid).map_or(0, |(_, ns)| *ns);
        sums[*whose] += ns.saturating_sub(before);
    }
    sums.map(|ns| ns / 1_000_000)
}

fn schedstat_wait(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The machine's CPU ticks since boot: [busy (user, nice, system, irq, softirq), iowait,
/// steal].
fn machine_ticks() -> [u64; 3] {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return [0; 3];
    };
    let t: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| t.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    [at(0) + at(1) + at(2) + at(5) + at(6), at(4), at(7)]
}

/// What autovacuum would do soon after a phase's setup, on a PostgreSQL where it is off:
/// the database's statistics brought up to date (`ANALYZE`), so the planner plans as on a
/// server that keeps them (PostgreSQL's default). Nothing where autovacuum is on, or on
/// SQLite.
pub async fn analyze_without_autovacuum(url: &str, name: &str) {
    use sqlx::Row as _;
    let Some(mut conn) = postgres(url).await else {
        return;
    };
    let on = sqlx::query("SHOW autovacuum")
        .fetch_one(&mut conn)
        .await
        .ok()
        .and_then(|r| r.try_get::<String, _>(0).ok());
    if on.as_deref() != Some("off") {
        return;
    }
    let t = std::time::Instant::now();
    sqlx::raw_sql("ANALYZE")
        .execute(&mut conn)
        .await
        .expect("ANALYZE the bench's database");
    eprintln!(
        "[{name}] autovacuum is off on this PostgreSQL: the tables analyzed ({:.0} ms), as it would soon",
        t.elapsed().as_secs_f64() * 1000.0
    );
}

/// PostgreSQL's write-ahead log over a run, from the bench's own connection: the bytes
/// written (the distance the log's insert position moved), the syncs (`pg_stat_wal`,
/// which backends report up to a second late, so a run's last syncs may count in the
/// next; their time only where `track_wal_io_timing` is on), the segment files in
/// `pg_wal` before and after, and the checkpoints between. With no checkpoint between, a
/// file more is a segment PostgreSQL created rather than recycled: it writes the
/// segment's zeros and syncs them while holding the log's write lock, so every commit
/// waits for it (ARCHITECTURE.md, Decisions); a checkpoint removes and recycles files.
/// The statement reads PostgreSQL 14–16's statistics views, and the folder needs a
/// superuser or `pg_monitor`: elsewhere, and on SQLite, there is no figure.
pub struct WalMeter {
    url: String,
    start: Option<WalState>,
}

impl WalMeter {
    pub async fn start(url: &str) -> WalMeter {
        WalMeter {
            url: url.to_string(),
            start: wal_state(url).await,
        }
    }

    /// What the log did since `start`, or `None` without the figures.
    pub async fn since(&self) -> Option<Wal> {
        let start = self.start?;
        let now = wal_state(&self.url).await?;
        Some(Wal {
            bytes: now.bytes - start.bytes,
            syncs: now.syncs - start.syncs,
            sync_ms: now.sync_ms - start.sync_ms,
            files: (start.files, now.files),
            checkpoints: now.checkpoints - start.checkpoints,
        })
    }
}

/// What PostgreSQL's write-ahead log did over a run (`WalMeter`).
pub struct Wal {
    pub bytes: i64,
    pub syncs: i64,
    /// The syncs' time, 0 where `track_wal_io_timing` is off.
    pub sync_ms: f64,
    /// Segment files in `pg_wal` before and after.
    pub files: (i64, i64),
    pub checkpoints: i64,
}

impl std::fmt::Display for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WAL {:.1} MB, {} syncs",
            self.bytes as f64 / 1e6,
            self.syncs
        )?;
        if self.sync_ms > 0.0 {
            write!(
                f,
                " ({:.0} ms, {:.2} ms each)",
                self.sync_ms,
                self.sync_ms / self.syncs.max(1) as f64
            )?;
        }
        write!(f, ", {}", self.segments())
    }
}

impl Wal {
    /// `segment files 5 → 6, 0 checkpoints`.
    pub fn segments(&self) -> String {
        format!(
            "segment files {} → {}, {} checkpoints",
            self.files.0, self.files.1, self.checkpoints
        )
    }
}

#[derive(Clone, Copy)]
struct WalState {
    bytes: i64,
    syncs: i64,
    sync_ms: f64,
    files: i64,
    checkpoints: i64,
}

/// A connection of the bench's own to the database at `url`, if it is a PostgreSQL one
/// that answers.
async fn postgres(url: &str) -> Option<sqlx::PgConnection> {
    use sqlx::Connection as _;
    if !url.starts_with("postgres") {
        return None;
    }
    sqlx::PgConnection::connect(url).await.ok()
}

async fn wal_state(url: &str) -> Option<WalState> {
    use sqlx::Row as _;
    let mut conn = postgres(url).await?;
    let row = sqlx::query(
        "SELECT CAST(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0') AS BIGINT), \
         wal_sync, wal_sync_time, \
         (SELECT count(*) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'), \
         (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter) FROM pg_stat_wal",
    )
    .fetch_one(&mut conn)
    .await
    .ok()?;
    Some(WalState {
        bytes: row.try_get(0).ok()?,
        syncs: row.try_get(1).ok()?,
        sync_ms: row.try_get(2).ok()?,
        files: row.try_get(3).ok()?,
        checkpoints: row.try_get(4).ok()?,
    })
}

/// CPU used by every `postgres` process on this machine, with the children they reaped
/// (connections that ended), µs.
pub fn postgres_cpu_micros() -> u64 {
    let mut total = 0;
    for pid in postgres_pids() {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime, stime, cutime, cstime: fields 14–17, in ticks of 10 ms.
        total += (11..15)
            .filter_map(|i| fields.get(i)?.parse::<u64>().ok())
            .sum::<u64>()
            * 10_000;
    }
    total
}

/// Every `postgres` process on this machine.
fn postgres_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (comm, _) = stat.rsplit_once(')')?;
            comm.ends_with("(postgres").then_some(pid)
        })
        .collect()
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Whether a phase is selected by `BENCH_PHASES` (comma-separated: lat, batch, tp, group,
/// mega; all when unset).
pub fn phase(name: &str) -> bool {
    std::env::var("BENCH_PHASES").map_or(true, |p| p.split(',').any(|x| x.trim() == name))
}

/// A text `send` into a group.
pub fn group_frame(cmid: &str, cid: i64, text: &str) -> Message {
    let to = json!({"conversationId": cid, "conversationType": 2});
    frame(cmid, &to, 1, json!({ "text": text }))
}

/// The seq of a text `notify` of the conversation (`"conversationId":N,` as `conversation`).
pub fn notify_seq(frame: &str, conversation: &str) -> Option<i64> {
    if !frame.starts_with(r#"{"type":"notify""#)
        || !frame.contains(conversation)
        || !frame.contains(r#""contentType":1,"#)
    {
        return None;
    }
    let rest = &frame[frame.find(r#""seq":"#)? + 6..];
    let end = rest.find(|c: char| !c.is_ascii_digit())?;
    rest[..end].parse().ok()
}

/// A group of `members` (the owner included), member `k` online with one device on node
/// `k % nodes` (the owner, `k = 0`, on node 1); the owner sends texts at `rate` msgs/s for
/// `secs` (at least `min_messages`). Per message, the time from just before its send until every other
/// device has its `notify`, in ms; with `meter`, that server's CPU per delivery.
pub async fn group_fanout(
    addrs: &[String],
    tag: &str,
    members: usize,
    rate: f64,
    secs: f64,
    min_messages: usize,
    meter: Option<u32>,
) -> FanOut {
    let home = |k: usize| &addrs[k % addrs.len()];
    let owner = format!("{tag}o");
    let others: Vec<String> = (1..members).map(|k| format!("{tag}m{k}")).collect();
    // Users are known once a token of theirs was used, each on its own node.
    must(home(0), "GET", "/v1/friends", &owner, "").await;
    for (j, u) in others.iter().enumerate() {
        must(home(j + 1), "GET", "/v1/friends", u, "").await;
    }
    let group = must(
        home(0),
        "POST",
        "/v1/groups",
        &owner,
        &json!({"name": "bench", "members": others}).to_string(),
    )
    .await;
    let cid = group["conversationId"].as_i64().unwrap();
    assert_eq!(group["memberCount"], members as i64, "{group}");
    let mut per_node = vec![0; addrs.len()];
    for k in 0..members {
        per_node[k % addrs.len()] += 1;
    }

    let n = ((rate * secs).round() as usize).max(min_messages);
    // Readers wait on their socket and on this, not on timers: a thousand idle tasks
    // polling a timeout would load the servers' cores.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let conversation = format!("\"conversationId\":{cid},");
    let complete = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::with_capacity(others.len());
    let connect_until = Instant::now() + Duration::from_secs(300);
    for (j, u) in others.iter().enumerate() {
        assert!(
            Instant::now() < connect_until,
            "connecting {members} devices took over 300 s"
        );
        let ws = connect(home(j + 1), u, "d").await;
        let (stopped, complete) = (stopped.clone(), complete.clone());
        let conversation = conversation.clone();
        readers.push(read_group(ws, n, conversation, complete, stopped));
    }
    let ws = connect(home(0), &owner, "d").await;
    // Routes and presence of a thousand new devices settle first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut sink, stream) = ws.split();
    // The owner's connection gets only the acks.
    let acks = acks_of(stream, n, rate);
    let meter = meter.map(CpuMeter::start);
    let sent_at = send_paced(&mut sink, cid, "g", n, rate).await;
    let seqs = acks.await.unwrap();
    wait_complete(&complete, readers.len()).await;
    let cpu = meter.map(|m| m.per((sent_at.len() * readers.len()) as u64));
    let mut f = fanout_of(stop, readers, &sent_at, &seqs, per_node).await;
    f.cpu = cpu;
    drop(sink);
    f
}

/// After the sends of a fan-out: a second more for duplicates, then the readers stop and
/// what they got is tallied against what was sent and acked.
pub async fn fanout_of(
    stop: tokio::sync::watch::Sender<bool>,
    readers: Vec<tokio::task::JoinHandle<Vec<(i64, Instant)>>>,
    sent_at: &[(String, Instant)],
    seqs: &HashMap<String, Acked>,
    per_node: Vec<usize>,
) -> FanOut {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = stop.send(true);
    let mut per_device = Vec::with_capacity(readers.len());
    for r in readers {
        per_device.push(r.await.unwrap());
    }
    let (lat, first, mismatches) = tally(sent_at, seqs, &per_device);
    let first_ack = sent_at
        .first()
        .and_then(|(cmid, t)| Some(seqs.get(cmid)?.1.duration_since(*t).as_secs_f64() * 1000.0))
        .unwrap_or(f64::NAN);
    FanOut {
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        max: lat.last().copied().unwrap_or(f64::NAN),
        first_ack,
        first,
        messages: sent_at.len(),
        complete: lat.len(),
        mismatches,
        per_node,
        cpu: None,
    }
}

/// A fan-out's sends (clientMsgId, when sent), their acked seqs and what each device got
/// (seq, when): per message every device got, the time until the last device had it, ms,
/// sorted, and that time for the first message sent (NaN if not every device got it); and
/// the (device, seq) pairs not received exactly once plus the sends never acked and the
/// notifies of seqs never acked.
pub fn tally(
    sent_at: &[(String, Instant)],
    seqs: &HashMap<String, Acked>,
    per_device: &[Vec<(i64, Instant)>],
) -> (Vec<f64>, f64, usize) {
    let seq_of = |cmid: &String| seqs.get(cmid).and_then(|a| a.0);
    let sent: HashMap<i64, Instant> = sent_at
        .iter()
        .filter_map(|(cmid, t)| Some((seq_of(cmid)?, *t)))
        .collect();
    let first_seq = sent_at.first().and_then(|(cmid, _)| seq_of(cmid));
    let mut first = f64::NAN;
    let mut mismatches = sent_at.len() - sent.len();
    // Per seq: the latest first arrival over the devices, and on how many it arrived.
    let mut last: HashMap<i64, (Instant, usize)> = HashMap::new();
    for got in per_device {
        let mut count: HashMap<i64, (usize, Instant)> = HashMap::new();
        for &(seq, at) in got {
            count.entry(seq).or_insert((0, at)).0 += 1;
        }
        for (seq, (c, at)) in count {
            if !sent.contains_key(&seq) || c != 1 {
                mismatches += 1;
            }
            let e = last.entry(seq).or_insert((at, 0));
            e.0 = e.0.max(at);
            e.1 += 1;
        }
    }
    let mut lat = Vec::with_capacity(sent.len());
    for (seq, t) in &sent {
        match last.get(seq) {
            Some(&(at, c)) if c == per_device.len() => {
                let ms = at.duration_since(*t).as_secs_f64() * 1000.0;
                if Some(*seq) == first_seq {
                    first = ms;
                }
                lat.push(ms)
            }
            Some(&(_, c)) => mismatches += per_device.len() - c,
            None => mismatches += per_device.len(),
        }
    }
    lat.sort_by(f64::total_cmp);
    (lat, first, mismatches)
}

/// The server's `/metrics` now: every sample by its line's name and labels
/// (`courier_commit_seconds_bucket{le="0.005"}`).
pub async fn scrape(addr: &str) -> HashMap<String, f64> {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let answer = request(addr, "GET", "/metrics", &[("authorization", &auth)], "").await;
    answer
        .body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// What the committer did between two scrapes: batches, ops per batch, and how many
/// commits took longer than 5 and 10 ms; and how many stored sends the server acked more
/// than 2.5, 5 and 10 ms after reading their frame (a slow commit holds back every send
/// that arrives while it runs).
pub fn commits_between(before: &HashMap<String, f64>, after: &HashMap<String, f64>) -> String {
    let moved =
        |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let batches = moved("courier_commit_seconds_count");
    let ops = moved("courier_commit_batch_ops_sum");
    let within = |le: &str| moved(&format!("courier_commit_seconds_bucket{{le=\"{le}\"}}"));
    let path = |p: &str| moved(&format!("courier_commit_paths_total{{path=\"{p}\"}}"));
    let acks = moved("courier_send_ack_seconds_count{delivery=\"stored\"}");
    let acked_within = |le: &str| {
        moved(&format!(
            "courier_send_ack_seconds_bucket{{delivery=\"stored\",le=\"{le}\"}}"
        ))
    };
    format!(
        "{batches:.0} commits of {:.1} ops on average ({:.0} from remembered heads, {:.0} \
         locked, {:.0} stale); {:.0} over 5 ms, {:.0} over 10 ms; mean commit {:.2} ms; \
         acks of {acks:.0} stored sends after their frame was read: {:.0} over 2.5 ms, \
         {:.0} over 5 ms, {:.0} over 10 ms",
        ops / batches.max(1.0),
        path("remembered"),
        path("locked"),
        path("stale"),
        batches - within("0.005"),
        batches - within("0.01"),
        moved("courier_commit_seconds_sum") * 1000.0 / batches.max(1.0),
        acks - acked_within("0.0025"),
        acks - acked_within("0.005"),
        acks - acked_within("0.01"),
    )
}

/// An ack: the seq it gave (none for a live kind) and when it came.
pub type Acked = (Option<i64>, Instant);

/// Reads a group sender's connection, which gets only the acks, until `n` came (or time is
/// up): by clientMsgId.
pub fn acks_of(
    mut stream: futures_util::stream::SplitStream<Ws>,
    n: usize,
    rate: f64,
) -> tokio::task::JoinHandle<HashMap<String, Acked>> {
    tokio::spawn(async move {
        let mut seqs = HashMap::new();
        let until = Instant::now() + Duration::from_secs_f64(n as f64 / rate + 60.0);
        while seqs.len() < n && Instant::now() < until {
            match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    match v["type"].as_str() {
                        Some("ack") => {
                            let id = v["id"].as_str().unwrap().to_string();
                            seqs.insert(id, (v["seq"].as_i64(), Instant::now()));
                        }
                        Some("error") => panic!("group send: {v}"),
                        _ => {}
                    }
                }
                Ok(Some(Ok(_))) => {}
                _ => break,
            }
        }
        seqs
    })
}

/// Sends `n` texts into group `cid` at `rate` a second (bounded in time), the `i`th with
/// clientMsgId `{prefix}{i}`: when each left.
pub async fn send_paced(
    sink: &mut futures_util::stream::SplitSink<Ws, Message>,
    cid: i64,
    prefix: &str,
    n: usize,
    rate: f64,
) -> Vec<(String, Instant)> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let until = Instant::now() + Duration::from_secs_f64(n as f64 / rate + 30.0);
    let mut sent_at = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        if Instant::now() > until {
            break;
        }
        let cmid = format!("{prefix}{i}");
        let text = format!("fan-out message {i} of a benchmark, about fifty bytes");
        let t = Instant::now();
        sink.send(group_frame(&cmid, cid, &text)).await.unwrap();
        sent_at.push((cmid, t));
    }
    sent_at
}

/// Waits until `complete` devices have every message, or 30 s.
pub async fn wait_complete(complete: &AtomicUsize, of: usize) {
    let until = Instant::now() + Duration::from_secs(30);
    while complete.load(Ordering::Relaxed) < of && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A group member's device: collects `(seq, when)` of the group's `notify` frames
/// (`conversation` is `"conversationId":N,`) until `stopped`, counting itself in
/// `complete` once it has `n`. Pings every 30 s, so it outlives the server's heartbeat
/// however long the phase is; waits on its socket, the stop and that one timer.
pub fn read_group(
    mut ws: Ws,
    n: usize,
    conversation: String,
    complete: Arc<AtomicUsize>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<(i64, Instant)>> {
    tokio::spawn(async move {
        let mut got: Vec<(i64, Instant)> = Vec::with_capacity(n);
        let mut beat = tokio::time::interval(Duration::from_secs(30));
        beat.tick().await;
        loop {
            let msg = tokio::select! {
                m = ws.next() => m,
                _ = beat.tick() => {
                    let _ = ws.send(Message::Text(r#"{"type":"ping"}"#.into())).await;
                    continue;
                }
                _ = stopped.changed() => break,
            };
            match msg {
                Some(Ok(Message::Text(t))) => {
                    let at = Instant::now();
                    // A scan, not a JSON parse: the client shares the server's cores, and a
                    // thousand parses per message would be counted as fan-out.
                    if let Some(seq) = notify_seq(t.as_str(), &conversation) {
                        got.push((seq, at));
                        if got.len() == n {
                            complete.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Some(Ok(_)) => {}
                _ => break,
            }
        }
        got
    })
}
