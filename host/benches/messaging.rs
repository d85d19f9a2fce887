//! Messaging benchmark: the `courier` binary as a separate process on loopback, this
//! program as the load generator, on the same machine. Prints, per database:
//! persistent 1:1 throughput (acked msgs/s) with 1, 16 and 256 concurrent senders, and
//! of one sender that waits for each ack (with each ack's wait, beside this disk's fsync);
//! send→push latency p50/p99 at a fixed rate; the time to pull 1,000 missed messages;
//! live (typing) throughput; server memory per idle connection at 10,000 connections;
//! group fan-out to 1,000 online members (until every device has it) and the pull of a
//! member with three membership intervals; ping-pong between two devices with a stored
//! kind and with a live one (each hop's latency); a 10,000-member group (`mega`, on a
//! server of its own with `max_group_members` raised, on a fresh database): its creation
//! and add batches of 500, the fan-out to 2,000 online members at 5 msgs/s until the last
//! device has it (and the first message, the first after the group grew, on its own: its
//! ack and its fan-out), a member's pull (whole, and from just after the tip it joined by) and
//! overview and the owner's receipts for 100 seqs against a 10-member group with as many
//! messages, 1,000 members asking for the newest message's receipt at about the same time
//! (how long each waited, and the passes over the members the server ran), and the ack of a typing signal into it right after a kick and once more; and
//! for each timed phase the server's CPU per delivered message and its RSS (for the group
//! fan-out, per delivery to a device, over the sends alone: from just before the first
//! send until every device had every message, not the making of the group and its
//! connections). A summary table at the end.
//!
//! Run: `cargo bench -p courier --bench messaging`. SQLite with `synchronous` full (an ack
//! survives power loss) and normal (an ack survives a crash of the server), and PostgreSQL
//! too when `PG_TEST_URL` names a database the bench may create others from.
//! `BENCH_SECS` (default 5) sets the length of each timed phase;
//! `BENCH_ONLY=sqlite|sqlite-full|sqlite-normal|postgres` picks the databases and
//! `BENCH_PHASES=seq,tp,lat,pingpong,pull,live,mem,group,mega,receipts,offline` the figures;
//! `BENCH_STORAGE` adds lines to the `[storage]` section of every server (`committers = 1`);
//! `BENCH_REPEAT=5` runs the latency phase five times (the summary adds the median of their
//! p99s), and `BENCH_LAT_BYTES=600` pads its messages' text to about that many bytes
//! (default: the send time alone, about 10). Each timed phase also prints the server's CPU
//! per delivered message (from `/proc`, user + system, and the system part alone: the
//! kernel's, which on loopback includes the receiving side of every socket write unless
//! the kernel accounts interrupt time apart) and its RSS after; each latency run also
//! prints what else the machine did meanwhile (CPU of other processes and of the kernel's own
//! threads, iowait, and steal: CPU time the hypervisor gave to another machine, which both
//! the server and the load generator lost), how long the server's, PostgreSQL's and the
//! load generator's threads waited for a CPU, and on PostgreSQL what its write-ahead log
//! did (the bytes and syncs, the segment files before and after, the checkpoints: with
//! none, one file more is a segment created, not recycled, which holds every commit while
//! it is written). Where PostgreSQL's autovacuum is off, the tables are analyzed after the
//! `mega` and `offline` phases' setup, as autovacuum would soon after. `BENCH_CALLGRIND=1` runs the server under
//! valgrind's callgrind (instrumentation on only while a phase is metered) and adds the
//! server's instructions per delivered message, user space only: a count that does not
//! move with the machine, where CPU time moves by tens of percent between runs. The server
//! is some fifty times slower there, so only figures that do not depend on how sends batch
//! (the live phase, say) compare with a normal run. The server and its database are the
//! tests' (`tests/common`); its log is `server.log` in its folder under the target's tmp
//! dir (`COURIER_LOG=courier::messaging=debug` adds each batch's size and time).
//! Every loop is bounded by a count and by time (the `mega` phase's too: 10,000 users made
//! 32 at a time within 600 s, 2,000 devices connected within 300 s, 20 to 300 messages),
//! and every client is on loopback.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "support/devices.rs"]
mod devices;
#[path = "support/mega.rs"]
mod mega;
mod support;

use support::*;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::server::{Backend, Db, Sections, Server};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// Send limits out of the way: the bench measures the server, not the rate limit.
const GATEWAY: &str = "[gateway]\nsend_rate_per_sec = 1000000\nsend_burst = 1000000\n";

/// `senders` connections, each its own 1:1 conversation, each keeping `window` sends in
/// flight for `secs`. Acked messages per second, and every message acked (the drain after
/// the deadline included).
async fn throughput(addr: &str, tag: &str, senders: usize, window: usize, secs: f64) -> (f64, u64) {
    let mut convs = Vec::new();
    for i in 0..senders {
        let a = format!("{tag}s{i}");
        let b = format!("{tag}r{i}");
        convs.push((a.clone(), open_known(addr, &a, &b).await));
    }
    let acked = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, (user, cid)) in convs.into_iter().enumerate() {
        let addr = addr.to_string();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let mut ws = connect(&addr, &user, "d").await;
            let to = json!({"conversationId": cid});
            let mut sent = 0u64;
            let mut got = 0u64;
            while Instant::now() < deadline && sent < 10_000_000 {
                while sent - got < window as u64 {
                    let cmid = format!("t{i}-{sent}");
                    ws.feed(frame(&cmid, &to, 1, json!({"text": "hello, this is a benchmark message of about a hundred bytes"})))
                        .await
                        .unwrap();
                    sent += 1;
                }
                ws.flush().await.unwrap();
                match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) if t.as_str().starts_with(r#"{"type":"ack""#) => {
                        got += 1;
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
            // Drain what is in flight, so the next phase starts on a quiet server.
            let drain_until = Instant::now() + Duration::from_secs(10);
            while got < sent && Instant::now() < drain_until {
                match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                    Ok(Some(Ok(Message::Text(_)))) => {
                        got += 1;
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
        }));
    }
    let mut at_deadline = 0;
    tokio::time::sleep_until(deadline.into()).await;
    at_deadline += acked.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for t in tasks {
        t.await.unwrap();
    }
    (at_deadline as f64 / elapsed, acked.load(Ordering::Relaxed))
}

