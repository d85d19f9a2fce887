//! The one typed configuration: embedded defaults, then a TOML file, then `COURIER_…`
//! environment variables (`__` separates nesting: `COURIER_SERVER__LISTEN`). Unknown keys
//! are errors that name the key. `check()` runs at start-up and on every reload.
//!
//! A variable's value is text, read as its key's type: a string key takes it exactly as
//! written (a token of digits stays a token), a number or switch key parses it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};

pub use crate::plugins::{Isolation, PluginEntry, RuntimeConfig};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("config: {0}")]
    Check(String),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub runtime: RuntimeConfig,
    pub storage: StorageConfig,
    pub auth: AuthConfig,
    pub gateway: GatewayConfig,
    pub messaging: MessagingConfig,
    /// `[cluster]`: present, this node is one of several sharing PostgreSQL; absent, it
    /// runs alone.
    pub cluster: Option<ClusterConfig>,
    /// `[push]`: offline notices to the deployer's webhook.
    pub push: PushConfig,
    /// `[e2e]`: the key directory and the device mailboxes.
    pub e2e: E2eConfig,
    pub log: LogConfig,
    /// `[plugins.<name>]`: per-plugin switches, paths and pins, keyed by manifest name.
    pub plugins: BTreeMap<String, PluginEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the HTTP/WebSocket listener binds.
    pub listen: SocketAddr,
    /// Bearer token for `/admin/*`. Without it the admin endpoints answer `admin_disabled`.
    pub admin_token: Option<String>,
    /// A second address serving only `GET /metrics`, without a token (for Prometheus;
    /// bind it where only the scraper reaches). Unset: `/metrics` is on the main address,
    /// on the admin token.
    pub metrics_listen: Option<SocketAddr>,
    /// This server's number (0–1023), part of every message id it makes: give each node
    /// sharing one database its own.
    pub node_id: u16,
    /// Open connections (HTTP and WebSocket) at once; beyond, a new one is refused with
    /// `503 too_many_connections`. 0: the open-file limit minus 1024.
    pub max_connections: usize,
    /// Open connections from one client address (an IPv6 /64 counts as one). 0: no cap
    /// (behind a proxy every client has the proxy's address).
    pub max_connections_per_address: usize,
    /// A request's head must arrive whole within this many seconds of its first byte (or
    /// of the connection's opening).
    pub header_timeout_secs: u64,
    /// A request's body must arrive whole within this many seconds of its head.
    pub body_timeout_secs: u64,
    /// A keep-alive connection with no request for this long is closed.
    pub idle_timeout_secs: u64,
    /// A request must be answered, its response written whole, within this many seconds
    /// of its head; a client that stops reading its responses is cut off.
    pub request_timeout_secs: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSync {
    /// fsync at every commit: an ack survives a power loss.
    Full,
    /// fsync at checkpoints only: an ack survives a crash of the server process, not a
    /// power loss.
    Normal,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// `sqlite://path/to/file.db` (created if missing) or `postgres://user@host/db`.
    pub url: String,
    /// SQLite's `synchronous` mode: what an acknowledgement promises.
    pub sqlite_synchronous: SqliteSync,
    /// Connections the server opens for reads (pulls, overviews).
    pub max_connections: u32,
    /// Most sends committed together in one transaction.
    pub batch_max: usize,
    /// Committers on PostgreSQL, each owning a share of the conversations (SQLite has one
    /// writer and always uses one).
    pub committers: usize,
    /// PostgreSQL: how long a connection from the pool, and then the database's answers on
    /// it, are waited for before the work fails with `store_unavailable` (a missed answer
    /// takes the connection for dead). 1..=3600.
    pub answer_timeout_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// HS256 key for the tokens, shared with the deployer's backend if it signs its own
    /// (`sub` = user id). Unset: the server makes one and keeps it in the database.
    pub jwt_secret: Option<String>,
    /// Lifetime of the tokens `/v1/auth/login` and `/v1/auth/register` issue.
    pub token_ttl_secs: u64,
    /// `POST /v1/auth/register` is open. Off: accounts come from the deployer's tokens.
    pub registration: bool,
    /// Password hashes computed at once (each takes 19 MiB for its duration). 0: the
    /// number of cores.
    pub hash_concurrency: usize,
    /// How long a login or registration waits for a hashing slot before `503 busy`.
    pub hash_queue_secs: u64,
    /// Logins and registrations one client address may attempt per minute (in a burst of
    /// as many). 0: no limit.
    pub attempts_per_minute_per_address: u32,
    /// Failed logins one account may have per hour (in a burst of as many) before its
    /// logins are refused with `429 rate_limited` for a while. 0: no limit.
    pub failed_logins_per_hour_per_account: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Largest WebSocket frame (and HTTP send body) accepted, in bytes.
    pub max_frame_bytes: usize,
    /// A device that sends nothing for this long is dropped.
    pub heartbeat_secs: u64,
    /// Sends a connection may make per second, on average…
    pub send_rate_per_sec: u32,
    /// …and in a burst.
    pub send_burst: u32,
    /// Frames that may wait for a slow consumer before it is disconnected.
    pub outbox_frames: usize,
    /// Bytes that may wait for one connection (queued and being written) before it is
    /// disconnected as a slow consumer, whichever of this and `outbox_frames` comes first.
    pub outbox_bytes: usize,
    /// Bytes of frames waiting for all connections of this node together (a frame pushed
    /// to many devices counts once). Above it, every connection with frames still queued
    /// is disconnected as a slow consumer on its next push.
    pub node_outbox_bytes: usize,
    /// The WebSocket upgrade must complete and the `hello` frame reach the client within
    /// this many seconds of the connection's opening.
    pub handshake_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MessagingConfig {
    /// How long after sending a message its sender may recall it.
    pub recall_window_secs: u64,
    /// Most members a group or channel may have, the owner included.
    pub max_group_members: u32,
    /// Most devices a user may have registered (removed ones do not count).
    pub max_devices_per_user: u32,
    /// A user's friends are told of its presence at most once per this many seconds.
    pub presence_interval_secs: u64,
    /// Keep delivered positions: a device's `received` moves its user's position, a
    /// private conversation's other member gets a `delivered` frame, group receipts count
    /// deliveries. Off: `received` is answered and nothing is written.
    pub delivery_receipts: bool,
}

/// End-to-end encryption support: the key directory (X3DH) and the device mailboxes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct E2eConfig {
    /// One-time prekeys a device may hold.
    pub one_time_prekeys_max: u32,
    /// Below this many one-time prekeys left, the device's user stream gets `keys.low`.
    pub one_time_prekeys_low: u32,
    /// Bundles one user may claim of another per minute (and as a burst), per node.
    pub claims_per_minute: u32,
    /// After a rotation, the previous signed prekey stays in the bundles this long.
    pub signed_prekey_grace_secs: u64,
    /// Entries a device's mailbox holds at most.
    pub mailbox_max_entries: u32,
    /// An entry expires this long after it was sent.
    pub mailbox_ttl_secs: u64,
    /// Devices one send may address.
    pub mailbox_max_targets: u32,
}

