//! HTTP: health, accounts, the WebSocket upgrade, sync (overview, pull, read positions),
//! the HTTP send, the plugin list, the admin endpoints (enable, disable, reload,
//! dry-run validate), and the web client with its operator page (`web.rs`). `app(state)`
//! builds the router so tests can call it without a socket.

mod accounts;
mod conversations;
mod devices;
mod e2e;
pub mod error;
mod groups;
mod metrics;
pub mod openapi;
mod schema;
mod social;
pub mod web;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

pub use crate::protocol::{Code, Error};
pub use metrics::new_request_id;

use crate::auth::{Attempts, Passwords};
use crate::config::Config;
use crate::gateway::Gateway;
use crate::limits::Limiter;
use crate::messaging::Core;
use crate::plugins::{PluginRegistry, SendContext, SenderKind};

/// A path segment, as axum extracts it.
type Segment = Result<Path<String>, axum::extract::rejection::PathRejection>;

/// The device id of a path, or `bad_request`.
fn device_id(path: Segment) -> Result<String, Error> {
    path.ok()
        .map(|Path(s)| s)
        .filter(|d| crate::auth::valid_device_id(d))
        .ok_or_else(|| {
            Error::bad_request(format!("a device id is {}", crate::auth::DEVICE_ID_RULE))
        })
}

/// Users whose HTTP send rate is tracked at once; past it, full allowances are forgotten,
/// and a newcomer is refused while every tracked one is in use.
const HTTP_SENDERS_TRACKED: usize = 100_000;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<PluginRegistry>,
    pub core: Arc<Core>,
    /// This node's connections (the WebSocket registers its own there).
    pub hub: Arc<crate::gateway::hub::Hub>,
    /// What else hears of this node's connections (presence; the routes in cluster mode).
    pub links: Arc<dyn crate::gateway::links::Links>,
    /// The config in force (replaced on a successful reload).
    pub config: Arc<Mutex<Config>>,
    /// The file a reload re-reads; `None`: embedded defaults (and environment).
    pub config_path: Option<PathBuf>,
    /// One reload at a time, from reading the file to installing the new config.
    reloading: Arc<Mutex<()>>,
    /// Password hashing, bounded in concurrency.
    pub passwords: Arc<Passwords>,
    /// Rate limits of logins and registrations.
    pub attempts: Arc<Attempts>,
    /// The rate of each user's sends over HTTP (`POST /v1/messages`), all its tokens
    /// together: `gateway.send_rate_per_sec`, burst `gateway.send_burst`, as a connection's.
    pub http_sends: Arc<Limiter<String>>,
}

impl AppState {
    pub fn new(
        Gateway { core, hub, links }: Gateway,
        config: Config,
        config_path: Option<PathBuf>,
    ) -> AppState {
        let auth = &config.auth;
        let passwords = Passwords::new(
            auth.hash_concurrency,
            std::time::Duration::from_secs(auth.hash_queue_secs),
        );
        let attempts = Attempts::new(
            auth.attempts_per_minute_per_address,
            auth.failed_logins_per_hour_per_account,
        );
        let g = &config.gateway;
        let http_sends =
            Limiter::per_second(g.send_rate_per_sec, g.send_burst, HTTP_SENDERS_TRACKED);
        AppState {
            registry: core.registry.clone(),
            hub,
            links,
            passwords: Arc::new(passwords),
            attempts: Arc::new(attempts),
            http_sends: Arc::new(http_sends),
            core,
            config: Arc::new(Mutex::new(config)),
            config_path,
            reloading: Arc::new(Mutex::new(())),
        }
    }

    /// Re-reads the config file and reloads the plugins. CPU-heavy (compiles what changed):
    /// call from a blocking thread.
    /// The outcome is logged, however the reload was asked for (SIGHUP or the admin API).
    pub fn reload(&self) -> Result<Vec<crate::plugins::PluginInfo>, String> {
        let _one_at_a_time = self.reloading.lock().expect("reload lock");
        let result = Config::load(self.config_path.as_deref())
            .map_err(|e| e.to_string())
            .and_then(|config| {
                let list = self.registry.reload(&config).map_err(|e| e.to_string())?;
                *self.config.lock().expect("config lock") = config;
                Ok(list)
            });
        match &result {
            Ok(list) => tracing::info!(plugins = list.len(), "reload done"),
            Err(e) => tracing::error!("reload refused, the running plugins stay:\n{e}"),
        }
        result
    }

