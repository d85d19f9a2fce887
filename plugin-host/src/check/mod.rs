//! The contract suite: `courier plugin check FILE.wasm [--cases DIR]`. Runs any component
//! through every check a plugin must pass and prints one line per check.

mod behaviour;
mod cases;
mod inputs;
mod probe;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::loader::{self, CONTRACT_MAX, CONTRACT_MIN};
use super::manifest::{Manifest, SenderKind};
use super::pool::InstancePool;
use super::registry::ValidateError;
use super::runtime::{Limits, Runtime};
use crate::config::{Isolation, RuntimeConfig};
use probe::Probe;

#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Data-driven cases: `DIR/<case>/input.json` with `expected.json` or `error.txt`.
    pub cases: Option<PathBuf>,
    pub fuel_per_call: u64,
    pub memory_mib: u32,
    /// Number of fuzzed inputs.
    pub fuzz: usize,
    pub seed: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        let rc = RuntimeConfig::default();
        CheckOptions {
            cases: None,
            fuel_per_call: rc.fuel_per_call,
            memory_mib: rc.memory_mib,
            fuzz: 1000,
            seed: 0x0c0_01e4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skip,
    /// Passes, with something the author should know.
    Warn,
}

/// A kind a server already has, for `Report::against`.
#[derive(Debug, Clone)]
pub struct Taken {
    pub manifest: Manifest,
    /// Where it comes from (`built-in text.wasm`, a path).
    pub source: String,
    /// Its component's SHA-256: the checked file itself is no clash.
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub file: String,
    pub manifest: Option<Manifest>,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut out = format!("courier plugin check: {}\n", self.file);
        if let Some(m) = &self.manifest {
            // The manifest may be one the host refused: its strings are shown escaped.
            out += &format!(
                "  plugin {} {} — content type {}, {}, {}\n",
                crate::display(&m.name),
                crate::display(&m.version),
                m.content_type,
                m.delivery,
                if m.counts_unread {
                    "counts unread"
                } else {
                    "does not count unread"
                }
            );
        }
        for c in &self.checks {
            let tag = match c.status {
                Status::Pass => "PASS",
                Status::Fail => "FAIL",
                Status::Skip => "SKIP",
                Status::Warn => "WARN",
            };
            let mut lines = c.detail.lines();
            out += &format!(
                "  {tag}  {:<13} {}\n",
                c.name,
                lines.next().unwrap_or_default()
            );
            for l in lines {
                out += &format!("  {:<4}  {:<13} {l}\n", "", "");
            }
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        if failed == 0 {
            out += &format!("result: PASS ({} checks)\n", self.checks.len());
        } else {
            out += &format!(
                "result: FAIL ({failed} of {} checks failed)\n",
                self.checks.len()
            );
        }
        out
    }

    fn push(&mut self, name: &'static str, status: Status, detail: impl Into<String>) {
        self.checks.push(Check {
            name,
            status,
            detail: detail.into(),
        });
    }