impl Default for E2eConfig {
    fn default() -> Self {
        Self {
            one_time_prekeys_max: 100,
            one_time_prekeys_low: 10,
            claims_per_minute: 30,
            signed_prekey_grace_secs: 7 * 24 * 3600,
            mailbox_max_entries: 1000,
            mailbox_ttl_secs: 7 * 24 * 3600,
            mailbox_max_targets: 100,
        }
    }
}

impl E2eConfig {
    fn check(&self) -> Result<(), ConfigError> {
        let positive = [
            self.one_time_prekeys_max,
            self.claims_per_minute,
            self.mailbox_max_entries,
            self.mailbox_max_targets,
        ];
        if positive.contains(&0) || self.mailbox_ttl_secs == 0 {
            return Err(ConfigError::Check(
                "e2e.one_time_prekeys_max, claims_per_minute, mailbox_max_entries, \
                 mailbox_max_targets and mailbox_ttl_secs must be positive"
                    .into(),
            ));
        }
        if self.one_time_prekeys_low > self.one_time_prekeys_max {
            return Err(ConfigError::Check(
                "e2e.one_time_prekeys_low must not be above one_time_prekeys_max".into(),
            ));
        }
        Ok(())
    }
}

/// Offline push: a notice to the deployer's webhook (which forwards to APNs, FCM, …) when a
/// stored message that counts toward unread reaches a user none of whose devices is online.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PushConfig {
    /// Where notices are POSTed (`http://` or `https://`). Unset: no offline push.
    pub webhook_url: Option<String>,
    /// The key of each notice's HMAC-SHA256 signature (`x-courier-signature`), at least 32
    /// characters; required with `webhook_url`.
    pub webhook_secret: Option<String>,
    /// A user's messages within this many milliseconds of the first go in one notice.
    pub coalesce_ms: u64,
    /// One POST waits at most this long for its answer.
    pub timeout_secs: u64,
    /// POSTs in flight at once.
    pub concurrency: usize,
    /// Users waiting for a notice at most; past it, notices are dropped (and counted).
    pub queue: usize,
}

