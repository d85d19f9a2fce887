//! Limits every layer shares: the token bucket (sends per connection, logins per address
//! and per account), a bounded map of buckets by key, and the counters of what the server
//! refused or cut off, logged as one summary line per interval instead of one per event.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The part of a client's address that limits count it under: an IPv4 address (also when
/// mapped into IPv6), or an IPv6 address's /64 prefix (one subscriber's network).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressKey {
    V4(u32),
    V6(u64),
}

impl AddressKey {
    pub fn of(ip: IpAddr) -> AddressKey {
        match ip {
            IpAddr::V4(v4) => AddressKey::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey::V4(u32::from(v4)),
                None => AddressKey::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// A token bucket: `rate` per second, up to `burst` at once.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(rate_per_sec: f64, burst: u32) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            rate: rate_per_sec,
            burst: f64::from(burst),
            at: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        self.tokens = (self.tokens
            + now.saturating_duration_since(self.at).as_secs_f64() * self.rate)
            .min(self.burst);
        self.at = now;
    }

    /// Takes one token if there is one.
    pub fn take(&mut self) -> bool {
        self.refill(Instant::now());
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether a token is there, without taking it.
    pub fn has(&mut self) -> bool {
        self.refill(Instant::now());
        self.tokens >= 1.0
    }

    /// How long until a token is there (zero if one is).
    pub fn wait(&mut self) -> Duration {
        self.refill(Instant::now());
        if self.tokens >= 1.0 || self.rate <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / self.rate)
        }
    }

    fn full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }
}

/// Buckets by key (a client address, an account), bounded: full buckets are forgotten (a
/// fresh one is the same), and past `max_keys` the map is swept of them.
pub struct Limiter<K> {
    rate_per_sec: f64,
    burst: u32,
    max_keys: usize,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq + Clone> Limiter<K> {
    /// `per_period` events per `period`, in a burst of as many; `per_period == 0`: no limit.
    pub fn new(per_period: u32, period: Duration, max_keys: usize) -> Limiter<K> {
        let rate = f64::from(per_period) / period.as_secs_f64();
        Limiter::with_rate(rate, per_period, max_keys)
    }

    /// `rate_per_sec` events a second, in a burst of up to `burst` (a `Bucket` per key).
    pub fn per_second(rate_per_sec: u32, burst: u32, max_keys: usize) -> Limiter<K> {
        Limiter::with_rate(f64::from(rate_per_sec), burst, max_keys)
    }

    fn with_rate(rate_per_sec: f64, burst: u32, max_keys: usize) -> Limiter<K> {
        Limiter {
            rate_per_sec,
            burst,
            max_keys,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.burst > 0
    }

    /// Counts one event for `key`: `Err(retry_after)` if its allowance is spent.
    pub fn take(&self, key: &K) -> Result<(), Duration> {
        self.with(key, |b| if b.take() { Ok(()) } else { Err(b.wait()) })
    }

    /// `Err(retry_after)` if `key`'s allowance is spent, without counting anything.
    pub fn check(&self, key: &K) -> Result<(), Duration> {
        self.with(key, |b| if b.has() { Ok(()) } else { Err(b.wait()) })
    }

    fn with(
        &self,
        key: &K,
        f: impl FnOnce(&mut Bucket) -> Result<(), Duration>,
    ) -> Result<(), Duration> {
        if !self.enabled() {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().expect("limiter lock");
        if buckets.len() >= self.max_keys && !buckets.contains_key(key) {
            let now = Instant::now();
            buckets.retain(|_, b| !b.full(now));
            if buckets.len() >= self.max_keys {
                // Every tracked key is in use: refuse newcomers rather than grow.
                return Err(Duration::from_secs(1));
            }
        }
        let (rate, burst) = (self.rate_per_sec, self.burst);
        f(buckets
            .entry(key.clone())
            .or_insert_with(|| Bucket::new(rate, burst)))
    }
}

/// Something the server refused or cut off to protect itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// A connection over `server.max_connections`.
    TooManyConnections,
    /// A connection over `server.max_connections_per_address`.
    TooManyFromAddress,
    /// A request head that did not arrive in `server.header_timeout_secs`.
    HeaderTimeout,
    /// A request body that did not arrive in `server.body_timeout_secs`.
    BodyTimeout,
    /// A keep-alive connection idle for `server.idle_timeout_secs`.
    Idle,
    /// A response not written within `server.request_timeout_secs`.
    RequestTimeout,
    /// A WebSocket whose upgrade and hello took longer than `gateway.handshake_secs`.
    HandshakeTimeout,
    /// A WebSocket reader too slow for its outbox (frames or bytes, its own or the node's).
    SlowConsumer,
    /// A WebSocket dropped because one write waited the write limit: its client stopped
    /// reading.
    WriteStalled,
    /// A login or registration over a rate limit.
    AuthRateLimited,
    /// A login or registration that waited too long for a hashing slot.
    HashBusy,
    /// `accept` failed (out of file descriptors, most likely).
    AcceptError,
}

impl Guard {
    /// Its name in the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Guard::TooManyConnections => "too_many_connections",
            Guard::TooManyFromAddress => "too_many_from_address",
            Guard::HeaderTimeout => "header_timeout",
            Guard::BodyTimeout => "body_timeout",
            Guard::Idle => "idle",
            Guard::RequestTimeout => "request_timeout",
            Guard::HandshakeTimeout => "handshake_timeout",
            Guard::SlowConsumer => "slow_consumer",
            Guard::WriteStalled => "write_stalled",
            Guard::AuthRateLimited => "auth_rate_limited",
            Guard::HashBusy => "hash_busy",
            Guard::AcceptError => "accept_error",
        }
    }
}

