//! The client side of the devices phases of the messaging bench: 1:1 senders with their
//! receivers online, each receiver answering every push with a `received` frame (or not);
//! offline users with push tokens; a webhook receiver on loopback that answers at once and
//! counts what it got. Every loop is bounded by a count and by time; everything is on
//! loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt, stream};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{connect, frame, must, open_known};

/// What a 1:1 run with receivers online counted.
pub struct Online {
    /// Acked sends per second until the deadline.
    pub rate: f64,
    pub acked: u64,
    /// Pushes the receivers got.
    pub pushed: u64,
    /// `delivered` frames the senders got.
    pub delivered: u64,
}

/// `senders` connections, each its own 1:1 conversation with a receiver online, each
/// keeping `window` sends in flight for `secs`; with `receipts`, every receiver answers
/// each push with a `received` frame (a client acknowledging message by message: the most
/// the server is asked to do).
pub async fn one_to_one_online(
    addr: &str,
    tag: &str,
    senders: usize,
    window: u64,
    secs: f64,
    receipts: bool,
) -> Online {
    let (acked, pushed, delivered) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let until = deadline + Duration::from_secs(10);
    let mut tasks = Vec::new();
    let started = Instant::now();
    for i in 0..senders {
        let a = format!("{tag}s{i}");
        let b = format!("{tag}r{i}");
        let cid = open_known(addr, &a, &b).await;
        let mut rx = connect(addr, &b, "r").await;
        let pushed = pushed.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let Ok(Some(Ok(Message::Text(t)))) =
                    tokio::time::timeout_at(until.into(), rx.next()).await
                else {
                    break;
                };
                if !t.as_str().starts_with(r#"{"type":"notify""#) {
                    continue;
                }
                pushed.fetch_add(1, Ordering::Relaxed);
                if receipts {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    let received =
                        json!({"type": "received", "conversationId": cid, "seq": v["seq"]});
                    if rx
                        .send(Message::Text(received.to_string().into()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }));
        let (addr, acked, delivered) = (addr.to_string(), acked.clone(), delivered.clone());
        tasks.push(tokio::spawn(async move {
            let mut ws = connect(&addr, &a, "d").await;
            let to = json!({"conversationId": cid});
            let (mut sent, mut got) = (0u64, 0u64);
            while Instant::now() < until && (got < sent || Instant::now() < deadline) {
                while Instant::now() < deadline && sent - got < window && sent < 10_000_000 {
                    let text = json!({"text": "hello, this is a benchmark message"});
                    ws.feed(frame(&format!("o{i}-{sent}"), &to, 1, text))
                        .await
                        .unwrap();
                    sent += 1;
                }
                ws.flush().await.unwrap();
                match tokio::time::timeout_at(until.into(), ws.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) => {
                        if t.as_str().starts_with(r#"{"type":"ack""#) {
                            got += 1;
                            if Instant::now() <= deadline {
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                        } else if t.as_str().starts_with(r#"{"type":"delivered""#) {
                            delivered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
        }));
    }
    tokio::time::sleep_until(deadline.into()).await;
    let elapsed = started.elapsed().as_secs_f64();
    let rate = acked.load(Ordering::Relaxed) as f64 / elapsed;
    // The receivers read on until `until`: they are stopped, the senders drained.
    for t in tasks {
        let _ = tokio::time::timeout_at(until.into(), t).await;
    }
    Online {
        rate,
        acked: acked.load(Ordering::Relaxed),
        pushed: pushed.load(Ordering::Relaxed),
        delivered: delivered.load(Ordering::Relaxed),
    }
}

/// A webhook on loopback that answers 200 at once; its address and the notices it got.
pub async fn webhook_sink() -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let got = Arc::new(AtomicU64::new(0));
    let counter = got.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let counter = counter.clone();
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let counter = counter.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        counter.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from_static(b"{}"),
                        )))
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    (addr, got)
}