impl Default for PushConfig {
    fn default() -> Self {
        Self {
            webhook_url: None,
            webhook_secret: None,
            coalesce_ms: 1000,
            timeout_secs: 5,
            concurrency: 8,
            queue: 10_000,
        }
    }
}

impl PushConfig {
    fn check(&self) -> Result<(), ConfigError> {
        let Some(url) = &self.webhook_url else {
            return Ok(());
        };
        if !(url.starts_with("http://") || url.starts_with("https://"))
            || url.parse::<http::Uri>().is_err()
        {
            return Err(ConfigError::Check(
                "push.webhook_url must be an http:// or https:// URL".into(),
            ));
        }
        if self.webhook_secret.as_ref().is_none_or(|s| s.len() < 32) {
            return Err(ConfigError::Check(
                "push.webhook_secret (at least 32 characters) is required with push.webhook_url"
                    .into(),
            ));
        }
        if self.timeout_secs == 0 || self.concurrency == 0 || self.queue == 0 {
            return Err(ConfigError::Check(
                "push.timeout_secs, push.concurrency and push.queue must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// How the server writes its log (to stderr).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Lines for people; coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line, never coloured.
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// What is logged, as `tracing` filter directives (`info`, `warn,courier::gateway=debug`);
    /// the `COURIER_LOG` environment variable, when set, wins.
    pub filter: String,
}

/// Which message bus carries pushes, kicks and cache invalidations between nodes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BusKind {
    #[default]
    Nats,
    Redis,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node's number (0–1023), unique among the live nodes; it is also the node
    /// number in the message ids it makes (`server.node_id` stays unset).
    pub node_id: u16,
    /// Device routes and presence, and the node leases.
    pub redis_url: String,
    pub bus: BusKind,
    /// The bus's address: a NATS server (`nats://…`), or with `bus = "redis"` a Redis
    /// (`redis://…`). Unset: `nats://127.0.0.1:4222` for NATS, `redis_url` for Redis (as is
    /// an empty one); `bus_address()` resolves it.
    pub bus_url: Option<String>,
    /// Starts every Redis key and bus subject: deployments that share a Redis or NATS
    /// keep apart by it.
    pub prefix: String,
    /// How long a device's route lives in Redis without a refresh.
    pub route_ttl_secs: u64,
    /// How often this node refreshes its routes (one pipelined write for all of them).
    pub refresh_secs: u64,
    /// How long this node's claim on its `node_id` lives without a refresh; a node that
    /// crashed holds its number this long.
    pub lease_secs: u64,
    /// What a node caches of other nodes' changes (members, mutes, blocks, accounts) is
    /// read again after this many seconds even if the bus never said it changed.
    pub cache_secs: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            node_id: 0,
            redis_url: "redis://127.0.0.1:6379".into(),
            bus: BusKind::Nats,
            bus_url: None,
            prefix: "courier".into(),
            route_ttl_secs: 90,
            refresh_secs: 30,
            lease_secs: 10,
            cache_secs: 10,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://data/courier.db".into(),
            sqlite_synchronous: SqliteSync::Full,
            max_connections: 8,
            batch_max: 4096,
            committers: 2,
            answer_timeout_secs: 5,
        }
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_secret: None,
            token_ttl_secs: 7 * 24 * 3600,
            registration: true,
            hash_concurrency: 0,
            hash_queue_secs: 5,
            attempts_per_minute_per_address: 30,
            failed_logins_per_hour_per_account: 20,
        }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            max_frame_bytes: 1024 * 1024 + 64 * 1024,
            heartbeat_secs: 90,
            send_rate_per_sec: 100,
            send_burst: 200,
            outbox_frames: 1024,
            outbox_bytes: 8 * 1024 * 1024,
            node_outbox_bytes: 512 * 1024 * 1024,
            handshake_secs: 10,
        }
    }
}

