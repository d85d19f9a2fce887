//! The HTTP listener: admits connections under the caps, serves each with hyper, and
//! holds every connection to its deadlines — a request head within `header_timeout`, a
//! body within `body_timeout`, a response written within `request_timeout`, no longer
//! than `idle_timeout` idle between requests. A WebSocket leaves these deadlines at its
//! upgrade and is held to the gateway's own (handshake, heartbeat, writes).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::Service as _;

use super::admission::{Admission, Admitted};
use crate::api::{BodyTimeout, Peer};
use crate::limits::{Guard, Guards};

/// The deadlines of an HTTP connection.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    pub header: Duration,
    pub body: Duration,
    pub request: Duration,
    pub idle: Duration,
}

/// How long shutdown waits for open connections to finish.
const DRAIN: Duration = Duration::from_secs(10);

/// Accepts until `shutdown` resolves, then lets the open connections finish (for at most
/// `DRAIN`).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    admission: Arc<Admission>,
    deadlines: Deadlines,
    guards: Arc<Guards>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (stop, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    guards.count(Guard::AcceptError);
                    tracing::debug!(guard = Guard::AcceptError.name(), "accept failed: {e}");
                    // Out of descriptors or memory: give the open connections a moment
                    // to end instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        match admission.admit(peer.ip()) {
            Ok(admitted) => {
                tokio::spawn(connection(
                    stream,
                    peer,
                    Arc::new(admitted),
                    router.clone(),
                    deadlines,
                    guards.clone(),
                    stopping.clone(),
                ));
            }
            Err(refusal) => {
                let guard = refusal.guard();
                guards.count(guard);
                let id = crate::api::new_request_id();
                tracing::debug!(%peer, guard = guard.name(), %id, "refusing the connection: {refusal}");
                admission.refuse(stream, refusal, id);
            }
        }
    }
    let _ = stop.send(true);
    drop(listener);
    admission.drained(DRAIN).await;
}

/// Where a connection is between requests, for its deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Waiting for (or reading) a request head.
    Head = 0,
    /// A request is being answered.
    Busy = 1,
    /// Between requests (keep-alive).
    Idle = 2,
    /// The response's body has ended and its last bytes wait to be written: still within
    /// the request's deadline, from when it began.
    Writing = 3,
}

