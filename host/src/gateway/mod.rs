//! The WebSocket gateway: authenticates the upgrade, registers the device, then runs one
//! task per connection that reads frames and writes the connection's outbox. Stored sends
//! go to the committer and their acks come back through the outbox; a frame whose work
//! must wait for the database first (`Waiting`) holds the frames after it, while the
//! connection goes on writing its pushes and answering its pings.

pub mod hub;
pub mod links;
pub mod outbox;

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes, error::ProtocolError};

use crate::clock::now_ms;
use crate::limits::{Bucket, Guard};
use crate::messaging::Respond;
use crate::messaging::batch::Op;
use crate::messaging::{Core, Session};
use crate::protocol::{Code, Error, Peer, bearer, frames};
use crate::telemetry;
use frames::{DeviceSendFrame, MailboxAckFrame, Peek, ReadFrame, SendFrame};
use hub::{Device, Hub};
use tracing::Instrument as _;

/// What the WebSocket needs: the core (sends, reads, who may connect), this node's hub
/// (the connections it registers) and what else hears of them (`links`).
#[derive(Clone)]
pub struct Gateway {
    pub core: Arc<Core>,
    pub hub: Arc<Hub>,
    pub links: Arc<dyn links::Links>,
}
use outbox::{Close, Frame};

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connect {
    token: Option<String>,
    device_id: Option<String>,
    /// `true`: this connection hears its friends' presence changes.
    #[serde(default)]
    presence: bool,
    /// The device's name and platform, recorded when it registers (or changed).
    device_name: Option<String>,
    platform: Option<String>,
}

/// `GET /v1/ws?deviceId=…[&token=…][&presence=true]`: the token from the query or `Authorization: Bearer`.
#[utoipa::path(get, path = "/v1/ws", tag = "websocket",
    description = "The WebSocket upgrade (RFC 6455: `Connection: upgrade`, `Upgrade: websocket`, `Sec-WebSocket-Version: 13`, `Sec-WebSocket-Key`); the frames are in docs/protocol.md",
    security(("userToken" = []), ()),
    params(
        ("deviceId" = String, Query, description = "1 to 64 of A-Z a-z 0-9 _ . - :"),
        ("token" = Option<String>, Query, description = "the user's token, when not in `Authorization: Bearer`"),
        ("presence" = Option<bool>, Query, description = "`true`: this connection gets its friends' `presence` frames"),
        ("deviceName" = Option<String>, Query, description = "the device's name, at most 64 characters (recorded when it registers, or changed)"),
        ("platform" = Option<String>, Query, description = "the device's platform (ios, android, web, …), at most 64 characters"),
    ),
    responses((status = 101, description = "Switching Protocols: the connection is a WebSocket")))]