impl Default for MessagingConfig {
    fn default() -> Self {
        Self {
            recall_window_secs: 120,
            max_group_members: 2000,
            max_devices_per_user: 100,
            presence_interval_secs: 2,
            delivery_receipts: true,
        }
    }
}

/// The NATS server a NATS bus connects to when `cluster.bus_url` is not set.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

impl ClusterConfig {
    /// Where the bus connects: `bus_url` when set and not empty; otherwise
    /// `DEFAULT_NATS_URL` for a NATS bus and `redis_url` for a Redis one (`check()` refuses
    /// an empty `bus_url` for NATS).
    pub fn bus_address(&self) -> &str {
        match (self.bus_url.as_deref(), self.bus) {
            (Some(url), _) if !url.is_empty() => url,
            (_, BusKind::Nats) => DEFAULT_NATS_URL,
            (_, BusKind::Redis) => &self.redis_url,
        }
    }

    fn check(&self, config: &Config) -> Result<(), ConfigError> {
        let fail = |m: &str| Err(ConfigError::Check(m.into()));
        if config.storage.url.starts_with("sqlite:") {
            return fail(
                "cluster mode needs PostgreSQL: nodes cannot share an embedded SQLite file; set storage.url to postgres://… or remove [cluster]",
            );
        }
        if self.node_id > 1023 {
            return fail("cluster.node_id must be between 0 and 1023");
        }
        if config.server.node_id != 0 && config.server.node_id != self.node_id {
            return fail(
                "server.node_id and cluster.node_id differ: in cluster mode set cluster.node_id only",
            );
        }
        // This build's Redis client has no TLS: a `rediss://` URL is refused here, not by
        // a connection that fails once the node has claimed its number.
        if !self.redis_url.starts_with("redis://") {
            return fail(
                "cluster.redis_url must start with redis:// (rediss://, TLS, is not supported)",
            );
        }
        match (self.bus, self.bus_url.as_deref()) {
            (BusKind::Nats, Some("")) => {
                return fail("cluster.bus_url must name the NATS server");
            }
            (BusKind::Redis, Some(url)) if !url.is_empty() && !url.starts_with("redis://") => {
                return fail(
                    "cluster.bus_url must start with redis:// with bus = \"redis\" (rediss://, TLS, is not supported)",
                );
            }
            _ => {}
        }
        if self.prefix.is_empty()
            || !self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return fail("cluster.prefix must be letters, digits, _ or -");
        }
        if self.route_ttl_secs < 3
            || self.refresh_secs == 0
            || self.refresh_secs * 2 > self.route_ttl_secs
        {
            return fail(
                "cluster.refresh_secs must be positive and at most half of cluster.route_ttl_secs (at least 3)",
            );
        }
        if self.lease_secs < 2 || self.cache_secs == 0 {
            return fail("cluster.lease_secs must be at least 2 and cluster.cache_secs positive");
        }
        Ok(())
    }
}

impl Config {
    /// The node number in this node's message ids.
    pub fn node_id(&self) -> u16 {
        self.cluster
            .as_ref()
            .map_or(self.server.node_id, |c| c.node_id)
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            filter: "info".to_string(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_token: None,
            metrics_listen: None,
            node_id: 0,
            max_connections: 0,
            max_connections_per_address: 1000,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            idle_timeout_secs: 60,
            request_timeout_secs: 60,
        }
    }
}

