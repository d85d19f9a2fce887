//! `courier serve`: load the plugins, bind, serve until Ctrl-C; reload on SIGHUP.

mod admission;
mod listener;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::api::{AppState, app};
use crate::auth::{Tokens, random_bytes};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::gateway::hub::Hub;
use crate::gateway::links::{Alone, PresenceThrottle};
use crate::messaging::{Core, Settings};
use crate::plugins::PluginRegistry;
use crate::store::Store;

/// Opens the database and starts the messaging core, delivering through this node's hub.
pub async fn start_core(config: &Config, registry: Arc<PluginRegistry>) -> anyhow::Result<Gateway> {
    let store = Store::open(&config.storage).await?;
    let key = match &config.auth.jwt_secret {
        Some(k) => k.clone(),
        None => {
            store
                .secret_or_insert("jwt_hs256", &hex::encode(random_bytes::<32>()))
                .await?
        }
    };
    let tokens = Tokens::new(key.as_bytes(), config.auth.token_ttl_secs);
    let settings = Settings {
        recall_window_ms: (config.messaging.recall_window_secs as i64).saturating_mul(1000),
        batch_max: config.storage.batch_max,
        committers: config.storage.committers,
        node_id: config.node_id(),
        max_frame_bytes: config.gateway.max_frame_bytes,
        heartbeat_secs: config.gateway.heartbeat_secs,
        send_rate_per_sec: config.gateway.send_rate_per_sec,
        send_burst: config.gateway.send_burst,
        outbox_frames: config.gateway.outbox_frames,
        outbox_bytes: config.gateway.outbox_bytes,
        node_outbox_bytes: config.gateway.node_outbox_bytes,
        handshake_secs: config.gateway.handshake_secs,
        registration: config.auth.registration,
        max_group_members: config.messaging.max_group_members.max(1),
        max_devices: config.messaging.max_devices_per_user.max(1),
        receipts: config.messaging.delivery_receipts,
        e2e: config.e2e.clone(),
        cache_max_age: config
            .cluster
            .as_ref()
            .map(|c| Duration::from_secs(c.cache_secs)),
    };
    let hub = Arc::new(Hub::new(config.gateway.node_outbox_bytes));
    let interval = Duration::from_secs(config.messaging.presence_interval_secs);
    match &config.cluster {
        None => {
            let offline = crate::push::Bridge::start(&config.push, &store, &registry, hub.clone());
            let core = Core::start(store, registry, tokens, settings, hub.clone(), offline);
            let presence = PresenceThrottle::new(core.clone(), interval);
            Ok(Gateway {
                core,
                hub,
                links: Arc::new(Alone { presence }),
            })
        }
        Some(c) => {
            let (cluster, incoming) = Cluster::start(c, config.server.listen, hub.clone())
                .await
                .context("cluster mode")?;
            let offline =
                crate::push::Bridge::start(&config.push, &store, &registry, cluster.clone());
            let core = Core::start(store, registry, tokens, settings, cluster.clone(), offline);
            let presence = PresenceThrottle::new(core.clone(), interval);
            cluster.attach(core.clone(), presence, incoming);
            Ok(Gateway {
                core,
                hub,
                links: cluster,
            })
        }
    }
}

