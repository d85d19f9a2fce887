//! The WebSocket gateway: authenticates the upgrade, registers the device, then runs one
//! task per connection that reads frames and writes the connection's outbox. The task
//! never waits for the database on a send: stored sends go to the committer and their
//! acks come back through the outbox.

pub mod frames;
pub mod hub;
pub mod outbox;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::SinkExt as _;
use serde::Deserialize;

use crate::api::{ApiError, AppState, bearer};
use crate::messaging::Core;
use crate::store::batch::Op;
use crate::store::now_ms;
use frames::{Peek, ReadFrame, SendFrame};
use hub::Device;
use outbox::Close;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connect {
    token: Option<String>,
    device_id: Option<String>,
}

fn valid_device_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
}

/// `GET /v1/ws?deviceId=…[&token=…]`: the token from the query or `Authorization: Bearer`.
pub async fn upgrade(
    State(s): State<AppState>,
    query: Result<Query<Connect>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("bad query: {e}")))?;
    let token = q
        .token
        .or_else(|| bearer(&headers).map(str::to_string))
        .ok_or_else(ApiError::unauthorized)?;
    let core = s.core.clone();
    let user_id = core
        .tokens
        .verify(&token)
        .map_err(|e| ApiError::token(&e))?;
    let device_id = q.device_id.filter(|d| valid_device_id(d)).ok_or_else(|| {
        ApiError::bad_request("deviceId (1 to 64 of A-Z a-z 0-9 _ . - :) is required")
    })?;
    let ws = ws.map_err(|e| ApiError::bad_request(format!("not a WebSocket upgrade: {e}")))?;
    core.ensure_user(&user_id).await?;
    let max = core.settings.max_frame_bytes;
    Ok(ws
        .max_message_size(max * 4)
        .max_frame_size(max * 4)
        .read_buffer_size(1024)
        .write_buffer_size(0)
        .on_upgrade(move |socket| run(core, socket, user_id, device_id))
        .into_response())
}

/// A token bucket: `rate` per second, up to `burst` at once.
struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u32, burst: u32) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            rate: f64::from(rate),
            burst: f64::from(burst),
            at: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

async fn run(core: Arc<Core>, mut socket: WebSocket, user_id: String, device_id: String) {
    let set = &core.settings;
    let device = Arc::new(Device::new(user_id, device_id, set.outbox_frames));
    // Queued before registering, so even a connection replaced at once says hello first.
    device.outbox.reply(frames::hello(
        &device.user_id,
        &device.device_id,
        device.session,
        set.heartbeat_secs,
        set.max_frame_bytes,
    ));
    core.hub.register(device.clone());
    let heartbeat = Duration::from_secs(set.heartbeat_secs);
    // A client that stops reading blocks our writes once the kernel buffers are full; it
    // gets this long before it is dropped (its outbox stays bounded meanwhile).
    let write_limit = heartbeat.min(WRITE_TIMEOUT);
    let silence = tokio::time::sleep(heartbeat);
    tokio::pin!(silence);
    let mut bucket = Bucket::new(set.send_rate_per_sec, set.send_burst);
    let mut out: Vec<Utf8Bytes> = Vec::new();
    let close = loop {
        tokio::select! {
            biased;
            closing = device.outbox.next(&mut out) => {
                match write_all(&mut socket, &mut out, write_limit).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break None,
                    Err(_) => {
                        tracing::info!(user = %device.user_id, device = %device.device_id, "closing the connection: it stopped reading");
                        break None;
                    }
                }
                if let Some(why) = closing {
                    break Some(why);
                }
            }
            incoming = socket.recv(), if device.may_read() => {
                let msg = match incoming {
                    Some(Ok(msg)) => msg,
                    Some(Err(e)) => break Some(read_failure(&e)),
                    None => break None,
                };
                silence.as_mut().reset(tokio::time::Instant::now() + heartbeat);
                match msg {
                    // Boxed: the frame's work lives on the heap only while it runs, so an idle
                    // connection's task stays small.
                    Message::Text(text) => Box::pin(handle(&core, &device, &mut bucket, text.as_str())).await,
                    Message::Binary(_) => {
                        device.in_flight.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                        device.answer(frames::error(None, &ApiError::frame("bad_frame", "frames are JSON text, not binary")));
                    }
                    Message::Close(_) => break None,
                    Message::Ping(_) | Message::Pong(_) => {}
                }
            }
            () = &mut silence => break Some(Close::Heartbeat),
        }
    };
    core.hub
        .unregister(&device.user_id, &device.device_id, device.session);
    if let Some(why) = close {
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            say_goodbye(&mut socket, why, &device),
        )
        .await;
    }
}