impl Config {
    /// Defaults, then `file` (if any), then `COURIER_…` environment variables; then `check()`.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.is_file() {
                return Err(ConfigError::Invalid {
                    path: file.display().to_string(),
                    message: "no such file".into(),
                });
            }
            fig = fig.merge(Toml::file_exact(file));
        }
        let invalid = |e: figment::Error| ConfigError::Invalid {
            path: file
                .map(|f| f.display().to_string())
                .unwrap_or_else(|| "(defaults)".into()),
            message: e.to_string(),
        };
        // The file's values have their TOML types: a number key given "30" is refused.
        fig.extract::<Config>().map_err(invalid)?;
        // Lossy: a number or switch key also reads a string that spells one, as every value
        // from the environment is.
        let config: Config = fig
            .merge(EnvText(config_env()))
            .extract_lossy()
            .map_err(invalid)?;
        config.check()?;
        Ok(config)
    }

    /// Parses TOML text alone (no environment), then `check()`. Used by tests and tools.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError::Invalid {
                path: "(inline)".into(),
                message: e.to_string(),
            })?;
        config.check()?;
        Ok(config)
    }

    /// Checks what types cannot: ranges and formats.
    pub fn check(&self) -> Result<(), ConfigError> {
        let r = &self.runtime;
        if r.fuel_per_call < 10_000 {
            return Err(ConfigError::Check(
                "runtime.fuel_per_call must be at least 10000".into(),
            ));
        }
        if !(1..=4096).contains(&r.memory_mib) {
            return Err(ConfigError::Check(
                "runtime.memory_mib must be between 1 and 4096".into(),
            ));
        }
        if r.recycle_after_calls == 0 || r.breaker_failures == 0 || r.breaker_window_secs == 0 {
            return Err(ConfigError::Check(
                "runtime.recycle_after_calls, breaker_failures and breaker_window_secs must be positive".into(),
            ));
        }
        // The token goes in an HTTP header, which carries visible ASCII whole (spaces at
        // its ends are stripped, other bytes are not text): any other token could never
        // be given.
        if let Some(token) = &self.server.admin_token
            && (token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(ConfigError::Check(
                "server.admin_token must be at least 16 characters, each a visible ASCII \
                 character (! to ~: no spaces)"
                    .into(),
            ));
        }
        if !(self.storage.url.starts_with("sqlite:")
            || self.storage.url.starts_with("postgres:")
            || self.storage.url.starts_with("postgresql:"))
        {
            return Err(ConfigError::Check(
                "storage.url must start with sqlite:, postgres: or postgresql:".into(),
            ));
        }
        if self.server.node_id > 1023 {
            return Err(ConfigError::Check(
                "server.node_id must be between 0 and 1023".into(),
            ));
        }
        if let Some(c) = &self.cluster {
            c.check(self)?;
        }
        self.push.check()?;
        self.e2e.check()?;
        if !(1..=64).contains(&self.storage.committers) {
            return Err(ConfigError::Check(
                "storage.committers must be between 1 and 64".into(),
            ));
        }
        if self.storage.max_connections == 0 || !(1..=16384).contains(&self.storage.batch_max) {
            return Err(ConfigError::Check(
                "storage.max_connections must be positive and storage.batch_max 1..=16384".into(),
            ));
        }
        if !(1..=3600).contains(&self.storage.answer_timeout_secs) {
            return Err(ConfigError::Check(
                "storage.answer_timeout_secs must be between 1 and 3600".into(),
            ));
        }
        if let Some(secret) = &self.auth.jwt_secret
            && secret.len() < 32
        {
            return Err(ConfigError::Check(
                "auth.jwt_secret must be at least 32 bytes (in UTF-8)".into(),
            ));
        }
        let g = &self.gateway;
        refuse_failing(&[
            (
                "gateway.max_frame_bytes must be at least 1024",
                g.max_frame_bytes < 1024,
            ),
            (
                "gateway.outbox_frames must be at least 16",
                g.outbox_frames < 16,
            ),
            (
                "gateway.heartbeat_secs must be positive",
                g.heartbeat_secs == 0,
            ),
            (
                "gateway.send_rate_per_sec must be positive",
                g.send_rate_per_sec == 0,
            ),
            ("gateway.send_burst must be positive", g.send_burst == 0),
            (
                "gateway.handshake_secs must be positive",
                g.handshake_secs == 0,
            ),
        ])?;
        // A frame pushed to a connection must fit its budget, or no large message could
        // ever be delivered.
        if g.outbox_bytes < 2 * g.max_frame_bytes || g.node_outbox_bytes < g.outbox_bytes {
            return Err(ConfigError::Check(
                "gateway: outbox_bytes must be at least twice max_frame_bytes, and node_outbox_bytes at least outbox_bytes".into(),
            ));
        }
        let s = &self.server;
        refuse_failing(&[
            (
                "server.header_timeout_secs must be positive",
                s.header_timeout_secs == 0,
            ),
            (
                "server.body_timeout_secs must be positive",
                s.body_timeout_secs == 0,
            ),
            (
                "server.idle_timeout_secs must be positive",
                s.idle_timeout_secs == 0,
            ),
            (
                "server.request_timeout_secs must be positive",
                s.request_timeout_secs == 0,
            ),
        ])?;
        refuse_failing(&[
            (
                "auth.hash_queue_secs must be positive",
                self.auth.hash_queue_secs == 0,
            ),
            (
                "auth.token_ttl_secs must be positive",
                self.auth.token_ttl_secs == 0,
            ),
            (
                "messaging.max_group_members must be positive",
                self.messaging.max_group_members == 0,
            ),
            (
                "messaging.max_devices_per_user must be positive",
                self.messaging.max_devices_per_user == 0,
            ),
            (
                "storage.url names no SQLite file (sqlite://FILE)",
                self.storage
                    .url
                    .strip_prefix("sqlite:")
                    .is_some_and(|rest| {
                        rest.trim_start_matches('/')
                            .split('?')
                            .next()
                            .is_none_or(str::is_empty)
                    }),
            ),
        ])?;
        for (name, entry) in &self.plugins {
            if entry.fuel_per_call.is_some_and(|f| f < 10_000) {
                return Err(ConfigError::Check(format!(
                    "plugins.{name}.fuel_per_call must be at least 10000"
                )));
            }
            if let Some(pin) = &entry.sha256
                && (pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                return Err(ConfigError::Check(format!(
                    "plugins.{name}.sha256 must be 64 hex digits"
                )));
            }
        }
        Ok(())
    }
}

