//! What the registry loads, as the server's config says it: the runtime's limits and the
//! plugins it names. The server's `Config` embeds these and tells the registry which
//! components it bundles (`Setup`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a registry is built from.
pub trait Setup {
    fn runtime(&self) -> &RuntimeConfig;
    /// `[plugins.<name>]` entries.
    fn plugins(&self) -> &BTreeMap<String, PluginEntry>;
    /// The components bundled with the binary, by name.
    fn builtins(&self) -> &[(&'static str, &'static [u8])];
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Reuse warm instances from a pool; recycle on trap, after N calls or above a memory mark.
    Pooled,
    /// A new store and instance from the pre-instantiated template for every call.
    Fresh,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Load the plugins bundled with the server.
    pub builtins: bool,
    /// Also load every `*.wasm` file in this directory.
    pub dir: Option<PathBuf>,
    /// Fuel (≈ wasm instructions) one call may use before it is stopped.
    pub fuel_per_call: u64,
    /// Linear memory one plugin instance may grow to, in MiB.
    pub memory_mib: u32,
    pub isolation: Isolation,
    /// Pooled mode: an instance is dropped after this many calls…
    pub recycle_after_calls: u64,
    /// …or once its memory has grown past this many MiB.
    pub recycle_above_mib: u32,
    /// The circuit breaker switches a plugin off after this many failed calls (trap,
    /// budget, memory)…
    pub breaker_failures: u32,
    /// …within this many seconds.
    pub breaker_window_secs: u64,
    /// Instances of one plugin that may exist at once; a call beyond waits for one to be
    /// free. 0: twice the number of cores.
    pub max_instances: u32,
    /// Where compiled plugins are cached between starts (keyed by file hash and engine),
    /// by default `data/plugin-cache` beside the default database. Empty: no cache.
    pub cache_dir: Option<PathBuf>,
}

/// The compiled-plugin cache unless the config says otherwise (relative to the working
/// directory, like the default database `data/courier.db`).
pub const DEFAULT_CACHE_DIR: &str = "data/plugin-cache";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PluginEntry {
    pub enabled: bool,
    /// A `.wasm` component to load for this name (overrides a bundled plugin of that name).
    pub path: Option<PathBuf>,
    /// Refuse to load unless the file's SHA-256 (hex) is this.
    pub sha256: Option<String>,
    /// Overrides `runtime.fuel_per_call` for this plugin.
    pub fuel_per_call: Option<u64>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            builtins: true,
            dir: None,
            fuel_per_call: 50_000_000,
            memory_mib: 64,
            isolation: Isolation::Pooled,
            recycle_after_calls: 100_000,
            recycle_above_mib: 32,
            breaker_failures: 5,
            breaker_window_secs: 60,
            max_instances: 0,
            cache_dir: Some(PathBuf::from(DEFAULT_CACHE_DIR)),
        }
    }
}

impl Default for PluginEntry {
    fn default() -> Self {
        Self {
            enabled: true,
            path: None,
            sha256: None,
            fuel_per_call: None,
        }
    }
}