pub async fn upgrade(
    State(gateway): State<Gateway>,
    query: Result<Query<Connect>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    mut req: axum::extract::Request,
) -> Result<Response, Error> {
    let Query(q) = query.map_err(|e| Error::bad_request(format!("bad query: {e}")))?;
    let token = q
        .token
        .or_else(|| bearer(&headers).map(str::to_string))
        .ok_or_else(Error::unauthorized)?;
    let core = gateway.core.clone();
    let session = core.authenticate(&token).await?;
    let device_id = match q.device_id {
        Some(d) if crate::auth::valid_device_id(&d) => d,
        given => {
            return Err(Error::bad_request(format!(
                "deviceId ({}) is {}",
                crate::auth::DEVICE_ID_RULE,
                if given.is_some() {
                    "not valid"
                } else {
                    "required"
                }
            )));
        }
    };
    let labels = [q.device_name.as_deref(), q.platform.as_deref()];
    if labels
        .iter()
        .flatten()
        .any(|l| !crate::messaging::valid_label(l))
    {
        return Err(Error::bad_request(
            "deviceName and platform are at most 64 characters without control characters",
        ));
    }
    let accept = accept_key(&headers)?;
    // Registered the first time it connects; a device its user removed is refused.
    core.device_connects(&session.user_id, &device_id, labels[0], labels[1])
        .await?;
    let on_upgrade = req
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| {
            Error::bad_request("not a WebSocket upgrade: this connection cannot be upgraded")
        })?;
    let peer = req.extensions().get::<Peer>().cloned();
    let opened = peer.as_ref().map_or_else(Instant::now, |p| p.head_at);
    let deadline = opened + Duration::from_secs(core.settings.handshake_secs);
    let addr = peer.as_ref().map(|p| p.addr);
    tokio::spawn(async move {
        // Holds the connection's place under the connection caps for as long as it lives.
        let _admitted = peer.map(|p| p.admitted);
        let upgraded = match tokio::time::timeout_at(deadline.into(), on_upgrade).await {
            Ok(Ok(upgraded)) => upgraded,
            Ok(Err(e)) => {
                tracing::debug!("WebSocket upgrade failed: {e}");
                return;
            }
            Err(_) => {
                core.guards.count(Guard::HandshakeTimeout);
                tracing::debug!(
                    peer = addr.map(tracing::field::display),
                    user = %session.user_id,
                    device = %device_id,
                    guard = Guard::HandshakeTimeout.name(),
                    "closing the connection: the WebSocket upgrade did not complete in time"
                );
                return;
            }
        };
        let max = core.settings.max_frame_bytes;
        let config = WebSocketConfig::default()
            .max_message_size(Some(max * 4))
            .max_frame_size(Some(max * 4))
            .read_buffer_size(1024)
            // Frames queued together leave in one write (the loop flushes after each
            // round); a buffer past this goes out at once, so it never holds more.
            .write_buffer_size(WRITE_BUFFER);
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        // The connection's log lines carry its id (the `sessionId` of its hello), user and
        // device.
        let span = tracing::info_span!("connection", conn = tracing::field::Empty, user = %session.user_id, device = %device_id);
        run(gateway, socket, session, device_id, q.presence, deadline)
            .instrument(span)
            .await;
    });
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = res.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).expect("base64 is a header value"),
    );
    Ok(res)
}

/// The `Sec-WebSocket-Accept` of a valid upgrade request (RFC 6455 §4.2.1).
fn accept_key(headers: &HeaderMap) -> Result<String, Error> {
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, "websocket") {
        return Err(Error::bad_request(
            "not a WebSocket upgrade: Connection: upgrade and Upgrade: websocket are required",
        ));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err(Error::bad_request(
            "not a WebSocket upgrade: Sec-WebSocket-Version must be 13",
        ));
    }
    match headers.get(header::SEC_WEBSOCKET_KEY) {
        Some(key) if !key.is_empty() => {
            Ok(tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()))
        }
        _ => Err(Error::bad_request(
            "not a WebSocket upgrade: Sec-WebSocket-Key is missing",
        )),
    }
}

/// Takes a connection out of the hub (if it is still the device's current one) and tells
/// the links.
async fn leave(hub: &Hub, links: &dyn links::Links, device: &Device) {
    if let Some(last) = hub.unregister(&device.user_id, &device.device_id, device.session) {
        links.disconnected(device, last).await;
    }
}

/// How a connection's loop ended.
enum End {
    /// The client sent a close frame: it is answered, then the server closes TCP.
    ClientClosed,
    /// The connection is gone (closed or reset): nothing more to say.
    Gone,
    /// A write waited the write limit: the client stopped reading. Dropped, counted.
    Stalled,
    /// The server closes it, for this reason.
    Close(Close),
}