/// Tells the client why it is being closed: a `kicked` frame for a replaced connection,
/// then the close frame.
async fn say_goodbye(socket: &mut WebSocket, why: Close, device: &Device) {
    {
        if why != Close::Replaced {
            tracing::info!(user = %device.user_id, device = %device.device_id, "closing the connection: {}", why.reason());
        }
        if why == Close::Replaced {
            let _ = socket
                .send(Message::Text(frames::kicked(
                    "replaced",
                    "this device connected again; this connection is closed",
                )))
                .await;
        }
        let _ = socket
            .send(Message::Close(Some(CloseFrame {
                code: why.code(),
                reason: Utf8Bytes::from_static(why.reason()),
            })))
            .await;
    }
}

/// A frame the WebSocket layer refused: above four times the frame limit (1009), or not
/// WebSocket at all (1002).
fn read_failure(e: &axum::Error) -> Close {
    let text = e.to_string();
    tracing::debug!("WebSocket read failed: {text}");
    if text.contains("too long") || text.contains("Space limit") {
        Close::TooBig
    } else {
        Close::Protocol
    }
}

/// How long a write may wait for a client that does not read (at most the heartbeat).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes the frames; `Err(Elapsed)` if one of them (or the flush) waited longer than
/// `limit`, which only a client that stopped reading makes happen.
async fn write_all(
    socket: &mut WebSocket,
    out: &mut Vec<Utf8Bytes>,
    limit: Duration,
) -> Result<Result<(), axum::Error>, tokio::time::error::Elapsed> {
    for frame in out.drain(..) {
        if let Err(e) = tokio::time::timeout(limit, socket.feed(Message::Text(frame))).await? {
            return Ok(Err(e));
        }
    }
    tokio::time::timeout(limit, socket.flush()).await
}

/// One client frame. Every error is answered on the connection, which stays open.
async fn handle(core: &Arc<Core>, device: &Arc<Device>, bucket: &mut Bucket, text: &str) {
    // Every frame gets exactly one answer (`Device::answer`), which ends its flight.
    device
        .in_flight
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let reply_err = |id: Option<&str>, e: ApiError| {
        device.answer(frames::error(id, &e));
    };
    if text.len() > core.settings.max_frame_bytes {
        return reply_err(
            None,
            ApiError::frame(
                "frame_too_large",
                format!(
                    "the frame is {} bytes, the limit is {}",
                    text.len(),
                    core.settings.max_frame_bytes
                ),
            ),
        );
    }
    let peek: Peek = match serde_json::from_str(text) {
        Ok(p) => p,
        Err(e) => {
            return reply_err(
                None,
                ApiError::frame("bad_frame", format!("not a JSON object: {e}")),
            );
        }
    };
    let id = match &peek.id {
        Some(serde_json::Value::String(s)) if s.len() <= 64 => Some(s.as_str()),
        None => None,
        Some(_) => {
            return reply_err(
                None,
                ApiError::frame("bad_frame", "id must be a string of at most 64 bytes"),
            );
        }
    };
    match peek.kind.as_deref() {
        Some("send") => {
            if !bucket.take() {
                return reply_err(
                    id,
                    ApiError::frame(
                        "rate_limited",
                        format!(
                            "more than {} sends per second on this connection; slow down",
                            core.settings.send_rate_per_sec
                        ),
                    ),
                );
            }
            match serde_json::from_str::<SendFrame>(text) {
                Ok(req) => core.send_from(device, req).await,
                Err(e) => reply_err(
                    id,
                    ApiError::frame("bad_frame", format!("bad send frame: {e}")),
                ),
            }
        }
        Some("read") => match serde_json::from_str::<ReadFrame>(text) {
            Ok(r) => {
                core.submit(
                    Op::Read {
                        user_id: device.user_id.clone(),
                        conversation_id: r.conversation_id,
                        seq: r.seq,
                    },
                    crate::messaging::Reply::Ws {
                        device: device.clone(),
                        id: r.id,
                    },
                )
                .await;
            }
            Err(e) => reply_err(
                id,
                ApiError::frame("bad_frame", format!("bad read frame: {e}")),
            ),
        },
        Some("ping") => {
            device.answer(frames::pong(id, now_ms()));
        }
        Some(other) => reply_err(
            id,
            ApiError::frame("unknown_frame_type", format!("no frame type {other:?}")),
        ),
        None => reply_err(id, ApiError::frame("bad_frame", "the frame has no type")),
    }
}
