//! A plugin's manifest as the host keeps it, and the sanity rules every manifest must meet.

use serde::Serialize;

use super::bindings::{WitDelivery, WitManifest, WitSender};

/// Largest payload any plugin may declare (the gateway's frame limit is above this).
pub const MAX_PAYLOAD_CEILING: u32 = 1024 * 1024;

/// Longest `version` a manifest may declare, in bytes.
pub const MAX_VERSION_BYTES: usize = 64;

/// Longest `description`, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 300;

/// The most characters of a plugin's string the host ever shows (in a report, an error
/// or a log line).
pub const MAX_SHOWN_CHARS: usize = 64;

/// A plugin's string as it is when it is short plain text, else as `shown` has it.
pub fn display(s: &str) -> String {
    let plain = s.len() <= MAX_SHOWN_CHARS
        && !s.is_empty()
        && s.chars().all(|c| !c.is_control() && c != '"' && c != '\\');
    if plain { s.to_string() } else { shown(s) }
}

/// A string that came from a plugin, as the host shows it: control characters escaped (a
/// newline or a terminal escape cannot forge a line or clear a screen), quoted, and cut to
/// `MAX_SHOWN_CHARS` characters with the full length said.
pub fn shown(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_SHOWN_CHARS * 2) + 2);
    out.push('"');
    for (i, c) in s.chars().enumerate() {
        if i == MAX_SHOWN_CHARS {
            out.push_str(&format!("…\" ({} bytes)", s.len()));
            return out;
        }
        if c.is_control() || c == '"' || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    Persistent,
    Live,
    Latest,
    Droppable,
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Delivery::Persistent => "persistent",
            Delivery::Live => "live",
            Delivery::Latest => "latest",
            Delivery::Droppable => "droppable",
        })
    }
}

