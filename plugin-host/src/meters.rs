//! What the plugin host counts for the server's metrics, through the `metrics` facade: the
//! server installs a Prometheus recorder; anywhere else (`courier plugin check`) these are
//! no-ops. Keyed by the plugin's name, so a reloaded version goes on counting where the
//! last one stopped (the per-load counters of `/admin/plugins` start again at zero).

use metrics::{Counter, Histogram, counter, histogram};

/// `validate` calls of the send path by plugin and outcome (`accepted`, `rejected`,
/// `failed`, `busy`: every instance was taken).
pub const CALLS: &str = "courier_plugin_calls_total";
/// Fuel the plugin's `validate` calls used.
pub const FUEL: &str = "courier_plugin_fuel_total";
/// Time of one `validate` call (instance included), in seconds.
pub const CALL_SECONDS: &str = "courier_plugin_call_seconds";
/// Times the circuit breaker switched the plugin off.
pub const BREAKER_TRIPS: &str = "courier_plugin_breaker_trips_total";

/// How a `validate` call ended, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Rejected,
    Failed,
    Busy,
}

/// One plugin's handles (looked up once, at load).
pub(crate) struct Meters {
    accepted: Counter,
    rejected: Counter,
    failed: Counter,
    busy: Counter,
    fuel: Counter,
    seconds: Histogram,
    pub(crate) trips: Counter,
}

impl Meters {
    pub(crate) fn new(plugin: &str) -> Meters {
        let calls = |outcome: &'static str| counter!(CALLS, "plugin" => plugin.to_string(), "outcome" => outcome);
        Meters {
            accepted: calls("accepted"),
            rejected: calls("rejected"),
            failed: calls("failed"),
            busy: calls("busy"),
            fuel: counter!(FUEL, "plugin" => plugin.to_string()),
            seconds: histogram!(CALL_SECONDS, "plugin" => plugin.to_string()),
            trips: counter!(BREAKER_TRIPS, "plugin" => plugin.to_string()),
        }
    }

    pub(crate) fn call(&self, outcome: Outcome, cost: &crate::runtime::CallCost) {
        match outcome {
            Outcome::Accepted => &self.accepted,
            Outcome::Rejected => &self.rejected,
            Outcome::Failed => &self.failed,
            Outcome::Busy => &self.busy,
        }
        .increment(1);
        self.fuel.increment(cost.fuel);
        self.seconds.record(cost.micros as f64 / 1e6);
    }
}
