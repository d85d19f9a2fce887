//! The sandbox: one wasmtime engine (fuel on), the linker that defines what a plugin may
//! import, and the per-store state: the inert WASI context, the memory limiter, the
//! captured stderr. `pool.rs` runs the calls.

mod inert;

use std::sync::Arc;

use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{LogLevel, Plugin as Bindings, PluginPre, courier::plugin::log};
use crate::config::{Isolation, RuntimeConfig};

/// Budgets applied to every call of one plugin.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub fuel_per_call: u64,
    pub memory_bytes: usize,
    pub isolation: Isolation,
    pub recycle_after_calls: u64,
    pub recycle_above_bytes: usize,
    /// Instances of one plugin that may exist at once (calls beyond wait for one).
    pub max_instances: usize,
}

impl Limits {
    pub fn from_config(c: &RuntimeConfig, fuel_override: Option<u64>) -> Limits {
        Limits {
            fuel_per_call: fuel_override.unwrap_or(c.fuel_per_call),
            memory_bytes: c.memory_mib as usize * 1024 * 1024,
            isolation: c.isolation,
            recycle_after_calls: c.recycle_after_calls,
            recycle_above_bytes: c.recycle_above_mib as usize * 1024 * 1024,
            max_instances: match c.max_instances {
                0 => 2 * std::thread::available_parallelism().map_or(1, |n| n.get()),
                n => n as usize,
            },
        }
    }
}

/// Why a call into a plugin failed (as opposed to the plugin rejecting a payload).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CallFailure {
    #[error("exceeded its budget of {fuel} fuel units (an endless loop?)")]
    Budget { fuel: u64 },
    #[error("asked to grow its memory to {asked} bytes, over the cap of {cap} bytes")]
    Memory { asked: usize, cap: usize },
    #[error("trapped: {0}")]
    Trap(String),
    #[error("could not be instantiated: {0}")]
    Instantiate(String),
    #[error("had no free instance within {waited_ms} ms ({max} instances busy)")]
    Busy { max: usize, waited_ms: u64 },
    #[error("broke the contract: {0}")]
    Contract(String),
}

/// What a validate call came to: the normalized payload, or the plugin's rejection as
/// `(code, message)`; or the call failed.
pub type ValidateOutcome = Result<Result<String, (String, String)>, CallFailure>;

/// What a call cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallCost {
    pub fuel: u64,
    pub memory_bytes: usize,
    pub micros: u64,
}

/// The engine and linker shared by every plugin.
pub struct Runtime {
    engine: Engine,
    linker: Linker<HostState>,
}

impl Runtime {
    pub fn new() -> wasmtime::Result<Runtime> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(true);
        // Plugins are wasm32: no 64-bit memories or tables, whose sizes could overflow the
        // limiter's arithmetic.
        config.wasm_memory64(false);
        // Plugins are small and called often: spend compile time for faster calls.
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        // Enough of a trap's backtrace to tell an overflowing stack (`recursed`).
        config.wasm_backtrace_max_frames(std::num::NonZeroUsize::new(BACKTRACE_FRAMES));
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        // WASI is linked because standard guest toolchains import it, but the context is
        // inert: no preopened directories, no sockets, no name lookup, no environment,
        // a frozen clock, fixed random seed, stdio discarded. See `loader::ALLOWED_WASI`.
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        // Over it, what keeps a plugin from waiting: on time, or on the async runtime.
        inert::link(&mut linker)?;
        Bindings::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        Ok(Runtime { engine, linker })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn linker(&self) -> &Linker<HostState> {
        &self.linker
    }

    /// Compiles a component (the expensive step: done once per file).
    pub fn compile(&self, bytes: &[u8]) -> wasmtime::Result<Component> {
        Component::new(&self.engine, bytes)
    }

    /// Resolves a component's imports against the linker, once.
    pub fn prepare(&self, component: &Component) -> wasmtime::Result<PluginPre<HostState>> {
        PluginPre::new(self.linker.instantiate_pre(component)?)
    }
}

/// Per-store state: the inert WASI context and the memory limiter.
pub struct HostState {
    plugin: Arc<str>,
    wasi: WasiCtx,
    /// What the plugin wrote to stderr (a panic message, a Python traceback), kept to
    /// explain a trap. Bounded: the instance is recycled before it fills.
    stderr: MemoryOutputPipe,
    /// Where the current call's stderr starts.
    stderr_mark: usize,
    table: ResourceTable,
    limiter: MemoryLimiter,
    log_lines: u32,
}