/// Gives each of `users` a device with a push token, `concurrency` users at a time, none
/// started after `limit`; panics unless every one answered 200.
pub async fn push_tokens(addr: &str, users: &[String], concurrency: usize, limit: Duration) {
    let until = Instant::now() + limit;
    let done = stream::iter(users)
        .map(|u| async move {
            if Instant::now() > until {
                return false;
            }
            must(
                addr,
                "POST",
                "/v1/devices",
                u,
                r#"{"deviceId":"phone","platform":"ios"}"#,
            )
            .await;
            let token = format!(r#"{{"provider":"apns","token":"token-of-{u}"}}"#);
            must(addr, "PUT", "/v1/devices/phone/push", u, &token).await;
            true
        })
        .buffer_unordered(concurrency)
        .fold(0usize, |n, ok| async move { n + usize::from(ok) })
        .await;
    assert_eq!(
        done,
        users.len(),
        "tokens for {done} of {} users",
        users.len()
    );
}

/// Which of `to_many`'s recipients a sender texts.
#[derive(Clone, Copy)]
pub enum Share {
    /// Its own share: every `senders`-th recipient from its index on.
    Own,
    /// Every recipient outside its own share, each a new conversation after `Own`: once
    /// it texted them all, and those sends were acked, the sender connects as a new user
    /// (`{tag}s{i}n{k}`, known once its token is used) and texts them all again.
    Others,
}

/// `senders` connections sending texts by peer id to `recipients` in turn (each sender
/// its `share`), `window` in flight each, for `secs` or until each sent `cap`: acked
/// sends per second until `secs`, and every send acked (those in flight at `secs` too).
/// `round` keeps the client message ids of one call apart from another's.
pub async fn to_many(
    addr: &str,
    (tag, round): (&str, &str),
    recipients: &[String],
    (senders, window, share): (usize, u64, Share),
    secs: f64,
    cap: u64,
) -> (f64, u64) {
    let acked = Arc::new(AtomicU64::new(0));
    let all_acked = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let until = deadline + Duration::from_secs(10);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..senders {
        let peers: Vec<String> = recipients
            .iter()
            .enumerate()
            .filter(|(j, _)| (j % senders == i) == matches!(share, Share::Own))
            .map(|(_, r)| r.clone())
            .collect();
        let (addr, round) = (addr.to_string(), round.to_string());
        let (acked, all_acked) = (acked.clone(), all_acked.clone());
        let sender = format!("{tag}s{i}");
        tasks.push(tokio::spawn(async move {
            let mut ws = connect(&addr, &sender, "d").await;
            let (mut sent, mut got) = (0u64, 0u64);
            // `Others`: the users this sender has connected as.
            let mut users = 1;
            while Instant::now() < until
                && (got < sent || (Instant::now() < deadline && sent < cap))
            {
                while Instant::now() < deadline && sent - got < window && sent < cap {
                    let at = sent as usize % peers.len();
                    if matches!(share, Share::Others) && sent > 0 && at == 0 {
                        if got < sent {
                            break;
                        }
                        ws = connect(&addr, &format!("{sender}n{users}"), "d").await;
                        users += 1;
                    }
                    let peer = &peers[at];
                    let to = json!({"peerId": peer});
                    let text = json!({"text": "are you there?"});
                    ws.feed(frame(&format!("{round}m{i}-{sent}"), &to, 1, text))
                        .await
                        .unwrap();
                    sent += 1;
                }
                ws.flush().await.unwrap();
                match tokio::time::timeout_at(until.into(), ws.next()).await {
                    Ok(Some(Ok(Message::Text(t))))
                        if t.as_str().starts_with(r#"{"type":"ack""#) =>
                    {
                        got += 1;
                        all_acked.fetch_add(1, Ordering::Relaxed);
                        if Instant::now() <= deadline {
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
        }));
    }
    let mut all = std::pin::pin!(futures_util::future::join_all(tasks));
    let done = tokio::time::timeout_at(deadline.into(), &mut all)
        .await
        .is_ok();
    let rate = acked.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    if !done {
        let _ = tokio::time::timeout_at(until.into(), all).await;
    }
    (rate, all_acked.load(Ordering::Relaxed))
}