    fn admin_token(&self) -> Option<String> {
        self.config
            .lock()
            .expect("config lock")
            .server
            .admin_token
            .clone()
    }
}

impl axum::extract::FromRef<AppState> for Gateway {
    fn from_ref(s: &AppState) -> Gateway {
        Gateway {
            core: s.core.clone(),
            hub: s.hub.clone(),
            links: s.links.clone(),
        }
    }
}

/// The router of `server.metrics_listen`: `GET /metrics` without a token.
pub fn metrics_app(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics::open))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn(metrics::observe))
        .with_state(state)
}

pub fn app(state: AppState) -> Router {
    Router::new()
        // The web client's pages and files: not part of the API (nor of its OpenAPI).
        .merge(web::routes())
        .route("/healthz", get(healthz))
        .route("/v1/openapi.json", get(openapi::serve))
        .route("/v1/auth/register", post(accounts::register))
        .route("/v1/auth/login", post(accounts::login))
        .route("/v1/auth/logout", post(accounts::logout))
        .route("/v1/auth/revoke-all", post(accounts::revoke_all))
        .route("/v1/account", axum::routing::delete(accounts::delete_own))
        .route("/v1/ws", get(crate::gateway::upgrade))
        .route("/v1/messages", post(conversations::send))
        .route("/v1/conversations", get(conversations::overview))
        .route("/v1/conversations/{id}", get(conversations::one))
        .route("/v1/conversations/{id}/messages", get(conversations::pull))
        .route("/v1/conversations/{id}/read", post(conversations::read))
        .route(
            "/v1/conversations/{id}/received",
            post(conversations::received),
        )
        .route(
            "/v1/conversations/{id}/notifications",
            put(devices::notifications),
        )
        .route("/v1/devices", get(devices::list).post(devices::register))
        .route(
            "/v1/devices/{deviceId}",
            axum::routing::delete(devices::remove),
        )
        .route(
            "/v1/devices/{deviceId}/push",
            put(devices::set_push).delete(devices::clear_push),
        )
        .route(
            "/v1/devices/{deviceId}/keys",
            put(e2e::upload).get(e2e::status),
        )
        .route("/v1/devices/{deviceId}/mailbox", get(e2e::mailbox))
        .route("/v1/devices/{deviceId}/mailbox/ack", post(e2e::ack))
        .route("/v1/keys/{userId}", get(e2e::claim))
        .route("/v1/device-messages", post(e2e::send))
        .route(
            "/v1/conversations/{id}/read-positions",
            get(conversations::read_positions),
        )
        .route("/v1/user-stream", get(social::user_stream))
        .route("/v1/friends", get(social::friends))
        .route(
            "/v1/friends/{userId}",
            axum::routing::delete(social::remove_friend),
        )
        .route(
            "/v1/friends/requests",
            get(social::requests).post(social::request_friend),
        )
        .route("/v1/friends/requests/{id}/accept", post(social::accept))
        .route("/v1/friends/requests/{id}/reject", post(social::reject))
        .route("/v1/friends/requests/{id}/cancel", post(social::cancel))
        .route("/v1/presence", get(social::presence))
        .route("/v1/blocks", get(social::blocks))
        .route(
            "/v1/blocks/{userId}",
            put(social::block).delete(social::unblock),
        )
        .route("/v1/groups", get(groups::mine).post(groups::create))
        .route("/v1/groups/{id}", get(groups::one).patch(groups::patch))
        .route(
            "/v1/groups/{id}/members",
            get(groups::members).post(groups::add),
        )
        .route("/v1/groups/{id}/kick", post(groups::kick))
        .route("/v1/groups/{id}/quit", post(groups::quit))
        .route("/v1/groups/{id}/dissolve", post(groups::dissolve))
        .route("/v1/groups/{id}/transfer", post(groups::transfer))
        .route(
            "/v1/groups/{id}/admins/{userId}",
            put(groups::make_admin).delete(groups::unmake_admin),
        )
        .route("/v1/groups/{id}/mute", post(groups::mute))
        .route("/v1/groups/{id}/join", post(groups::join))
        .route("/v1/groups/{id}/join-requests", get(groups::join_requests))
        .route(
            "/v1/groups/{id}/join-requests/{userId}/approve",
            post(groups::approve),
        )
        .route(
            "/v1/groups/{id}/join-requests/{userId}/reject",
            post(groups::reject),
        )
        .route("/v1/groups/{id}/receipts", post(groups::receipts))
        .route("/v1/plugins", get(list_plugins))
        .route("/admin/plugins", get(admin_list))
        .route("/admin/plugins/{name}/enable", post(enable))
        .route("/admin/plugins/{name}/disable", post(disable))
        .route("/admin/plugins/reload", post(reload))
        .route("/admin/validate", post(dry_run))
        .route("/admin/node", get(admin_node))
        .route("/metrics", get(metrics::on_admin_token))
        .route("/admin/users/{userId}/stream/reset", post(reset_stream))
        .route(
            "/admin/users/{userId}/revoke-all",
            post(accounts::admin_revoke_all),
        )
        .route(
            "/admin/users/{userId}",
            axum::routing::delete(accounts::admin_delete),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn(metrics::observe))
        .with_state(state)
}

