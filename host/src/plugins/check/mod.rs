//! The contract suite: `courier plugin check FILE.wasm [--cases DIR]`. Runs any component
//! through every check a plugin must pass and prints one line per check.

mod cases;
mod inputs;
mod probe;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::loader::{self, CONTRACT_MAX, CONTRACT_MIN};
use super::manifest::{Manifest, SenderKind};
use super::registry::{SendContext, ValidateError, precheck};
use super::runtime::{InstancePool, Limits, Runtime};
use crate::config::{Isolation, RuntimeConfig};
use probe::{Outcome, Probe};

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
            out += &format!(
                "  plugin {} {} — content type {}, {}, {}\n",
                m.name,
                m.version,
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
    }
    r.manifest = Some(manifest.clone());
    probe.manifest = Some(manifest.clone());

    run_behaviour_checks(&mut r, &mut probe, &manifest, opts);
    r
}

fn run_behaviour_checks(r: &mut Report, probe: &mut Probe, m: &Manifest, opts: &CheckOptions) {
    // examples
    let examples = match probe.examples() {
        Ok(e) => e,
        Err(e) => {
            r.push("examples", Status::Fail, format!("examples() failed: {e}"));
            vec![]
        }
    };
    if !examples.is_empty() || r.check("examples").is_none() {
        let mut wrong = Vec::new();
        let (mut acc, mut rej) = (0, 0);
        for ex in &examples {
            let outcome = probe.validate(ex.conversation_type, &ex.payload);
            match (&outcome, ex.accepted) {
                (Outcome::Accepted(_), true) => acc += 1,
                (Outcome::Rejected { .. }, false) => rej += 1,
                (other, want) => wrong.push(format!(
                    "{:?}: declared {}, got {}",
                    ex.name,
                    if want { "accepted" } else { "rejected" },
                    other.describe()
                )),
            }
        }
        if acc == 0 {
            wrong.push("declares no accepted example".into());
        }
        if rej == 0 {
            wrong.push("declares no rejected example".into());
        }
        if wrong.is_empty() {
            r.push(
                "examples",
                Status::Pass,
                format!("{acc} accepted and {rej} rejected, as declared"),
            );
        } else {
            r.push("examples", Status::Fail, wrong.join("\n"));
        }
    }

    let mut corpus: Vec<(u8, String)> = examples
        .iter()
        .map(|e| (e.conversation_type, e.payload.clone()))
        .collect();
    if corpus.is_empty() {
        corpus.push((
            m.conversation_types.first().copied().unwrap_or(1),
            "{}".into(),
        ));
    }

    // determinism: the warm pooled instance (after all the calls above) and a fresh one agree,
    // and two calls in a row agree.
    let mut diffs = Vec::new();
    for (ct, payload) in &corpus {
        let warm = probe.validate(*ct, payload);
        let again = probe.validate(*ct, payload);
        let fresh = probe.validate_fresh(*ct, payload);
        if warm != again || warm != fresh {
            diffs.push(format!(
                "{}: {} / {} / fresh instance: {}",
                inputs::snippet(payload),
                warm.describe(),
                again.describe(),
                fresh.describe()
            ));
        }
    }
    push_result(
        r,
        "determinism",
        diffs,
        format!(
            "{} inputs give the same result twice in a row and on a fresh instance",
            corpus.len()
        ),
    );

    // idempotence
    let mut bad = Vec::new();
    let mut accepted_outputs = Vec::new();
    for (ct, payload) in &corpus {
        if let Outcome::Accepted(out) = probe.validate(*ct, payload) {
            let again = probe.validate(*ct, &out);
            if again != Outcome::Accepted(out.clone()) {
                bad.push(format!(
                    "{} normalizes to {}, which validates to {}",
                    inputs::snippet(payload),
                    inputs::snippet(&out),
                    again.describe()
                ));
            }
            accepted_outputs.push(out);
        }
    }
    push_result(
        r,
        "idempotence",
        bad,
        format!(
            "{} normalized payloads validate to themselves",
            accepted_outputs.len()
        ),
    );

    // preview
    let mut bad = Vec::new();
    for out in &accepted_outputs {
        match probe.preview(out) {
            Ok(line) if line.contains(['\n', '\r']) => bad.push(format!(
                "preview of {} spans several lines",
                inputs::snippet(out)
            )),
            Ok(line) if line.chars().count() > 200 => bad.push(format!(
                "preview of {} is longer than 200 characters",
                inputs::snippet(out)
            )),
            Ok(_) => {}
            Err(e) => bad.push(format!("preview of {} failed: {e}", inputs::snippet(out))),
        }
    }
    push_result(
        r,
        "preview",
        bad,
        format!(
            "{} previews are single lines of at most 200 characters",
            accepted_outputs.len()
        ),
    );

    // malformed
    let ct = corpus[0].0;
    let mut bad = Vec::new();
    for input in inputs::malformed() {
        let o = probe.validate(ct, &input);
        if !matches!(o, Outcome::Rejected { .. }) {
            bad.push(format!("{}: {}", inputs::snippet(&input), o.describe()));
        }
    }
    for input in inputs::odd_but_valid_json() {
        let o = probe.validate(ct, &input);
        if matches!(o, Outcome::Failed(_)) {
            bad.push(format!("{}: {}", inputs::snippet(&input), o.describe()));
        }
    }
    let ctx = SendContext {
        sender_id: "u-check",
        sender: user_or_system(m),
        conversation_type: ct,
        conversation_id: "c-check",
    };
    let not_utf8: &[u8] = b"{\"text\":\"\xff\xfe\"}";
    if !matches!(
        precheck(m, &ctx, not_utf8),
        Err(ValidateError::Invalid { .. })
    ) {
        bad.push("non-UTF-8 input was not rejected before the plugin".into());
    }
    push_result(
        r,
        "malformed",
        bad,
        format!(
            "{} malformed inputs rejected, odd JSON and non-UTF-8 handled, no trap",
            inputs::malformed().len()
        ),
    );

    // oversized
    let mut bad = Vec::new();
    let max = m.max_payload_bytes as usize;
    let over = inputs::padded(max + 1);
    match precheck(m, &ctx, over.as_bytes()) {
        Err(ValidateError::TooLarge { .. }) => {}
        other => bad.push(format!(
            "a {}-byte payload was not refused by the host: {other:?}",
            over.len()
        )),
    }
    let at_max = inputs::padded(max);
    let o = probe.validate(ct, &at_max);
    if matches!(o, Outcome::Failed(_)) {
        bad.push(format!(
            "a payload of exactly {max} bytes: {}",
            o.describe()
        ));
    }
    push_result(
        r,
        "oversized",
        bad,
        format!(
            "{} bytes refused before wasm; {max} bytes handled without a trap",
            max + 1
        ),
    );

    // fuzz
    let mut rng = fastrand::Rng::with_seed(opts.seed);
    let mut bad = Vec::new();
    let (mut acc, mut rej) = (0, 0);
    for i in 0..opts.fuzz {
        let (ct, base) = &corpus[i % corpus.len()];
        let input = inputs::mutate(&mut rng, base, max);
        let outcome = probe.validate(*ct, &input);
        // Every 100th input is also run on a fresh instance: the warm one, after hundreds of
        // calls, must still agree with it.
        if i % 100 == 0 && !matches!(outcome, Outcome::Failed(_)) {
            let fresh = probe.validate_fresh(*ct, &input);
            if fresh != outcome {
                bad.push(format!(
                    "#{i} {}: {} on the warm instance, {} on a fresh one",
                    inputs::snippet(&input),
                    outcome.describe(),
                    fresh.describe()
                ));
            }
        }
        match outcome {
            Outcome::Accepted(out) => {
                acc += 1;
                let again = probe.validate(*ct, &out);
                if again != Outcome::Accepted(out.clone()) {
                    bad.push(format!(
                        "#{i} {}: output {} is not idempotent ({})",
                        inputs::snippet(&input),
                        inputs::snippet(&out),
                        again.describe()
                    ));
                }
            }
            Outcome::Rejected { .. } | Outcome::Refused(_) => rej += 1,
            Outcome::Failed(e) => bad.push(format!("#{i} {}: {e}", inputs::snippet(&input))),
        }
        if bad.len() >= 3 {
            bad.push(format!("stopped after {} inputs", i + 1));
            break;
        }
    }
    push_result(
        r,
        "fuzz",
        bad,
        format!(
            "{} mutated inputs (seed {:#x}): {acc} accepted, {rej} rejected, no trap, warm and fresh instances agree",
            opts.fuzz, opts.seed
        ),
    );

    // cases
    match &opts.cases {
        None => r.push("cases", Status::Skip, "no --cases directory given"),
        Some(dir) => match cases::run(dir, probe, m) {
            Ok((n, bad)) => {
                push_result(r, "cases", bad, format!("{n} cases from {}", dir.display()))
            }
            Err(e) => r.push("cases", Status::Fail, e),
        },
    }

    // budget
    let s = probe.summary();
    let detail = format!(
        "{} calls; most fuel {} of {} ({:.2}%); peak memory {:.1} MiB of {} MiB; slowest {} µs",
        s.calls,
        s.max_fuel,
        opts.fuel_per_call,
        s.max_fuel as f64 * 100.0 / opts.fuel_per_call as f64,
        s.peak_memory as f64 / 1048576.0,
        opts.memory_mib,
        s.max_micros
    );
    if s.failures.is_empty() {
        r.push("budget", Status::Pass, detail);
    } else {
        let mut d = format!(
            "{} of {} calls failed and were contained:",
            s.failures.len(),
            s.calls
        );
        for f in s.failures.iter().take(5) {
            d += &format!("\n{f}");
        }
        d += &format!("\n{detail}");
        r.push("budget", Status::Fail, d);
    }
}

fn push_result(r: &mut Report, name: &'static str, bad: Vec<String>, ok: String) {
    if bad.is_empty() {
        r.push(name, Status::Pass, ok);
    } else {
        r.push(name, Status::Fail, bad.join("\n"));
    }
}

fn user_or_system(m: &Manifest) -> SenderKind {
    m.sender
}
