//! The server's clock: what it stamps on messages and events (`serverTime`), and what
//! its windows (recall, tokens) are measured against.
//!
//! A node of a cluster keeps Redis's time, not its own: `cluster` measures how far Redis's
//! clock is from this machine's (`set_offset`), so that every node stamps, orders and
//! measures by one clock, whatever their machines' clocks say. A single node keeps its
//! machine's clock (the offset stays 0).

use std::sync::atomic::{AtomicI64, Ordering};

/// Milliseconds to add to this machine's clock.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Milliseconds since the Unix epoch, by the server's clock.
pub fn now_ms() -> i64 {
    machine_ms() + OFFSET_MS.load(Ordering::Relaxed)
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub fn machine_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// From now on the server's clock is this machine's plus `ms`.
pub fn set_offset(ms: i64) {
    OFFSET_MS.store(ms, Ordering::Relaxed);
}

/// What the server's clock adds to this machine's (ms).
pub fn offset() -> i64 {
    OFFSET_MS.load(Ordering::Relaxed)
}
