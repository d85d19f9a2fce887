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

/// A number in `min..=max`: any integer type, or `f64`/`f32` (a NaN is never in range),
/// e.g. `range("lat", p.lat, -90.0, 90.0)` or `range("offset", p.offset, -720i64, 840)`.
pub fn range<T>(field: &str, value: T, min: T, max: T) -> Result<(), Rejection>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    // Written so that a NaN (comparing false to everything) is out of range.
    if !(value >= min && value <= max) {
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

/// Whether `value` is a user id: 1..=64 characters of `[A-Za-z0-9_.@-]`, not `.` or `..`
/// (a path segment clients rewrite, so `/admin/users/..` could never name it). The server
/// registers and recognizes users by this rule.
pub fn is_user_id(value: &str) -> bool {
    value != "."
        && value != ".."
        && (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'@'))
}

/// A user id ([`is_user_id`]), else `bad_id`.
pub fn user_id(field: &str, value: &str) -> Result<(), Rejection> {
    if !is_user_id(value) {
        return Err(Rejection::new(
            "bad_id",
            format!(
                "{field} must be 1 to 64 characters of A-Z, a-z, 0-9, _, ., - or @, not . or .."
            ),
        ));
    }
    Ok(())
}

/// User ids ([`user_id`] each, `field` naming the list), in order, without duplicates.
/// Duplicates go through a hash set with fixed keys (deterministic): a scan per id, or an
/// ordered set comparing ids with a long common prefix byte by byte, costs thousands of
/// ids more than a call's fuel.
pub fn user_ids(field: &str, ids: Vec<String>) -> Result<Vec<String>, Rejection> {
    use std::collections::HashSet;
    use std::hash::{BuildHasherDefault, DefaultHasher};
    let mut seen: HashSet<String, BuildHasherDefault<DefaultHasher>> = HashSet::default();
    let mut kept = Vec::with_capacity(ids.len());
    for id in ids {
        user_id(field, &id)?;
        if seen.insert(id.clone()) {
            kept.push(id);
        }
    }
    Ok(kept)
}

/// Whether `value` is a device id: 1..=64 characters of `[A-Za-z0-9_.:-]`, but not `.` or
/// `..` (path segments that clients rewrite). The server takes devices by this rule.
pub fn is_device_id(value: &str) -> bool {
    value != "."
        && value != ".."
        && (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b':'))
}

/// A device id ([`is_device_id`]), else `bad_id`.
pub fn device_id(field: &str, value: &str) -> Result<(), Rejection> {
    if !is_device_id(value) {
        return Err(Rejection::new(
            "bad_id",
            format!(
                "{field} must be 1 to 64 characters of A-Z, a-z, 0-9, _, ., - or :, \
                 and not . or .."
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code<T>(r: Result<T, Rejection>) -> String {
        r.err().map(|e| e.code).unwrap_or_default()
    }

    #[test]
    fn text_trims_and_counts_characters_not_bytes() {
        assert_eq!(text("t", "  hi \n", 5).unwrap(), "hi");
        assert_eq!(text("t", "ééééé", 5).unwrap(), "ééééé");
        assert_eq!(code(text("t", "ééééé6", 5)), "too_long");
        assert_eq!(code(text("t", " \t ", 5)), "empty");
        assert_eq!(code(text("t", "a\u{7}b", 5)), "control_character");
        assert_eq!(text("t", "a\nb", 5).unwrap(), "a\nb");
        assert_eq!(optional_text("t", "  ", 5).unwrap(), "");
    }

    #[test]
    fn https_urls_only() {
        assert!(https_url("u", "https://cdn.example.com/a.png?x=1#f").is_ok());
        assert!(https_url("u", "https://[2001:db8::1]:8443/a").is_ok());
        for bad in [
            "http://x.example/a",
            "https://",
            "https:///a",
            "https://a b/",
            "javascript:alert(1)",
            "https://x.example/ä",
        ] {
            assert_eq!(code(https_url("u", bad)), "bad_url", "{bad}");
        }
    }

    #[test]
    fn mime_types_are_lower_cased_and_limited() {
        assert_eq!(mime("m", " Image/PNG ", &["image"]).unwrap(), "image/png");
        assert_eq!(code(mime("m", "application/pdf", &["image"])), "bad_mime");
        assert_eq!(code(mime("m", "png", &[])), "bad_mime");
        assert_eq!(code(mime("m", "a/b c", &[])), "bad_mime");
    }

    #[test]
    fn ranges_take_signed_and_fractional_numbers() {
        assert!(range("lat", -33.87, -90.0, 90.0).is_ok());
        assert_eq!(code(range("lat", 90.5, -90.0, 90.0)), "out_of_range");
        assert_eq!(code(range("lat", f64::NAN, -90.0, 90.0)), "out_of_range");
        assert_eq!(
            code(range("lon", f64::INFINITY, -180.0, 180.0)),
            "out_of_range"
        );
        assert!(range("offset", -720i64, -720, 840).is_ok());
        assert_eq!(code(range("offset", -721i64, -720, 840)), "out_of_range");
        let e = range("lat", 91.25, -90.0, 90.0).unwrap_err();
        assert_eq!(e.message, "lat must be between -90 and 90, got 91.25");
    }

    #[test]
    fn ranges_and_ids() {
        assert!(range("n", 5, 1, 5).is_ok());
        assert_eq!(code(range("n", 0, 1, 5)), "out_of_range");
        assert!(id("i", "a-B_9", 8).is_ok());
        assert_eq!(code(id("i", "", 8)), "bad_id");
        assert_eq!(code(id("i", "a b", 8)), "bad_id");
        assert_eq!(code(id("i", "123456789", 8)), "bad_id");
    }

    #[test]
    fn user_ids_take_dots_and_at_signs() {
        for good in [
            "bob",
            "bob@example.com",
            "dot.user",
            "a_b-c",
            &"x".repeat(64),
        ] {
            assert!(user_id("u", good).is_ok(), "{good}");
        }
        assert!(user_id("u", "...").is_ok());
        for bad in ["", "a b", "bob+1", "é", ".", "..", &"x".repeat(65)] {
            assert_eq!(code(user_id("u", bad)), "bad_id", "{bad}");
        }
    }

    #[test]
    fn user_id_lists_keep_the_first_of_each_in_order() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            user_ids("u[]", ids(&["b", "a", "b", "c", "a"])).unwrap(),
            ids(&["b", "a", "c"])
        );
        assert_eq!(code(user_ids("u[]", ids(&["a", "a b"]))), "bad_id");
    }

    #[test]
    fn device_ids_take_colons_but_not_dot_segments() {
        for good in ["phone", "ios:1.2", "a_b-c", "...", &"x".repeat(64)] {
            assert!(device_id("d", good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a@b", "a/b", &"x".repeat(65)] {
            assert_eq!(code(device_id("d", bad)), "bad_id", "{bad}");
        }
    }
}
