//! The one API the send path uses: look up a content type, validate a payload, preview it.
//! Also enable / disable / reload, and the circuit breaker.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use serde_json::value::RawValue;
use wasmtime::component::Component;

use super::manifest::{Delivery, Manifest, SenderKind};
use super::meters::Outcome;
pub use super::plugin::{LoadedPlugin, PluginInfo, Stats, StatsSnapshot};
use super::runtime::{CallFailure, Runtime, ValidateOutcome};
use crate::config::Setup;

/// Who is sending, and where: what `validate` needs besides the payload.
#[derive(Debug, Clone, Copy)]
pub struct SendContext<'a> {
    pub sender_id: &'a str,
    /// `System` for messages the server emits itself (tips, friend requests).
    pub sender: SenderKind,
    pub conversation_type: u8,
    pub conversation_id: &'a str,
}

/// Why a payload was not accepted. `code()` is the documented error code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ValidateError {
    #[error("no plugin handles content type {0}")]
    Unknown(u32),
    #[error("content type {content_type} ({name}) is disabled")]
    Disabled { content_type: u32, name: String },
    #[error("content type {content_type} ({name}) is sent only by the server")]
    Forbidden { content_type: u32, name: String },
    #[error(
        "{name} cannot be sent to conversation type {conversation_type} (allowed: {allowed:?})"
    )]
    ConversationType {
        name: String,
        conversation_type: u8,
        allowed: Vec<u8>,
    },
    #[error("payload is {size} bytes, {name} accepts at most {max}")]
    TooLarge { name: String, size: usize, max: u32 },
    #[error("{message}")]
    Invalid { code: String, message: String },
    #[error("plugin {name} (content type {content_type}) failed: {failure}")]
    PluginFailed {
        name: String,
        content_type: u32,
        failure: CallFailure,
    },
    #[error("plugin {name} (content type {content_type}) is busy: {failure}; try again")]
    Busy {
        name: String,
        content_type: u32,
        failure: CallFailure,
    },
}

impl ValidateError {
    /// The error code the server answers with (docs/protocol.md), which a plugin's cases
    /// may expect of the host (`error.txt`).
    pub fn code(&self) -> &'static str {
        match self {
            ValidateError::Unknown(_) => "content_type_unknown",
            ValidateError::Disabled { .. } => "content_type_disabled",
            ValidateError::Forbidden { .. } => "content_type_forbidden",
            ValidateError::ConversationType { .. } => "conversation_type_not_allowed",
            ValidateError::TooLarge { .. } => "payload_too_large",
            ValidateError::Invalid { .. } => "payload_invalid",
            ValidateError::PluginFailed { .. } => "plugin_failed",
            ValidateError::Busy { .. } => "plugin_busy",
        }
    }

    /// The plugin's own rejection code, for `payload_invalid`.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ValidateError::Invalid { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A payload the plugin accepted, normalized: JSON, read once when it came back.
#[derive(Debug, Clone)]
pub struct Validated {
    pub plugin: Arc<LoadedPlugin>,
    pub payload: Box<RawValue>,
}

impl Validated {
    /// The normalized payload as text.
    pub fn into_text(self) -> String {
        text(self.payload)
    }
}

/// JSON as the text it was read from (no copy).
fn text(json: Box<RawValue>) -> String {
    Box::<str>::from(json).into_string()
}

pub(super) struct Snapshot {
    pub(super) by_type: foldhash::HashMap<u32, Arc<LoadedPlugin>>,
    pub(super) by_name: BTreeMap<String, Arc<LoadedPlugin>>,
}

/// All loaded plugins. Cheap to share (`Arc`); reads never wait on a reload.
pub struct PluginRegistry {
    pub(super) runtime: Runtime,
    /// The plugins in force; readers load it without a lock, a reload swaps it whole.
    current: ArcSwap<Snapshot>,
    /// Compiled components by file hash, so a reload recompiles only what changed.
    pub(super) compiled: Mutex<HashMap<String, Component>>,
    /// Delivery class and unread counting of every content type loaded since start-up,
    /// by content type. Held through a reload, so reloads run one at a time.
    history: Mutex<HashMap<u32, (String, Delivery, bool)>>,
}

