//! What is linked over wasmtime-wasi's WASI so that a plugin never waits.
//!
//! Time does not pass inside a plugin: the clock is frozen (`inert_wasi`), and a timer (a
//! sleep, a poll with a timeout) is ready at once instead of blocking the host's thread.
//!
//! Nor does a plugin need the async runtime. wasmtime-wasi's synchronous bindings run every
//! blocking stream call (a write to stderr, a panic's message, a Python traceback), every
//! poll and a socket's bind or listen through `in_tokio`, which panics on a thread of the
//! async runtime: the server calls plugins there, inline, for a WebSocket send. The
//! `wasi:io` bindings here run them to their end on the calling thread instead. In the
//! inert context everything a plugin can wait for is ready at once (memory pipes, a closed
//! stdin, the timers above), so nothing here waits; a future still pending after a few
//! polls fails the call. Sockets cannot be made.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::io::poll as async_poll;
use wasmtime_wasi::p2::bindings::io::streams as async_streams;
use wasmtime_wasi::p2::bindings::sync::io::{poll, streams};
use wasmtime_wasi::p2::bindings::sync::sockets::network::{ErrorCode, IpAddressFamily};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, DynPollable, StreamError, StreamResult};
use wasmtime_wasi::p2::{TcpSocket, UdpSocket};

use super::HostState;

/// Links the timers, the streams and poll interfaces, and sockets that are never made, over
/// wasmtime-wasi's.
pub(super) fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap("subscribe-duration", |mut cx, (_,): (u64,)| {
        ready_pollable(&mut cx)
    })?;
    clock.func_wrap("subscribe-instant", |mut cx, (_,): (u64,)| {
        ready_pollable(&mut cx)
    })?;
    streams::add_to_linker::<HostState, InertIo>(linker, |s| Inert(&mut s.table))?;
    poll::add_to_linker::<HostState, InertIo>(linker, |s| Inert(&mut s.table))?;
    linker
        .instance(TCP_CREATE)?
        .func_wrap("create-tcp-socket", |_, (_,): (IpAddressFamily,)| {
            Ok((Err::<Resource<TcpSocket>, _>(ErrorCode::AccessDenied),))
        })?;
    linker
        .instance(UDP_CREATE)?
        .func_wrap("create-udp-socket", |_, (_,): (IpAddressFamily,)| {
            Ok((Err::<Resource<UdpSocket>, _>(ErrorCode::AccessDenied),))
        })?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The interfaces as wasmtime-wasi defines them (guests importing any 0.2.x version are
/// linked to them).
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";
const TCP_CREATE: &str = "wasi:sockets/tcp-create-socket@0.2.12";
const UDP_CREATE: &str = "wasi:sockets/udp-create-socket@0.2.12";

/// A pollable that is ready at once.
struct Ready;

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for Ready {
    async fn ready(&mut self) {}
}

fn ready_pollable(
    cx: &mut wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<(Resource<DynPollable>,)> {
    let table = &mut cx.data_mut().table;
    let ready = table.push(Ready)?;
    Ok((wasmtime_wasi::p2::subscribe(table, ready)?,))
}

/// How many times a future is polled before the call fails.
const POLLS: usize = 64;

/// Runs `f` on this thread, if it ends within `POLLS` polls.
fn at_once<F: Future>(f: F) -> wasmtime::Result<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..POLLS {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return Ok(out);
        }
    }
    wasmtime::bail!(
        "the plugin waited for something that never comes (nothing in its sandbox does)"
    )
}

/// As `at_once`, for a stream call: failing it traps.
fn stream_at_once<T, F: Future<Output = StreamResult<T>>>(f: F) -> StreamResult<T> {
    at_once(f).unwrap_or_else(|e| Err(StreamError::Trap(e)))
}

struct InertIo;

impl HasData for InertIo {
    type Data<'a> = Inert<'a>;
}

/// A store's resource table, seen through these bindings.
struct Inert<'a>(&'a mut ResourceTable);

impl streams::Host for Inert<'_> {
    fn convert_stream_error(&mut self, e: StreamError) -> wasmtime::Result<streams::StreamError> {
        streams::Host::convert_stream_error(self.0, e)
    }
}

impl streams::HostOutputStream for Inert<'_> {
    fn drop(&mut self, stream: Resource<DynOutputStream>) -> wasmtime::Result<()> {
        at_once(async_streams::HostOutputStream::drop(self.0, stream))?
    }

    fn check_write(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<u64> {
        streams::HostOutputStream::check_write(self.0, stream)
    }

    fn write(&mut self, stream: Resource<DynOutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
        streams::HostOutputStream::write(self.0, stream, bytes)
    }

    fn blocking_write_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        stream_at_once(async_streams::HostOutputStream::blocking_write_and_flush(
            self.0, stream, bytes,
        ))
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        stream_at_once(
            async_streams::HostOutputStream::blocking_write_zeroes_and_flush(self.0, stream, len),
        )
    }

    fn write_zeroes(&mut self, stream: Resource<DynOutputStream>, len: u64) -> StreamResult<()> {
        streams::HostOutputStream::write_zeroes(self.0, stream, len)
    }

    fn flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        streams::HostOutputStream::flush(self.0, stream)
    }

    fn blocking_flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        stream_at_once(async_streams::HostOutputStream::blocking_flush(
            self.0, stream,
        ))
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynOutputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostOutputStream::subscribe(self.0, stream)
    }

    fn splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        streams::HostOutputStream::splice(self.0, dst, src, len)
    }

    fn blocking_splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        stream_at_once(async_streams::HostOutputStream::blocking_splice(
            self.0, dst, src, len,
        ))
    }
}

impl streams::HostInputStream for Inert<'_> {
    fn drop(&mut self, stream: Resource<DynInputStream>) -> wasmtime::Result<()> {
        at_once(async_streams::HostInputStream::drop(self.0, stream))?
    }

    fn read(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<Vec<u8>> {
        streams::HostInputStream::read(self.0, stream, len)
    }

    fn blocking_read(
        &mut self,
        stream: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<Vec<u8>> {
        stream_at_once(async_streams::HostInputStream::blocking_read(
            self.0, stream, len,
        ))
    }

    fn skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        streams::HostInputStream::skip(self.0, stream, len)
    }

    fn blocking_skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        stream_at_once(async_streams::HostInputStream::blocking_skip(
            self.0, stream, len,
        ))
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynInputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostInputStream::subscribe(self.0, stream)
    }
}

impl poll::Host for Inert<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        at_once(async_poll::Host::poll(self.0, pollables))?
    }
}

impl poll::HostPollable for Inert<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        at_once(async_poll::HostPollable::ready(self.0, pollable))?
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        at_once(async_poll::HostPollable::block(self.0, pollable))?
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        poll::HostPollable::drop(self.0, pollable)
    }
}