impl HostState {
    /// A fresh store state for one instance of `plugin` under `limits`.
    pub(super) fn new(plugin: Arc<str>, limits: Limits) -> HostState {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        HostState {
            plugin,
            wasi: inert_wasi(stderr.clone()),
            stderr,
            stderr_mark: 0,
            table: ResourceTable::new(),
            limiter: MemoryLimiter {
                cap: limits.memory_bytes,
                current: 0,
                pending: None,
            },
            log_lines: 0,
        }
    }

    pub(super) fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limiter
    }

    /// The largest linear memory this instance has grown to.
    pub(super) fn memory_bytes(&self) -> usize {
        self.limiter.current
    }

    /// Whether the instance has written so much to stderr that it should be replaced.
    pub(super) fn stderr_full(&self) -> bool {
        self.stderr.contents().len() >= STDERR_RECYCLE
    }

    /// The last lines the plugin wrote to stderr during the current call, on one line
    /// (what earlier calls wrote, possibly for other senders, is never shown).
    pub(super) fn stderr_tail(&self) -> String {
        stderr_tail(&self.stderr, self.stderr_mark)
    }

    /// A call starts: forget the stderr written before it, for reporting.
    pub(super) fn start_call(&mut self) {
        self.stderr_mark = self.stderr.contents().len();
        self.log_lines = 0;
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// At most this many log lines per call (more stops the call); lines are cut to 512 bytes.
const MAX_LOG_LINES: u32 = 100;
const MAX_LOG_BYTES: usize = 512;
/// A longer line stops the call.
const MAX_LOG_MESSAGE: usize = 64 * 1024;

impl log::Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) -> wasmtime::Result<()> {
        // The host copies what a plugin logs, outside its fuel budget: bound that work.
        if self.log_lines >= MAX_LOG_LINES || message.len() > MAX_LOG_MESSAGE {
            wasmtime::bail!(
                "logged more than {MAX_LOG_LINES} lines or a line over {MAX_LOG_MESSAGE} bytes in one call"
            );
        }
        self.log_lines += 1;
        // Control characters could forge log lines: escaped.
        let msg = escaped(&message, MAX_LOG_BYTES);
        let plugin = &*self.plugin;
        match level {
            LogLevel::Debug => tracing::debug!(plugin, "{msg}"),
            LogLevel::Info => tracing::info!(plugin, "{msg}"),
            LogLevel::Warn => tracing::warn!(plugin, "{msg}"),
            LogLevel::Error => tracing::error!(plugin, "{msg}"),
        }
        Ok(())
    }
}

/// Caps linear memory; a refused growth traps with a [`MemoryCapExceeded`] that says so.
struct MemoryLimiter {
    cap: usize,
    current: usize,
    /// The last approved growth, as (old, new), undone if the growth then fails.
    pending: Option<(usize, usize)>,
}

#[derive(Debug)]
struct MemoryCapExceeded {
    asked: usize,
    cap: usize,
}

impl std::fmt::Display for MemoryCapExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memory growth to {} bytes exceeds the cap of {} bytes",
            self.asked, self.cap
        )
    }
}

impl std::error::Error for MemoryCapExceeded {}

impl MemoryLimiter {
    /// One memory or table goes from `old` to `new` bytes: allowed while the instance's
    /// total stays under the cap.
    fn grow(&mut self, old: usize, new: usize) -> wasmtime::Result<bool> {
        let total = self.current.saturating_sub(old).checked_add(new);
        match total {
            Some(total) if total <= self.cap => {
                self.current = total;
                self.pending = Some((old, new));
                Ok(true)
            }
            _ => Err(wasmtime::Error::new(MemoryCapExceeded {
                asked: total.unwrap_or(usize::MAX),
                cap: self.cap,
            })),
        }
    }

