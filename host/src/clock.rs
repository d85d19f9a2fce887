//! The server's clock: what it stamps on messages and events (`serverTime`), and what
//! its windows (recall, tokens) are measured against.
//!
//! A single node keeps its machine's clock. A node of a cluster keeps Redis's time
//! instead (`keep`, from `cluster`'s readings of Redis's clock): Redis's time at a reading
//! plus the time passed since by this process's monotonic clock, so every node stamps,
//! orders and measures by one clock whatever their machines' clocks say, and a machine
//! clock set while the node runs does not move the time it keeps.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Instant;

/// The monotonic clock's zero, for `mono_ms`.
static START: LazyLock<Instant> = LazyLock::new(Instant::now);
/// Whether the time kept is Redis's (`KEPT` is set).
static KEEPS: AtomicBool = AtomicBool::new(false);
/// Redis's time less `mono_ms` (ms).
static KEPT: AtomicI64 = AtomicI64::new(0);

/// Milliseconds since the Unix epoch, by the server's clock.
pub fn now_ms() -> i64 {
    if KEEPS.load(Ordering::Acquire) {
        mono_ms() + KEPT.load(Ordering::Relaxed)
    } else {
        machine_ms()
    }
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub fn machine_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Milliseconds by this process's monotonic clock (from an arbitrary zero): never set,
/// never stepped.
pub fn mono_ms() -> i64 {
    START.elapsed().as_millis() as i64
}

/// From now on the server's time is `mono_ms() + offset`.
pub fn keep(offset: i64) {
    KEPT.store(offset, Ordering::Relaxed);
    KEEPS.store(true, Ordering::Release);
}

/// How far the server's time is ahead of this machine's clock (ms; negative: behind).
pub fn offset() -> i64 {
    now_ms() - machine_ms()
}