    /// Adds the `conflicts` check against the kinds in `taken` (`what` says whose: the
    /// bundled kinds, a config's). The file would be installed as `[plugins.<its name>]
    /// path`, which takes the place of the kind of that name: that kind is no clash, but
    /// a change of its content type, delivery or counts-unread warns (stored history
    /// depends on them; a reload refuses the last two). Another kind's content type is a
    /// clash: it warns, or fails when `fail` (a server with `taken` would refuse the
    /// plugin). Not added when the manifest could not be read or is invalid.
    pub fn against(&mut self, taken: &[Taken], sha256: &str, what: &str, fail: bool) {
        let Some(m) = &self.manifest else { return };
        if !m.problems().is_empty() {
            return;
        }
        let clashes: Vec<String> = taken
            .iter()
            .filter(|t| t.manifest.name != m.name && t.manifest.content_type == m.content_type)
            .map(|t| {
                let n = &t.manifest;
                format!("{} (content type {}, {})", n.name, n.content_type, t.source)
            })
            .collect();
        let replaced = taken
            .iter()
            .find(|t| t.manifest.name == m.name && t.sha256 != sha256);
        let mut changes = Vec::new();
        if let Some(t) = replaced {
            let old = &t.manifest;
            if old.content_type != m.content_type {
                changes.push(format!(
                    "content type from {} to {} (messages stored as {} lose their kind)",
                    old.content_type, m.content_type, old.content_type
                ));
            }
            for (change, why) in m.history_changes(old.delivery, old.counts_unread) {
                changes.push(format!("{change} (a reload refuses it; {why})"));
            }
        }
        let replacing = replaced.map(|t| {
            format!(
                "takes the place of {} ({}) when configured as [plugins.{}] path",
                m.name, t.source, m.name
            )
        });
        if !clashes.is_empty() {
            self.push(
                "conflicts",
                if fail { Status::Fail } else { Status::Warn },
                format!(
                    "claims the content type of {what}: {}; a server that has it refuses to load this plugin (content types 1-999 are the bundled kinds': use 1000 and up)",
                    clashes.join(", ")
                ),
            );
        } else if let (Some(replacing), false) = (&replacing, changes.is_empty()) {
            self.push(
                "conflicts",
                Status::Warn,
                format!("{replacing}, and changes its {}", changes.join(", ")),
            );
        } else {
            let detail = match replacing {
                Some(r) => format!("{r}; no content type of another kind of {what}"),
                None => format!("no name or content type of {what}"),
            };
            self.push("conflicts", Status::Pass, detail);
        }
    }

