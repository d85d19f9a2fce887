//! Assembling the set of plugins a config asks for: candidates from `[plugins.<name>]`
//! paths, the bundled plugins and `runtime.dir`; each loaded (compiled or taken from a
//! cache) and checked; clashes of names and content types refused. Every problem is
//! collected, not just the first.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::cache::DiskCache;
use super::loader::{self, LoadError, LoadFailure, Source};
use super::manifest::Manifest;
use super::plugin::{Breaker, LoadedPlugin, Stats};
use super::registry::{LoadErrors, PluginRegistry, Snapshot};
use super::runtime::Limits;
use crate::config::{RuntimeConfig, Setup};

impl PluginRegistry {
    /// Loads every candidate, collecting every problem rather than stopping at the first.
    pub(super) fn build(&self, config: &impl Setup) -> Result<Snapshot, LoadErrors> {
        let rc = config.runtime();
        let mut errors: Vec<String> = Vec::new();
        // (expected name if known, source, bytes)
        let mut candidates: Vec<(Option<String>, Source, Vec<u8>)> = Vec::new();
        for (name, entry) in config.plugins() {
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
            for (name, bytes) in config.builtins() {
                let overridden = config
                    .plugins()
                    .get(*name)
                    .is_some_and(|e| e.path.is_some());
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
                .plugins()
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
        let mut by_type: foldhash::HashMap<u32, Arc<LoadedPlugin>> = foldhash::HashMap::default();
        for (expected, source, bytes) in candidates {
            let entry = expected.as_ref().and_then(|n| config.plugins().get(n));
            let pin = entry.and_then(|e| e.sha256.as_deref());
            match self.load_one(
                rc,
                &source,
                &bytes,
                pin,
                entry.and_then(|e| e.fuel_per_call),
            ) {
                Err(e) => errors.push(e.to_string()),
                Ok((checked_manifest, mut plugin)) => {
                    let name = checked_manifest.name.clone();
                    if let Some(expected) = &expected
                        && expected != &name
                    {
                        errors.push(format!("{source}: declares the name {name:?}, but is configured as {expected:?}"));
                        continue;
                    }
                    let entry = config.plugins().get(&name);
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
                    // A file from the plugin directory gets its name's fuel override now
                    // that the name is known.
                    if expected.is_none()
                        && let Some(fuel) = entry.and_then(|e| e.fuel_per_call)
                        && let Some(p) = Arc::get_mut(&mut plugin)
                    {
                        p.pool.set_fuel(fuel);
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
        for name in config.plugins().keys() {
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
        let sha = loader::check_bytes(bytes, pin).map_err(|f| LoadError::new(source, f))?;
        // Compiled once: in memory for this process, on disk across starts (if configured).
        let disk = rc
            .cache_dir
            .as_deref()
            .filter(|d| !d.as_os_str().is_empty())
            .and_then(DiskCache::open);
        let memory = self
            .compiled
            .lock()
            .expect("compile cache")
            .get(&sha)
            .cloned();
        let component = match memory.or_else(|| disk.as_ref()?.load(&self.runtime, &sha)) {
            Some(component) => component,
            None => {
                let component = self
                    .runtime
                    .compile(bytes)
                    .map_err(|e| LoadError::new(source, LoadFailure::Compile(format!("{e:#}"))))?;
                if let Some(disk) = &disk {
                    disk.store(&self.runtime, &sha, &component);
                }
                component
            }
        };
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
            meters: crate::meters::Meters::new(&checked.manifest.name),
            breaker_failures: rc.breaker_failures as usize,
            breaker_window: Duration::from_secs(rc.breaker_window_secs),
        });
        Ok((checked.manifest, plugin))
    }
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