async fn no_route(uri: axum::http::Uri) -> Error {
    Error::not_found(format!("no endpoint at {}", uri.path()))
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Error {
    Error::new(
        Code::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// `ok`, or `degraded` with the reasons: a cluster node that cannot reach Redis or the
/// bus still serves its own devices and every pull.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, body = schema::Health)))]
async fn healthz(State(s): State<AppState>) -> Json<schema::Health> {
    let reasons = s.core.delivery.degraded();
    Json(if reasons.is_empty() {
        schema::Health {
            status: schema::Status::Ok,
            reasons: None,
        }
    } else {
        schema::Health {
            status: schema::Status::Degraded,
            reasons: Some(reasons),
        }
    })
}

/// `GET /admin/node`: this node's health, its commit batches, and in cluster mode what it
/// forwarded to the other nodes.
#[utoipa::path(get, path = "/admin/node", tag = "admin", security(("adminToken" = [])),
    responses((status = 200, body = schema::NodeState)))]
async fn admin_node(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<schema::NodeState>, Error> {
    require_admin(&s, &headers)?;
    let reasons = s.core.delivery.degraded();
    Ok(Json(schema::NodeState {
        status: if reasons.is_empty() {
            schema::Status::Ok
        } else {
            schema::Status::Degraded
        },
        reasons,
        online_devices: s.core.delivery.online_devices(),
        commit_batches: s.core.batches.load(std::sync::atomic::Ordering::Relaxed),
        cluster: s.core.delivery.cluster(),
    }))
}

#[utoipa::path(get, path = "/v1/plugins", tag = "plugins", security(("userToken" = [])),
    responses((status = 200, body = schema::PluginList)))]
async fn list_plugins(_user: User, State(s): State<AppState>) -> Json<Value> {
    Json(json!({ "plugins": s.registry.list() }))
}

pub use crate::protocol::bearer;

/// The user a request's bearer token speaks for.
pub struct User(pub String);

impl axum::extract::FromRequestParts<AppState> for User {
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        s: &AppState,
    ) -> Result<User, Error> {
        let Authenticated(session) = Authenticated::from_request_parts(parts, s).await?;
        Ok(User(session.user_id))
    }
}

/// The session (user and token) of a request's bearer token.
pub struct Authenticated(pub crate::messaging::Session);

impl axum::extract::FromRequestParts<AppState> for Authenticated {
    type Rejection = Error;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        s: &AppState,
    ) -> Result<Authenticated, Error> {
        let token = bearer(&parts.headers).ok_or_else(Error::unauthorized)?;
        Ok(Authenticated(s.core.authenticate(token).await?))
    }
}

pub use crate::protocol::{BodyTimeout, Peer};

/// A JSON body of at most `gateway.max_frame_bytes`, with a bad one answered in the error
/// envelope.
pub struct Body<T>(pub T);

impl<T: serde::de::DeserializeOwned> axum::extract::FromRequest<AppState> for Body<T> {
    type Rejection = Error;

    async fn from_request(req: axum::extract::Request, s: &AppState) -> Result<Body<T>, Error> {
        read_json(req, s.core.settings.max_frame_bytes)
            .await
            .map(Body)
    }
}

/// The body of an endpoint that takes none: nothing, or `{}`. A field is `400
/// bad_request` naming it, and anything but JSON too, as on every endpoint
/// (docs/protocol.md, Conventions).
pub struct NoBody;

impl axum::extract::FromRequest<AppState> for NoBody {
    type Rejection = Error;

