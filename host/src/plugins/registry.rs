//! The one API the send path uses: look up a content type, validate a payload, preview it.
//! Also enable / disable / reload, and the circuit breaker.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use wasmtime::component::Component;

use super::bindings::WitContext;
use super::builtin::BUILTINS;
use super::cache::DiskCache;
use super::loader::{self, LoadError, LoadFailure, Source};
use super::manifest::{Manifest, SenderKind};
use super::runtime::{CallFailure, InstancePool, Limits, Runtime};
use crate::config::{Config, RuntimeConfig};

/// Who is sending, and where: what `validate` needs besides the payload.
#[derive(Debug, Clone, Copy)]
pub struct SendContext<'a> {
    pub sender_id: &'a str,
    /// `System` for messages the server emits itself (tips, friend requests).
    pub sender: SenderKind,
    pub conversation_type: u8,
    pub conversation_id: &'a str,
}

/// Why a payload was not accepted. `code()` is the documented error code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ValidateError {
    #[error("no plugin handles content type {0}")]
    Unknown(u32),
    #[error("content type {content_type} ({name}) is disabled")]
    Disabled { content_type: u32, name: String },
    #[error("content type {content_type} ({name}) is sent only by the server")]
    Forbidden { content_type: u32, name: String },
    #[error(
        "{name} cannot be sent to conversation type {conversation_type} (allowed: {allowed:?})"
    )]
    ConversationType {
        name: String,
        conversation_type: u8,
        allowed: Vec<u8>,
    },
    #[error("payload is {size} bytes, {name} accepts at most {max}")]
    TooLarge { name: String, size: usize, max: u32 },
    #[error("{message}")]
    Invalid { code: String, message: String },
    #[error("plugin {name} (content type {content_type}) failed: {failure}")]
    PluginFailed {
        name: String,
        content_type: u32,
        failure: CallFailure,
    },
}

impl ValidateError {
    pub fn code(&self) -> &'static str {
        match self {
            ValidateError::Unknown(_) => "content_type_unknown",
            ValidateError::Disabled { .. } => "content_type_disabled",
            ValidateError::Forbidden { .. } => "content_type_forbidden",
            ValidateError::ConversationType { .. } => "conversation_type_not_allowed",
            ValidateError::TooLarge { .. } => "payload_too_large",
            ValidateError::Invalid { .. } => "payload_invalid",
            ValidateError::PluginFailed { .. } => "plugin_failed",
        }
    }

    /// The plugin's own rejection code, for `payload_invalid`.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ValidateError::Invalid { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A payload the plugin accepted, normalized.
#[derive(Debug, Clone)]
pub struct Validated {
    pub plugin: Arc<LoadedPlugin>,
    pub payload: String,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Validate calls that failed (so `calls` = accepted + rejected + this; one counter
    /// fewer to bump on the hot path).
    pub validate_failed: AtomicU64,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    /// Every failed call, validate or preview.
    pub failed: AtomicU64,
}

struct Breaker {
    failures: VecDeque<Instant>,
    tripped: Option<String>,
}

/// One loaded plugin.
pub struct LoadedPlugin {
    pub manifest: Manifest,
    pub source: Source,
    pub sha256: String,
    pub contract: String,
    pool: InstancePool,
    enabled: AtomicBool,
    breaker: Mutex<Breaker>,
    stats: Stats,
    breaker_failures: usize,
    breaker_window: Duration,
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
                + self.stats.validate_failed.load(Ordering::Relaxed),
            accepted: self.stats.accepted.load(Ordering::Relaxed),
            rejected: self.stats.rejected.load(Ordering::Relaxed),
            failed: self.stats.failed.load(Ordering::Relaxed),
        }
    }

    /// Counts a failure; trips the breaker (switching the plugin off) after too many.
    fn record_failure(&self, failure: &CallFailure) {
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
            self.enabled.store(false, Ordering::Release);
            self.pool.clear();
        }
    }

    /// Validates under the budget; no registry lookups, no enabled check.
    pub fn call_validate(
        &self,
        ctx: &SendContext<'_>,
        payload: &str,
    ) -> Result<Result<String, (String, String)>, CallFailure> {
        let wit_ctx = WitContext {
            sender_id: ctx.sender_id.to_string(),
            conversation_type: ctx.conversation_type,
            conversation_id: ctx.conversation_id.to_string(),
        };
        self.pool
            .call(|store, b| {
                b.courier_plugin_kind()
                    .call_validate(store, &wit_ctx, payload)
            })
            .0
            .map(|r| r.map_err(|rej| (rej.code, rej.message)))
    }
}