/// Refuses with every rule of `rules` that fails (`true`), each by its own words.
fn refuse_failing(rules: &[(&str, bool)]) -> Result<(), ConfigError> {
    let failing: Vec<&str> = rules.iter().filter(|r| r.1).map(|r| r.0).collect();
    match failing.is_empty() {
        true => Ok(()),
        false => Err(ConfigError::Check(failing.join("; "))),
    }
}

/// The environment's config keys: `COURIER_<SECTION>__<KEY>` (and deeper, `__` between
/// levels). Variables of any other shape under the prefix (`COURIER_LOG`, a deployment's
/// own `COURIER_BIN`) are not config and are left alone; one of this shape with an unknown
/// key is refused by `deny_unknown_fields`, naming it.
fn config_env() -> Env {
    Env::prefixed("COURIER_")
        .filter(|key| key.as_str().contains("__"))
        .split("__")
}

/// The variables of an `Env` with every value kept as text. Figment's `Env` parses each
/// value (`1234…` becomes a number, `true` a switch, `[a]` a list), which a string key then
/// refuses, and a parse loses text (`0012` → 12); with text only, the key's type decides,
/// and `extract_lossy` parses the numbers and switches. As that parse did, the text is
/// trimmed, and a value in double quotes is the text inside them (`"0012"` → `0012`).
struct EnvText(Env);

/// A variable's value as its key reads it (`EnvText`).
fn env_text(value: &str) -> String {
    let value = value.trim();
    match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => inner.to_string(),
        None => value.to_string(),
    }
}