const GUARDS: [(Guard, &str); 12] = [
    (
        Guard::TooManyConnections,
        "connections refused over server.max_connections",
    ),
    (
        Guard::TooManyFromAddress,
        "connections refused over server.max_connections_per_address",
    ),
    (
        Guard::HeaderTimeout,
        "connections closed: no complete request head in server.header_timeout_secs",
    ),
    (
        Guard::BodyTimeout,
        "requests answered 408: body not complete in server.body_timeout_secs",
    ),
    (
        Guard::Idle,
        "keep-alive connections closed after server.idle_timeout_secs idle",
    ),
    (
        Guard::RequestTimeout,
        "connections closed: response not written in server.request_timeout_secs",
    ),
    (
        Guard::HandshakeTimeout,
        "WebSockets closed: no upgrade and hello in gateway.handshake_secs",
    ),
    (
        Guard::SlowConsumer,
        "WebSockets closed as slow consumers (4008)",
    ),
    (
        Guard::WriteStalled,
        "WebSockets dropped: a write waited out its limit (the client stopped reading)",
    ),
    (
        Guard::AuthRateLimited,
        "logins and registrations refused by rate limits (429)",
    ),
    (
        Guard::HashBusy,
        "logins and registrations refused: no hashing slot in auth.hash_queue_secs (503 busy)",
    ),
    (Guard::AcceptError, "accept errors"),
];

/// How often the summary of refusals is logged.
pub const GUARD_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Counts of every `Guard` since start-up.
#[derive(Default)]
pub struct Guards {
    counts: [AtomicU64; GUARDS.len()],
}

impl Guards {
    pub fn count(&self, g: Guard) {
        self.counts[g as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Since start-up.
    pub fn total(&self, g: Guard) -> u64 {
        self.counts[g as usize].load(Ordering::Relaxed)
    }

    /// Every guard with its count since start-up.
    pub fn all(&self) -> impl Iterator<Item = (Guard, u64)> + '_ {
        GUARDS.iter().map(|(g, _)| (*g, self.total(*g)))
    }

    /// Logs, once per `GUARD_LOG_INTERVAL`, what was refused in it (nothing when nothing was).
    pub async fn log_every_interval(self: std::sync::Arc<Self>) {
        let mut last = [0u64; GUARDS.len()];
        let mut tick = tokio::time::interval(GUARD_LOG_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let mut parts = Vec::new();
            for (i, (g, what)) in GUARDS.iter().enumerate() {
                let now = self.total(*g);
                if now > last[i] {
                    parts.push(format!("{} {what}", now - last[i]));
                }
                last[i] = now;
            }
            if !parts.is_empty() {
                tracing::warn!(
                    "in the last {} s: {}",
                    GUARD_LOG_INTERVAL.as_secs(),
                    parts.join("; ")
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_refuses() {
        let mut b = Bucket::new(0.001, 3);
        assert!(b.take() && b.take() && b.take());
        assert!(!b.take());
        assert!(b.wait() > Duration::from_secs(100));
    }

    #[test]
    fn a_limiter_keeps_keys_apart_and_bounded() {
        let l: Limiter<u32> = Limiter::new(2, Duration::from_secs(3600), 2);
        assert!(l.take(&1).is_ok() && l.take(&1).is_ok());
        assert!(l.take(&1).is_err());
        assert!(l.take(&2).is_ok());
        // Both tracked keys are in use: a third is refused rather than tracked.
        assert!(l.take(&3).is_err());
        assert!(
            Limiter::<u32>::new(0, Duration::from_secs(1), 1)
                .take(&9)
                .is_ok()
        );
    }

    #[test]
    fn ipv6_counts_by_its_64_prefix() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(AddressKey::of(a), AddressKey::of(b));
        assert_ne!(AddressKey::of(a), AddressKey::of(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(
            AddressKey::of(mapped),
            AddressKey::of("10.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn every_guard_has_its_line() {
        for (i, (g, _)) in GUARDS.iter().enumerate() {
            assert_eq!(*g as usize, i);
        }
    }
}
