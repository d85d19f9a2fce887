//! Cluster benchmark: three `courier` nodes in cluster mode (routes in Redis, pushes over
//! NATS) on one PostgreSQL database, each a separate process on loopback, this program as
//! the load generator, all on the same machine. Prints:
//!
//! - `lat`: send→push latency p50/p99 at a fixed offered rate of 1,000 and 5,000 msgs/s
//!   over 16 private conversations, same-node (sender and receiver on node 1) and
//!   cross-node (sender on node 1, receiver on node 2), with how many were measured and
//!   whether any were missing;
//! - `batch`: bus publishes per commit batch and per message on node 1 during the
//!   cross-node 5,000 msgs/s phase (from `GET /admin/node` before and after);
//! - `tp`: persistent 1:1 throughput (acked msgs/s), 48 senders with 16 in flight each,
//!   spread over the three nodes with each receiver on another node than its sender,
//!   against one node alone (cluster mode, no peers, a fresh database, the three nodes
//!   stopped);
//! - `group`: a 1,000-member group whose devices are spread over the three nodes; per
//!   message, the time until every other member's device has its push.
//!
//! Run: `PG_TEST_URL=postgres://postgres@127.0.0.1:5432/test REDIS_TEST_URL=redis://127.0.0.1:6379
//! NATS_TEST_URL=nats://127.0.0.1:4222 cargo bench -p courier --bench cluster`. Without the
//! three URLs it says why it skipped and exits 0. `BENCH_SECS` (default 5) sets the length
//! of each timed phase, `BENCH_PHASES=lat,batch,tp,group` picks the figures (all when
//! unset). The nodes and their database are the tests' (`tests/common/cluster.rs`); their
//! logs are `node1.log`… in the database's folder under the target's tmp dir (printed at
//! start). Every loop is bounded by a count and by time.

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use support::*;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{Services, Wiring, node, nodes, services};
use common::server::{ADMIN_TOKEN, Db, Server, http_at};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// Private conversations of the latency phases.
const LAT_PAIRS: usize = 16;
/// Senders of the throughput phases, and what each keeps in flight.
const TP_SENDERS: usize = 48;
const TP_WINDOW: usize = 16;
/// The group phase: members (the sender included) and its offered rate.
const GROUP_MEMBERS: usize = 1000;
const GROUP_RATE: f64 = 5.0;

/// `GET /admin/node` of the node at `addr`.
async fn admin_node(addr: &str) -> Value {
    let (st, v) = http_at(addr, "GET", "/admin/node", Some(ADMIN_TOKEN), "").await;
    assert_eq!(st, 200, "GET /admin/node on {addr}: {st} {v}");
    v
}

