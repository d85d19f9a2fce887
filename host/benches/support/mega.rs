//! The client side of the 10,000-member group phase (`mega` in the messaging bench): many
//! users made with bounded concurrency, a group grown in batches the way a client grows
//! one, devices of an existing group brought online, the fan-out of its messages to the
//! last of them, and the median of repeated requests. Every loop is bounded by a count
//! and by time; everything is on loopback.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream};
use serde_json::{Value, json};

use crate::support::{
    Cpu, CpuMeter, FanOut, acks_of, connect, fanout_of, http, must, percentile, read_group,
    send_paced, wait_complete,
};

/// Makes `users` known to the server (a token of theirs used once), `concurrency` requests
/// at a time, none started after `limit`. Panics unless every one answered 200.
pub async fn make_users(addr: &str, users: &[String], concurrency: usize, limit: Duration) {
    let until = Instant::now() + limit;
    let made = stream::iter(users)
        .map(|u| async move {
            if Instant::now() > until {
                return false;
            }
            http(addr, "GET", "/v1/friends", u, "").await.0 == 200
        })
        .buffer_unordered(concurrency)
        .fold(0usize, |n, ok| async move { n + usize::from(ok) })
        .await;
    assert_eq!(
        made,
        users.len(),
        "made {made} of {} users within {limit:?}",
        users.len()
    );
}

/// A group grown as a client grows one: what the creation took, then each add batch's.
pub struct Grown {
    pub cid: i64,
    pub create_ms: f64,
    /// Per add batch, in order, ms.
    pub batches: Vec<f64>,
    /// `memberCount` of the group info at the end.
    pub members: i64,
}

/// `owner` creates a group with the first `first` of `members`, then adds the rest in
/// batches of `batch` (`POST /v1/groups/{id}/members`), each timed; all within `limit`.
pub async fn grow_group(
    addr: &str,
    owner: &str,
    members: &[String],
    first: usize,
    batch: usize,
    limit: Duration,
) -> Grown {
    let until = Instant::now() + limit;
    let first = first.min(members.len());
    let t = Instant::now();
    let group = must(
        addr,
        "POST",
        "/v1/groups",
        owner,
        &json!({"name": "mega", "members": members[..first]}).to_string(),
    )
    .await;
    let create_ms = t.elapsed().as_secs_f64() * 1000.0;
    let cid = group["conversationId"].as_i64().unwrap();
    let path = format!("/v1/groups/{cid}/members");
    let mut batches = Vec::new();
    for chunk in members[first..].chunks(batch) {
        assert!(
            Instant::now() < until,
            "growing the group to {} members took over {limit:?} ({} batches done)",
            members.len() + 1,
            batches.len()
        );
        let body = json!({ "userIds": chunk }).to_string();
        let t = Instant::now();
        let added = must(addr, "POST", &path, owner, &body).await;
        batches.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(
            added["added"].as_array().map_or(0, Vec::len),
            chunk.len(),
            "add batch {}",
            batches.len()
        );
    }
    let info = must(addr, "GET", &format!("/v1/groups/{cid}"), owner, "").await;
    Grown {
        cid,
        create_ms,
        batches,
        members: info["memberCount"].as_i64().unwrap_or(0),
    }
}

