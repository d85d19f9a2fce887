//! Data-driven cases: `DIR/<case>/input.json` (the payload), optional `context.json`
//! (`{"conversationType": 2, "senderId": "u1", "sender": "user"}`), and either
//! `expected.json` (the normalized payload, compared as JSON values, numbers by value) or
//! `error.txt` (the expected error code: a host code such as `payload_too_large`,
//! `payload_invalid` for any plugin rejection, or the plugin's own rejection code).

use std::path::Path;

use serde::Deserialize;

use super::super::manifest::{Manifest, SenderKind};
use super::super::registry::SendContext;
use super::probe::{Outcome, Probe};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CaseContext {
    conversation_type: Option<u8>,
    sender_id: Option<String>,
    sender: Option<String>,
}

/// Runs every case; returns how many ran and the failures.
pub fn run(dir: &Path, probe: &mut Probe, m: &Manifest) -> Result<(usize, Vec<String>), String> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    if entries.is_empty() {
        return Err(format!("{} holds no case directories", dir.display()));
    }
    let mut bad = Vec::new();
    for entry in &entries {
        let case = entry.file_name().to_string_lossy().into_owned();
        if let Err(e) = run_one(&entry.path(), probe, m) {
            bad.push(format!("{case}: {e}"));
        }
    }
    Ok((entries.len(), bad))
}

fn run_one(dir: &Path, probe: &mut Probe, m: &Manifest) -> Result<(), String> {
    let input = std::fs::read(dir.join("input.json")).map_err(|e| format!("input.json: {e}"))?;
    let input = trim_newline(input);
    let ctx: CaseContext = match std::fs::read_to_string(dir.join("context.json")) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| format!("context.json: {e}"))?,
        Err(_) => CaseContext {
            conversation_type: None,
            sender_id: None,
            sender: None,
        },
    };
    let sender = match ctx.sender.as_deref() {
        Some("system") => SenderKind::System,
        Some("user") => SenderKind::User,
        None => m.sender,
        Some(other) => {
            return Err(format!(
                "context.json: sender must be user or system, not {other:?}"
            ));
        }
    };
    let sender_id = ctx.sender_id.unwrap_or_else(|| {
        if sender == SenderKind::System {
            "system".into()
        } else {
            "u-case".into()
        }
    });
    let send = SendContext {
        sender_id: &sender_id,
        sender,
        conversation_type: ctx
            .conversation_type
            .unwrap_or_else(|| m.conversation_types.first().copied().unwrap_or(1)),
        conversation_id: "c-case",
    };
    let outcome = probe.validate_as(&send, &input);
    let expected = std::fs::read_to_string(dir.join("expected.json")).ok();
    let error = std::fs::read_to_string(dir.join("error.txt")).ok();
    match (expected, error) {
        (Some(exp), None) => {
            let want: serde_json::Value =
                serde_json::from_str(&exp).map_err(|e| format!("expected.json: {e}"))?;
            match &outcome {
                Outcome::Accepted(out) => {
                    let got: serde_json::Value = serde_json::from_str(out)
                        .map_err(|e| format!("the plugin returned invalid JSON: {e}"))?;
                    if same_json(&got, &want) {
                        Ok(())
                    } else {
                        Err(format!("expected {want}, got {got}"))
                    }
                }
                other => Err(format!("expected acceptance, got {}", other.describe())),
            }
        }
        (None, Some(err)) => {
            let want = err.lines().next().unwrap_or_default().trim().to_string();
            let ok = match &outcome {
                Outcome::Rejected { code, .. } => want == "payload_invalid" || &want == code,
                Outcome::Refused(code) => want == *code,
                _ => false,
            };
            if ok {
                Ok(())
            } else {
                Err(format!("expected error {want}, got {}", outcome.describe()))
            }
        }
        (Some(_), Some(_)) => Err("has both expected.json and error.txt".into()),
        (None, None) => Err("has neither expected.json nor error.txt".into()),
    }
}

/// JSON values alike: objects by key (order aside), arrays in order, numbers by value
/// (`1` equals `1.0`: a number that passed through an `f64` comes back as a float).
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn trim_newline(mut v: Vec<u8>) -> Vec<u8> {
    while v.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        v.pop();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::same_json;
    use serde_json::json;

    #[test]
    fn numbers_compare_by_value() {
        assert!(same_json(
            &json!({"n": 1, "xs": [2, 3.5]}),
            &json!({"xs": [2.0, 3.5], "n": 1.0})
        ));
        assert!(same_json(&json!(u64::MAX), &json!(u64::MAX)));
        assert!(same_json(&json!(-3), &json!(-3.0)));
        assert!(!same_json(&json!({"n": 1}), &json!({"n": 1.5})));
        assert!(!same_json(&json!({"n": 1}), &json!({"n": "1"})));
        assert!(!same_json(&json!([1, 2]), &json!([2, 1])));
        assert!(!same_json(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
    }
}
