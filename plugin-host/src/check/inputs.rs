//! Inputs the suite throws at a plugin: malformed JSON, odd JSON, padding, and mutations.

/// Not JSON at all: every one must be rejected.
pub fn malformed() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        " ",
        "{",
        "}",
        "[",
        "{\"",
        "{\"a\"",
        "{\"a\":",
        "{\"a\":}",
        "{,}",
        "{'a':1}",
        "{a:1}",
        "nul",
        "tru",
        "[1,]",
        "{\"a\":1,}",
        "\"unterminated",
        "{\"a\":\"\\u12\"}",
        "{\"a\":01}",
        "{\"a\":1}{\"b\":2}",
        "{\"a\":1} trailing",
        "NaN",
        "Infinity",
        "\u{feff}{}",
        "\0",
        "{\"a\":\"\u{1}\"}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("[".repeat(200));
    v.push(format!("{}1{}", "{\"a\":".repeat(150), "}".repeat(149)));
    v
}

/// Valid JSON of the wrong shape: accept or reject, but never trap.
pub fn odd_but_valid_json() -> Vec<String> {
    let mut v: Vec<String> = [
        "null",
        "true",
        "0",
        "-1",
        "1e308",
        "\"text\"",
        "[]",
        "{}",
        "[{}]",
        "{\"\":\"\"}",
        "{\"text\":null}",
        "{\"text\":\"\\ud800\"}",
        "{\"seq\":18446744073709551616}",
        "{\"a\":[1,2,3]}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(format!("{}{}", "[".repeat(60), "]".repeat(60)));
    v
}

/// A JSON object of exactly `len` bytes (for `len >= 12`).
pub fn padded(len: usize) -> String {
    let fill = len.saturating_sub(11);
    format!("{{\"text\":\"{}\"}}", "a".repeat(fill))
}

/// One mutation of a seed input, bounded by `max` bytes.
pub fn mutate(rng: &mut fastrand::Rng, base: &str, max: usize) -> String {
    let mut bytes = base.as_bytes().to_vec();
    let rounds = rng.usize(1..=4);
    for _ in 0..rounds {
        match rng.u8(0..9) {
            0 if !bytes.is_empty() => {
                let i = rng.usize(..bytes.len());
                bytes[i] ^= 1 << rng.u8(0..7);
            }
            1 if !bytes.is_empty() => {
                let i = rng.usize(..bytes.len());
                bytes.truncate(i);
            }
            2 => {
                let i = rng.usize(..=bytes.len());
                let b = *b"{}[]\":,\\0-e.tnfu a\n"
                    .get(rng.usize(..19))
                    .unwrap_or(&b' ');
                bytes.insert(i, b);
            }
            3 if bytes.len() > 1 => {
                let i = rng.usize(..bytes.len());
                let j = rng.usize(i..bytes.len());
                bytes.drain(i..j);
            }
            4 => {
                let long = "\"".to_string() + &"x".repeat(rng.usize(0..max.min(70_000))) + "\"";
                return replace_value(rng, base, long);
            }
            5 => return replace_value(rng, base, "-1".into()),
            6 => return replace_value(rng, base, "18446744073709551615".into()),
            7 => {
                let odd = [
                    "null",
                    "true",
                    "[]",
                    "{}",
                    "\"\"",
                    "1.5",
                    "\"\\u0000\"",
                    // A lone surrogate: valid JSON, not valid Unicode.
                    "\"\\ud800\"",
                ][rng.usize(..8)];
                return replace_value(rng, base, odd.into());
            }
            _ => {
                let i = rng.usize(..=bytes.len());
                let chunk: Vec<u8> = bytes.clone();
                bytes.splice(i..i, chunk.into_iter().take(64));
            }
        }
    }
    bytes.truncate(max);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Replaces one top-level value of a JSON object with `value`, JSON text (structure-aware
/// mutation).
fn replace_value(rng: &mut fastrand::Rng, base: &str, value: String) -> String {
    match serde_json::from_str::<serde_json::Value>(base) {
        Ok(serde_json::Value::Object(mut map)) if !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = &keys[rng.usize(..keys.len())];
            // Spliced in as raw text, so values serde_json would not build (a lone
            // surrogate escape) reach the plugin as written.
            const MARK: &str = "\u{1}courier-fuzz-value\u{1}";
            map.insert(key.clone(), serde_json::Value::String(MARK.into()));
            let marked = serde_json::Value::Object(map).to_string();
            marked.replacen(
                &serde_json::Value::String(MARK.into()).to_string(),
                &value,
                1,
            )
        }
        _ => value,
    }
}

/// The first 60 characters of an input, for reports.
pub fn snippet(s: &str) -> String {
    let mut out: String = s.chars().take(60).collect();
    if s.chars().count() > 60 {
        out += &format!("… ({} bytes)", s.len());
    }
    format!("{out:?}")
}