/// The fan-out of `n` texts `sender` sends at `rate` msgs/s into the existing group `cid`,
/// with one device of each of `online` (members other than the sender) connected first,
/// `concurrency` connections opened at a time, all within `connect_limit`. Per message,
/// the time from just before its send until the last of those devices has its `notify`;
/// and the server's (process `pid`) CPU from the first send until every device had every
/// message, µs.
#[allow(clippy::too_many_arguments)]
// Each connect yields its reader's handle on purpose: the readers are awaited after the sends.
#[allow(clippy::async_yields_async)]
pub async fn fanout_online(
    addr: &str,
    pid: u32,
    cid: i64,
    sender: &str,
    online: &[String],
    rate: f64,
    n: usize,
    connect_limit: Duration,
) -> (FanOut, Cpu) {
    // Readers wait on their socket, on this, and on a 30 s heartbeat tick (connecting
    // thousands of devices can take longer than the server's heartbeat).
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let conversation = format!("\"conversationId\":{cid},");
    let complete = Arc::new(AtomicUsize::new(0));
    let connect_until = Instant::now() + connect_limit;
    let readers: Vec<_> = stream::iter(online)
        .map(|u| {
            let (stopped, complete) = (stopped.clone(), complete.clone());
            let conversation = conversation.clone();
            async move {
                assert!(
                    Instant::now() < connect_until,
                    "connecting {} devices took over {connect_limit:?}",
                    online.len()
                );
                let ws = connect(addr, u, "d").await;
                read_group(ws, n, conversation, complete, stopped)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let ws = connect(addr, sender, "d").await;
    // Routes of the new devices settle first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut sink, stream) = ws.split();
    // The sender's connection gets only the acks.
    let acks = acks_of(stream, n, rate);
    let cpu = CpuMeter::start(pid);
    let sent_at = send_paced(&mut sink, cid, "mega", n, rate).await;
    let seqs = acks.await.unwrap();
    wait_complete(&complete, readers.len()).await;
    let cpu_us = cpu.per(1);
    let online_devices = vec![online.len() + 1];
    let f = fanout_of(stop, readers, &sent_at, &seqs, online_devices).await;
    drop(sink);
    (f, cpu_us)
}

/// Median of `n` answers to one request (each must be 200), ms, and the last answer.
pub async fn median_of(
    addr: &str,
    method: &str,
    path: &str,
    user: &str,
    body: &str,
    n: usize,
) -> (f64, Value) {
    let mut times = Vec::with_capacity(n);
    let mut last = Value::Null;
    for _ in 0..n {
        let t = Instant::now();
        last = must(addr, method, path, user, body).await;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    (percentile(&times, 0.5), last)
}

/// `users` mark `cid` read up to `seq`, `concurrency` at a time, none started after `limit`.
pub async fn mark_read(
    addr: &str,
    cid: i64,
    users: &[String],
    seq: i64,
    concurrency: usize,
    limit: Duration,
) {
    let until = Instant::now() + limit;
    let path = format!("/v1/conversations/{cid}/read");
    let body = json!({ "seq": seq }).to_string();
    let done = stream::iter(users)
        .map(|u| {
            let (path, body) = (&path, &body);
            async move {
                if Instant::now() > until {
                    return false;
                }
                http(addr, "POST", path, u, body).await.0 == 200
            }
        })
        .buffer_unordered(concurrency)
        .fold(0usize, |n, ok| async move { n + usize::from(ok) })
        .await;
    assert_eq!(done, users.len(), "read marks within {limit:?}");
}

/// Each of `users` makes the same request once, `concurrency` at a time, none started
/// after `limit`: how long each answer took (ms, sorted) and how long all took (ms).
/// Panics unless every one answered 200.
pub async fn all_at_once(
    addr: &str,
    method: &str,
    path: &str,
    users: &[String],
    body: &str,
    concurrency: usize,
    limit: Duration,
) -> (Vec<f64>, f64) {
    let until = Instant::now() + limit;
    let t = Instant::now();
    let mut times: Vec<f64> = stream::iter(users)
        .map(|u| async move {
            if Instant::now() > until {
                return None;
            }
            let t = Instant::now();
            let (status, _) = http(addr, method, path, u, body).await;
            (status == 200).then(|| t.elapsed().as_secs_f64() * 1000.0)
        })
        .buffer_unordered(concurrency)
        .filter_map(|ms| async move { ms })
        .collect()
        .await;
    let all = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(
        times.len(),
        users.len(),
        "{method} {path}: {} of {} answered 200 within {limit:?}",
        times.len(),
        users.len()
    );
    times.sort_by(f64::total_cmp);
    (times, all)
}
