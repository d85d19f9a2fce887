//! One loaded plugin: its manifest and source, its instance pool, the enabled switch, the
//! circuit breaker and the counters.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::loader::Source;
use super::manifest::Manifest;
use super::meters::{Meters, Outcome};
use super::pool::InstancePool;
use super::registry::SendContext;
use super::runtime::{CallCost, CallFailure, ValidateOutcome};

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    /// Validate calls that failed (trap, fuel, memory, busy, contract).
    pub failed: AtomicU64,
}

pub(super) struct Breaker {
    pub(super) failures: VecDeque<Instant>,
    pub(super) tripped: Option<String>,
}

/// One loaded plugin.
pub struct LoadedPlugin {
    pub manifest: Manifest,
    pub source: Source,
    pub sha256: String,
    pub contract: String,
    pub(super) pool: InstancePool,
    pub(super) enabled: AtomicBool,
    pub(super) breaker: Mutex<Breaker>,
    pub(super) stats: Stats,
    pub(super) meters: Meters,
    pub(super) breaker_failures: usize,
    pub(super) breaker_window: Duration,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.manifest.name)
            .field("source", &self.source)
            .finish()
    }
}

/// What `GET /v1/plugins` shows of a plugin.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    #[serde(flatten)]
    pub manifest: Manifest,
    pub enabled: bool,
    pub source: String,
    pub sha256: String,
    pub contract: String,
    /// Why the circuit breaker switched the plugin off, if it did.
    pub tripped: Option<String>,
    pub stats: StatsSnapshot,
}

#[derive(Debug, Serialize, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub calls: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub failed: u64,
}

impl LoadedPlugin {
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub fn pool(&self) -> &InstancePool {
        &self.pool
    }

    pub fn info(&self) -> PluginInfo {
        PluginInfo {
            manifest: self.manifest.clone(),
            enabled: self.is_enabled(),
            source: self.source.to_string(),
            sha256: self.sha256.clone(),
            contract: self.contract.clone(),
            tripped: self.breaker.lock().expect("breaker lock").tripped.clone(),
            stats: self.stats(),
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            calls: self.stats.accepted.load(Ordering::Relaxed)
                + self.stats.rejected.load(Ordering::Relaxed)
                + self.stats.failed.load(Ordering::Relaxed),
            accepted: self.stats.accepted.load(Ordering::Relaxed),
            rejected: self.stats.rejected.load(Ordering::Relaxed),
            failed: self.stats.failed.load(Ordering::Relaxed),
        }
    }

    /// Counts a `validate` call of the send path: the per-load counters (a failure also
    /// feeds the breaker, `record_failure`) and the metrics (time and fuel).
    pub(super) fn record(&self, outcome: Outcome, cost: &CallCost) {
        match outcome {
            Outcome::Accepted => self.stats.accepted.fetch_add(1, Ordering::Relaxed),
            Outcome::Rejected => self.stats.rejected.fetch_add(1, Ordering::Relaxed),
            // Busy is load, not the plugin's fault; failures are counted with the breaker.
            Outcome::Busy | Outcome::Failed => 0,
        };
        self.meters.call(outcome, cost);
    }

    /// Counts a failure; trips the breaker (switching the plugin off) after too many.
    pub(super) fn record_failure(&self, failure: &CallFailure) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(plugin = %self.manifest.name, content_type = self.manifest.content_type, "plugin call failed: {failure}");
        let mut b = self.breaker.lock().expect("breaker lock");
        let now = Instant::now();
        b.failures.push_back(now);
        while b
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.breaker_window)
        {
            b.failures.pop_front();
        }
        if b.tripped.is_none() && b.failures.len() >= self.breaker_failures {
            let reason = format!(
                "{} failures within {} s, the last: {failure}",
                b.failures.len(),
                self.breaker_window.as_secs()
            );
            tracing::error!(plugin = %self.manifest.name, content_type = self.manifest.content_type, "circuit breaker switched the plugin off: {reason}");
            b.tripped = Some(reason);
            self.meters.trips.increment(1);
            self.enabled.store(false, Ordering::Release);
            self.pool.clear();
        }
    }

    /// Validates under the budget; no registry lookups, no enabled check, not counted.
    pub fn call_validate(&self, ctx: &SendContext<'_>, payload: &str) -> ValidateOutcome {
        self.pool.validate(ctx, payload).0
    }
}