async fn run(
    Gateway { core, hub, links }: Gateway,
    mut socket: Socket,
    session: Session,
    device_id: String,
    presence: bool,
    handshake_deadline: Instant,
) {
    let set = &core.settings;
    let mut device = Device::new(
        &hub,
        session.user_id,
        device_id,
        session.token,
        set.outbox_frames,
        set.outbox_bytes,
    );
    device.presence = presence;
    device.issued_at = session.issued_at;
    let device = Arc::new(device);
    tracing::Span::current().record("conn", format!("{:016x}", device.session));
    tracing::debug!("connected");
    let hello = frames::hello(&frames::HelloFrame {
        user_id: &device.user_id,
        device_id: &device.device_id,
        session: device.session,
        heartbeat_secs: set.heartbeat_secs,
        max_frame: set.max_frame_bytes,
        receipts: set.receipts,
    });
    // Registered before the hello is written, so a push right after the client read its
    // hello reaches it; pushes wait in the outbox until the hello is out.
    let first = hub.register(device.clone());
    links.connected(&device, first).await;
    // A removal, revocation or deletion that committed after the upgrade's checks closed
    // the device's connections before this one was here to close: it is closed now, after
    // its hello (always the first frame).
    let refused = match core
        .device_was_removed(&device.user_id, &device.device_id)
        .await
    {
        true => Some(Close::DeviceRemoved),
        false => {
            core.refused_now(&device.user_id, device.token, device.issued_at)
                .await
        }
    };
    if let Some(why) = refused {
        leave(&hub, &*links, &device).await;
        core.device_left(&device.user_id, &device.device_id);
        let goodbye = Box::pin(async {
            telemetry::frame_out(&hello);
            let _ = socket.send(Message::Text(hello.clone())).await;
            say_goodbye(&mut socket, why, &device).await;
        });
        let _ = tokio::time::timeout(GOODBYE, goodbye).await;
        return;
    }
    telemetry::frame_out(&hello);
    match tokio::time::timeout_at(handshake_deadline.into(), socket.send(Message::Text(hello)))
        .await
    {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            leave(&hub, &*links, &device).await;
            return;
        }
        Err(_) => {
            core.guards.count(Guard::HandshakeTimeout);
            tracing::debug!(
                guard = Guard::HandshakeTimeout.name(),
                "closing the connection: the client did not read its hello in time"
            );
            leave(&hub, &*links, &device).await;
            return;
        }
    }
    let heartbeat = Duration::from_secs(set.heartbeat_secs);
    // A client that stops reading blocks our writes once the kernel buffers are full; it
    // gets this long before it is dropped (its outbox stays bounded meanwhile).
    let write_limit = heartbeat.min(WRITE_TIMEOUT);
    let silence = tokio::time::sleep(heartbeat);
    tokio::pin!(silence);
    let mut bucket = Bucket::new(f64::from(set.send_rate_per_sec), set.send_burst);
    let mut out: Vec<Frame> = Vec::new();
    let mut held = Held::default();
    let end = loop {
        tokio::select! {
            biased;
            closing = device.outbox.next(&mut out) => {
                if let Some(end) = send(&mut socket, &device, &mut out, write_limit).await {
                    break end;
                }
                if let Some(why) = closing {
                    break End::Close(why);
                }
            }
            incoming = held.next(&mut socket), if device.may_read() => {
                silence.as_mut().reset(tokio::time::Instant::now() + heartbeat);
                // The frames that arrived together are taken together, so their answers
                // leave in one write instead of one write each. Each frame's answers join
                // the socket's buffer before the next frame is read: a close read after
                // them can only follow them.
                let mut incoming = incoming;
                let (mut taken, mut bytes) = (0, 0);
                let ending = loop {
                    let msg = match incoming {
                        Some(Ok(msg)) => msg,
                        Some(Err(e)) => break Some(read_failure(e)),
                        None => break Some(End::Gone),
                    };
                    bytes += msg.len();
                    let work = take(&core, &device, &mut bucket, msg);
                    let waiting = Waiting {
                        socket: &mut socket,
                        device: &device,
                        out: &mut out,
                        held: &mut held,
                        limit: write_limit,
                        silence: silence.as_mut(),
                        heartbeat,
                    };
                    if let Some(end) = waiting.serve(&core, work).await {
                        break Some(end);
                    }
                    taken += 1;
                    // A close waiting (a kick, a slow consumer) ends the round, after what
                    // was queued before it.
                    if let Some(end) = buffer_queued(&mut socket, &device, &mut out, write_limit).await {
                        break Some(end);
                    }
                    if taken == READ_ROUND || bytes >= READ_ROUND_BYTES || !device.may_read() {
                        break None;
                    }
                    match held.poll_next(&mut socket).await {
                        Poll::Ready(next) => incoming = next,
                        Poll::Pending => break None,
                    }
                };
                // The round's answers go out (and the pong of a ping the round read).
                if let Some(end) = send(&mut socket, &device, &mut out, write_limit).await {
                    break end;
                }
                if let Some(end) = ending {
                    break end;
                }
            }
            () = &mut silence => break End::Close(Close::Heartbeat),
        }
    };
    drop(out);
    leave(&hub, &*links, &device).await;
    core.device_left(&device.user_id, &device.device_id);
    tracing::debug!("disconnected");
    match end {
        // The answer to the client's close frame is queued: send it; the server then
        // closes TCP first, as RFC 6455 asks.
        End::ClientClosed => {
            let _ = tokio::time::timeout(GOODBYE, socket.flush()).await;
        }
        End::Gone => {}
        End::Stalled => core.guards.count(Guard::WriteStalled),
        End::Close(why) => {
            // A slow consumer may still be reading what the kernel holds for it: it gets
            // as long for the close frame as any write gets.
            let grace = if why == Close::SlowConsumer {
                core.guards.count(Guard::SlowConsumer);
                write_limit
            } else {
                GOODBYE
            };
            // Boxed: its state (a read buffer among it) lives on the heap only while a
            // connection closes, so an idle connection's task stays small.
            let goodbye = Box::pin(say_goodbye(&mut socket, why, &device));
            let _ = tokio::time::timeout(grace, goodbye).await;
        }
    }
}