pub async fn serve(config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let config = Config::load(config_path.as_deref())?;
    // Before anything is counted (the plugins take their handles when they load).
    crate::telemetry::install();
    tokio::spawn(crate::telemetry::upkeep());
    let started = std::time::Instant::now();
    let cfg = config.clone();
    let registry = tokio::task::spawn_blocking(move || PluginRegistry::load(&cfg))
        .await?
        .map_err(|e| anyhow::anyhow!("refusing to start, the plugins did not load:\n{e}"))?;
    let registry = Arc::new(registry);
    for p in registry.list() {
        tracing::info!(
            plugin = %p.manifest.name, content_type = p.manifest.content_type, delivery = %p.manifest.delivery,
            enabled = p.enabled, source = %p.source, "plugin loaded"
        );
    }
    tracing::info!(
        "{} plugins loaded in {} ms",
        registry.list().len(),
        started.elapsed().as_millis()
    );

    let gateway = start_core(&config, registry.clone())
        .await
        .context("refusing to start")?;
    let links = gateway.links.clone();
    let core = gateway.core.clone();
    tracing::info!(
        storage = ?core.store.dialect(),
        "database ready"
    );
    let (listener, metrics_listener) = match bind(&config.server).await {
        Ok(bound) => bound,
        Err(e) => {
            // In cluster mode the node's number goes back at once: the next start need not
            // wait out its lease.
            links.shutdown().await;
            core.store.close().await;
            return Err(e);
        }
    };
    let addr = listener.local_addr()?;
    let limits = &config.server;
    let open_files = admission::raise_open_file_limit();
    let max_connections = match limits.max_connections {
        0 => admission::default_max_connections(open_files),
        n => n,
    };
    let admission = admission::Admission::new(max_connections, limits.max_connections_per_address);
    let deadlines = listener::Deadlines {
        header: Duration::from_secs(limits.header_timeout_secs),
        body: Duration::from_secs(limits.body_timeout_secs),
        request: Duration::from_secs(limits.request_timeout_secs),
        idle: Duration::from_secs(limits.idle_timeout_secs),
    };
    tracing::info!(
        max_connections,
        per_address = limits.max_connections_per_address,
        open_files,
        "connection caps"
    );
    if max_connections as u64 + 64 > open_files {
        tracing::warn!(
            "server.max_connections ({max_connections}) leaves fewer than 64 of the {open_files} open files for the database and plugins"
        );
    }
    let state = AppState::new(gateway, config, config_path);
    if let Some(listener) = metrics_listener {
        tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
        tokio::spawn(listener::serve(
            listener,
            crate::api::metrics_app(state.clone()),
            admission::Admission::new(METRICS_CONNECTIONS, 0),
            deadlines,
            core.guards.clone(),
            std::future::pending(),
        ));
    }
    // Registered before the listening line, so a SIGHUP right after start-up reloads
    // instead of killing the process.
    tokio::spawn(reload_on_sighup(state.clone(), sighup()));
    tracing::info!("courier listening on http://{addr}");
    // A line for scripts and tests that start the server on port 0.
    println!("listening on {addr}");
    tokio::spawn(core.guards.clone().log_every_interval());
    let delivery = core.delivery.clone();
    listener::serve(
        listener,
        app(state),
        admission,
        deadlines,
        core.guards.clone(),
        async move {
            shutdown().await;
            delivery.close_all();
        },
    )
    .await;
    links.shutdown().await;
    core.store.close().await;
    Ok(())
}

/// The server's address and, if set, the metrics address.
async fn bind(
    c: &crate::config::ServerConfig,
) -> anyhow::Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>)> {
    let listener = tokio::net::TcpListener::bind(c.listen)
        .await
        .with_context(|| format!("cannot listen on {}", c.listen))?;
    let metrics = match c.metrics_listen {
        Some(at) => Some(
            tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("cannot listen on {at} (server.metrics_listen)"))?,
        ),
        None => None,
    };
    Ok((listener, metrics))
}

/// Connections the metrics address takes at once (a scraper needs one or two).
const METRICS_CONNECTIONS: usize = 16;

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<()>;

#[cfg(unix)]
fn sighup() -> Hangup {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("cannot listen for SIGHUP ({e}); reload through the admin endpoint");
            None
        }
    }
}

#[cfg(not(unix))]
fn sighup() -> Hangup {
    None
}

#[cfg(unix)]
async fn reload_on_sighup(state: AppState, hup: Hangup) {
    let Some(mut hup) = hup else { return };
    while hup.recv().await.is_some() {
        tracing::info!("SIGHUP: reloading the config and plugins");
        let s = state.clone();
        // The reload logs its outcome.
        if let Err(e) = tokio::task::spawn_blocking(move || s.reload()).await {
            tracing::error!("reload task failed: {e}");
        }
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(_state: AppState, _hup: Hangup) {}

/// Ctrl-C or SIGTERM.
async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("shutting down");
}