    fn skip_rest(&mut self, names: &[&'static str], why: &str) {
        for n in names {
            self.push(n, Status::Skip, why);
        }
    }
}

const ALL_CHECKS: &[&str] = &[
    "component",
    "compiles",
    "contract",
    "imports",
    "manifest",
    "examples",
    "determinism",
    "idempotence",
    "preview",
    "malformed",
    "oversized",
    "fuzz",
    "cases",
    "budget",
];

/// Checks a file.
pub fn check_file(path: &Path, opts: &CheckOptions) -> Report {
    match std::fs::read(path) {
        Ok(bytes) => check_bytes(&path.display().to_string(), &bytes, opts),
        Err(e) => {
            let mut r = Report {
                file: path.display().to_string(),
                manifest: None,
                checks: vec![],
            };
            r.push(
                "component",
                Status::Fail,
                format!("cannot read the file: {e}"),
            );
            r.skip_rest(&ALL_CHECKS[1..], "the file could not be read");
            r
        }
    }
}

/// Checks component bytes; `file` names them in the report.
pub fn check_bytes(file: &str, bytes: &[u8], opts: &CheckOptions) -> Report {
    let mut r = Report {
        file: file.to_string(),
        manifest: None,
        checks: vec![],
    };
    if let Err(e) = loader::check_is_component(bytes) {
        r.push("component", Status::Fail, e.to_string());
        r.skip_rest(&ALL_CHECKS[1..], "not a component");
        return r;
    }
    r.push(
        "component",
        Status::Pass,
        format!(
            "WebAssembly component, {} KiB, sha256 {}",
            bytes.len() / 1024,
            loader::sha256_hex(bytes)
        ),
    );

    let runtime = match Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            r.push(
                "compiles",
                Status::Fail,
                format!("cannot start the wasm engine: {e:#}"),
            );
            return r;
        }
    };
    let started = Instant::now();
    let component = match runtime.compile(bytes) {
        Ok(c) => c,
        Err(e) => {
            r.push("compiles", Status::Fail, format!("does not compile: {e:#}"));
            r.skip_rest(&ALL_CHECKS[2..], "does not compile");
            return r;
        }
    };
    r.push(
        "compiles",
        Status::Pass,
        format!("in {} ms", started.elapsed().as_millis()),
    );

    match loader::contract_version(&runtime, &component) {
        Ok((a, b, c)) => r.push(
            "contract",
            Status::Pass,
            format!(
                "targets courier:plugin@{a}.{b}.{c}; host supports {}.{}–{}.{}",
                CONTRACT_MIN.0, CONTRACT_MIN.1, CONTRACT_MAX.0, CONTRACT_MAX.1
            ),
        ),
        Err(e) => {
            r.push("contract", Status::Fail, e.to_string());
            r.skip_rest(&ALL_CHECKS[3..], "contract version not supported");
            return r;
        }
    }

    let verdicts = loader::classify_imports(&runtime, &component);
    let refused: Vec<&str> = verdicts
        .iter()
        .filter(|v| v.allowed.is_none())
        .map(|v| v.name.as_str())
        .collect();
    let mut detail = String::new();
    if refused.is_empty() {
        detail += &format!(
            "{} imports, all within the contract or neutralized WASI",
            verdicts.len()
        );
    } else {
        detail += &format!("imports outside the contract: {}", refused.join(", "));
    }
    for v in &verdicts {
        detail += &format!(
            "\n{} — {}",
            v.name,
            v.allowed.unwrap_or("REFUSED: not provided to plugins")
        );
    }
    if !refused.is_empty() {
        r.push("imports", Status::Fail, detail);
        r.skip_rest(&ALL_CHECKS[4..], "imports outside the contract");
        return r;
    }
    r.push("imports", Status::Pass, detail);

    let limits = |isolation| Limits {
        fuel_per_call: opts.fuel_per_call,
        memory_bytes: opts.memory_mib as usize * 1024 * 1024,
        isolation,
        recycle_after_calls: u64::MAX,
        recycle_above_bytes: usize::MAX,
        max_instances: 4,
    };
    let pool = |isolation| -> Result<InstancePool, String> {
        let pre = runtime.prepare(&component).map_err(|e| format!("{e:#}"))?;
        Ok(InstancePool::new(
            "(check)",
            &runtime,
            pre,
            limits(isolation),
        ))
    };
    let (pooled, fresh) = match (pool(Isolation::Pooled), pool(Isolation::Fresh)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            r.push(
                "manifest",
                Status::Fail,
                format!("cannot be instantiated: {e}"),
            );
            r.skip_rest(&ALL_CHECKS[5..], "cannot be instantiated");
            return r;
        }
    };
    let mut probe = Probe::new(pooled, fresh, opts.fuel_per_call);
    let manifest: Manifest = match probe.manifest() {
        Ok(m) => m,
        Err(e) => {
            r.push("manifest", Status::Fail, format!("manifest() failed: {e}"));
            r.skip_rest(&ALL_CHECKS[5..], "no manifest");
            return r;
        }
    };
    let problems = manifest.problems();
    if problems.is_empty() {
        r.push(
            "manifest",
            Status::Pass,
            format!(
                "{} {}: content type {}, {}, sender {}, conversation types {:?}, max {} bytes",
                manifest.name,
                manifest.version,
                manifest.content_type,
                manifest.delivery,
                format!("{:?}", manifest.sender).to_lowercase(),
                manifest.conversation_types,
                manifest.max_payload_bytes
            )
            .to_string(),
        );
    } else {
        r.push("manifest", Status::Fail, problems.join("\n"));
        r.manifest = Some(manifest);
        // The host would not load it; its limits cannot be trusted to drive the rest.
        r.skip_rest(&ALL_CHECKS[5..], "invalid manifest");
        return r;
    }
    r.manifest = Some(manifest.clone());
    probe.manifest = Some(manifest.clone());

    behaviour::run_behaviour_checks(&mut r, &mut probe, &manifest, opts);
    r
}

pub(super) fn push_result(r: &mut Report, name: &'static str, bad: Vec<String>, ok: String) {
    if bad.is_empty() {
        r.push(name, Status::Pass, ok);
    } else {
        r.push(name, Status::Fail, bad.join("\n"));
    }
}
