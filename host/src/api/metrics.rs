//! `GET /metrics`: the Prometheus text of `telemetry::SERIES`, on the admin token (or
//! without one on `server.metrics_listen`, an address of its own); and the layer every
//! HTTP request passes, which gives it a request id (its log lines carry it) and counts it.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument as _;

use super::{AppState, Error, require_admin};
use crate::telemetry::{self, Pulled};

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics` on the main listener: the admin token is required.
pub async fn on_admin_token(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Error> {
    require_admin(&s, &headers)?;
    Ok(scrape(&s))
}

/// `GET /metrics` on `server.metrics_listen`: no token (bind it where only Prometheus
/// reaches).
pub async fn open(State(s): State<AppState>) -> Response {
    scrape(&s)
}

fn scrape(s: &AppState) -> Response {
    refresh(s);
    (
        [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
        telemetry::render(),
    )
        .into_response()
}

/// Sets the gauges of what is there now, and the counters kept elsewhere (the guards, the
/// cluster's forwarder).
fn refresh(s: &AppState) {
    use metrics::{counter, gauge};
    let load = s.hub.load();
    gauge!(telemetry::CONNECTIONS).set(load.connections as f64);
    gauge!(telemetry::USERS_ONLINE).set(load.users as f64);
    gauge!(telemetry::OUTBOX_FRAMES).set(load.outbox_frames as f64);
    gauge!(telemetry::OUTBOX_BYTES).set(load.outbox_bytes as f64);
    for p in s.registry.list() {
        let on = if p.enabled { 1.0 } else { 0.0 };
        gauge!(telemetry::PLUGIN_ENABLED, "plugin" => p.manifest.name).set(on);
    }
    for (pool, open, idle, max) in s.core.store.pools() {
        let busy = (open as usize).saturating_sub(idle);
        gauge!(telemetry::DB_CONNECTIONS, "pool" => pool, "state" => "idle").set(idle as f64);
        gauge!(telemetry::DB_CONNECTIONS, "pool" => pool, "state" => "busy").set(busy as f64);
        gauge!(telemetry::DB_MAX, "pool" => pool).set(f64::from(max));
    }
    let degraded = !s.core.delivery.degraded().is_empty();
    gauge!(telemetry::DEGRADED).set(if degraded { 1.0 } else { 0.0 });
    if let Some(c) = s.core.delivery.cluster() {
        counter!(telemetry::CLUSTER_ROUNDS).absolute(c.rounds);
        counter!(telemetry::CLUSTER_PUBLISHES).absolute(c.publishes);
        counter!(telemetry::CLUSTER_LOST).absolute(c.lost);
        gauge!(telemetry::CLUSTER_CLOCK_OFFSET).set(crate::clock::offset() as f64 / 1000.0);
    }
    // Counted since start-up by the guards themselves: set, not added.
    for (guard, n) in s.core.guards.all() {
        if guard == crate::limits::Guard::SlowConsumer {
            counter!(telemetry::SLOW_CONSUMERS).absolute(n);
        } else {
            counter!(telemetry::REFUSALS, "guard" => guard.name()).absolute(n);
        }
    }
}

/// The request-id header: taken from the request when it is a sane id, else made here;
/// always on the response.
const REQUEST_ID: &str = "x-request-id";

/// The routes whose time is also a pull's.
const PULLS: [(&str, Pulled); 3] = [
    ("GET /v1/conversations/{id}/messages", Pulled::Messages),
    ("GET /v1/user-stream", Pulled::UserStream),
    ("GET /v1/conversations", Pulled::Overview),
];

fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            (1..=64).contains(&v.len())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
        .map_or_else(new_request_id, str::to_string)
}

/// A request id made here: 16 hex digits.
pub fn new_request_id() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// Every request runs in a `request` span (its id, method and route template — never the
/// query, which may hold a token), is counted by route and status, and answers with its id.
pub async fn observe(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(req.headers());
    // Bounded: a method HTTP does not define reads as OTHER.
    let method = match *req.method() {
        Method::GET
        | Method::POST
        | Method::PUT
        | Method::PATCH
        | Method::DELETE
        | Method::HEAD
        | Method::OPTIONS => req.method().as_str(),
        _ => "OTHER",
    };
    let route = match req.extensions().get::<MatchedPath>() {
        Some(path) => format!("{method} {}", path.as_str()),
        None => "unmatched".to_string(),
    };
    let span = tracing::info_span!("request", id = %id, route = %route);
    let mut res = next.run(req).instrument(span).await;
    let took = started.elapsed();
    telemetry::http(&route, res.status().as_u16(), took);
    if let Some((_, what)) = PULLS.iter().find(|(r, _)| *r == route) {
        telemetry::pull(*what, took);
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(REQUEST_ID, v);
    }
    res
}
