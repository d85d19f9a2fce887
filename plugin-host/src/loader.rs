//! Turning bytes into a checked, ready-to-call plugin: component check, contract version,
//! closed imports, instantiation and manifest sanity. Every refusal names the file.

use std::fmt;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, types::ComponentItem};

use super::manifest::Manifest;
use super::pool::InstancePool;
use super::runtime::{CallFailure, Limits, Runtime};

/// Contract versions (major, minor) this host implements: 1.0 up to 1.0.
pub const CONTRACT_MIN: (u64, u64) = (1, 0);
pub const CONTRACT_MAX: (u64, u64) = (1, 0);

/// The interface a plugin must export (followed by `@<version>`).
pub const KIND_INTERFACE: &str = "courier:plugin/kind";
/// The one host interface of the contract.
pub const LOG_INTERFACE: &str = "courier:plugin/log";

/// WASI 0.2 interfaces the host links in a neutralized form, because standard guest
/// toolchains (Rust's wasm32-wasip2 std, componentize-py, componentize-js) import them.
/// What each gives a plugin: nothing from the outside world.
pub const NEUTRALIZED_WASI: &[(&str, &str)] = &[
    (
        "wasi:cli/",
        "no arguments, no environment, stdin empty, stdout discarded, stderr kept to explain a trap",
    ),
    ("wasi:io/", "streams of the above only"),
    ("wasi:clocks/", "frozen at 0: no clock"),
    ("wasi:random/", "fixed seed: deterministic"),
    ("wasi:filesystem/", "no preopened directory: no files"),
    (
        "wasi:sockets/",
        "every socket and name lookup denied: no network",
    ),
];

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Bundled with the server binary (its file name).
    Builtin(String),
    File(PathBuf),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Builtin(name) => write!(f, "built-in {name}.wasm"),
            Source::File(p) => write!(f, "{}", p.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadFailure {
    #[error("cannot read the file: {0}")]
    Read(String),
    #[error("sha256 mismatch: the config pins {expected}, the file has {actual}")]
    ShaMismatch { expected: String, actual: String },
    #[error("not a WebAssembly component: {0}")]
    NotComponent(String),
    #[error("does not compile: {0}")]
    Compile(String),
    #[error("exports no {KIND_INTERFACE} interface, so it is not a Courier plugin (exports: {0})")]
    NoContract(String),
    #[error("plugin targets {target}, host supports {min}–{max}")]
    Version {
        target: String,
        min: String,
        max: String,
    },
    #[error("imports outside the contract: {0}")]
    Imports(String),
    #[error("cannot be instantiated: {0}")]
    Instantiate(String),
    #[error("manifest() failed: {0}")]
    ManifestCall(CallFailure),
    #[error("invalid manifest: {0}")]
    Manifest(String),
}

/// A refusal to load: which file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {failure}")]
pub struct LoadError {
    pub source_name: String,
    pub failure: LoadFailure,
}

impl LoadError {
    pub fn new(source: &Source, failure: LoadFailure) -> LoadError {
        LoadError {
            source_name: source.to_string(),
            failure,
        }
    }
}

/// Hex SHA-256 of a file's bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Component-model binaries carry layer 1 in the version field; core modules carry 1/0.
pub fn check_is_component(bytes: &[u8]) -> Result<(), LoadFailure> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(LoadFailure::NotComponent(
            "the file does not start with the WebAssembly magic bytes".into(),
        ));
    }
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(LoadFailure::NotComponent(
            "it is a core wasm module; build for wasm32-wasip2 or wrap it with `wasm-tools component new`".into(),
        ));
    }
    Ok(())
}