    async fn from_request(req: axum::extract::Request, s: &AppState) -> Result<NoBody, Error> {
        let bytes = read_body(req, s.core.settings.max_frame_bytes).await?;
        if bytes.trim_ascii().is_empty() {
            return Ok(NoBody);
        }
        match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes) {
            Ok(fields) => match fields.keys().next() {
                None => Ok(NoBody),
                Some(field) => Err(Error::bad_request(format!(
                    "bad request body: unknown field `{field}`: this endpoint takes no body"
                ))),
            },
            Err(_) => Err(Error::bad_request(
                "this endpoint takes no body (nothing, or {})",
            )),
        }
    }
}

/// Refuses the fields of a WebSocket frame that the HTTP body of the same request does not
/// take (`type`, `id`), naming them as an unknown field is named.
pub fn no_frame_fields(kind: Option<&str>, id: Option<&str>) -> Result<(), Error> {
    for (field, there) in [("type", kind.is_some()), ("id", id.is_some())] {
        if there {
            return Err(Error::bad_request(format!(
                "bad request body: unknown field `{field}` (a WebSocket frame's, not the HTTP body's)"
            )));
        }
    }
    Ok(())
}

/// Largest body of an `/admin/*` request.
const ADMIN_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// Reads a JSON body of at most `limit` bytes: `request_too_large` above, `bad_request`
/// for one that cannot be read or parsed (or is missing where one is required). A client
/// that waits to be told to send its body (`Expect: 100-continue`) and announces one too
/// large is refused before it sends any (the connection then closes: `server::listener`).
/// Any other is read up to the limit first: closing on a body still arriving would reset
/// the connection, and the client could lose the answer with it.
async fn read_json<T: serde::de::DeserializeOwned>(
    req: axum::extract::Request,
    limit: usize,
) -> Result<T, Error> {
    let bytes = read_body(req, limit).await?;
    // A body is an object: serde would also read a struct from an array of its fields.
    if bytes.trim_ascii_start().starts_with(b"[") {
        return Err(Error::bad_request("the request body is a JSON object"));
    }
    // No body reads as `null`: an optional body (`Body<Option<T>>`) may be left out.
    let text: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
    serde_json::from_slice(text).map_err(|e| match bytes.is_empty() {
        true => Error::bad_request("the request needs a JSON body"),
        false => Error::bad_request(format!("bad request body: {e}")),
    })
}

/// The body of a request, at most `limit` bytes (see `read_json`).
async fn read_body(req: axum::extract::Request, limit: usize) -> Result<axum::body::Bytes, Error> {
    let too_large = || {
        Error::new(
            Code::RequestTooLarge,
            format!("the request body is over {limit} bytes"),
        )
    };
    let headers = req.headers();
    let waits = headers
        .get(axum::http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let announced = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if waits && announced.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|e| {
            if caused_by::<BodyTimeout>(&e) {
                Error::new(
                    Code::RequestTimeout,
                    "the request body did not arrive in time; the connection is closed",
                )
            } else if format!("{e:?}").contains("LengthLimit") {
                too_large()
            } else {
                Error::bad_request(format!("cannot read the request body: {e}"))
            }
        })?;
    Ok(bytes)
}

/// Whether `E` is somewhere in the chain of `e`'s sources.
fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.is::<E>() {
            return true;
        }
        next = err.source();
    }
    false
}

pub(crate) fn require_admin(s: &AppState, headers: &HeaderMap) -> Result<(), Error> {
    let Some(token) = s.admin_token() else {
        return Err(Error::new(
            Code::AdminDisabled,
            "the admin endpoints are off: set server.admin_token in the config",
        ));
    };
    match bearer(headers) {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(Error::unauthorized()),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[utoipa::path(get, path = "/admin/plugins", tag = "admin", security(("adminToken" = [])),
    responses((status = 200, body = schema::PluginList)))]
async fn admin_list(State(s): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, Error> {
    require_admin(&s, &headers)?;
    Ok(Json(json!({ "plugins": s.registry.list() })))
}

/// The `{name}` path segment, with a bad one answered in the error envelope.
fn plugin_name(
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<String, Error> {
    path.map(|Path(name)| name)
        .map_err(|e| Error::bad_request(format!("bad plugin name in the path: {e}")))
}

#[utoipa::path(post, path = "/admin/plugins/{name}/enable", tag = "admin",
    security(("adminToken" = [])), params(("name" = String, Path, description = "the plugin's name")),
    responses((status = 200, body = schema::PluginAnswer)))]
async fn enable(
    State(s): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    _: NoBody,
) -> Result<Json<Value>, Error> {
    switch(s, headers, plugin_name(path)?, true)
}

#[utoipa::path(post, path = "/admin/plugins/{name}/disable", tag = "admin",
    security(("adminToken" = [])), params(("name" = String, Path, description = "the plugin's name")),
    responses((status = 200, body = schema::PluginAnswer)))]