struct Snapshot {
    by_type: HashMap<u32, Arc<LoadedPlugin>>,
    by_name: BTreeMap<String, Arc<LoadedPlugin>>,
}

/// All loaded plugins. Cheap to share (`Arc`); reads never wait on a reload.
pub struct PluginRegistry {
    runtime: Runtime,
    current: RwLock<Arc<Snapshot>>,
    /// Compiled components by file hash, so a reload recompiles only what changed.
    compiled: Mutex<HashMap<String, Component>>,
    reloading: Mutex<()>,
}

/// Every problem found while loading, one per line.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct LoadErrors(pub Vec<String>);

impl PluginRegistry {
    /// Loads every plugin the config asks for; refuses (listing every problem) if any fails.
    pub fn load(config: &Config) -> Result<PluginRegistry, LoadErrors> {
        let runtime = Runtime::new()
            .map_err(|e| LoadErrors(vec![format!("cannot start the wasm engine: {e:#}")]))?;
        let registry = PluginRegistry {
            runtime,
            current: RwLock::new(Arc::new(Snapshot {
                by_type: HashMap::new(),
                by_name: BTreeMap::new(),
            })),
            compiled: Mutex::new(HashMap::new()),
            reloading: Mutex::new(()),
        };
        let snapshot = registry.build(config)?;
        *registry.current.write().expect("registry lock") = Arc::new(snapshot);
        Ok(registry)
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.current.read().expect("registry lock").clone()
    }

    /// The plugin for a content type, enabled or not.
    pub fn get(&self, content_type: u32) -> Option<Arc<LoadedPlugin>> {
        self.snapshot().by_type.get(&content_type).cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        self.snapshot().by_name.get(name).cloned()
    }

    /// Every plugin, by name.
    pub fn list(&self) -> Vec<PluginInfo> {
        self.snapshot().by_name.values().map(|p| p.info()).collect()
    }

    /// The full send-path check: known, enabled, sender allowed, conversation type allowed,
    /// size (before any wasm runs), UTF-8, then the plugin's own `validate`.
    pub fn validate(
        &self,
        content_type: u32,
        ctx: &SendContext<'_>,
        payload: &[u8],
    ) -> Result<Validated, ValidateError> {
        let plugin = self
            .get(content_type)
            .ok_or(ValidateError::Unknown(content_type))?;
        let m = &plugin.manifest;
        if !plugin.is_enabled() {
            return Err(ValidateError::Disabled {
                content_type,
                name: m.name.clone(),
            });
        }
        let text = precheck(m, ctx, payload)?;
        match plugin.call_validate(ctx, text) {
            Ok(Ok(normalized)) => {
                plugin.stats.accepted.fetch_add(1, Ordering::Relaxed);
                Ok(Validated {
                    plugin: plugin.clone(),
                    payload: normalized,
                })
            }
            Ok(Err((code, message))) => {
                plugin.stats.rejected.fetch_add(1, Ordering::Relaxed);
                Err(ValidateError::Invalid { code, message })
            }
            Err(failure) => {
                plugin.stats.validate_failed.fetch_add(1, Ordering::Relaxed);
                plugin.record_failure(&failure);
                Err(ValidateError::PluginFailed {
                    name: m.name.clone(),
                    content_type,
                    failure,
                })
            }
        }
    }

    /// One line for conversation lists. Works for disabled kinds too (history stays
    /// readable); falls back to `[name]` if the plugin fails or the type is unknown.
    pub fn preview(&self, content_type: u32, payload: &str) -> String {
        let Some(plugin) = self.get(content_type) else {
            return "[unsupported message]".into();
        };
        match plugin
            .pool
            .call(|store, b| b.courier_plugin_kind().call_preview(store, payload))
            .0
        {
            Ok(line) => line,
            Err(failure) => {
                plugin.record_failure(&failure);
                format!("[{}]", plugin.manifest.name)
            }
        }
    }

    /// Switches a plugin on (and resets its circuit breaker) or off.
    pub fn set_enabled(&self, name: &str, enabled: bool) -> Option<PluginInfo> {
        let plugin = self.by_name(name)?;
        if enabled {
            let mut b = plugin.breaker.lock().expect("breaker lock");
            b.failures.clear();
            b.tripped = None;
        }
        plugin.enabled.store(enabled, Ordering::Release);
        tracing::info!(plugin = name, enabled, "plugin switched");
        Some(plugin.info())
    }