/// How long the closing handshake may take.
const GOODBYE: Duration = Duration::from_secs(5);

/// Tells the client why it is being closed (a `kicked` frame for a replaced connection,
/// then the close frame) and waits for its answering close. After a protocol failure the
/// stream cannot be read as frames any more (the rest of an oversized frame may still be
/// arriving): the server stops writing and reads the bytes away until the client closes,
/// so the close frame is not lost to a TCP reset.
async fn say_goodbye(socket: &mut Socket, why: Close, device: &Device) {
    // A slow consumer is a counted cut-off: its line names the guard, as the others do.
    let guard = (why == Close::SlowConsumer).then(|| Guard::SlowConsumer.name());
    tracing::debug!(
        user = %device.user_id,
        device = %device.device_id,
        guard,
        "closing the connection: {}",
        why.reason()
    );
    let kicked = match why {
        Close::Replaced => Some("this device connected again; this connection is closed"),
        Close::Revoked => Some("the token of this connection was revoked; log in again"),
        Close::Deleted => Some("the account was deleted"),
        Close::DeviceRemoved => Some("this device was removed by its user"),
        _ => None,
    };
    if let Some(message) = kicked {
        let frame = frames::kicked(why.reason(), message);
        telemetry::frame_out(&frame);
        let _ = socket.send(Message::Text(frame)).await;
    }
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: why.code().into(),
            reason: Utf8Bytes::from_static(why.reason()),
        })))
        .await;
    if matches!(why, Close::TooBig | Close::Protocol | Close::NotUtf8) {
        let io = socket.get_mut();
        let _ = io.shutdown().await;
        let mut sink = vec![0u8; 8192];
        while let Ok(n) = io.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    } else {
        while let Some(Ok(msg)) = socket.next().await {
            if let Message::Close(_) = msg {
                break;
            }
        }
    }
}

/// Frames taken from the socket in one round before what they answered is written, and
/// the bytes after which a round ends sooner: a round of large frames is one frame, as
/// every frame was before rounds, so what a round holds at once stays small.
const READ_ROUND: usize = 32;
const READ_ROUND_BYTES: usize = 8 * 1024;

/// What a connection read from its socket while a frame's work waited (`Waiting`), to be
/// taken in order after it: frames, then what ended the reading (a close, an error, the
/// end of the stream), if anything did.
#[derive(Default)]
struct Held {
    frames: std::collections::VecDeque<Option<Result<Message, WsError>>>,
    bytes: usize,
    ended: bool,
}