/// The phase of a connection and since when, shared by the connection's task, its socket
/// (bytes arriving end an idle spell, the last bytes of a response written a busy one)
/// and its requests (a head starts a busy spell).
struct Clock {
    base: Instant,
    phase: AtomicU8,
    since_ms: AtomicU64,
    /// Bytes arrived while a response was being written: the next request's head has
    /// begun.
    read_ahead: AtomicBool,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            base: Instant::now(),
            phase: AtomicU8::new(Phase::Head as u8),
            since_ms: AtomicU64::new(0),
            read_ahead: AtomicBool::new(false),
        }
    }

    fn set(&self, phase: Phase) {
        self.since_ms
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// The response's body ended: its bytes are still to be written, within the request's
    /// deadline.
    fn writing(&self) {
        self.read_ahead.store(false, Ordering::Relaxed);
        self.phase.store(Phase::Writing as u8, Ordering::Release);
    }

    /// Everything the response put in the socket's way was written.
    fn written(&self) {
        if self.phase() == Phase::Writing {
            match self.read_ahead.load(Ordering::Relaxed) {
                true => self.set(Phase::Head),
                false => self.set(Phase::Idle),
            }
        }
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Head,
            1 => Phase::Busy,
            2 => Phase::Idle,
            _ => Phase::Writing,
        }
    }

    /// When the current phase runs out, and what running out means.
    fn deadline(&self, d: &Deadlines) -> (Instant, Guard) {
        let since = self.base + Duration::from_millis(self.since_ms.load(Ordering::Relaxed));
        match self.phase() {
            Phase::Head => (since + d.header, Guard::HeaderTimeout),
            Phase::Busy | Phase::Writing => (since + d.request, Guard::RequestTimeout),
            Phase::Idle => (since + d.idle, Guard::Idle),
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    admitted: Arc<Admitted>,
    router: Router,
    deadlines: Deadlines,
    guards: Arc<Guards>,
    mut stopping: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let clock = Arc::new(Clock::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        clock: clock.clone(),
    });
    let request_clock = clock.clone();
    let body_timeout = deadlines.body;
    let body_guards = guards.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        request_clock.set(Phase::Busy);
        let peer = Peer {
            addr: peer,
            head_at: Instant::now(),
            admitted: admitted.clone(),
        };
        answer(
            req,
            peer,
            router.clone(),
            request_clock.clone(),
            (body_timeout, body_guards.clone()),
        )
    });
    // hyper's own head timeout (30 s, restarted when a connection goes idle) is off: the
    // clock below holds every phase to the configured deadlines. `pipeline_flush` stays
    // off: with it hyper would skip flushing the socket, which is how `Watched` learns an
    // answer was written.
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(conn);
    let mut draining = *stopping.borrow();
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    let mut armed = clock.deadline(&deadlines).0;
    let timer = tokio::time::sleep_until(armed.into());
    tokio::pin!(timer);
    loop {
        // Every change of phase happens while hyper polls the connection (its reads and
        // writes, the service, the answer's body), so the deadline in force is read after
        // each poll and the timer moved when it changed, sooner or later.
        let step = std::future::poll_fn(|cx| {
            if let Poll::Ready(done) = conn.as_mut().poll(cx) {
                return Poll::Ready(Step::Ended(done));
            }
            let (deadline, guard) = clock.deadline(&deadlines);
            if deadline != armed {
                timer.as_mut().reset(deadline.into());
                armed = deadline;
            }
            timer.as_mut().poll(cx).map(|()| Step::Expired(guard))
        });
        tokio::select! {
            step = step => {
                match step {
                    Step::Expired(guard) => {
                        guards.count(guard);
                        tracing::debug!(%peer, guard = guard.name(), "closing the connection: its deadline passed");
                    }
                    Step::Ended(Err(e)) => tracing::debug!(%peer, "connection ended: {e}"),
                    Step::Ended(Ok(())) => {}
                }
                return;
            }
            changed = stopping.changed(), if !draining => {
                if changed.is_err() || *stopping.borrow() {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// How a connection's watch ends: hyper finished with it, or the deadline in force passed.
enum Step {
    Ended(hyper::Result<()>),
    Expired(Guard),
}

/// One request: its body held to the body deadline, the router's answer, `Connection:
/// close` when the body was left unread (the connection cannot carry another request
/// then), and the end of the response's body starting its last writes (`Ends`).
async fn answer(
    req: Request<Incoming>,
    peer: Peer,
    mut router: Router,
    clock: Arc<Clock>,
    (body_timeout, guards): (Duration, Arc<Guards>),
) -> Result<Response<Body>, Infallible> {
    let (mut parts, incoming) = req.into_parts();
    let addr = peer.addr;
    let read_whole = Arc::new(AtomicBool::new(hyper::body::Body::is_end_stream(&incoming)));
    parts.extensions.insert(peer);
    let body = Body::new(Timed {
        inner: incoming,
        deadline: Box::pin(tokio::time::sleep(body_timeout)),
        read_whole: read_whole.clone(),
        guards,
        peer: addr,
    });
    let mut res = router
        .call(Request::from_parts(parts, body))
        .await
        .unwrap_or_else(|never| match never {});
    if !read_whole.load(Ordering::Acquire) && res.status() != StatusCode::SWITCHING_PROTOCOLS {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(res.map(|b| Body::new(Ends { inner: b, clock })))
}

/// A request body that fails with `BodyTimeout` once its deadline passes (counted and
/// logged at debug with the client's address), and says whether it was read to its end.
struct Timed {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    read_whole: Arc<AtomicBool>,
    guards: Arc<Guards>,
    peer: SocketAddr,
}

impl hyper::body::Body for Timed {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                self.read_whole.store(true, Ordering::Release);
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => {
                if self.inner.is_end_stream() {
                    self.read_whole.store(true, Ordering::Release);
                }
                Poll::Ready(Some(frame.map_err(Into::into)))
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.guards.count(Guard::BodyTimeout);
                    tracing::debug!(
                        peer = %self.peer,
                        guard = Guard::BodyTimeout.name(),
                        "answering 408: the request body did not arrive in time"
                    );
                    Poll::Ready(Some(Err(BodyTimeout.into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body whose end (read whole, or dropped) leaves its last bytes to be written
/// (`Phase::Writing`); once they are (`Watched`), the connection's idle spell starts.
struct Ends {
    inner: Body,
    clock: Arc<Clock>,
}

impl Drop for Ends {
    fn drop(&mut self) {
        self.clock.writing();
    }
}

impl hyper::body::Body for Ends {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, telling the clock when bytes arrive on an idle connection (a new request
/// has begun: its head deadline starts), and when a response's last bytes were written:
/// hyper flushes the socket only once every byte it holds was written to it.
struct Watched {
    inner: TcpStream,
    clock: Arc<Clock>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            match self.clock.phase() {
                Phase::Idle => self.clock.set(Phase::Head),
                Phase::Writing => self.clock.read_ahead.store(true, Ordering::Relaxed),
                Phase::Head | Phase::Busy => {}
            }
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            self.clock.written();
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