    /// Loads everything `config` asks for and swaps it in, unless that would change the
    /// delivery class or counts-unread of a content type already loaded (stored history
    /// depends on both). On refusal the running set stays as it was.
    pub fn reload(&self, config: &Config) -> Result<Vec<PluginInfo>, LoadErrors> {
        let _one_at_a_time = self.reloading.lock().expect("reload lock");
        let next = self.build(config)?;
        let current = self.snapshot();
        let mut refusals = Vec::new();
        for (ct, new) in &next.by_type {
            if let Some(old) = current.by_type.get(ct) {
                let (o, n) = (&old.manifest, &new.manifest);
                if o.delivery != n.delivery {
                    refusals.push(format!(
                        "reload refused: {} (content type {ct}) would change delivery from {} to {}; stored history depends on it",
                        n.name, o.delivery, n.delivery
                    ));
                }
                if o.counts_unread != n.counts_unread {
                    refusals.push(format!(
                        "reload refused: {} (content type {ct}) would change counts-unread from {} to {}; unread totals depend on it",
                        n.name, o.counts_unread, n.counts_unread
                    ));
                }
            }
        }
        if !refusals.is_empty() {
            return Err(LoadErrors(refusals));
        }
        *self.current.write().expect("registry lock") = Arc::new(next);
        tracing::info!(plugins = self.snapshot().by_name.len(), "plugins reloaded");
        Ok(self.list())
    }

    /// Loads every candidate, collecting every problem rather than stopping at the first.
    fn build(&self, config: &Config) -> Result<Snapshot, LoadErrors> {
        let rc = &config.runtime;
        let mut errors: Vec<String> = Vec::new();
        // (expected name if known, source, bytes)
        let mut candidates: Vec<(Option<String>, Source, Vec<u8>)> = Vec::new();
        for (name, entry) in &config.plugins {
            if let Some(path) = &entry.path {
                match std::fs::read(path) {
                    Ok(bytes) => {
                        candidates.push((Some(name.clone()), Source::File(path.clone()), bytes))
                    }
                    Err(e) => errors.push(
                        LoadError::new(
                            &Source::File(path.clone()),
                            LoadFailure::Read(e.to_string()),
                        )
                        .to_string(),
                    ),
                }
            }
        }
        if rc.builtins {
            for (name, bytes) in BUILTINS {
                let overridden = config.plugins.get(*name).is_some_and(|e| e.path.is_some());
                if !overridden {
                    candidates.push((
                        Some(name.to_string()),
                        Source::Builtin(name.to_string()),
                        bytes.to_vec(),
                    ));
                }
            }
        }
        if let Some(dir) = &rc.dir {
            // A file named by a `[plugins.<name>] path` is loaded once, under that name.
            let configured: Vec<PathBuf> = config
                .plugins
                .values()
                .filter_map(|e| e.path.as_ref())
                .filter_map(|p| p.canonicalize().ok())
                .collect();
            match wasm_files(dir) {
                Ok(files) => {
                    for path in files {
                        if path.canonicalize().is_ok_and(|c| configured.contains(&c)) {
                            continue;
                        }
                        match std::fs::read(&path) {
                            Ok(bytes) => candidates.push((None, Source::File(path), bytes)),
                            Err(e) => errors.push(
                                LoadError::new(
                                    &Source::File(path),
                                    LoadFailure::Read(e.to_string()),
                                )
                                .to_string(),
                            ),
                        }
                    }
                }
                Err(e) => errors.push(format!(
                    "{}: cannot list the plugin directory: {e}",
                    dir.display()
                )),
            }
        }

        let mut by_name: BTreeMap<String, Arc<LoadedPlugin>> = BTreeMap::new();
        let mut by_type: HashMap<u32, Arc<LoadedPlugin>> = HashMap::new();
        for (expected, source, bytes) in candidates {
            let entry = expected.as_ref().and_then(|n| config.plugins.get(n));
            let pin = entry.and_then(|e| e.sha256.as_deref());
            match self.load_one(
                rc,
                &source,
                &bytes,
                pin,
                entry.and_then(|e| e.fuel_per_call),
            ) {
                Err(e) => errors.push(e.to_string()),
                Ok((checked_manifest, plugin)) => {
                    let name = checked_manifest.name.clone();
                    if let Some(expected) = &expected
                        && expected != &name
                    {
                        errors.push(format!("{source}: declares the name {name:?}, but is configured as {expected:?}"));
                        continue;
                    }
                    let entry = config.plugins.get(&name);
                    if expected.is_none()
                        && let Some(pin) = entry.and_then(|e| e.sha256.as_deref())
                        && !pin.eq_ignore_ascii_case(&plugin.sha256)
                    {
                        errors.push(
                            LoadError::new(
                                &source,
                                LoadFailure::ShaMismatch {
                                    expected: pin.to_ascii_lowercase(),
                                    actual: plugin.sha256.clone(),
                                },
                            )
                            .to_string(),
                        );
                        continue;
                    }
                    plugin
                        .enabled
                        .store(entry.is_none_or(|e| e.enabled), Ordering::Release);
                    if let Some(other) = by_name.get(&name) {
                        errors.push(format!(
                            "two plugins are named {name:?}: {} and {}",
                            other.source, plugin.source
                        ));
                        continue;
                    }
                    if let Some(other) = by_type.get(&checked_manifest.content_type) {
                        errors.push(format!(
                            "content type {} is claimed by two plugins: {} ({}) and {} ({})",
                            checked_manifest.content_type,
                            other.manifest.name,
                            other.source,
                            name,
                            plugin.source
                        ));
                        continue;
                    }
                    by_type.insert(checked_manifest.content_type, plugin.clone());
                    by_name.insert(name, plugin);
                }
            }
        }
        for name in config.plugins.keys() {
            if !by_name.contains_key(name) && !errors.iter().any(|e| e.contains(name.as_str())) {
                errors.push(format!(
                    "config names plugin {name:?}, but no plugin of that name was loaded"
                ));
            }
        }
        if !errors.is_empty() {
            return Err(LoadErrors(errors));
        }
        Ok(Snapshot { by_type, by_name })
    }