impl Held {
    /// The next message: a held one, else the socket's.
    async fn next(&mut self, socket: &mut Socket) -> Option<Result<Message, WsError>> {
        match self.pop() {
            Some(held) => held,
            None => socket.next().await,
        }
    }

    /// `next` without the wait.
    async fn poll_next(&mut self, socket: &mut Socket) -> Poll<Option<Result<Message, WsError>>> {
        match self.pop() {
            Some(held) => Poll::Ready(held),
            None => std::future::poll_fn(|cx| Poll::Ready(socket.poll_next_unpin(cx))).await,
        }
    }

    fn pop(&mut self) -> Option<Option<Result<Message, WsError>>> {
        let held = self.frames.pop_front()?;
        if let Some(Ok(msg)) = &held {
            self.bytes -= msg.len();
        }
        Some(held)
    }

    fn push(&mut self, incoming: Option<Result<Message, WsError>>) {
        match &incoming {
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => self.ended = true,
            Some(Ok(msg)) => self.bytes += msg.len(),
        }
        self.frames.push_back(incoming);
    }

    /// Whether another message may be read and held: not after the end of the reading,
    /// and at most a round's frames and bytes, so what waits stays small (past them the
    /// client waits, by TCP backpressure).
    fn has_room(&self) -> bool {
        !self.ended && self.frames.len() < READ_ROUND && self.bytes < READ_ROUND_BYTES
    }
}

/// The connection while one frame's work waits (for the database: a lookup, room in the
/// commit queue): it writes the answers of the frames before it at once, goes on writing
/// what its outbox gets (pushes, their answers) and reading, so the client's pings are
/// answered at once. The other frames it reads are held, in order, for after the waiting
/// one (`Held`).
struct Waiting<'a> {
    socket: &'a mut Socket,
    device: &'a Device,
    out: &'a mut Vec<Frame>,
    held: &'a mut Held,
    limit: Duration,
    /// The heartbeat's timer: what the connection reads meanwhile is a sign of life.
    silence: std::pin::Pin<&'a mut tokio::time::Sleep>,
    heartbeat: Duration,
}

impl Waiting<'_> {
    /// Runs `work` to its end. A frame's work does not wait in the usual case, and then
    /// nothing else is done. A write that ends the connection (it is gone, stalled or
    /// overflowed) or a close asked of it stops the writing and the reading; the work
    /// still runs to its end (bounded by the database's deadlines), which then returns
    /// that end.
    async fn serve(
        self,
        core: &Core,
        work: impl std::future::Future<Output = Option<End>>,
    ) -> Option<End> {
        let mut work = std::pin::pin!(work);
        let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
        match first {
            Poll::Ready(end) => end,
            // Boxed: the waiting's state lives on the heap only while a frame waits, so
            // a connection's task stays small.
            Poll::Pending => Box::pin(self.wait(core, work)).await,
        }
    }

    async fn wait<W: std::future::Future<Output = Option<End>>>(
        self,
        core: &Core,
        mut work: std::pin::Pin<&mut W>,
    ) -> Option<End> {
        let Waiting {
            socket,
            device,
            out,
            held,
            limit,
            mut silence,
            heartbeat,
        } = self;
        // What the frames before this one were answered goes out now, not once this
        // one is done.
        let mut ending = send(socket, device, out, limit).await;
        loop {
            tokio::select! {
                biased;
                end = work.as_mut() => return end.or(ending),
                closing = device.outbox.next(out), if ending.is_none() => {
                    ending = send(socket, device, out, limit).await.or(closing.map(End::Close));
                }
                incoming = socket.next(), if ending.is_none() && held.has_room() && device.may_read() => {
                    silence.as_mut().reset(tokio::time::Instant::now() + heartbeat);
                    match incoming {
                        Some(Ok(Message::Text(text))) if ping_now(core, device, text.as_str()) => {}
                        // The WebSocket layer queued the pong of a ping: out it goes.
                        Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {
                            ending = send(socket, device, out, limit).await;
                        }
                        incoming => held.push(incoming),
                    }
                }
            }
        }
    }
}