async fn disable(
    State(s): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    _: NoBody,
) -> Result<Json<Value>, Error> {
    switch(s, headers, plugin_name(path)?, false)
}

fn switch(s: AppState, headers: HeaderMap, name: String, on: bool) -> Result<Json<Value>, Error> {
    require_admin(&s, &headers)?;
    let info = s
        .registry
        .set_enabled(&name, on)
        .ok_or_else(|| Error::new(Code::PluginNotFound, format!("no plugin named {name:?}")))?;
    // Every node of a cluster switches it too.
    s.core.delivery.announce(&crate::messaging::Forget::Plugin {
        name,
        enabled: on,
        at: crate::clock::now_ms(),
    });
    Ok(Json(json!({ "plugin": info })))
}

#[utoipa::path(post, path = "/admin/plugins/reload", tag = "admin", security(("adminToken" = [])),
    responses((status = 200, body = schema::PluginList)))]
async fn reload(
    State(s): State<AppState>,
    headers: HeaderMap,
    _: NoBody,
) -> Result<Json<Value>, Error> {
    require_admin(&s, &headers)?;
    let state = s.clone();
    // The reload's log lines carry the request's id.
    let span = tracing::Span::current();
    let result = tokio::task::spawn_blocking(move || span.in_scope(|| state.reload()))
        .await
        .map_err(|e| Error::new(Code::Internal, e.to_string()))?;
    match result {
        Ok(list) => Ok(Json(json!({ "plugins": list }))),
        Err(message) => Err(Error::new(Code::ReloadRefused, message)),
    }
}

/// Compacts a user's stream: a new epoch, so their devices resync from the snapshots.
#[utoipa::path(post, path = "/admin/users/{userId}/stream/reset", tag = "admin",
    security(("adminToken" = [])), params(("userId" = String, Path)),
    responses((status = 200, body = schema::StreamReset)))]
async fn reset_stream(
    State(s): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    _: NoBody,
) -> Result<Json<schema::StreamReset>, Error> {
    require_admin(&s, &headers)?;
    let user = path
        .map(|Path(u)| u)
        .map_err(|e| Error::bad_request(format!("bad path: {e}")))?;
    if !crate::auth::valid_user_id(&user) {
        return Err(Error::bad_request("not a valid user id"));
    }
    if s.core
        .store
        .password_hash(&user)
        .await
        .map_err(crate::store::unavailable)?
        .is_none()
    {
        return Err(crate::protocol::Refused::UserNotFound(user).into());
    }
    let epoch = s
        .core
        .store
        .reset_user_stream(&user)
        .await
        .map_err(crate::store::unavailable)?;
    Ok(Json(schema::StreamReset {
        user_id: user,
        epoch,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DryRun {
    content_type: u32,
    conversation_type: u8,
    /// The payload, given to the plugin as it was written here (as a send's is).
    #[schema(value_type = Object)]
    payload: Box<serde_json::value::RawValue>,
    /// Validate as the server itself (system kinds).
    #[serde(default)]
    as_system: bool,
}

/// Runs the send path's plugin checks on a payload without sending anything.
#[utoipa::path(post, path = "/admin/validate", tag = "admin", security(("adminToken" = [])),
    request_body = DryRun, responses((status = 200, body = schema::DryRunAnswer)))]
async fn dry_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: axum::extract::Request,
) -> Result<Json<schema::DryRunAnswer>, Error> {
    require_admin(&s, &headers)?;
    let req: DryRun = read_json(body, ADMIN_BODY_LIMIT).await?;
    let payload = req.payload.get().to_string();
    let registry = s.registry.clone();
    let result = tokio::task::spawn_blocking(move || {
        let ctx = SendContext {
            sender_id: if req.as_system { "system" } else { "admin" },
            sender: if req.as_system {
                SenderKind::System
            } else {
                SenderKind::User
            },
            conversation_type: req.conversation_type,
            conversation_id: "dry-run",
        };
        registry
            .dry_run(req.content_type, &ctx, payload.as_bytes())
            .map(|v| {
                let preview = registry.preview(req.content_type, v.payload.get());
                (v.into_text(), preview)
            })
    })
    .await
    .map_err(|e| Error::new(Code::Internal, e.to_string()))?;
    let (normalized, preview) = result?;
    Ok(Json(schema::DryRunAnswer {
        payload: crate::protocol::frames::raw(&normalized),
        preview,
    }))
}