impl Delivery {
    /// Stored and pulled by seq (as opposed to pushed to online devices only).
    pub fn is_stored(self) -> bool {
        self == Delivery::Persistent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SenderKind {
    User,
    System,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub name: String,
    pub version: String,
    pub content_type: u32,
    pub delivery: Delivery,
    pub counts_unread: bool,
    pub conversation_types: Vec<u8>,
    pub sender: SenderKind,
    pub max_payload_bytes: u32,
    pub description: String,
}

impl From<WitManifest> for Manifest {
    fn from(m: WitManifest) -> Self {
        Manifest {
            name: m.name,
            version: m.version,
            content_type: m.content_type,
            delivery: match m.delivery {
                WitDelivery::Persistent => Delivery::Persistent,
                WitDelivery::Live => Delivery::Live,
                WitDelivery::Latest => Delivery::Latest,
                WitDelivery::Droppable => Delivery::Droppable,
            },
            counts_unread: m.counts_unread,
            conversation_types: m.conversation_types,
            sender: match m.sender {
                WitSender::User => SenderKind::User,
                WitSender::System => SenderKind::System,
            },
            max_payload_bytes: m.max_payload_bytes,
            description: m.description,
        }
    }
}

impl Manifest {
    /// What stored history depends on, changed from a kind's earlier `delivery` and
    /// `counts_unread` to this manifest's: each change in words (`delivery from persistent
    /// to live`) with why it matters. A reload refuses any (`PluginRegistry::reload`);
    /// `plugin check` warns of them.
    pub fn history_changes(
        &self,
        delivery: Delivery,
        counts_unread: bool,
    ) -> Vec<(String, &'static str)> {
        let mut changes = Vec::new();
        if delivery != self.delivery {
            changes.push((
                format!("delivery from {delivery} to {}", self.delivery),
                "stored history depends on it",
            ));
        }
        if counts_unread != self.counts_unread {
            changes.push((
                format!(
                    "counts-unread from {counts_unread} to {}",
                    self.counts_unread
                ),
                "unread totals depend on it",
            ));
        }
        changes
    }

    /// Every rule a manifest must meet; each problem is one sentence.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 32
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !self.name.starts_with('-');
        if !name_ok {
            p.push(format!(
                "name {} must be 1-32 characters of a-z, 0-9 and -",
                shown(&self.name)
            ));
        }
        if !is_semver(&self.version) {
            p.push(format!(
                "version {} must be semver (MAJOR.MINOR.PATCH, then -pre or +build of A-Z a-z 0-9 . -), at most {MAX_VERSION_BYTES} bytes",
                shown(&self.version)
            ));
        }
        if self.content_type == 0 {
            p.push("content type 0 is reserved".into());
        }
        if self.conversation_types.is_empty() {
            p.push("conversation types must not be empty".into());
        }
        let mut seen = [false; 4];
        for &t in &self.conversation_types {
            match seen.get_mut(t as usize) {
                Some(s) if !*s => *s = true,
                Some(_) => p.push(format!("conversation type {t} is listed twice")),
                None => p.push(format!("conversation type {t} is not one of 0 (user), 1 (private), 2 (group), 3 (channel)")),
            }
        }
        if !self.delivery.is_stored() && self.counts_unread {
            p.push(format!(
                "a {} kind is never stored, so it cannot count toward unread",
                self.delivery
            ));
        }
        if !self.delivery.is_stored() && self.conversation_types.contains(&0) {
            p.push("the user stream (conversation type 0) only holds persistent kinds".into());
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_CEILING {
            p.push(format!(
                "max payload bytes must be between 1 and {MAX_PAYLOAD_CEILING}"
            ));
        }
        if self.description.trim().is_empty()
            || self.description.len() > MAX_DESCRIPTION_BYTES
            || self.description.chars().any(char::is_control)
        {
            p.push(format!(
                "description must be 1-{MAX_DESCRIPTION_BYTES} bytes of text without control characters ({} bytes given)",
                self.description.len()
            ));
        }
        p
    }
}

fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    v.len() <= MAX_VERSION_BYTES
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+'))
        && parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> Manifest {
        Manifest {
            name: "text".into(),
            version: "1.0.0".into(),
            content_type: 1,
            delivery: Delivery::Persistent,
            counts_unread: true,
            conversation_types: vec![1, 2, 3],
            sender: SenderKind::User,
            max_payload_bytes: 16384,
            description: "plain text".into(),
        }
    }

    #[test]
    fn strings_from_a_plugin_are_shown_escaped_and_cut() {
        assert_eq!(shown("text"), "\"text\"");
        assert_eq!(shown("a\nb\u{1b}[2J"), "\"a\\nb\\u{1b}[2J\"");
        let long = "x".repeat(10 << 20);
        let s = shown(&long);
        assert!(s.len() < 100 && s.ends_with("(10485760 bytes)"), "{s}");
        assert_eq!(display("text"), "text");
        assert_eq!(display(&long), s);
        assert_eq!(display("a\nb"), "\"a\\nb\"");
    }

    #[test]
    fn a_hostile_manifest_gets_short_escaped_problems() {
        let m = Manifest {
            name: format!("evil\n\u{1b}[2J{}", "x".repeat(10 << 20)),
            version: format!("1.0.0-\u{1b}[31m{}", "y".repeat(1 << 20)),
            description: "line\nforged".into(),
            ..text()
        };
        let p = m.problems().join("\n");
        assert!(p.len() < 1024, "{} bytes of problems", p.len());
        assert!(!p.contains('\u{1b}'), "{p}");
        assert_eq!(p.lines().count(), 3, "{p}");
        assert!(p.contains("(10485769 bytes)"), "{p}");
    }

    #[test]
    fn a_good_manifest_has_no_problems() {
        assert!(text().problems().is_empty());
    }

    #[test]
    fn every_rule_names_its_problem() {
        let m = Manifest {
            name: "Bad Name".into(),
            version: "one".into(),
            content_type: 0,
            delivery: Delivery::Live,
            counts_unread: true,
            conversation_types: vec![0, 1, 1, 7],
            max_payload_bytes: 0,
            description: " ".into(),
            ..text()
        };
        let p = m.problems().join("\n");
        for needle in [
            "name",
            "semver",
            "reserved",
            "listed twice",
            "7 is not",
            "cannot count",
            "user stream",
            "max payload",
            "description",
        ] {
            assert!(p.contains(needle), "missing {needle:?} in\n{p}");
        }
    }
}