/// Answers `text` at once if it is a well-formed ping (`handle`'s answer to it), which
/// carries no state and so may pass the frames read before it; `false` for any other
/// frame.
fn ping_now(core: &Core, device: &Device, text: &str) -> bool {
    if text.len() > core.settings.max_frame_bytes || !text.contains("\"ping\"") {
        return false;
    }
    let Ok(peek) = serde_json::from_str::<Peek>(text) else {
        return false;
    };
    let Some(id) = peek.id() else {
        return false;
    };
    if !matches!(&peek.kind, Some(serde_json::Value::String(k)) if k == "ping") {
        return false;
    }
    telemetry::frame_in("ping");
    device
        .in_flight
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    device.answer(frames::pong(id, now_ms()));
    true
}

/// Acts on one message from the client; `Some` ends the connection.
async fn take(
    core: &Arc<Core>,
    device: &Arc<Device>,
    bucket: &mut Bucket,
    msg: Message,
) -> Option<End> {
    match msg {
        // Boxed: the frame's work lives on the heap only while it runs, so an idle
        // connection's task stays small.
        Message::Text(text) => Box::pin(handle(core, device, bucket, text.as_str())).await,
        Message::Binary(_) => {
            telemetry::frame_in("binary");
            device
                .in_flight
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            device.answer(frames::error(
                None,
                &Error::new(Code::BadFrame, "frames are JSON text, not binary"),
            ));
        }
        Message::Close(_) => return Some(End::ClientClosed),
        // The WebSocket layer queued the pong: the round's flush sends it.
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
    }
    None
}

/// A read the WebSocket layer refused: a frame above four times the frame limit (1009),
/// text that is not UTF-8 (1007), anything else that is not the protocol (1002); or the
/// connection simply went away.
fn read_failure(e: WsError) -> End {
    tracing::debug!("WebSocket read failed: {e}");
    match e {
        WsError::Capacity(_) => End::Close(Close::TooBig),
        WsError::Utf8(_) => End::Close(Close::NotUtf8),
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => End::Gone,
        WsError::Protocol(_) => End::Close(Close::Protocol),
        _ => End::Gone,
    }
}

/// Bytes of frames a connection gathers before writing them to its socket: the frames of
/// one round go out in one system call instead of one each, and what a connection keeps
/// allocated for it stays this size plus one frame.
const WRITE_BUFFER: usize = 8 * 1024;

/// How long a write may wait for a client that does not read (at most the heartbeat).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes the frames; `Err(Elapsed)` if one of them (or the flush) waited longer than
/// `limit`, which only a client that stopped reading makes happen. A write that does not
/// have to wait (the usual case: room in the buffer, a writable socket) sets no timer.
async fn write_all(
    socket: &mut Socket,
    out: &mut Vec<Frame>,
    limit: Duration,
) -> Result<Result<(), WsError>, tokio::time::error::Elapsed> {
    if let Err(e) = buffer_all(socket, out, limit).await? {
        return Ok(Err(e));
    }
    within(
        limit,
        std::future::poll_fn(|cx| socket.poll_flush_unpin(cx)),
    )
    .await
}

/// Writes the frames and what the socket's buffer holds. `Some` ends the connection
/// (`ended`).
async fn send(
    socket: &mut Socket,
    device: &Device,
    out: &mut Vec<Frame>,
    limit: Duration,
) -> Option<End> {
    ended(device, write_all(socket, out, limit)).await
}

/// Runs a write to the connection's socket. `Some` ends the connection: it is gone or
/// stopped reading, or it overflowed its outbox meanwhile. Such a reader is closed at
/// once: its queue is gone (and the memory of what it held); only the frame being written
/// remains, then the close frame.
async fn ended(
    device: &Device,
    write: impl std::future::Future<Output = Result<Result<(), WsError>, tokio::time::error::Elapsed>>,
) -> Option<End> {
    let written = tokio::select! {
        written = write => written,
        () = device.outbox.overflowed() => return Some(End::Close(Close::SlowConsumer)),
    };
    match written {
        Ok(Ok(())) => None,
        Ok(Err(_)) => Some(End::Gone),
        Err(_) => {
            tracing::debug!(
                user = %device.user_id,
                device = %device.device_id,
                guard = Guard::WriteStalled.name(),
                "dropping the connection: it stopped reading"
            );
            Some(End::Stalled)
        }
    }
}