/// `rate` msgs/s spread over 50 senders for `secs` (after a second of warm-up); receivers
/// online (with `receipts`, answering every push with `received`). Latency from the
/// send frame leaving to the receiver's notify, in ms, after the warm-up; and every notify
/// received.
async fn latency(
    addr: &str,
    tag: &str,
    rate: u64,
    secs: f64,
    receipts: bool,
) -> (Percentiles, u64) {
    const PAIRS: usize = 50;
    let epoch = Instant::now();
    let mut convs = Vec::new();
    for i in 0..PAIRS {
        let a = format!("{tag}ls{i}");
        let b = format!("{tag}lr{i}");
        let cid = open_known(addr, &a, &b).await;
        convs.push((a, b, cid));
    }
    let per_sender = rate as f64 / PAIRS as f64;
    // The send time, then padding up to `BENCH_LAT_BYTES`.
    let pad: usize = std::env::var("BENCH_LAT_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let padding = if pad > 12 {
        format!(" {}", "x".repeat(pad - 12))
    } else {
        String::new()
    };
    // One more second at the start, not counted: connections and statements warm up.
    let total_each = (per_sender * (secs + 1.0)) as u64;
    let mut receivers = Vec::new();
    let mut senders = Vec::new();
    for (i, (a, b, cid)) in convs.into_iter().enumerate() {
        let mut rx = connect(addr, &b, "r").await;
        receivers.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(total_each as usize);
            let until = Instant::now() + Duration::from_secs_f64(secs + 15.0);
            while (lat.len() as u64) < total_each && Instant::now() < until {
                match tokio::time::timeout(Duration::from_secs(10), rx.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) => {
                        let now = epoch.elapsed().as_secs_f64() * 1000.0;
                        let v: Value = serde_json::from_str(t.as_str()).unwrap();
                        if v["type"] == "notify"
                            && let Some(sent) = v["payload"]["text"]
                                .as_str()
                                .and_then(|s| s.split(' ').next())
                                .and_then(|s| s.parse::<f64>().ok())
                        {
                            lat.push((sent, now - sent));
                            if receipts {
                                let received = json!({"type": "received",
                                    "conversationId": cid, "seq": v["seq"]});
                                let _ = rx.send(Message::Text(received.to_string().into())).await;
                            }
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
            lat
        }));
        let addr = addr.to_string();
        let padding = padding.clone();
        senders.push(tokio::spawn(async move {
            let ws = connect(&addr, &a, "s").await;
            let (mut sink, mut stream) = ws.split();
            // Acks are read and dropped.
            let reader =
                tokio::spawn(async move { while let Some(Ok(_)) = stream.next().await {} });
            let to = json!({"conversationId": cid});
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sender));
            // Spread the senders' phases.
            tokio::time::sleep(Duration::from_secs_f64(
                i as f64 / PAIRS as f64 / per_sender,
            ))
            .await;
            for n in 0..total_each {
                tick.tick().await;
                let sent = format!("{:.3}{padding}", epoch.elapsed().as_secs_f64() * 1000.0);
                sink.send(frame(&format!("l{i}-{n}"), &to, 1, json!({"text": sent})))
                    .await
                    .unwrap();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            reader.abort();
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    let mut samples = Vec::new();
    for r in receivers {
        samples.extend(r.await.unwrap());
    }
    let received = samples.len() as u64;
    let first = samples.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    let all: Vec<f64> = samples
        .into_iter()
        .filter(|s| s.0 >= first + 1000.0)
        .map(|s| s.1)
        .collect();
    (Percentiles::of(all), received)
}

/// p50, p99, p999 of a sample, and its size.
#[derive(Debug, Clone, Copy)]
struct Percentiles {
    p50: f64,
    p99: f64,
    p999: f64,
    n: usize,
}

impl Percentiles {
    fn of(mut v: Vec<f64>) -> Percentiles {
        v.sort_by(f64::total_cmp);
        Percentiles {
            p50: percentile(&v, 0.5),
            p99: percentile(&v, 0.99),
            p999: percentile(&v, 0.999),
            n: v.len(),
        }
    }

    fn shown(&self) -> String {
        format!("{:.2} / {:.2} / {:.2} ms", self.p50, self.p99, self.p999)
    }
}

/// Ping-pong between two devices of two users: each receives the other's message, then
/// answers it; `n` hops one after the other. The time of each hop, from its send leaving to
/// the peer's notify, in ms.
async fn ping_pong(
    addr: &str,
    tag: &str,
    content_type: u32,
    payload: Value,
    n: usize,
) -> Percentiles {
    let a = format!("{tag}a");
    let b = format!("{tag}b");
    let cid = open_known(addr, &a, &b).await;
    let mut ws = [connect(addr, &a, "d").await, connect(addr, &b, "d").await];
    let to = json!({"conversationId": cid});
    let mut hops = Vec::with_capacity(n);
    let until = Instant::now() + Duration::from_secs(120);
    for i in 0..n {
        if Instant::now() > until {
            break;
        }
        let (from, peer) = (i % 2, 1 - i % 2);
        let sent = Instant::now();
        ws[from]
            .send(frame(
                &format!("{tag}{i}"),
                &to,
                content_type,
                payload.clone(),
            ))
            .await
            .unwrap();
        // The peer's notify; the sender's ack is read on its next turn.
        loop {
            match tokio::time::timeout(Duration::from_secs(10), ws[peer].next()).await {
                Ok(Some(Ok(Message::Text(t)))) if t.as_str().starts_with(r#"{"type":"notify""#) => {
                    hops.push(sent.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
                Ok(Some(Ok(_))) => {}
                _ => return Percentiles::of(hops),
            }
        }
    }
    // The first hundred warm the connections and statements up.
    Percentiles::of(hops.split_off(hops.len().min(100)))
}

/// One sender with one send in flight: each send leaves only after the last one's ack
/// arrived, as a client that waits for every ack does. Acked per second, and each send's
/// wait for its ack in ms, and how many sends it made (the warm-up's among them); bounded
/// by `secs` and 100,000 sends.
async fn sequential(addr: &str, tag: &str, secs: f64) -> (f64, Percentiles, u64) {
    let a = format!("{tag}a");
    let b = format!("{tag}b");
    let cid = open_known(addr, &a, &b).await;
    let mut ws = connect(addr, &a, "d").await;
    let to = json!({"conversationId": cid});
    let mut waits = Vec::new();
    let mut sends = 0;
    // The first hundred warm the connection and statements up, outside the clock.
    let warm = 100;
    let mut started = Instant::now();
    let mut deadline = started + Duration::from_secs_f64(secs);
    for n in 0..100_000 {
        if n == warm {
            started = Instant::now();
            deadline = started + Duration::from_secs_f64(secs);
        }
        if n > warm && Instant::now() > deadline {
            break;
        }
        let sent = Instant::now();
        ws.send(frame(
            &format!("{tag}{n}"),
            &to,
            1,
            json!({"text": "sequential"}),
        ))
        .await
        .unwrap();
        sends += 1;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) if t.as_str().starts_with(r#"{"type":"ack""#) => {
                    break;
                }
                Ok(Some(Ok(Message::Text(t)))) if t.as_str().starts_with(r#"{"type":"error""#) => {
                    panic!("sequential send {n}: {t}")
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("sequential send {n}: no ack: {other:?}"),
            }
        }
        if n >= warm {
            waits.push(sent.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let rate = waits.len() as f64 / started.elapsed().as_secs_f64();
    (rate, Percentiles::of(waits), sends)
}

/// This disk's `fdatasync` after appending 4 KiB to a file in `dir` (as a commit appends
/// to SQLite's log), 300 times: p50 and p99 in ms. The floor under a durable ack.
fn fsync_probe(dir: &std::path::Path) -> (f64, f64) {
    use std::io::Write as _;
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path).expect("the fsync probe's file");
    let block = [7u8; 4096];
    let mut took = Vec::with_capacity(300);
    for _ in 0..300 {
        file.write_all(&block).expect("the fsync probe's write");
        let t = Instant::now();
        file.sync_data().expect("the fsync probe's fdatasync");
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    took.sort_by(f64::total_cmp);
    (percentile(&took, 0.5), percentile(&took, 0.99))
}

/// Time to pull 1,000 messages a device missed (two pages of 500), median of 20 rounds, ms.
async fn pull_missed(addr: &str, tag: &str) -> f64 {
    let a = format!("{tag}pa");
    let b = format!("{tag}pb");
    let cid = open_known(addr, &a, &b).await;
    let mut ws = connect(addr, &a, "d").await;
    let to = json!({"conversationId": cid});
    for n in 0..1000 {
        ws.feed(frame(
            &format!("p{n}"),
            &to,
            1,
            json!({"text": format!("missed message number {n}")}),
        ))
        .await
        .unwrap();
    }
    ws.flush().await.unwrap();
    let mut acks = 0;
    while acks < 1000 {
        if let Some(Ok(Message::Text(_))) = ws.next().await {
            acks += 1;
        }
    }
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let mut after = 1;
        let mut got = 0;
        for _ in 0..4 {
            let (_, page) = http(
                addr,
                "GET",
                &format!("/v1/conversations/{cid}/messages?afterSeq={after}&limit=500"),
                &b,
                "",
            )
            .await;
            let msgs = page["messages"].as_array().unwrap();
            got += msgs.len();
            after = msgs.last().map_or(after, |m| m["seq"].as_i64().unwrap());
            if !page["hasMore"].as_bool().unwrap() {
                break;
            }
        }
        assert_eq!(got, 1000);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    percentile(&times, 0.5)
}

/// A live kind from 16 senders to online peers, window 64: acked per second and notifies
/// the peers received. Typing (`latest`) is coalesced while a peer's queue holds one;
/// call signalling (`live`) is delivered whole.
async fn live(
    addr: &str,
    pid: u32,
    tag: &str,
    secs: f64,
    content_type: u32,
    payload: &Value,
) -> Live {
    const PAIRS: usize = 16;
    let received = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    // Every pair is connected before the clock starts: the rate is over the sending alone.
    let mut pairs = Vec::with_capacity(PAIRS);
    for i in 0..PAIRS {
        let a = format!("{tag}ta{i}");
        let b = format!("{tag}tb{i}");
        let cid = open_known(addr, &a, &b).await;
        pairs.push((
            cid,
            connect(addr, &b, "r").await,
            connect(addr, &a, "s").await,
        ));
    }
    let cpu = CpuMeter::start(pid);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (cid, mut rx, mut ws) in pairs {
        let received = received.clone();
        tasks.push(tokio::spawn(async move {
            let until = deadline + Duration::from_secs(3);
            while Instant::now() < until {
                match tokio::time::timeout_at(until.into(), rx.next()).await {
                    Ok(Some(Ok(Message::Text(_)))) => {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
        }));
        let acked = acked.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let to = json!({"conversationId": cid});
            let (mut sent, mut got) = (0u64, 0u64);
            while Instant::now() < deadline && sent < 50_000_000 {
                while sent - got < 64 {
                    ws.feed(frame(
                        &format!("ty{sent}"),
                        &to,
                        content_type,
                        payload.clone(),
                    ))
                    .await
                    .unwrap();
                    sent += 1;
                }
                ws.flush().await.unwrap();
                match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                    Ok(Some(Ok(Message::Text(_)))) => {
                        got += 1;
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep_until(deadline.into()).await;
    let rate = acked.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    for t in tasks {
        t.await.unwrap();
    }
    Live {
        rate,
        acked: acked.load(Ordering::Relaxed),
        received: received.load(Ordering::Relaxed),
        cpu,
    }
}

/// What `live` measured: acked per second over its time, the acks and the pushes the peers
/// received in all, and the server's CPU from the first send.
struct Live {
    rate: f64,
    acked: u64,
    received: u64,
    cpu: CpuMeter,
}

/// Sends `n` texts into group `cid` on `ws` (64 in flight) and waits for their acks.
async fn send_group(ws: &mut Ws, cid: i64, prefix: &str, n: usize) {
    let (mut sent, mut acked) = (0, 0);
    let until = Instant::now() + Duration::from_secs(120);
    while acked < n && Instant::now() < until {
        while sent < n && sent - acked < 64 {
            ws.feed(group_frame(
                &format!("{prefix}{sent}"),
                cid,
                "a group message of a benchmark",
            ))
            .await
            .unwrap();
            sent += 1;
        }
        ws.flush().await.unwrap();
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                match v["type"].as_str() {
                    Some("ack") => acked += 1,
                    Some("error") => panic!("group send {prefix}: {v}"),
                    _ => {}
                }
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("group send {prefix}: connection gone: {other:?}"),
        }
    }
    assert_eq!(acked, n, "group send {prefix}: acks");
}

/// Every message `user` may see in `cid` after `from`: `afterSeq=from&limit=500`, following
/// `hasMore`.
async fn pull_everything(addr: &str, user: &str, cid: i64, from: i64) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after = from;
    for _ in 0..100 {
        let page = must(
            addr,
            "GET",
            &format!("/v1/conversations/{cid}/messages?afterSeq={after}&limit=500"),
            user,
            "",
        )
        .await;
        let msgs = page["messages"].as_array().unwrap();
        after = msgs.last().map_or(after, |m| m["seq"].as_i64().unwrap());
        all.extend(msgs.iter().cloned());
        if !page["hasMore"].as_bool().unwrap() || msgs.is_empty() {
            break;
        }
    }
    all
}

/// Median of 20 pulls of everything after `from`, ms, and the messages of one.
async fn time_pull(addr: &str, user: &str, cid: i64, from: i64) -> (f64, usize) {
    let mut times = Vec::new();
    let mut got = 0;
    for _ in 0..20 {
        let t = Instant::now();
        got = pull_everything(addr, user, cid, from).await.len();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    (percentile(&times, 0.5), got)
}

/// Figures of the pull of a member with three membership intervals.
struct IntervalPull {
    ms: f64,
    got: usize,
    expected: usize,
    /// Seqs M got that it should not see plus those it should but did not get.
    wrong: usize,
    one_ms: f64,
    one_got: usize,
}

/// A group of owner, M and C (C a member throughout); `per` texts, kick M, `per`, add M,
/// `per`, kick M, `per`, add M, `per`: M has three intervals. Full pulls of M and of C.
async fn interval_pull(addr: &str, tag: &str, per: usize) -> IntervalPull {
    let (owner, m, c) = (format!("{tag}o"), format!("{tag}m"), format!("{tag}c"));
    for u in [&owner, &m, &c] {
        must(addr, "GET", "/v1/friends", u, "").await;
    }
    let group = must(
        addr,
        "POST",
        "/v1/groups",
        &owner,
        &json!({"name": "bench", "members": [m, c]}).to_string(),
    )
    .await;
    let cid = group["conversationId"].as_i64().unwrap();
    let members = format!("/v1/groups/{cid}/members");
    let kick = format!("/v1/groups/{cid}/kick");
    let only_m = json!({"userIds": [m]}).to_string();
    let mut ws = connect(addr, &owner, "d").await;
    send_group(&mut ws, cid, "i1-", per).await;
    must(addr, "POST", &kick, &owner, &only_m).await;
    send_group(&mut ws, cid, "gap1-", per).await;
    must(addr, "POST", &members, &owner, &only_m).await;
    send_group(&mut ws, cid, "i2-", per).await;
    must(addr, "POST", &kick, &owner, &only_m).await;
    send_group(&mut ws, cid, "gap2-", per).await;
    must(addr, "POST", &members, &owner, &only_m).await;
    send_group(&mut ws, cid, "i3-", per).await;
    drop(ws);

    // What M may see, by the protocol's rules, from C's complete view: from the tip that
    // added M (the created tip for the first interval) to the tip that kicked M.
    let everything = pull_everything(addr, &c, cid, 0).await;
    let mut expected = std::collections::HashSet::new();
    let mut inside = false;
    for msg in &everything {
        let p = &msg["payload"];
        let names_m = |key: &str| {
            p[key]
                .as_array()
                .is_some_and(|a| a.iter().any(|u| *u == *m))
        };
        if msg["contentType"] == 9 && (p["event"] == "created" || names_m("userIds")) {
            inside = true;
        }
        if inside {
            expected.insert(msg["seq"].as_i64().unwrap());
        }
        if msg["contentType"] == 8 && names_m("kickedUserIds") {
            inside = false;
        }
    }
    let got: std::collections::HashSet<i64> = pull_everything(addr, &m, cid, 0)
        .await
        .iter()
        .map(|msg| msg["seq"].as_i64().unwrap())
        .collect();
    let wrong = got.symmetric_difference(&expected).count();
    let (ms, got) = time_pull(addr, &m, cid, 0).await;
    let (one_ms, one_got) = time_pull(addr, &c, cid, 0).await;
    IntervalPull {
        ms,
        got,
        expected: expected.len(),
        wrong,
        one_ms,
        one_got,
    }
}

/// Server RSS growth per idle WebSocket connection, over `n` connections (100 users).
async fn idle_memory(server: &Server, tag: &str, n: usize) -> (f64, u64, u64) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(server.pid().unwrap_or(0));
    let mut conns = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        if started.elapsed() > Duration::from_secs(120) {
            break;
        }
        let user = format!("{tag}m{}", i % 100);
        conns.push(connect(&server.addr, &user, &format!("d{i}")).await);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(server.pid().unwrap_or(0));
    let per = (after.saturating_sub(before)) as f64 * 1024.0 / conns.len() as f64;
    drop(conns);
    (per, before, after)
}

/// The bench's server: the load generator is every client, all from 127.0.0.1, so no cap
/// per address.
async fn start(db: &Db, storage: &str) -> Server {
    start_with(db, storage, GATEWAY).await
}

/// As `start`, with `extra` as the config's own sections.
async fn start_with(db: &Db, storage: &str, extra: &str) -> Server {
    Server::start_sections(
        db,
        Sections {
            server: "max_connections_per_address = 0\n",
            storage,
            extra,
            ..Sections::default()
        },
    )
    .await
}

/// The `receipts` phase, on servers of its own with delivery receipts on and off: 1:1 with
/// every receiver online (16 senders, 64 in flight; with receipts on, each receiver answers
/// every push with `received`, and each sender gets the `delivered` frames), and send →
/// push latency at 5,000 msgs/s the same way.
async fn receipts_phase(
    name: &str,
    backend: &Backend,
    storage: &str,
    secs: f64,
    out: &mut Figures,
) {
    for (on, key, lat_key) in [
        (true, "rc-on", "rc-lat-on"),
        (false, "rc-off", "rc-lat-off"),
    ] {
        let db = Db::new(backend, &format!("bench-{name}-{key}")).await;
        let extra = format!("{GATEWAY}[messaging]\ndelivery_receipts = {on}\n");
        let server = start_with(&db, storage, &extra).await;
        let pid = server.pid().unwrap_or(0);
        let cpu = CpuMeter::start(pid);
        let o = devices::one_to_one_online(&server.addr, key, 16, 64, secs, on).await;
        out.record(
            name,
            pid,
            key,
            format!(
                "{:.0} acked/s ({} pushes, {} delivered frames)",
                o.rate, o.pushed, o.delivered
            ),
            cpu.per(o.acked),
        );
        let cpu = CpuMeter::start(pid);
        let (l, received) = latency(&server.addr, &format!("{key}l"), 5000, secs, on).await;
        out.record(name, pid, lat_key, l.shown(), cpu.per(received));
    }
}

/// Recipients of the `offline` phase, none online, each with a push token; its senders.
const OFFLINE_USERS: usize = 10_000;
const OFFLINE_SENDERS: usize = 16;

/// The `offline` phase, on servers of its own with the push webhook on (a receiver on
/// loopback that answers at once) and off: 16 senders, 64 in flight, texting 10,000 offline
/// users with push tokens in turn, each sender its own share of them: first each one's
/// first message, then for `secs`. Then, for `secs`, first messages again: each sender
/// texts the users outside its share, a new conversation each, and then all of them
/// again as a new user (`devices::Share::Others`).
async fn offline_phase(name: &str, backend: &Backend, storage: &str, secs: f64, out: &mut Figures) {
    let users: Vec<String> = (0..OFFLINE_USERS).map(|i| format!("off{i}")).collect();
    for (on, key, first_key, firsts_key) in [
        (true, "push-on", "first-on", "firsts-on"),
        (false, "push-off", "first-off", "firsts-off"),
    ] {
        let db = Db::new(backend, &format!("bench-{name}-{key}")).await;
        let (hook, notices) = devices::webhook_sink().await;
        let push = match on {
            true => format!(
                "[push]\nwebhook_url = \"http://{hook}/notify\"\n\
                 webhook_secret = \"bench-secret-bench-secret-bench-secret\"\n"
            ),
            false => String::new(),
        };
        let server = start_with(&db, storage, &format!("{GATEWAY}{push}")).await;
        let pid = server.pid().unwrap_or(0);
        let made = Instant::now();
        mega::make_users(&server.addr, &users, 32, Duration::from_secs(600)).await;
        devices::push_tokens(&server.addr, &users, 32, Duration::from_secs(600)).await;
        eprintln!(
            "[{name}] {key}: {OFFLINE_USERS} users with push tokens in {:.1} s",
            made.elapsed().as_secs_f64()
        );
        analyze_without_autovacuum(&db.url, name).await;
        // Each recipient's first message (a new conversation), then the steady load; the
        // CPU of each part per send acked in it.
        let per_sender = OFFLINE_USERS.div_ceil(OFFLINE_SENDERS) as u64;
        let cpu = CpuMeter::start(pid);
        let (first, acked) = devices::to_many(
            &server.addr,
            (key, "first"),
            &users,
            (OFFLINE_SENDERS, 64, devices::Share::Own),
            600.0,
            per_sender,
        )
        .await;
        out.record(
            name,
            pid,
            first_key,
            format!("{first:.0} acked/s"),
            cpu.per(acked),
        );
        let cpu = CpuMeter::start(pid);
        let (rate, acked) = devices::to_many(
            &server.addr,
            (key, "steady"),
            &users,
            (OFFLINE_SENDERS, 64, devices::Share::Own),
            secs,
            u64::MAX,
        )
        .await;
        out.record(
            name,
            pid,
            key,
            format!(
                "{rate:.0} acked/s; {} notices reached the webhook",
                notices.load(Ordering::Relaxed)
            ),
            cpu.per(acked),
        );
        // First messages for `secs`, each a new conversation (the 10,000 above are over in
        // a fraction of a second): each sender texts the recipients outside its share,
        // then all of them again as a new user.
        let cpu = CpuMeter::start(pid);
        let (rate, acked) = devices::to_many(
            &server.addr,
            (key, "firsts"),
            &users,
            (OFFLINE_SENDERS, 64, devices::Share::Others),
            secs,
            u64::MAX,
        )
        .await;
        out.record(
            name,
            pid,
            firsts_key,
            format!("{rate:.0} acked/s"),
            cpu.per(acked),
        );
    }
}

/// Members of the `mega` phase's big group, the owner included; those online (the sender
/// included); the size of an add batch (and of the group as created); the small group.
const MEGA_MEMBERS: usize = 10_000;
const MEGA_ONLINE: usize = 2_000;
const MEGA_BATCH: usize = 500;
/// Members asking for the newest message's receipt at about the same time, and how many
/// of their requests are in flight at once.
const MEGA_ASKERS: usize = 1_000;
const MEGA_ASKING: usize = 64;
const MEGA_SMALL: usize = 10;
/// The rate of the big group's messages and their count's bounds.
const MEGA_RATE: f64 = 5.0;
const MEGA_MIN_MESSAGES: usize = 20;
const MEGA_MAX_MESSAGES: usize = 300;

/// The `mega` phase on a server of its own (`max_group_members` raised to the big group's
/// size), on a fresh database: 10,000 users, a group of them grown as a client grows one
/// (created with 500, then 500 at a time), 2,000 of its members online and the fan-out of
/// texts at `MEGA_RATE`; then a member's full pull, overview and the owner's receipts for
/// 100 seqs, against a 10-member group with the same messages.
async fn mega_phase(name: &str, backend: &Backend, storage: &str, secs: f64, out: &mut Figures) {
    let started = Instant::now();
    let db = Db::new(backend, &format!("bench-{name}-mega")).await;
    let extra = format!("{GATEWAY}[messaging]\nmax_group_members = {MEGA_MEMBERS}\n");
    let server = start_with(&db, storage, &extra).await;
    let (addr, pid) = (server.addr.as_str(), server.pid().unwrap_or(0));
    eprintln!("[{name}] mega: server on {addr} (pid {pid})");
    let owner = "megao".to_string();
    let members: Vec<String> = (1..MEGA_MEMBERS).map(|k| format!("megam{k}")).collect();
    let small_owner = "megaso".to_string();
    let small: Vec<String> = (1..MEGA_SMALL).map(|k| format!("megas{k}")).collect();

    // 1. Users, then the big group grown in batches.
    let t = Instant::now();
    let everyone: Vec<String> = [&owner, &small_owner]
        .into_iter()
        .cloned()
        .chain(members.iter().cloned())
        .chain(small.iter().cloned())
        .collect();
    mega::make_users(addr, &everyone, 32, Duration::from_secs(600)).await;
    let users_s = t.elapsed().as_secs_f64();
    let g = mega::grow_group(
        addr,
        &owner,
        &members,
        MEGA_BATCH - 1,
        MEGA_BATCH,
        Duration::from_secs(900),
    )
    .await;
    assert_eq!(
        g.members, MEGA_MEMBERS as i64,
        "the big group's memberCount"
    );
    let cid = g.cid;
    let mut sorted = g.batches.clone();
    sorted.sort_by(f64::total_cmp);
    let grow = format!(
        "create (500 members) {:.1} ms; {} add batches of 500: p50 {:.1} / max {:.1} ms \
         (first {:.1}, last {:.1})",
        g.create_ms,
        g.batches.len(),
        percentile(&sorted, 0.5),
        sorted.last().copied().unwrap_or(f64::NAN),
        g.batches.first().copied().unwrap_or(f64::NAN),
        g.batches.last().copied().unwrap_or(f64::NAN),
    );
    let each: Vec<String> = g.batches.iter().map(|b| format!("{b:.0}")).collect();
    eprintln!(
        "[{name}] mega: {} users made in {users_s:.1} s (32 at once); {grow}; each batch, ms: {}",
        everyone.len(),
        each.join(" ")
    );
    out.figure.insert("mega-grow", grow);
    let small_group = must(
        addr,
        "POST",
        "/v1/groups",
        &small_owner,
        &json!({"name": "small", "members": small}).to_string(),
    )
    .await;
    let small_cid = small_group["conversationId"].as_i64().unwrap();

    // 2. The fan-out to 1,999 other online devices.
    let n = ((MEGA_RATE * secs).round() as usize).clamp(MEGA_MIN_MESSAGES, MEGA_MAX_MESSAGES);
    let online = &members[..MEGA_ONLINE - 1];
    let t = Instant::now();
    let (f, cpu_us) = mega::fanout_online(
        addr,
        pid,
        cid,
        &owner,
        online,
        MEGA_RATE,
        n,
        Duration::from_secs(300),
    )
    .await;
    let deliveries = (f.messages * online.len()) as u64;
    // From the first send until every device had every message: the pushes' cost.
    let n = deliveries.max(1) as f64;
    let cpu = Cpu {
        server: cpu_us.server / n,
        kernel: cpu_us.kernel / n,
        db: cpu_us.db / n,
        instructions: cpu_us.instructions.map(|i| i / n),
    };
    let every = if f.mismatches == 0 {
        "all once".to_string()
    } else {
        format!(
            "MISMATCH: {} (device, message) pairs not received exactly once",
            f.mismatches
        )
    };
    eprintln!(
        "[{name}] mega: fan-out {MEGA_MEMBERS} members, {MEGA_ONLINE} online, {MEGA_RATE} msgs/s, \
         until the last of {} other devices has it: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; \
         the first message (the first after the group grew): acked in {:.2} ms, on every \
         device in {:.2} ms ({} messages, {} complete, {every}; connect and send {:.1} s)",
        online.len(),
        f.p50,
        f.p99,
        f.max,
        f.first_ack,
        f.first,
        f.messages,
        f.complete,
        t.elapsed().as_secs_f64()
    );
    out.record(
        name,
        pid,
        "mega",
        format!(
            "{:.2} / {:.2} / {:.2} ms, the first {:.2} ({} messages, {every})",
            f.p50, f.p99, f.max, f.first, f.messages
        ),
        cpu,
    );

    analyze_without_autovacuum(&db.url, name).await;
    // 3. Pull and overview: a member of the last add batch of the big group (it sees that
    // batch's tip and the texts) against a member of the small group (the created tip and
    // as many texts).
    let mut ws = connect(addr, &small_owner, "d").await;
    send_group(&mut ws, small_cid, "ms", f.messages).await;
    let (big_member, small_member) = (members.last().unwrap(), small.last().unwrap());
    let (big_pull, big_got) = time_pull(addr, big_member, cid, 0).await;
    let (small_pull, small_got) = time_pull(addr, small_member, small_cid, 0).await;
    // The first message each sees is a tip: of the big member's add batch (its 500 names)
    // or of the small group's creation (9). The same pulls from just after it tell what
    // the group's size costs apart from that tip's size.
    let big_tip = pull_everything(addr, big_member, cid, 0).await[0].clone();
    let small_tip = pull_everything(addr, small_member, small_cid, 0).await[0].clone();
    let (big_texts, _) = time_pull(addr, big_member, cid, big_tip["seq"].as_i64().unwrap()).await;
    let (small_texts, _) = time_pull(
        addr,
        small_member,
        small_cid,
        small_tip["seq"].as_i64().unwrap(),
    )
    .await;
    let pull = format!(
        "10,000 members: {big_pull:.2} ms for {big_got} (its tip {} B), {big_texts:.2} ms after \
         the tip; 10 members: {small_pull:.2} ms for {small_got} (its tip {} B), \
         {small_texts:.2} ms after the tip",
        big_tip.to_string().len(),
        small_tip.to_string().len(),
    );
    eprintln!("[{name}] mega: full pull of a member, median of 20: {pull}");
    out.figure.insert("mega-pull", pull);
    let overview = "/v1/conversations?limit=50";
    let (big_ov, _) = mega::median_of(addr, "GET", overview, big_member, "", 20).await;
    let (small_ov, _) = mega::median_of(addr, "GET", overview, small_member, "", 20).await;
    let ov = format!("10,000 members: {big_ov:.2} ms; 10 members: {small_ov:.2} ms");
    eprintln!("[{name}] mega: overview of a member, median of 20: {ov}");
    out.figure.insert("mega-overview", ov);

    // 4. Receipts for the newest 100 seqs, the same texts added to both groups until each
    // has 100 after its tips; some members have read them.
    let extra = 100usize.saturating_sub(f.messages);
    send_group(&mut ws, small_cid, "mx", extra).await;
    drop(ws);
    let mut ws = connect(addr, &owner, "top-up").await;
    send_group(&mut ws, cid, "mx", extra).await;
    drop(ws);
    let mut receipts = Vec::new();
    for (gid, asker, readers) in [
        (cid, &owner, &members[..200]),
        (small_cid, &small_owner, &small[..5]),
    ] {
        let info = must(addr, "GET", &format!("/v1/conversations/{gid}"), asker, "").await;
        let last = info["lastSeq"].as_i64().unwrap();
        mega::mark_read(addr, gid, readers, last, 32, Duration::from_secs(120)).await;
        let seqs: Vec<i64> = (last - 99..=last).collect();
        let (ms, answer) = mega::median_of(
            addr,
            "POST",
            &format!("/v1/groups/{gid}/receipts"),
            asker,
            &json!({ "seqs": seqs }).to_string(),
            10,
        )
        .await;
        let list = answer["receipts"].as_array().cloned().unwrap_or_default();
        assert_eq!(list.len(), 100, "receipts of {gid}: {answer}");
        let newest = list.last().cloned().unwrap_or(Value::Null);
        receipts.push(format!(
            "{ms:.2} ms (newest: {} of {} read)",
            newest["read"], newest["of"]
        ));
    }
    let rc = format!(
        "10,000 members: {}; 10 members: {}",
        receipts[0], receipts[1]
    );
    eprintln!("[{name}] mega: receipts for 100 seqs, median of 10: {rc}");
    out.figure.insert("mega-receipts", rc);

    // 4b. Members showing the newest message ask for its receipt at about the same time:
    // MEGA_ASKERS of them, MEGA_ASKING at a time. How long each waited, how long all took,
    // and how many passes over the members the server ran for them.
    let info = must(addr, "GET", &format!("/v1/conversations/{cid}"), &owner, "").await;
    let newest = info["lastSeq"].as_i64().unwrap();
    let before = scrape(addr).await;
    let (each, all) = mega::all_at_once(
        addr,
        "POST",
        &format!("/v1/groups/{cid}/receipts"),
        &members[..MEGA_ASKERS],
        &json!({ "seqs": [newest] }).to_string(),
        MEGA_ASKING,
        Duration::from_secs(300),
    )
    .await;
    let after = scrape(addr).await;
    let passes = match after.get("courier_receipt_passes_total") {
        Some(n) => format!(
            "{}",
            n - before.get("courier_receipt_passes_total").unwrap_or(&0.0)
        ),
        None => "not counted".to_string(),
    };
    let many = format!(
        "all {MEGA_ASKERS} answered in {all:.0} ms; each p50 / p99 {:.2} / {:.2} ms; \
         {passes} passes",
        percentile(&each, 0.5),
        percentile(&each, 0.99)
    );
    eprintln!(
        "[{name}] mega: {MEGA_ASKERS} members ask for the newest receipt, {MEGA_ASKING} at a \
         time: {many}"
    );
    out.figure.insert("mega-receipts-many", many);

    // 5. A live signal (typing) by the owner into the big group, acked once the server
    // has its members: right after a kick (the members read anew) and once more (cached).
    // Five kicks of members who are not online; medians.
    let mut ws = common::server::Ws::connect(addr, &token(&owner), "live")
        .await
        .expect("the owner's WebSocket");
    let (mut after_change, mut cached) = (Vec::new(), Vec::new());
    for (k, gone) in members[MEGA_ONLINE..MEGA_ONLINE + 5].iter().enumerate() {
        must(
            addr,
            "POST",
            &format!("/v1/groups/{cid}/kick"),
            &owner,
            &json!({ "userIds": [gone] }).to_string(),
        )
        .await;
        for (i, into) in [&mut after_change, &mut cached].into_iter().enumerate() {
            let id = format!("tp{k}-{i}");
            let typing = json!({"type": "send", "id": id, "clientMsgId": id,
                "conversationType": 2, "conversationId": cid, "contentType": 5,
                "payload": {"state": "typing"}});
            let t = Instant::now();
            common::server::send_ok(&mut ws, typing).await;
            into.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    drop(ws);
    for v in [&mut after_change, &mut cached] {
        v.sort_by(f64::total_cmp);
    }
    let lv = format!(
        "{:.2} ms right after a member change, {:.2} ms next (median of 5)",
        percentile(&after_change, 0.5),
        percentile(&cached, 0.5)
    );
    eprintln!("[{name}] mega: a live signal into the big group, acked: {lv}");
    out.figure.insert("mega-live", lv);
    eprintln!(
        "[{name}] mega: phase took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    drop(server);
}

/// What one database's run printed: the phases' figures, the server's CPU per delivered
/// message in each, its RSS (MiB) after each.
#[derive(Default)]
struct Figures {
    /// PostgreSQL's own CPU is shown beside the server's.
    postgres: bool,
    figure: HashMap<&'static str, String>,
    cpu: HashMap<&'static str, String>,
    rss: HashMap<&'static str, String>,
}

impl Figures {
    fn record(&mut self, name: &str, pid: u32, key: &'static str, figure: String, cpu: Cpu) {
        let rss = rss_kib(pid);
        let cpu = cpu.shown(self.postgres);
        eprintln!("[{name}] {key}: {figure}; server CPU {cpu} µs/msg; RSS {rss} KiB");
        self.figure.insert(key, figure);
        self.cpu.insert(key, cpu);
        self.rss.insert(key, format!("{}", rss / 1024));
    }
}

async fn run(name: &str, backend: Backend, storage: &str, secs: f64) -> Figures {
    let mut out = Figures {
        postgres: !matches!(backend, Backend::Sqlite),
        ..Figures::default()
    };
    let db = Db::new(&backend, &format!("bench-{name}")).await;
    let storage = &format!(
        "{storage}\n{}",
        std::env::var("BENCH_STORAGE").unwrap_or_default()
    );
    let server = start(&db, storage).await;
    eprintln!(
        "[{name}] server on {} (pid {:?})",
        server.addr,
        server.pid()
    );
    let pid = server.pid().unwrap_or(0);
    // Latency first, on an empty database: the throughput phases leave a large WAL behind.
    if phase("lat") {
        let runs: usize = std::env::var("BENCH_REPEAT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        let mut shown = Vec::new();
        let mut cpus = Vec::new();
        let mut p99s = Vec::new();
        for run in 0..runs {
            let wal = WalMeter::start(&db.url).await;
            let cpu = CpuMeter::start(pid);
            let before = scrape(&server.addr).await;
            let (l, received) =
                latency(&server.addr, &format!("lat{run}"), 5000, secs, false).await;
            let machine = cpu.machine();
            cpus.push(cpu.per(received));
            let commits = commits_between(&before, &scrape(&server.addr).await);
            let wal = wal.since().await;
            let wal_shown = wal.as_ref().map(|w| format!("; {w}")).unwrap_or_default();
            eprintln!(
                "[{name}] latency at 5000 msgs/s, run {}: {} ({} samples; {commits}; {machine}{wal_shown})",
                run + 1,
                l.shown(),
                l.n
            );
            let segments = wal
                .map(|w| format!(", {}", w.segments()))
                .unwrap_or_default();
            shown.push(format!(
                "{} (steal {} ms{segments})",
                l.shown(),
                machine.steal_ms
            ));
            p99s.push(l.p99);
        }
        if runs > 1 {
            p99s.sort_by(f64::total_cmp);
            let m = p99s.len() / 2;
            let median = match p99s.len() % 2 {
                1 => p99s[m],
                _ => (p99s[m - 1] + p99s[m]) / 2.0,
            };
            shown.push(format!("median p99 {median:.2} ms"));
        }
        out.record(name, pid, "lat", shown.join("; "), Cpu::mean(&cpus));
    }
    if phase("pingpong") {
        let cpu = CpuMeter::start(pid);
        let stored = ping_pong(&server.addr, "pps", 1, json!({"text": "ping"}), 2100).await;
        out.record(
            name,
            pid,
            "pp-stored",
            format!("{} ({} hops)", stored.shown(), stored.n),
            cpu.per(2100),
        );
        let cpu = CpuMeter::start(pid);
        let call = json!({"action": "invite", "callId": "c-1", "media": "audio"});
        let live = ping_pong(&server.addr, "ppl", 6, call, 2100).await;
        out.record(
            name,
            pid,
            "pp-live",
            format!("{} ({} hops)", live.shown(), live.n),
            cpu.per(2100),
        );
    }
    if phase("seq") {
        let (fsync_p50, fsync_p99) = fsync_probe(&db.dir);
        let cpu = CpuMeter::start(pid);
        // Per send, the warm-up's included: the meter runs from before it.
        let (rate, waits, sends) = sequential(&server.addr, "sq", secs).await;
        out.record(
            name,
            pid,
            "seq",
            format!(
                "{rate:.0} acked/s; ack {} (fsync here p50 / p99 {fsync_p50:.3} / {fsync_p99:.3} ms)",
                waits.shown()
            ),
            cpu.per(sends),
        );
    }
    for (senders, key) in [(1, "tp1"), (16, "tp16"), (256, "tp256")] {
        if !phase("tp") {
            break;
        }
        let cpu = CpuMeter::start(pid);
        let (r, acked) = throughput(&server.addr, &format!("{key}x"), senders, 64, secs).await;
        out.record(name, pid, key, format!("{r:.0}"), cpu.per(acked));
    }
    if phase("pull") {
        let pull = pull_missed(&server.addr, "pull").await;
        eprintln!("[{name}] pull 1000 missed: {pull:.2} ms");
        out.figure.insert("pull", format!("{pull:.2} ms"));
    }
    if phase("live") {
        let typing = json!({"state": "typing"});
        let l = live(&server.addr, pid, "live", secs, 5, &typing).await;
        out.record(
            name,
            pid,
            "live",
            format!(
                "{:.0} acked/s ({} pushes received, coalesced)",
                l.rate, l.received
            ),
            // Per send the server handled (most pushes are coalesced away).
            l.cpu.per(l.acked),
        );
        // Call signalling: every signal is delivered, none coalesced.
        let call = json!({"action": "invite", "callId": "c-1", "media": "audio"});
        let l = live(&server.addr, pid, "sig", secs, 6, &call).await;
        let per = l.cpu.per(l.received);
        out.record(
            name,
            pid,
            "signal",
            format!(
                "{:.0} acked/s, {} delivered: {:.0} delivered per server CPU-second",
                l.rate,
                l.received,
                1e6 / per.server.max(f64::MIN_POSITIVE)
            ),
            per,
        );
    }
    if phase("group") {
        let f = group_fanout(
            std::slice::from_ref(&server.addr),
            "gf",
            1000,
            10.0,
            secs,
            50,
            Some(pid),
        )
        .await;
        let every = if f.mismatches == 0 {
            "every device got every message once".to_string()
        } else {
            format!(
                "MISMATCH: {} (device, message) pairs not received exactly once",
                f.mismatches
            )
        };
        eprintln!(
            "[{name}] group fan-out 1000 members online, 10 msgs/s: p50 {:.2} ms, p99 {:.2} ms, \
             max {:.2} ms ({} messages, {every})",
            f.p50, f.p99, f.max, f.messages
        );
        out.record(
            name,
            pid,
            "group",
            format!(
                "{:.2} / {:.2} / {:.2} ms ({} messages, {})",
                f.p50,
                f.p99,
                f.max,
                f.messages,
                if f.mismatches == 0 {
                    "all once".to_string()
                } else {
                    format!("{} mismatches", f.mismatches)
                }
            ),
            // Per delivery: each message reaches the 999 other members' devices.
            f.cpu.expect("metered"),
        );
        let p = interval_pull(&server.addr, "gi", 300).await;
        let check = if p.got == p.expected && p.wrong == 0 {
            String::new()
        } else {
            format!(", MISMATCH: {} seqs differ", p.wrong)
        };
        eprintln!(
            "[{name}] pull, member with 3 intervals: {:.2} ms for {} messages (expected {}{check}) \
             (1 interval: {:.2} ms for {})",
            p.ms, p.got, p.expected, p.one_ms, p.one_got
        );
        out.figure.insert(
            "gpull",
            format!(
                "{:.2} ms for {} (expected {}{check}); 1 interval: {:.2} ms for {}",
                p.ms, p.got, p.expected, p.one_ms, p.one_got
            ),
        );
    }
    drop(server);
    if phase("mega") {
        mega_phase(name, &backend, storage, secs, &mut out).await;
    }
    if phase("receipts") {
        receipts_phase(name, &backend, storage, secs, &mut out).await;
    }
    if phase("offline") {
        offline_phase(name, &backend, storage, secs, &mut out).await;
    }
    if !phase("mem") {
        return out;
    }
    // A fresh server for the memory figure.
    let server = start(&db, storage).await;
    let (per, before, after) = idle_memory(&server, "mem", 10_000).await;
    eprintln!("[{name}] idle connections: {per:.0} B each (RSS {before} KiB → {after} KiB)");
    out.figure.insert(
        "mem",
        format!("{:.2} KiB (RSS {before} → {after} KiB)", per / 1024.0),
    );
    out
}

fn main() {
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut results = Vec::new();
    for (name, sync) in [("SQLite (full)", "full"), ("SQLite (normal)", "normal")] {
        if !(only.is_empty() || only == "sqlite" || only == format!("sqlite-{sync}")) {
            continue;
        }
        let storage = format!("sqlite_synchronous = \"{sync}\"");
        let figures = rt.block_on(run(
            &format!("sqlite-{sync}"),
            Backend::Sqlite,
            &storage,
            secs,
        ));
        results.push((name, figures));
    }
    if only.is_empty() || only == "postgres" {
        // Without it, `Backend::postgres` says why it is skipped.
        if let Some(pg) = Backend::postgres("bench") {
            results.push(("PostgreSQL", rt.block_on(run("postgres", pg, "", secs))));
        }
    }
    println!(
        "\n| figure | {} |",
        results
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(results.len()));
    let row = |label: &str, pick: &dyn Fn(&Figures) -> Option<String>| {
        println!(
            "| {label} | {} |",
            results
                .iter()
                .map(|(_, r)| pick(r).unwrap_or_default())
                .collect::<Vec<_>>()
                .join(" | ")
        );
    };
    for (key, label) in [
        (
            "seq",
            "persistent 1:1, 1 sender waiting for each ack: acked msgs/s; ack p50 / p99 / p999",
        ),
        (
            "tp1",
            "persistent 1:1, 1 sender (64 in flight), acked msgs/s",
        ),
        ("tp16", "persistent 1:1, 16 senders, acked msgs/s"),
        ("tp256", "persistent 1:1, 256 senders, acked msgs/s"),
        (
            "lat",
            "send → push latency at 5,000 msgs/s, p50 / p99 / p999 (each run; steal: CPU the hypervisor gave elsewhere; segment files: PostgreSQL's `pg_wal` before → after, one more with no checkpoint is a segment created)",
        ),
        (
            "pp-stored",
            "ping-pong, stored kind (text), each hop p50 / p99 / p999",
        ),
        (
            "pp-live",
            "ping-pong, live kind (rtc-call), each hop p50 / p99 / p999",
        ),
        ("pull", "pull 1,000 missed messages (2 pages), median"),
        ("live", "typing (latest), 16 senders"),
        (
            "signal",
            "call signalling (rtc-call, live), 16 senders; CPU per delivered signal",
        ),
        (
            "group",
            "group fan-out, 1,000 members online, 10 msgs/s, until every device has it, p50 / p99 / max",
        ),
        (
            "gpull",
            "full pull of a group member with 3 membership intervals, median",
        ),
        (
            "mega-grow",
            "10,000-member group: create with 500, then add batches of 500 (p50 / max)",
        ),
        (
            "mega",
            "10,000-member group, 2,000 online, 5 msgs/s, until the last device has it, p50 / p99 / max",
        ),
        (
            "mega-pull",
            "full pull of a member, 10,000- vs 10-member group, median",
        ),
        (
            "mega-overview",
            "overview of a member, 10,000- vs 10-member group, median",
        ),
        (
            "mega-receipts",
            "group receipts for 100 seqs, 10,000- vs 10-member group, median",
        ),
        (
            "mega-receipts-many",
            "1,000 members of the 10,000-member group ask for the newest receipt, 64 at a time",
        ),
        (
            "mega-live",
            "a typing signal into the 10,000-member group, acked: after a kick / next",
        ),
        (
            "rc-on",
            "1:1, receivers online, 16 senders: delivery receipts on (a received per push)",
        ),
        ("rc-off", "… delivery receipts off"),
        (
            "rc-lat-on",
            "send → push at 5,000 msgs/s, receipts on (a received per push), p50 / p99 / p999",
        ),
        ("rc-lat-off", "… receipts off"),
        (
            "first-on",
            "first messages (each a new conversation) to 10,000 offline users with push tokens, 16 senders: webhook on",
        ),
        ("first-off", "… webhook off"),
        (
            "push-on",
            "1:1 to 10,000 offline users with push tokens, 16 senders: webhook on",
        ),
        ("push-off", "… webhook off"),
        (
            "firsts-on",
            "first messages to those 10,000 offline users for the phase's seconds, 16 senders each to the 9,375 outside its share, then to all as a new user (each a new conversation): webhook on",
        ),
        ("firsts-off", "… webhook off"),
        (
            "mem",
            "server memory per idle connection, 10,000 connections",
        ),
    ] {
        row(label, &|r| r.figure.get(key).cloned());
        if results.iter().any(|(_, r)| r.cpu.contains_key(key)) {
            row(
                "… server CPU µs per delivered message (the kernel's part)",
                &|r| r.cpu.get(key).cloned(),
            );
            row("… server RSS after, MiB", &|r| r.rss.get(key).cloned());
        }
    }
}