    /// The approved growth did not happen (over a declared maximum, or the OS said no).
    fn undo(&mut self) {
        if let Some((old, new)) = self.pending.take() {
            self.current = self.current.saturating_sub(new).saturating_add(old);
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    // `current` is the total of every memory and table of the instance: the cap is one
    // budget for the plugin, not one per memory.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(current, desired)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _max: Option<usize>,
    ) -> wasmtime::Result<bool> {
        const ELEMENT: usize = 8;
        self.grow(
            current.saturating_mul(ELEMENT),
            desired.saturating_mul(ELEMENT),
        )
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.undo();
        Ok(())
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.undo();
        Ok(())
    }

    fn instances(&self) -> usize {
        1000
    }

    fn tables(&self) -> usize {
        1000
    }

    fn memories(&self) -> usize {
        100
    }
}

/// Capacity of the captured stderr, and the mark past which an instance is recycled.
const STDERR_CAPACITY: usize = 64 * 1024;
const STDERR_RECYCLE: usize = 16 * 1024;

/// The inert WASI context every plugin store gets; stderr goes to `stderr`.
fn inert_wasi(stderr: MemoryOutputPipe) -> WasiCtx {
    use wasmtime_wasi::{HostMonotonicClock, HostWallClock};
    struct Frozen;
    impl HostWallClock for Frozen {
        fn resolution(&self) -> std::time::Duration {
            std::time::Duration::from_secs(1)
        }
        fn now(&self) -> std::time::Duration {
            std::time::Duration::ZERO
        }
    }
    impl HostMonotonicClock for Frozen {
        fn resolution(&self) -> u64 {
            1_000_000_000
        }
        fn now(&self) -> u64 {
            0
        }
    }
    let mut b = WasiCtx::builder();
    b.wall_clock(Frozen)
        .monotonic_clock(Frozen)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .insecure_random_seed(0)
        .secure_random(seeded_rng())
        .insecure_random(seeded_rng())
        .max_random_size(4096)
        .stderr(stderr);
    b.build()
}

/// A seeded generator: plugins must be deterministic, so "random" is reproducible.
fn seeded_rng() -> impl wasmtime_wasi::Rng + Send + 'static {
    use rand::SeedableRng;
    rand::rngs::StdRng::seed_from_u64(0x00c0_0e1e)
}

pub(super) fn classify(e: wasmtime::Error, limits: Limits, stderr: &str) -> CallFailure {
    if let Some(m) = e.downcast_ref::<MemoryCapExceeded>() {
        return CallFailure::Memory {
            asked: m.asked,
            cap: m.cap,
        };
    }
    if let Some(Trap::OutOfFuel) = e.downcast_ref::<Trap>() {
        return CallFailure::Budget {
            fuel: limits.fuel_per_call,
        };
    }
    // One line for the client: the trap, or the root cause of a host error (a wasm
    // backtrace with mangled symbols goes to the server log only).
    let what = match e.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => STACK_OVERFLOW.to_string(),
        // A Rust (or C) plugin keeps its stack in linear memory: overflowing it reads
        // below the memory's start, which traps as an out-of-bounds access. Deep recursion
        // in the backtrace tells the two apart.
        Some(Trap::MemoryOutOfBounds) if recursed(&e) => STACK_OVERFLOW.to_string(),
        Some(t) => one_line(&t.to_string()),
        None => {
            tracing::warn!("a plugin call failed: {e:?}");
            one_line(&e.root_cause().to_string())
        }
    };
    if stderr.is_empty() {
        CallFailure::Trap(what)
    } else {
        CallFailure::Trap(format!("{what}; the plugin wrote: {stderr}"))
    }
}

/// What the client reads for a call stack that ran out.
const STACK_OVERFLOW: &str = "stack overflow (the plugin recursed too deep)";

/// Frames of a trap's backtrace the engine keeps (the innermost ones).
const BACKTRACE_FRAMES: usize = 64;

/// Whether the trap's backtrace is full and, but for a few frames, one function calling
/// itself: recursion without end, not a call that happened to be deep.
fn recursed(e: &wasmtime::Error) -> bool {
    let Some(trace) = e.downcast_ref::<wasmtime::WasmBacktrace>() else {
        return false;
    };
    let frames = trace.frames();
    if frames.len() < BACKTRACE_FRAMES {
        return false;
    }
    let mut counts = std::collections::HashMap::new();
    for f in frames {
        *counts.entry(f.func_index()).or_insert(0usize) += 1;
    }
    counts
        .values()
        .max()
        .is_some_and(|n| n * 10 >= frames.len() * 9)
}

/// `s` with control characters escaped, cut (with `…`) once it reaches `max` bytes.
fn escaped(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(max.min(s.len()));
    for c in s.chars() {
        if out.len() >= max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The first line of `s`, at most 300 bytes, control characters escaped.
fn one_line(s: &str) -> String {
    escaped(s.lines().next().unwrap_or_default().trim(), 300)
}

/// The last lines the plugin wrote to stderr, on one line, at most ~300 bytes.
fn stderr_tail(pipe: &MemoryOutputPipe, mark: usize) -> String {
    let bytes = pipe.contents();
    let start = bytes.len().saturating_sub(300).max(mark.min(bytes.len()));
    let text = String::from_utf8_lossy(&bytes[start..]);
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .map(one_line)
        .collect();
    lines.join(" | ")
}