/// Moves the frames into the socket's buffer, which writes itself out only once it holds
/// `WRITE_BUFFER` bytes; the same `Err(Elapsed)` as `write_all`.
async fn buffer_all(
    socket: &mut Socket,
    out: &mut Vec<Frame>,
    limit: Duration,
) -> Result<Result<(), WsError>, tokio::time::error::Elapsed> {
    for frame in out.drain(..) {
        telemetry::frame_out(frame.text().as_str());
        if let Err(e) = within(
            limit,
            std::future::poll_fn(|cx| socket.poll_ready_unpin(cx)),
        )
        .await?
        {
            return Ok(Err(e));
        }
        if let Err(e) = socket.start_send_unpin(Message::Text(frame.text())) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// Moves what the connection's outbox holds into the socket's buffer. `Some` ends the
/// connection: it is gone, stopped reading, overflowed its outbox meanwhile, or was asked
/// to close.
async fn buffer_queued(
    socket: &mut Socket,
    device: &Device,
    out: &mut Vec<Frame>,
    limit: Duration,
) -> Option<End> {
    let closing = device.outbox.try_next(out)?;
    ended(device, buffer_all(socket, out, limit))
        .await
        .or_else(|| closing.map(End::Close))
}

/// `future`'s output, or `Err(Elapsed)` after `limit`; the timer is set only if the
/// future does not finish at its first poll.
async fn within<F: std::future::Future>(
    limit: Duration,
    future: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
    match first {
        std::task::Poll::Ready(out) => Ok(out),
        std::task::Poll::Pending => tokio::time::timeout(limit, future).await,
    }
}

/// The answer to a send over the connection's rate.
fn rate_limited(core: &Core) -> Error {
    Error::send_rate(core.settings.send_rate_per_sec, "on this connection", None)
}

/// One client frame. Every error is answered on the connection, which stays open.
async fn handle(core: &Arc<Core>, device: &Arc<Device>, bucket: &mut Bucket, text: &str) {
    // Every frame gets exactly one answer (`Device::answer`), which ends its flight.
    device
        .in_flight
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let reply_err = |id: Option<&str>, e: Error| {
        device.answer(frames::error(id, &e));
    };
    if text.len() > core.settings.max_frame_bytes {
        telemetry::frame_in("invalid");
        return reply_err(
            None,
            Error::new(
                Code::FrameTooLarge,
                format!(
                    "the frame is {} bytes, the limit is {}",
                    text.len(),
                    core.settings.max_frame_bytes
                ),
            ),
        );
    }
    // A frame is a JSON object: serde would also read a frame's struct from an array of
    // its fields.
    if !text.trim_start().starts_with('{') {
        telemetry::frame_in("invalid");
        let why = match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Ok(_) => "a frame is a JSON object".to_string(),
            Err(e) => format!("not JSON: {e}"),
        };
        return reply_err(None, Error::new(Code::BadFrame, why));
    }
    // The commonest frame, a well-formed send, is read once. Any other frame, or a send
    // that does not read, takes the general path below, with the answers it gives (a
    // frame without the string "send" in it, a read or a received, is not tried as one).
    if text.contains("\"send\"")
        && let Ok(req) = serde_json::from_str::<SendFrame>(text)
        && req._kind.as_deref() == Some("send")
        && req
            .id
            .as_ref()
            .is_none_or(|id| id.len() <= frames::MAX_ID_BYTES)
    {
        telemetry::frame_in("send");
        if !bucket.take() {
            return reply_err(req.id.as_deref(), rate_limited(core));
        }
        let to: Arc<dyn Respond> = device.clone();
        return core.send_from(&device.user_id, to, req).await;
    }
    let peek: Peek = match serde_json::from_str(text) {
        Ok(p) => p,
        Err(e) => {
            telemetry::frame_in("invalid");
            return reply_err(None, Error::new(Code::BadFrame, format!("not JSON: {e}")));
        }
    };
    let Some(id) = peek.id() else {
        telemetry::frame_in("invalid");
        return reply_err(
            None,
            Error::new(Code::BadFrame, "id must be a string of at most 64 bytes"),
        );
    };
    let kind = match &peek.kind {
        Some(serde_json::Value::String(k)) => Some(k.as_str()),
        None | Some(serde_json::Value::Null) => None,
        Some(_) => {
            telemetry::frame_in("invalid");
            return reply_err(id, Error::new(Code::BadFrame, "type must be a string"));
        }
    };
    telemetry::frame_in(match kind {
        Some("send") => "send",
        Some("read") => "read",
        Some("received") => "received",
        Some("send_to_devices") => "send_to_devices",
        Some("mailbox_ack") => "mailbox_ack",
        Some("ping") => "ping",
        Some(_) => "unknown",
        None => "invalid",
    });
    match kind {
        Some("send") => {
            if !bucket.take() {
                return reply_err(id, rate_limited(core));
            }
            match serde_json::from_str::<SendFrame>(text) {
                Ok(req) => {
                    let to: Arc<dyn Respond> = device.clone();
                    core.send_from(&device.user_id, to, req).await
                }
                Err(e) => reply_err(
                    id,
                    Error::new(Code::BadFrame, format!("bad send frame: {e}")),
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
                    crate::messaging::Reply::Socket {
                        to: device.clone(),
                        id: r.id,
                    },
                )
                .await;
            }
            Err(e) => reply_err(
                id,
                Error::new(Code::BadFrame, format!("bad read frame: {e}")),
            ),
        },
        Some("received") => match serde_json::from_str::<ReadFrame>(text) {
            Ok(r) => {
                let to = crate::messaging::Reply::Socket {
                    to: device.clone(),
                    id: r.id,
                };
                core.receive(&device.user_id, r.conversation_id, r.seq, to)
                    .await;
            }
            Err(e) => reply_err(
                id,
                Error::new(Code::BadFrame, format!("bad received frame: {e}")),
            ),
        },
        // A transaction of its own each: run beside the connection, which does not wait
        // for it (its answer, like every other, comes through the outbox), after the
        // connection's earlier ones, so they commit in the order sent.
        Some("send_to_devices") => match serde_json::from_str::<DeviceSendFrame>(text) {
            Ok(req) if req.device_id.is_some() => reply_err(
                id,
                Error::new(
                    Code::BadFrame,
                    "deviceId is the HTTP send's; over the WebSocket the connection's device sends",
                ),
            ),
            Ok(req) => {
                let (core, to) = (core.clone(), device.clone());
                device.in_turn(async move {
                    let id = req.id.clone();
                    let frame = match core.send_to_devices(&to.user_id, &to.device_id, req).await {
                        Ok(ack) => frames::ack(id.as_deref(), &ack),
                        Err(e) => frames::error(id.as_deref(), &e),
                    };
                    to.answer(frame);
                });
            }
            Err(e) => reply_err(
                id,
                Error::new(Code::BadFrame, format!("bad send_to_devices frame: {e}")),
            ),
        },
        Some("mailbox_ack") => match serde_json::from_str::<MailboxAckFrame>(text) {
            Ok(req) => {
                let (core, device) = (core.clone(), device.clone());
                tokio::spawn(async move {
                    let frame = match core
                        .ack_mailbox(&device.user_id, &device.device_id, req.seq)
                        .await
                    {
                        Ok(ack) => frames::ack(req.id.as_deref(), &ack),
                        Err(e) => frames::error(req.id.as_deref(), &e),
                    };
                    device.answer(frame);
                });
            }
            Err(e) => reply_err(
                id,
                Error::new(Code::BadFrame, format!("bad mailbox_ack frame: {e}")),
            ),
        },
        Some("ping") => {
            device.answer(frames::pong(id, now_ms()));
        }
        Some(other) => reply_err(
            id,
            Error::new(Code::UnknownFrameType, format!("no frame type {other:?}")),
        ),
        None => reply_err(id, Error::new(Code::BadFrame, "the frame has no type")),
    }
}