/// Waits (at most 60 s) until every node says `status: ok`.
async fn healthy(addrs: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for addr in addrs {
        loop {
            let v = admin_node(addr).await;
            if v["status"] == "ok" {
                break;
            }
            assert!(Instant::now() < deadline, "node {addr} never healthy: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Counters of `/admin/node` that phases compare before and after.
#[derive(Debug, Clone, Copy, Default)]
struct NodeStats {
    commit_batches: u64,
    rounds: u64,
    publishes: u64,
    lost: u64,
}

async fn node_stats(addr: &str) -> NodeStats {
    let v = admin_node(addr).await;
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    NodeStats {
        commit_batches: n(&v["commitBatches"]),
        rounds: n(&v["cluster"]["rounds"]),
        publishes: n(&v["cluster"]["publishes"]),
        lost: n(&v["cluster"]["lost"]),
    }
}

/// Figures of one latency run.
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
    /// Samples after the second of warm-up.
    measured: usize,
    /// Messages sent (warm-up included) and the distinct ones that arrived.
    sent: u64,
    arrived: u64,
    duplicates: u64,
    acked: u64,
    errors: u64,
    first_error: Option<String>,
    /// `/admin/node` of the stats node, after setup and after the last push arrived.
    stats: Option<(NodeStats, NodeStats)>,
}

/// `rate` msgs/s spread over `LAT_PAIRS` senders (connected to `send_addr`) for `secs`,
/// after a second of warm-up that is not counted; each receiver online on `recv_addr`.
/// Latency from the send frame leaving to the receiver's notify, in ms. With `stats`, the
/// counters of that node before the first send and after the last push.
async fn latency(
    send_addr: &str,
    recv_addr: &str,
    tag: &str,
    rate: u64,
    secs: f64,
    stats: Option<&str>,
) -> Latency {
    let epoch = Instant::now();
    let mut convs = Vec::new();
    for i in 0..LAT_PAIRS {
        let a = format!("{tag}s{i}");
        let b = format!("{tag}r{i}");
        // Users are known once a token of theirs was used.
        must(recv_addr, "GET", "/v1/conversations", &b, "").await;
        let cid = open(send_addr, &a, &b).await;
        convs.push((a, b, cid));
    }
    let per_sender = rate as f64 / LAT_PAIRS as f64;
    let total_each = (per_sender * (secs + 1.0)).round() as u64;
    let period = Duration::from_secs_f64(1.0 / per_sender);
    let mut rxs = Vec::new();
    let mut txs = Vec::new();
    for (a, b, cid) in &convs {
        rxs.push(connect(recv_addr, b, "r").await);
        txs.push((connect(send_addr, a, "s").await, *cid));
    }
    // Connections settled (their presence and route traffic done) before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = match stats {
        Some(addr) => Some(node_stats(addr).await),
        None => None,
    };
    let start = Instant::now() + Duration::from_millis(100);
    let start_ms = start.duration_since(epoch).as_secs_f64() * 1000.0;
    let hard_stop = start + Duration::from_secs_f64(secs + 1.0 + 40.0);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let complete = Arc::new(AtomicUsize::new(0));
    let mut receivers = Vec::new();
    for mut rx in rxs {
        let mut stopped = stopped.clone();
        let complete = complete.clone();
        receivers.push(tokio::spawn(async move {
            // (message number, sent at, latency), ms; and duplicates.
            let mut lat = Vec::with_capacity(total_each as usize);
            let mut seen = HashSet::with_capacity(total_each as usize);
            let mut duplicates = 0u64;
            let mut pinged = Instant::now();
            while Instant::now() < hard_stop {
                let msg = tokio::select! {
                    m = tokio::time::timeout_at(hard_stop.into(), rx.next()) => m,
                    _ = stopped.changed() => break,
                };
                match msg {
                    Ok(Some(Ok(Message::Text(t)))) => {
                        let now = epoch.elapsed().as_secs_f64() * 1000.0;
                        let v: Value = serde_json::from_str(t.as_str()).unwrap();
                        if v["type"] == "notify"
                            && let Some((n, sent)) = v["payload"]["text"]
                                .as_str()
                                .and_then(|s| s.split_once('@'))
                            && let (Ok(n), Ok(sent)) = (n.parse::<u64>(), sent.parse::<f64>())
                        {
                            if seen.insert(n) {
                                lat.push((n, sent, now - sent));
                                if seen.len() as u64 == total_each {
                                    complete.fetch_add(1, Ordering::Relaxed);
                                }
                            } else {
                                duplicates += 1;
                            }
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
                if pinged.elapsed() > Duration::from_secs(30) {
                    let _ = rx.send(Message::Text(r#"{"type":"ping"}"#.into())).await;
                    pinged = Instant::now();
                }
            }
            (lat, duplicates)
        }));
    }
    let acked = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for (i, (ws, cid)) in txs.into_iter().enumerate() {
        let (acked, errors) = (acked.clone(), errors.clone());
        senders.push(tokio::spawn(async move {
            let (mut sink, mut stream) = ws.split();
            // Acks are counted; the first error is kept.
            let reader = tokio::spawn(async move {
                let mut answered = 0u64;
                let mut first_error = None;
                while answered < total_each && Instant::now() < hard_stop {
                    match tokio::time::timeout_at(hard_stop.into(), stream.next()).await {
                        Ok(Some(Ok(Message::Text(t)))) => {
                            if t.as_str().starts_with(r#"{"type":"ack""#) {
                                answered += 1;
                                acked.fetch_add(1, Ordering::Relaxed);
                            } else if t.as_str().starts_with(r#"{"type":"error""#) {
                                answered += 1;
                                errors.fetch_add(1, Ordering::Relaxed);
                                first_error.get_or_insert_with(|| t.to_string());
                            }
                        }
                        Ok(Some(Ok(_))) => {}
                        _ => break,
                    }
                }
                first_error
            });
            let to = json!({"conversationId": cid});
            // Spread the senders' phases over one period.
            let first = start + period.mul_f64(i as f64 / LAT_PAIRS as f64);
            let mut tick = tokio::time::interval_at(first.into(), period);
            for n in 0..total_each {
                tick.tick().await;
                if Instant::now() > hard_stop {
                    break;
                }
                let text = format!("{n}@{:.3}", epoch.elapsed().as_secs_f64() * 1000.0);
                if sink
                    .send(frame(&format!("l{i}-{n}"), &to, 1, json!({ "text": text })))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let first_error = reader.await.unwrap();
            (sink, first_error)
        }));
    }
    let mut first_error = None;
    let mut sinks = Vec::new();
    for s in senders {
        let (sink, e) = s.await.unwrap();
        sinks.push(sink);
        if first_error.is_none() {
            first_error = e;
        }
    }
    // Every push arrived, or 10 s more passed; then half a second for duplicates.
    let until = (Instant::now() + Duration::from_secs(10)).min(hard_stop);
    while complete.load(Ordering::Relaxed) < LAT_PAIRS && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = match stats {
        Some(addr) => Some(node_stats(addr).await),
        None => None,
    };
    let _ = stop.send(true);
    let mut samples = Vec::new();
    let mut duplicates = 0;
    for r in receivers {
        let (lat, d) = r.await.unwrap();
        samples.extend(lat);
        duplicates += d;
    }
    drop(sinks);
    let arrived = samples.len() as u64;
    let mut all: Vec<f64> = samples
        .into_iter()
        .filter(|s| s.1 >= start_ms + 1000.0)
        .map(|s| s.2)
        .collect();
    all.sort_by(f64::total_cmp);
    Latency {
        p50: percentile(&all, 0.5),
        p99: percentile(&all, 0.99),
        max: all.last().copied().unwrap_or(f64::NAN),
        measured: all.len(),
        sent: total_each * LAT_PAIRS as u64,
        arrived,
        duplicates,
        acked: acked.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        first_error,
        stats: before.zip(after),
    }
}

impl Latency {
    fn line(&self) -> String {
        let missing = self.sent - self.arrived.min(self.sent);
        let mut s = format!(
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} measured after 1 s warm-up; {} sent, \
             {} acked, ",
            self.p50, self.p99, self.max, self.measured, self.sent, self.acked
        );
        if missing == 0 && self.duplicates == 0 {
            s.push_str("none missing)");
        } else {
            s.push_str(&format!(
                "MISSING {missing}, duplicates {})",
                self.duplicates
            ));
        }
        if self.errors > 0 {
            s.push_str(&format!(
                ", {} ERRORS, first: {}",
                self.errors,
                self.first_error.as_deref().unwrap_or("")
            ));
        }
        s
    }
}

/// Figures of one throughput run.
struct Throughput {
    rate: f64,
    /// Acked by the deadline, acked in all (the window drained), pushes the receivers got.
    at_deadline: u64,
    acked: u64,
    pushes: u64,
    errors: u64,
}

/// One sender per `(sender's node, receiver's node)` of `placement`, each its own 1:1
/// conversation with its receiver online, each keeping `window` sends in flight for `secs`.
/// Acked messages per second.
async fn throughput(
    placement: &[(String, String)],
    tag: &str,
    window: usize,
    secs: f64,
) -> Throughput {
    let mut pairs = Vec::new();
    for (i, (send_addr, recv_addr)) in placement.iter().enumerate() {
        let a = format!("{tag}s{i}");
        let b = format!("{tag}r{i}");
        must(recv_addr, "GET", "/v1/conversations", &b, "").await;
        let cid = open(send_addr, &a, &b).await;
        let rx = connect(recv_addr, &b, "r").await;
        let tx = connect(send_addr, &a, "s").await;
        pairs.push((tx, rx, cid));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acked = Arc::new(AtomicU64::new(0));
    let pushes = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let hard_stop = deadline + Duration::from_secs(40);
    let mut receivers = Vec::new();
    let mut senders = Vec::new();
    for (i, (mut ws, mut rx, cid)) in pairs.into_iter().enumerate() {
        let (pushes, mut stopped) = (pushes.clone(), stopped.clone());
        receivers.push(tokio::spawn(async move {
            let mut pinged = Instant::now();
            while Instant::now() < hard_stop {
                let msg = tokio::select! {
                    m = tokio::time::timeout_at(hard_stop.into(), rx.next()) => m,
                    _ = stopped.changed() => break,
                };
                match msg {
                    Ok(Some(Ok(Message::Text(t)))) => {
                        if t.as_str().starts_with(r#"{"type":"notify""#) {
                            pushes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
                if pinged.elapsed() > Duration::from_secs(30) {
                    let _ = rx.send(Message::Text(r#"{"type":"ping"}"#.into())).await;
                    pinged = Instant::now();
                }
            }
        }));
        let (acked, errors) = (acked.clone(), errors.clone());
        senders.push(tokio::spawn(async move {
            let to = json!({"conversationId": cid});
            let (mut sent, mut got) = (0u64, 0u64);
            // An answer (ack or error) counted where it belongs: 1, else 0.
            let count = |t: &str| {
                if t.starts_with(r#"{"type":"ack""#) {
                    acked.fetch_add(1, Ordering::Relaxed);
                    1
                } else if t.starts_with(r#"{"type":"error""#) {
                    errors.fetch_add(1, Ordering::Relaxed);
                    1
                } else {
                    0
                }
            };
            while Instant::now() < deadline && sent < 10_000_000 {
                while sent - got < window as u64 {
                    let cmid = format!("t{i}-{sent}");
                    let text = "hello, this is a benchmark message of about a hundred bytes";
                    ws.feed(frame(&cmid, &to, 1, json!({ "text": text })))
                        .await
                        .unwrap();
                    sent += 1;
                }
                ws.flush().await.unwrap();
                match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) => got += count(t.as_str()),
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
            // Drain what is in flight, so the next phase starts on a quiet cluster.
            let drain_until = Instant::now() + Duration::from_secs(10);
            while got < sent && Instant::now() < drain_until {
                match tokio::time::timeout_at(drain_until.into(), ws.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) => got += count(t.as_str()),
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
            ws
        }));
    }
    tokio::time::sleep_until(deadline.into()).await;
    let at_deadline = acked.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let mut keep = Vec::new();
    for t in senders {
        keep.push(t.await.unwrap());
    }
    // The receivers got every acked message, or 10 s passed.
    let total = acked.load(Ordering::Relaxed);
    let until = Instant::now() + Duration::from_secs(10);
    while pushes.load(Ordering::Relaxed) < total && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop.send(true);
    for r in receivers {
        r.await.unwrap();
    }
    drop(keep);
    Throughput {
        rate: at_deadline as f64 / elapsed,
        at_deadline,
        acked: total,
        pushes: pushes.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
    }
}

impl Throughput {
    fn line(&self) -> String {
        let mut s = format!(
            "{:.0} acked msgs/s ({} acked by the deadline; {} acked in all, receivers got {} \
             pushes",
            self.rate, self.at_deadline, self.acked, self.pushes
        );
        if self.pushes < self.acked {
            s.push_str(&format!(", {} PUSHES MISSING", self.acked - self.pushes));
        }
        if self.errors > 0 {
            s.push_str(&format!(", {} ERRORS", self.errors));
        }
        s.push(')');
        s
    }
}

/// A labelled figure, printed as it comes (stderr) and again in the summary (stdout).
fn report(out: &mut Vec<(String, String)>, label: String, value: String) {
    eprintln!("{label}: {value}");
    out.push((label, value));
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "n/a".to_string()
    } else {
        format!("{:.3}", a as f64 / b as f64)
    }
}

async fn run(svc: Services, secs: f64, out: &mut Vec<(String, String)>) {
    let db = Db::new(&svc.postgres, "bench-cluster").await;
    let wiring = Wiring::nats(&svc, "bench-cluster");
    let cluster = nodes(&db, &wiring, 3).await;
    let addrs: Vec<String> = cluster.iter().map(|s| s.addr.clone()).collect();
    healthy(&addrs).await;
    eprintln!(
        "cluster: 3 nodes {addrs:?} (pids {:?}), logs {}/node{{1,2,3}}.log",
        cluster.iter().map(Server::pid).collect::<Vec<_>>(),
        db.dir.display()
    );
    let (n1, n2) = (addrs[0].as_str(), addrs[1].as_str());

    // Latency first, on an empty database. The cross-node 5,000 msgs/s run also gives the
    // publishes per commit batch.
    let want_lat = phase("lat");
    let want_batch = phase("batch");
    for rate in [1000u64, 5000] {
        for (place, recv) in [("same-node", n1), ("cross-node", n2)] {
            let batch_run = rate == 5000 && place == "cross-node" && want_batch;
            if !want_lat && !batch_run {
                continue;
            }
            let tag = format!("lat{rate}{}", &place[..1]);
            let l = latency(n1, recv, &tag, rate, secs, batch_run.then_some(n1)).await;
            let where_ = if place == "same-node" {
                "sender and receiver on node 1"
            } else {
                "sender on node 1, receiver on node 2"
            };
            report(
                out,
                format!(
                    "send→push latency, {place} ({where_}), offered {rate} msgs/s over \
                     {LAT_PAIRS} private conversations, {secs} s"
                ),
                l.line(),
            );
            if let Some((b, a)) = l.stats {
                let publishes = a.publishes - b.publishes;
                let batches = a.commit_batches - b.commit_batches;
                let rounds = a.rounds - b.rounds;
                let lost = a.lost - b.lost;
                report(
                    out,
                    format!(
                        "bus publishes on node 1 during the cross-node {rate} msgs/s phase \
                         ({} messages sent incl. 1 s warm-up)",
                        l.sent
                    ),
                    format!(
                        "Δpublishes {publishes}, ΔcommitBatches {batches}, Δrounds {rounds}, \
                         Δlost {lost}; publishes/commitBatch {}, publishes/message {}, \
                         messages/commitBatch {}",
                        ratio(publishes, batches),
                        ratio(publishes, l.sent),
                        ratio(l.sent, batches)
                    ),
                );
            }
        }
    }

    let want_tp = phase("tp");
    if want_tp {
        // Sender i on node i % 3, its receiver on the next node.
        let placement: Vec<(String, String)> = (0..TP_SENDERS)
            .map(|i| (addrs[i % 3].clone(), addrs[(i + 1) % 3].clone()))
            .collect();
        let t = throughput(&placement, "tp3", TP_WINDOW, secs).await;
        report(
            out,
            format!(
                "throughput, persistent 1:1, 3 nodes: {TP_SENDERS} senders ({} per node) with \
                 {TP_WINDOW} in flight each, every receiver online on another node than its \
                 sender, {secs} s",
                TP_SENDERS / 3
            ),
            t.line(),
        );
    }

    if phase("group") {
        let f = group_fanout(&addrs, "gf", GROUP_MEMBERS, GROUP_RATE, secs, 10, None).await;
        let every = if f.mismatches == 0 {
            "every device got every message once".to_string()
        } else {
            format!(
                "MISMATCH: {} (device, message) pairs not received exactly once",
                f.mismatches
            )
        };
        report(
            out,
            format!(
                "group fan-out, {GROUP_MEMBERS} members online, devices per node {:?} (sender \
                 on node 1), {GROUP_RATE} msgs/s for {secs} s, until all {} other devices have it",
                f.per_node,
                GROUP_MEMBERS - 1
            ),
            format!(
                "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} messages sent, {} reached every \
                 device; {every})",
                f.p50, f.p99, f.max, f.messages, f.complete
            ),
        );
    }

    for (i, s) in cluster.iter().enumerate() {
        let v = admin_node(&s.addr).await;
        eprintln!("node{} /admin/node at the end: {v}", i + 1);
    }
    drop(cluster);

    if want_tp {
        // One node alone (cluster mode with its own prefix, no peers) on a fresh database,
        // the three cluster nodes stopped; every sender and receiver on it.
        let db1 = Db::new(&svc.postgres, "bench-cluster-single").await;
        let w1 = Wiring::nats(&svc, "bench-single");
        let one = node(&db1, &w1, 1, "");
        healthy(std::slice::from_ref(&one.addr)).await;
        eprintln!(
            "single node: {} (pid {:?}), log {}/node1.log",
            one.addr,
            one.pid(),
            db1.dir.display()
        );
        let placement: Vec<(String, String)> = (0..TP_SENDERS)
            .map(|_| (one.addr.clone(), one.addr.clone()))
            .collect();
        let t = throughput(&placement, "tp1", TP_WINDOW, secs).await;
        report(
            out,
            format!(
                "throughput, persistent 1:1, 1 node (a separate node in cluster mode without \
                 peers, fresh database, the 3 cluster nodes stopped): {TP_SENDERS} senders with \
                 {TP_WINDOW} in flight each, every receiver online on the same node, {secs} s"
            ),
            t.line(),
        );
    }

    // The same on one node without [cluster] (no Redis lookups, no bus), on a fresh
    // database: what cluster mode itself costs on one machine.
    let db2 = Db::new(&svc.postgres, "bench-plain").await;
    let plain = common::server::Server::start_named(
        &db2,
        "plain",
        common::server::Sections {
            extra: common::server::FAST,
            ..Default::default()
        },
    );
    healthy(std::slice::from_ref(&plain.addr)).await;
    if want_lat {
        for rate in [1000u64, 5000] {
            let l = latency(
                &plain.addr,
                &plain.addr,
                &format!("plat{rate}"),
                rate,
                secs,
                None,
            )
            .await;
            report(
                out,
                format!(
                    "send→push latency, one node without [cluster], offered {rate} msgs/s over \
                     {LAT_PAIRS} private conversations, {secs} s"
                ),
                l.line(),
            );
        }
    }
    if want_tp {
        let placement: Vec<(String, String)> = (0..TP_SENDERS)
            .map(|_| (plain.addr.clone(), plain.addr.clone()))
            .collect();
        let t = throughput(&placement, "tpp", TP_WINDOW, secs).await;
        report(
            out,
            format!(
                "throughput, persistent 1:1, one node without [cluster] (fresh database): \
                 {TP_SENDERS} senders with {TP_WINDOW} in flight each, every receiver online on \
                 the same node, {secs} s"
            ),
            t.line(),
        );
    }
}

fn main() {
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s > 0.0 && *s <= 3600.0)
        .unwrap_or(5.0);
    let Some(svc) = services("cluster bench") else {
        // `services` said why.
        return;
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let config = format!(
        "3 courier nodes in cluster mode (device routes in Redis {}, pushes over NATS {}) on \
         one PostgreSQL database; each node is a separate process on loopback with the test \
         harness's gateway settings (send rate limit 1,000,000/s, outbox_frames 100,000). \
         ALL of it — the nodes, PostgreSQL, Redis, NATS and this load generator (2 tokio \
         workers) — shares this one machine of {cores} cores, so the figures show the \
         cluster's overhead, not its scaling. Phases of {secs} s.",
        svc.redis, svc.nats
    );
    eprintln!("{config}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut out = Vec::new();
    rt.block_on(run(svc, secs, &mut out));
    println!("\n## Cluster benchmark\n\n{config}\n");
    for (label, value) in &out {
        println!("- {label}: {value}");
    }
}