    fn load_one(
        &self,
        rc: &RuntimeConfig,
        source: &Source,
        bytes: &[u8],
        pin: Option<&str>,
        fuel: Option<u64>,
    ) -> Result<(Manifest, Arc<LoadedPlugin>), LoadError> {
        let sha = loader::sha256_hex(bytes);
        let mut cached = self
            .compiled
            .lock()
            .expect("compile cache")
            .get(&sha)
            .cloned();
        let disk = rc.cache_dir.clone().map(DiskCache::new);
        let pin_ok = pin.is_none_or(|p| p.eq_ignore_ascii_case(&sha));
        if cached.is_none()
            && pin_ok
            && loader::check_is_component(bytes).is_ok()
            && let Some(disk) = &disk
        {
            cached = disk.load(&self.runtime, &sha);
        }
        let was_cached = cached.is_some();
        let (component, sha) = loader::compile(&self.runtime, bytes, pin, cached)
            .map_err(|f| LoadError::new(source, f))?;
        if !was_cached && let Some(disk) = &disk {
            disk.store(&self.runtime, &sha, &component);
        }
        self.compiled
            .lock()
            .expect("compile cache")
            .insert(sha.clone(), component.clone());
        let checked =
            loader::check_component(&self.runtime, component, Limits::from_config(rc, fuel))
                .map_err(|f| LoadError::new(source, f))?;
        let plugin = Arc::new(LoadedPlugin {
            manifest: checked.manifest.clone(),
            source: source.clone(),
            sha256: sha,
            contract: checked.contract,
            pool: checked.pool,
            enabled: AtomicBool::new(true),
            breaker: Mutex::new(Breaker {
                failures: VecDeque::new(),
                tripped: None,
            }),
            stats: Stats::default(),
            breaker_failures: rc.breaker_failures as usize,
            breaker_window: Duration::from_secs(rc.breaker_window_secs),
        });
        Ok((checked.manifest, plugin))
    }
}

/// The checks the host makes before any wasm runs: sender kind, conversation type,
/// size, UTF-8. Returns the payload as text.
pub fn precheck<'p>(
    m: &Manifest,
    ctx: &SendContext<'_>,
    payload: &'p [u8],
) -> Result<&'p str, ValidateError> {
    if m.sender == SenderKind::System && ctx.sender == SenderKind::User {
        return Err(ValidateError::Forbidden {
            content_type: m.content_type,
            name: m.name.clone(),
        });
    }
    if !m.conversation_types.contains(&ctx.conversation_type) {
        return Err(ValidateError::ConversationType {
            name: m.name.clone(),
            conversation_type: ctx.conversation_type,
            allowed: m.conversation_types.clone(),
        });
    }
    if payload.len() > m.max_payload_bytes as usize {
        return Err(ValidateError::TooLarge {
            name: m.name.clone(),
            size: payload.len(),
            max: m.max_payload_bytes,
        });
    }
    std::str::from_utf8(payload).map_err(|e| ValidateError::Invalid {
        code: "not_utf8".into(),
        message: format!("payload is not UTF-8 text: {e}"),
    })
}

fn wasm_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}
