//! The server's clock: what it stamps on messages and events (`serverTime`), and what
//! its windows (recall, tokens) are measured against.

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
