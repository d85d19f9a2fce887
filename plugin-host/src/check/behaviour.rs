//! The behaviour checks, run once a component has loaded and declared a sane manifest:
//! examples, determinism, idempotence, preview, malformed and oversized input, fuzz,
//! data-driven cases, and the budget summary.

use super::super::bindings::WitExample;
use super::super::manifest::Manifest;
use super::super::registry::{SendContext, ValidateError, precheck};
use super::probe::{Outcome, Probe};
use super::{CheckOptions, Report, Status, cases, inputs, push_result};

pub(super) fn run_behaviour_checks(
    r: &mut Report,
    probe: &mut Probe,
    m: &Manifest,
    opts: &CheckOptions,
) {
    let examples = examples(r, probe);
    let corpus = corpus(&examples, m);
    determinism(r, probe, &corpus);
    let accepted = idempotence(r, probe, &corpus);
    preview(r, probe, &accepted);
    let ctx = SendContext {
        sender_id: "u-check",
        sender: m.sender,
        conversation_type: corpus[0].0,
        conversation_id: "c-check",
    };
    malformed(r, probe, m, &ctx);
    oversized(r, probe, m, &ctx);
    fuzz(r, probe, m, opts, &corpus);
    cases(r, probe, m, opts);
    budget(r, probe, opts);
}

/// The plugin's own examples: each accepted or rejected as it declares, at least one of
/// each.
fn examples(r: &mut Report, probe: &mut Probe) -> Vec<WitExample> {
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
            let outcome = probe.validate_example(ex.conversation_type, &ex.payload);
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
    examples
}

/// The inputs the other checks start from: the examples' payloads, or `{}`.
fn corpus(examples: &[WitExample], m: &Manifest) -> Vec<(u8, String)> {
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
    corpus
}

/// The warm pooled instance (after all the calls before) and a fresh one agree, two calls
/// in a row agree, and nothing of a previous call's context shows in another conversation.
fn determinism(r: &mut Report, probe: &mut Probe, corpus: &[(u8, String)]) {
    let mut diffs = Vec::new();
    for (ct, payload) in corpus {
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
        // From another conversation: nothing of the previous calls' context may show.
        let warm_elsewhere = probe.validate_elsewhere(false, *ct, payload);
        let fresh_elsewhere = probe.validate_elsewhere(true, *ct, payload);
        if warm_elsewhere != fresh_elsewhere {
            diffs.push(format!(
                "{} from another conversation: {} on the warm instance, {} on a fresh one",
                inputs::snippet(payload),
                warm_elsewhere.describe(),
                fresh_elsewhere.describe()
            ));
        }
    }
    push_result(
        r,
        "determinism",
        diffs,
        format!(
            "{} inputs give the same result twice in a row, on a fresh instance, and from another conversation",
            corpus.len()
        ),
    );
}

/// A normalized payload validates to itself; the accepted outputs.
fn idempotence(r: &mut Report, probe: &mut Probe, corpus: &[(u8, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut accepted_outputs = Vec::new();
    for (ct, payload) in corpus {
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
    accepted_outputs
}

/// Previews are single lines of at most 200 characters.
fn preview(r: &mut Report, probe: &mut Probe, accepted_outputs: &[String]) {
    let mut bad = Vec::new();
    for out in accepted_outputs {
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
}

/// Malformed input is rejected, odd but valid JSON does not trap, non-UTF-8 never reaches
/// the plugin.
fn malformed(r: &mut Report, probe: &mut Probe, m: &Manifest, ctx: &SendContext<'_>) {
    let ct = ctx.conversation_type;
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
    let not_utf8: &[u8] = b"{\"text\":\"\xff\xfe\"}";
    if !matches!(
        precheck(m, ctx, not_utf8),
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
}

/// A payload over the kind's maximum is refused before wasm; one at the maximum is
/// handled.
fn oversized(r: &mut Report, probe: &mut Probe, m: &Manifest, ctx: &SendContext<'_>) {
    let ct = ctx.conversation_type;
    let mut bad = Vec::new();
    let max = m.max_payload_bytes as usize;
    let over = inputs::padded(max + 1);
    match precheck(m, ctx, over.as_bytes()) {
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
}

/// Mutated inputs: no trap, idempotent outputs, warm and fresh instances agree.
fn fuzz(
    r: &mut Report,
    probe: &mut Probe,
    m: &Manifest,
    opts: &CheckOptions,
    corpus: &[(u8, String)],
) {
    let max = m.max_payload_bytes as usize;
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
}

/// The data-driven cases of `--cases`.
fn cases(r: &mut Report, probe: &mut Probe, m: &Manifest, opts: &CheckOptions) {
    match &opts.cases {
        None => r.push("cases", Status::Skip, "no --cases directory given"),
        Some(dir) => match cases::run(dir, probe, m) {
            Ok((n, bad)) => {
                push_result(r, "cases", bad, format!("{n} cases from {}", dir.display()))
            }
            Err(e) => r.push("cases", Status::Fail, e),
        },
    }
}

/// Every call stayed within its budget (the failures that did not are contained).
fn budget(r: &mut Report, probe: &mut Probe, opts: &CheckOptions) {
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