/// Every problem found while loading, one per line.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct LoadErrors(pub Vec<String>);

impl PluginRegistry {
    /// Loads every plugin the config asks for; refuses (listing every problem) if any fails.
    pub fn load(config: &impl Setup) -> Result<PluginRegistry, LoadErrors> {
        let runtime = Runtime::new()
            .map_err(|e| LoadErrors(vec![format!("cannot start the wasm engine: {e:#}")]))?;
        let registry = PluginRegistry {
            runtime,
            current: ArcSwap::from_pointee(Snapshot {
                by_type: foldhash::HashMap::default(),
                by_name: BTreeMap::new(),
            }),
            compiled: Mutex::new(HashMap::new()),
            history: Mutex::new(HashMap::new()),
        };
        let snapshot = registry.build(config)?;
        remember(
            &mut registry.history.lock().expect("reload lock"),
            &snapshot,
        );
        registry.forget_compiled_except(&snapshot);
        registry.current.store(Arc::new(snapshot));
        Ok(registry)
    }

    /// Drops compiled components no loaded plugin uses (an updated plugin's old code).
    fn forget_compiled_except(&self, snapshot: &Snapshot) {
        self.compiled
            .lock()
            .expect("compile cache")
            .retain(|sha, _| snapshot.by_name.values().any(|p| &p.sha256 == sha));
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The plugin for a content type, enabled or not.
    pub fn get(&self, content_type: u32) -> Option<Arc<LoadedPlugin>> {
        self.current.load().by_type.get(&content_type).cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        self.current.load().by_name.get(name).cloned()
    }

    /// Every plugin, by name.
    pub fn list(&self) -> Vec<PluginInfo> {
        self.snapshot().by_name.values().map(|p| p.info()).collect()
    }

    /// The full send-path check: known, enabled, sender allowed, conversation type allowed,
    /// size (before any wasm runs), UTF-8, then the plugin's own `validate`; counted in the
    /// plugin's stats and metrics, a failure toward its circuit breaker.
    pub fn validate(
        &self,
        content_type: u32,
        ctx: &SendContext<'_>,
        payload: &[u8],
    ) -> Result<Validated, ValidateError> {
        self.check(content_type, ctx, payload, true)
    }

    /// `validate` for an operator's dry run: the same answer, counted nowhere, so trying
    /// payloads never switches a kind off.
    pub fn dry_run(
        &self,
        content_type: u32,
        ctx: &SendContext<'_>,
        payload: &[u8],
    ) -> Result<Validated, ValidateError> {
        self.check(content_type, ctx, payload, false)
    }

    fn check(
        &self,
        content_type: u32,
        ctx: &SendContext<'_>,
        payload: &[u8],
        counted: bool,
    ) -> Result<Validated, ValidateError> {
        let record = |plugin: &LoadedPlugin, outcome: Outcome, cost: &super::runtime::CallCost| {
            if counted {
                plugin.record(outcome, cost);
            }
        };
        let plugin = self
            .get(content_type)
            .ok_or(ValidateError::Unknown(content_type))?;
        let m = &plugin.manifest;
        if !plugin.is_enabled() {
            return Err(ValidateError::Disabled {
                content_type,
                name: m.name.clone(),
            });
        }
        let text = precheck(m, ctx, payload)?;
        let (answer, cost) = plugin.pool.validate(ctx, text);
        match answer.and_then(|r| checked_output(m, r)) {
            Ok(Ok(normalized)) => {
                record(&plugin, Outcome::Accepted, &cost);
                Ok(Validated {
                    plugin,
                    payload: normalized,
                })
            }
            Ok(Err((code, message))) => {
                record(&plugin, Outcome::Rejected, &cost);
                Err(ValidateError::Invalid { code, message })
            }
            // Every instance busy is load, not the plugin's fault: not counted as failed.
            Err(failure @ CallFailure::Busy { .. }) => {
                record(&plugin, Outcome::Busy, &cost);
                Err(ValidateError::Busy {
                    name: m.name.clone(),
                    content_type,
                    failure,
                })
            }
            Err(failure) => {
                record(&plugin, Outcome::Failed, &cost);
                if counted {
                    plugin.record_failure(&failure);
                }
                Err(ValidateError::PluginFailed {
                    name: m.name.clone(),
                    content_type,
                    failure,
                })
            }
        }
    }

    /// One line for conversation lists. Works for disabled kinds too (history stays
    /// readable); falls back to `[name]` if the plugin fails or the type is unknown.
    pub fn preview(&self, content_type: u32, payload: &str) -> String {
        let Some(plugin) = self.get(content_type) else {
            return "[unsupported message]".into();
        };
        match plugin
            .pool
            .call(|store, b| b.courier_plugin_kind().call_preview(store, payload))
            .0
        {
            Ok(line) => one_line(&line, 200),
            // Not counted toward the circuit breaker: rendering history must not switch
            // off sending.
            Err(_) => format!("[{}]", plugin.manifest.name),
        }
    }

    /// Switches a plugin on (and resets its circuit breaker) or off.
    pub fn set_enabled(&self, name: &str, enabled: bool) -> Option<PluginInfo> {
        let plugin = self.by_name(name)?;
        if enabled {
            let mut b = plugin.breaker.lock().expect("breaker lock");
            b.failures.clear();
            b.tripped = None;
        }
        plugin.enabled.store(enabled, Ordering::Release);
        tracing::info!(plugin = name, enabled, "plugin switched");
        Some(plugin.info())
    }

    /// Loads everything `config` asks for and swaps it in, unless that would change the
    /// delivery class or counts-unread of a content type already loaded (stored history
    /// depends on both). On refusal the running set stays as it was.
    pub fn reload(&self, config: &impl Setup) -> Result<Vec<PluginInfo>, LoadErrors> {
        let mut history = self.history.lock().expect("reload lock");
        let next = self.build(config)?;
        // Compared with every content type loaded since start-up, not only the current
        // set: removing a kind and adding it back changed must not slip through.
        let mut refusals = Vec::new();
        for (ct, new) in &next.by_type {
            if let Some((_, delivery, counts_unread)) = history.get(ct) {
                let n = &new.manifest;
                for (change, why) in n.history_changes(*delivery, *counts_unread) {
                    refusals.push(format!(
                        "reload refused: {} (content type {ct}) would change {change}; {why}",
                        n.name
                    ));
                }
            }
        }
        // A new or changed plugin must pass its own examples before it takes over.
        let current = self.snapshot();
        for (name, p) in &next.by_name {
            let unchanged = current
                .by_name
                .get(name)
                .is_some_and(|old| old.sha256 == p.sha256);
            if !unchanged && let Err(why) = examples_hold(p) {
                refusals.push(format!(
                    "reload refused: {} ({}) fails its own examples: {why}",
                    crate::shown(name),
                    p.source
                ));
            }
        }
        if !refusals.is_empty() {
            return Err(LoadErrors(refusals));
        }
        remember(&mut history, &next);
        self.forget_compiled_except(&next);
        self.current.store(Arc::new(next));
        tracing::info!(plugins = self.snapshot().by_name.len(), "plugins reloaded");
        Ok(self.list())
    }
}

/// Whether every example the plugin declares comes out as declared, sent as the server
/// would (the host's checks, then `validate`, then the checks of its output). The first
/// ones that do not, in words.
fn examples_hold(p: &LoadedPlugin) -> Result<(), String> {
    let examples = p
        .pool
        .call(|s, b| b.courier_plugin_kind().call_examples(s))
        .0
        .map_err(|e| format!("examples() failed: {e}"))?;
    let m = &p.manifest;
    let sender = m.sender;
    let mut wrong = Vec::new();
    for ex in &examples {
        let ctx = SendContext {
            sender_id: "example-sender",
            sender,
            conversation_type: ex.conversation_type,
            conversation_id: "1",
        };
        let accepted = match precheck(m, &ctx, ex.payload.as_bytes()) {
            Err(_) => false,
            Ok(text) => matches!(
                p.call_validate(&ctx, text).and_then(|r| check_output(m, r)),
                Ok(Ok(_))
            ),
        };
        if accepted != ex.accepted {
            wrong.push(format!(
                "{} declared {}, got {}",
                crate::shown(&ex.name),
                if ex.accepted { "accepted" } else { "rejected" },
                if accepted {
                    "accepted"
                } else {
                    "rejected or failed"
                }
            ));
        }
        if wrong.len() == 3 {
            break;
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn remember(history: &mut HashMap<u32, (String, Delivery, bool)>, snapshot: &Snapshot) {
    for (ct, p) in &snapshot.by_type {
        history.insert(
            *ct,
            (
                p.manifest.name.clone(),
                p.manifest.delivery,
                p.manifest.counts_unread,
            ),
        );
    }
}

/// What a plugin returns is checked too: a normalized payload must be JSON (else the plugin
/// failed) within the kind's size limit (else the payload is refused,
/// `normalized_too_large`); a rejection code must be `[a-z0-9_]{1,64}` (else the plugin
/// failed); a message is cut to one line of 300 characters.
pub fn check_output(m: &Manifest, result: Result<String, (String, String)>) -> ValidateOutcome {
    checked_output(m, result).map(|r| r.map(text))
}

/// `check_output`, keeping the normalized payload as the JSON it was read as.
fn checked_output(
    m: &Manifest,
    result: Result<String, (String, String)>,
) -> Result<Result<Box<RawValue>, (String, String)>, CallFailure> {
    match result {
        Ok(normalized) => {
            // Normalizing may add to a payload near the limit (a default filled in): the
            // sender's payload is refused, the plugin has not failed.
            if normalized.len() > m.max_payload_bytes as usize {
                return Ok(Err((
                    "normalized_too_large".into(),
                    format!(
                        "the normalized payload is {} bytes, over the kind's maximum of {}",
                        normalized.len(),
                        m.max_payload_bytes
                    ),
                )));
            }
            match RawValue::from_string(normalized) {
                Ok(json) => Ok(Ok(json)),
                Err(e) => Err(CallFailure::Contract(format!(
                    "returned a normalized payload that is not JSON: {e}"
                ))),
            }
        }
        Err((code, message)) => {
            let code_ok = !code.is_empty()
                && code.len() <= 64
                && code
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !code_ok {
                return Err(CallFailure::Contract(format!(
                    "rejected with the code {:?}, which is not 1-64 characters of a-z, 0-9 and _",
                    code.chars().take(80).collect::<String>()
                )));
            }
            Ok(Err((code, one_line(&message, 300))))
        }
    }
}

/// One line of at most `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max + 1)
        .collect();
    if out.chars().count() > max {
        out = out.chars().take(max - 1).collect();
        out.push('…');
    }
    out
}

/// The checks the host makes before any wasm runs: sender kind, conversation type,
/// size, UTF-8. Returns the payload as text.
pub fn precheck<'p>(
    m: &Manifest,
    ctx: &SendContext<'_>,
    payload: &'p [u8],
) -> Result<&'p str, ValidateError> {
    if m.sender == SenderKind::System && ctx.sender == SenderKind::User {
        return Err(ValidateError::Forbidden {
            content_type: m.content_type,
            name: m.name.clone(),
        });
    }
    if !m.conversation_types.contains(&ctx.conversation_type) {
        return Err(ValidateError::ConversationType {
            name: m.name.clone(),
            conversation_type: ctx.conversation_type,
            allowed: m.conversation_types.clone(),
        });
    }
    if payload.len() > m.max_payload_bytes as usize {
        return Err(ValidateError::TooLarge {
            name: m.name.clone(),
            size: payload.len(),
            max: m.max_payload_bytes,
        });
    }
    std::str::from_utf8(payload).map_err(|e| ValidateError::Invalid {
        code: "not_utf8".into(),
        message: format!("payload is not UTF-8 text: {e}"),
    })
}
