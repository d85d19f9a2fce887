//! Small checks most kinds need. Each returns a [`Rejection`] with a stable code.

use crate::Rejection;

/// The text, trimmed of surrounding whitespace, must hold 1..=`max` characters.
pub fn text(field: &str, value: &str, max: usize) -> Result<String, Rejection> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(Rejection::new(
            "empty",
            format!("{field} must not be empty"),
        ));
    }
    let n = trimmed.chars().count();
    if n > max {
        return Err(Rejection::new(
            "too_long",
            format!("{field} has {n} characters, at most {max} are allowed"),
        ));
    }
    if trimmed
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(Rejection::new(
            "control_character",
            format!("{field} contains a control character"),
        ));
    }
    Ok(trimmed.to_string())
}

/// At most `max` characters; may be empty. Returns the trimmed text.
pub fn optional_text(field: &str, value: &str, max: usize) -> Result<String, Rejection> {
    if value.trim().is_empty() {
        return Ok(String::new());
    }
    text(field, value, max)
}

/// An `https://` URL of at most 2048 printable ASCII characters with a host name.
pub fn https_url(field: &str, value: &str) -> Result<(), Rejection> {
    let bad = |why: &str| Err(Rejection::new("bad_url", format!("{field} {why}")));
    if value.len() > 2048 {
        return bad("is longer than 2048 characters");
    }
    let Some(rest) = value.strip_prefix("https://") else {
        return bad("must be an https:// URL");
    };
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return bad("must be printable ASCII without spaces (percent-encode the rest)");
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = host.rsplit('@').next().unwrap_or_default();
    let name = host.split(':').next().unwrap_or_default();
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'[' || b == b']')
    {
        return bad("has no valid host name");
    }
    Ok(())
}

/// A MIME type `type/subtype` made of RFC 6838 token characters, optionally limited to
/// the given top-level types (`["image"]`). Returns it in lower case.
pub fn mime(field: &str, value: &str, top_levels: &[&str]) -> Result<String, Rejection> {
    let lower = value.trim().to_ascii_lowercase();
    let token = |s: &str| {
        !s.is_empty()
            && s.len() <= 127
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    let Some((top, sub)) = lower.split_once('/') else {
        return Err(Rejection::new(
            "bad_mime",
            format!("{field} must look like type/subtype"),
        ));
    };
    if !token(top) || !token(sub) {
        return Err(Rejection::new(
            "bad_mime",
            format!("{field} must look like type/subtype"),
        ));
    }
    if !top_levels.is_empty() && !top_levels.contains(&top) {
        return Err(Rejection::new(
            "bad_mime",
            format!("{field} must be one of {}", top_levels.join(", ") + "/*"),
        ));
    }
    Ok(lower)
}

/// A number in `min..=max`.
pub fn range(field: &str, value: u64, min: u64, max: u64) -> Result<(), Rejection> {
    if value < min || value > max {
        return Err(Rejection::new(
            "out_of_range",
            format!("{field} must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(())
}

/// An identifier: 1..=`max` characters of `[A-Za-z0-9_-]`.
pub fn id(field: &str, value: &str, max: usize) -> Result<(), Rejection> {
    if value.is_empty()
        || value.len() > max
        || !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Rejection::new(
            "bad_id",
            format!("{field} must be 1 to {max} characters of A-Z, a-z, 0-9, _ or -"),
        ));
    }
    Ok(())
}