impl Provider for EnvText {
    fn metadata(&self) -> Metadata {
        self.0.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut dict = Dict::new();
        for (key, value) in self.0.iter() {
            let path: Vec<&str> = key.as_str().split('.').filter(|k| !k.is_empty()).collect();
            insert(&mut dict, &path, env_text(&value));
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// Puts `value` at `path` in `dict`, making the tables on the way.
fn insert(dict: &mut Dict, path: &[&str], value: String) {
    match path {
        [] => {}
        [last] => {
            dict.insert((*last).to_string(), Value::from(value));
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry((*first).to_string())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, table) = entry {
                insert(table, rest, value);
            }
        }
    }
}

/// The registry loads what the config names, and the components bundled with the binary.
impl crate::plugins::Setup for Config {
    fn runtime(&self) -> &RuntimeConfig {
        &self.runtime
    }

    fn plugins(&self) -> &BTreeMap<String, PluginEntry> {
        &self.plugins
    }

    fn builtins(&self) -> &[(&'static str, &'static [u8])] {
        crate::builtin::BUILTINS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_need_no_file() {
        let c = Config::from_toml("").unwrap();
        assert!(c.runtime.builtins);
        assert_eq!(c.runtime.isolation, Isolation::Pooled);
    }

    #[test]
    fn the_example_config_parses_to_the_defaults() {
        let example = Config::from_toml(include_str!("../../../courier.example.toml")).unwrap();
        assert_eq!(example, Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("[runtime]\nfuel = 5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("fuel"), "{err}");
        let err = Config::from_toml("[plugins.text]\nenable = false\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("enable"), "{err}");
    }

    #[test]
    fn a_refused_setting_is_named() {
        let err = Config::from_toml("[server]\nidle_timeout_secs = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("server.idle_timeout_secs must be positive"),
            "{err}"
        );
        assert!(!err.contains("header_timeout_secs"), "{err}");
        let err = Config::from_toml("[gateway]\nhandshake_secs = 0\nsend_burst = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gateway.handshake_secs must be positive"),
            "{err}"
        );
        assert!(err.contains("gateway.send_burst must be positive"), "{err}");
        assert!(!err.contains("heartbeat_secs"), "{err}");
    }

    #[test]
    fn settings_that_would_break_every_request_are_refused() {
        for (toml, refusal) in [
            (
                "[storage]\nurl = \"sqlite://\"\n",
                "storage.url names no SQLite file",
            ),
            (
                "[storage]\nurl = \"sqlite://?mode=rwc\"\n",
                "storage.url names no SQLite file",
            ),
            (
                "[auth]\ntoken_ttl_secs = 0\n",
                "auth.token_ttl_secs must be positive",
            ),
            (
                "[messaging]\nmax_group_members = 0\n",
                "messaging.max_group_members must be positive",
            ),
            (
                "[messaging]\nmax_devices_per_user = 0\n",
                "messaging.max_devices_per_user must be positive",
            ),
            (
                "[plugins.text]\nfuel_per_call = 9999\n",
                "plugins.text.fuel_per_call must be at least 10000",
            ),
            (
                "[server]\nadmin_token = \"                \"\n",
                "server.admin_token must be at least 16 characters, each a visible ASCII",
            ),
            (
                "[server]\nadmin_token = \"éééééééééééééééé\"\n",
                "server.admin_token must be at least 16 characters, each a visible ASCII",
            ),
        ] {
            let err = Config::from_toml(toml).unwrap_err().to_string();
            assert!(err.contains(refusal), "{toml}: {err}");
        }
        for url in [
            "sqlite://data/c.db",
            "sqlite:c.db",
            "sqlite:///tmp/c.db?mode=rwc",
        ] {
            Config::from_toml(&format!("[storage]\nurl = \"{url}\"\n")).unwrap();
        }
        Config::from_toml("[plugins.text]\nfuel_per_call = 10000\n").unwrap();
    }

    #[test]
    fn plugin_entries_parse() {
        let c = Config::from_toml(
            "[plugins.text]\nenabled = false\n[plugins.poll]\npath = \"/x/poll.wasm\"\nsha256 = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"\n",
        )
        .unwrap();
        assert!(!c.plugins["text"].enabled);
        assert!(c.plugins["poll"].enabled);
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own signature
    fn only_variables_shaped_like_keys_are_config() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("COURIER_BIN", "/usr/local/bin/courier");
            jail.set_env("COURIER_LOG", "debug");
            jail.set_env("COURIER_GATEWAY__HEARTBEAT_SECS", "30");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.gateway.heartbeat_secs, 30);
            jail.set_env("COURIER_GATEWAY__HEARTBEAT_SEC", "30");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("heartbeat_sec"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own signature
    fn string_keys_from_the_environment_keep_their_text() {
        figment::Jail::expect_with(|jail| {
            // Each of these parses as something else: a number, a number with leading
            // zeros, a float, a switch.
            jail.set_env("COURIER_SERVER__ADMIN_TOKEN", "1234567890123456");
            jail.set_env(
                "COURIER_AUTH__JWT_SECRET",
                "3.14159265358979323846264338327950",
            );
            jail.set_env("COURIER_PUSH__WEBHOOK_URL", "https://push.example/courier");
            jail.set_env(
                "COURIER_PUSH__WEBHOOK_SECRET",
                "\"00000000000000000000000000000042\"",
            );
            jail.set_env("COURIER_STORAGE__URL", "postgres://courier@db/courier");
            jail.set_env("COURIER_CLUSTER__PREFIX", "2024");
            jail.set_env("COURIER_CLUSTER__REDIS_URL", "redis://127.0.0.1:6379");
            jail.set_env("COURIER_LOG__FILTER", "true");
            jail.set_env("COURIER_RUNTIME__DIR", "0755");
            // Trimmed, and quoted as a shell or an env file may write it.
            jail.set_env("COURIER_SERVER__METRICS_LISTEN", " 127.0.0.1:9464\r");
            jail.set_env("COURIER_PLUGINS__POLL__SHA256", "0".repeat(64));
            // Numbers and switches still read as such.
            jail.set_env("COURIER_CLUSTER__NODE_ID", "0012");
            jail.set_env("COURIER_PLUGINS__POLL__ENABLED", "false");
            jail.set_env("COURIER_PLUGINS__POLL__FUEL_PER_CALL", "20000000");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.server.admin_token.as_deref(), Some("1234567890123456"));
            assert_eq!(
                c.auth.jwt_secret.as_deref(),
                Some("3.14159265358979323846264338327950")
            );
            assert_eq!(
                c.push.webhook_secret.as_deref(),
                Some("00000000000000000000000000000042")
            );
            let cluster = c.cluster.as_ref().expect("the variables make [cluster]");
            assert_eq!(cluster.prefix, "2024");
            assert_eq!(cluster.node_id, 12);
            assert_eq!(c.log.filter, "true");
            assert_eq!(
                c.server.metrics_listen,
                Some("127.0.0.1:9464".parse().unwrap())
            );
            assert_eq!(c.runtime.dir.as_deref(), Some(Path::new("0755")));
            let poll = &c.plugins["poll"];
            assert_eq!(poll.sha256.as_deref(), Some("0".repeat(64).as_str()));
            assert!(!poll.enabled);
            assert_eq!(poll.fuel_per_call, Some(20_000_000));
            // A number key given text that is no number names the key.
            jail.set_env("COURIER_GATEWAY__HEARTBEAT_SECS", "soon");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("HEARTBEAT_SECS"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_bus_url_defaults_by_bus_kind() {
        let cluster = |keys: &str| {
            Config::from_toml(&format!(
                "[storage]\nurl = \"postgres://courier@db/courier\"\n[cluster]\nredis_url = \"redis://routes:6379\"\n{keys}"
            ))
            .map(|c| c.cluster.expect("[cluster] is there"))
        };
        let address = |keys: &str| cluster(keys).unwrap().bus_address().to_string();
        assert_eq!(address(""), DEFAULT_NATS_URL);
        assert_eq!(address("bus = \"nats\"\n"), DEFAULT_NATS_URL);
        assert_eq!(
            address("bus_url = \"nats://bus:4222\"\n"),
            "nats://bus:4222"
        );
        assert_eq!(address("bus = \"redis\"\n"), "redis://routes:6379");
        assert_eq!(
            address("bus = \"redis\"\nbus_url = \"\"\n"),
            "redis://routes:6379"
        );
        assert_eq!(
            address("bus = \"redis\"\nbus_url = \"redis://bus:6379\"\n"),
            "redis://bus:6379"
        );
        let err = cluster("bus_url = \"\"\n").unwrap_err().to_string();
        assert!(err.contains("must name the NATS server"), "{err}");
        let err = cluster("bus = \"redis\"\nbus_url = \"nats://bus:4222\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cluster.bus_url must start with redis://"),
            "{err}"
        );
    }

    #[test]
    fn bad_pin_is_refused() {
        let err = Config::from_toml("[plugins.text]\nsha256 = \"abc\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugins.text.sha256"), "{err}");
    }
}