/// The contract version a component targets, from its `courier:plugin/kind@X.Y.Z` export.
pub fn contract_version(
    runtime: &Runtime,
    component: &Component,
) -> Result<(u64, u64, u64), LoadFailure> {
    let ty = component.component_type();
    let exports: Vec<String> = ty
        .exports(runtime.engine())
        .map(|(n, _)| n.to_string())
        .collect();
    let Some(v) = exports.iter().find_map(|n| {
        n.strip_prefix(KIND_INTERFACE)
            .and_then(|r| r.strip_prefix('@'))
    }) else {
        let list = if exports.is_empty() {
            "none".to_string()
        } else {
            exports.join(", ")
        };
        return Err(LoadFailure::NoContract(list));
    };
    let nums: Vec<u64> = v
        .split(['-', '+'])
        .next()
        .unwrap_or_default()
        .split('.')
        .filter_map(|p| p.parse().ok())
        .collect();
    let [major, minor, patch] = nums[..] else {
        return Err(LoadFailure::NoContract(format!(
            "{KIND_INTERFACE}@{v} has no valid version"
        )));
    };
    let supported = (major, minor) >= CONTRACT_MIN && (major, minor) <= CONTRACT_MAX;
    if !supported {
        return Err(LoadFailure::Version {
            target: format!("{major}.{minor}"),
            min: format!("{}.{}", CONTRACT_MIN.0, CONTRACT_MIN.1),
            max: format!("{}.{}", CONTRACT_MAX.0, CONTRACT_MAX.1),
        });
    }
    Ok((major, minor, patch))
}

/// One import and what the host makes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportVerdict {
    pub name: String,
    /// `None`: refused. `Some(note)`: allowed, with what it gives the plugin.
    pub allowed: Option<&'static str>,
}

pub fn classify_imports(runtime: &Runtime, component: &Component) -> Vec<ImportVerdict> {
    let ty = component.component_type();
    ty.imports(runtime.engine())
        .map(|(name, item)| {
            let allowed = if !matches!(item.ty, ComponentItem::ComponentInstance(_)) {
                None
            } else if name.starts_with(&format!("{LOG_INTERFACE}@1.")) {
                Some("the contract's log function")
            } else {
                NEUTRALIZED_WASI
                    .iter()
                    .find(|(prefix, _)| name.starts_with(prefix))
                    .map(|(_, note)| *note)
            };
            ImportVerdict {
                name: name.to_string(),
                allowed,
            }
        })
        .collect()
}

pub fn check_imports(runtime: &Runtime, component: &Component) -> Result<(), LoadFailure> {
    let refused: Vec<String> = classify_imports(runtime, component)
        .into_iter()
        .filter(|v| v.allowed.is_none())
        .map(|v| v.name)
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(LoadFailure::Imports(refused.join(", ")))
    }
}

/// A component that passed every load check, with its instance pool and manifest.
pub struct Checked {
    pub component: Component,
    pub pool: InstancePool,
    pub manifest: Manifest,
    pub contract: String,
}

/// Runs every load check on an already compiled component.
pub fn check_component(
    runtime: &Runtime,
    component: Component,
    limits: Limits,
) -> Result<Checked, LoadFailure> {
    let (major, minor, patch) = contract_version(runtime, &component)?;
    check_imports(runtime, &component)?;
    let pre = runtime
        .prepare(&component)
        .map_err(|e| LoadFailure::Instantiate(format!("{e:#}")))?;
    let pool = InstancePool::new("(loading)", runtime, pre, limits);
    let manifest: Manifest = pool
        .call(|store, b| b.courier_plugin_kind().call_manifest(store))
        .0
        .map_err(LoadFailure::ManifestCall)?
        .into();
    let problems = manifest.problems();
    if !problems.is_empty() {
        return Err(LoadFailure::Manifest(problems.join("; ")));
    }
    let pool = pool.renamed(&manifest.name);
    Ok(Checked {
        component,
        pool,
        manifest,
        contract: format!("{major}.{minor}.{patch}"),
    })
}

/// The checks made on a file's bytes before anything compiles them: the sha256 pin, then
/// the component header. Returns the file's sha256 (hex).
pub fn check_bytes(bytes: &[u8], pin: Option<&str>) -> Result<String, LoadFailure> {
    let sha = sha256_hex(bytes);
    if let Some(pin) = pin
        && !pin.eq_ignore_ascii_case(&sha)
    {
        return Err(LoadFailure::ShaMismatch {
            expected: pin.to_ascii_lowercase(),
            actual: sha,
        });
    }
    check_is_component(bytes)?;
    Ok(sha)
}
