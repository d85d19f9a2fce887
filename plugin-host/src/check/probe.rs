//! Calls into the plugin under check, recording what each call cost and every failure.

use super::super::bindings::WitExample;
use super::super::manifest::Manifest;
use super::super::pool::InstancePool;
use super::super::registry::{SendContext, check_output, precheck};
use super::super::runtime::{CallCost, CallFailure};
use super::inputs::snippet;

/// What one validate call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Accepted(String),
    /// The plugin rejected it.
    Rejected {
        code: String,
        message: String,
    },
    /// The host refused it before the plugin ran (the error code).
    Refused(&'static str),
    /// Trap, budget or memory.
    Failed(String),
}

impl Outcome {
    pub fn describe(&self) -> String {
        match self {
            Outcome::Accepted(out) => format!("accepted as {}", snippet(out)),
            Outcome::Rejected { code, message } => format!("rejected ({code}: {message})"),
            Outcome::Refused(code) => format!("refused by the host ({code})"),
            Outcome::Failed(e) => format!("FAILED: {e}"),
        }
    }
}

#[derive(Debug, Default)]
pub struct Summary {
    pub calls: u64,
    pub max_fuel: u64,
    pub peak_memory: usize,
    pub max_micros: u64,
    pub failures: Vec<String>,
}

pub struct Probe {
    pooled: InstancePool,
    fresh: InstancePool,
    pub manifest: Option<Manifest>,
    summary: Summary,
    fuel_per_call: u64,
}

impl Probe {
    pub fn new(pooled: InstancePool, fresh: InstancePool, fuel_per_call: u64) -> Probe {
        Probe {
            pooled,
            fresh,
            manifest: None,
            summary: Summary::default(),
            fuel_per_call,
        }
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    fn record<R>(
        &mut self,
        what: &str,
        (r, cost): (Result<R, CallFailure>, CallCost),
    ) -> Result<R, CallFailure> {
        self.summary.calls += 1;
        self.summary.max_fuel = self.summary.max_fuel.max(cost.fuel);
        self.summary.peak_memory = self.summary.peak_memory.max(cost.memory_bytes);
        self.summary.max_micros = self.summary.max_micros.max(cost.micros);
        if let Err(e) = &r {
            if matches!(e, CallFailure::Budget { .. }) {
                self.summary.max_fuel = self.fuel_per_call;
            }
            self.summary.failures.push(format!("{what}: {e}"));
        }
        r
    }

    pub fn manifest(&mut self) -> Result<Manifest, CallFailure> {
        let r = self
            .pooled
            .call(|s, b| b.courier_plugin_kind().call_manifest(s));
        self.record("manifest()", r).map(Into::into)
    }

    pub fn examples(&mut self) -> Result<Vec<WitExample>, CallFailure> {
        let r = self
            .pooled
            .call(|s, b| b.courier_plugin_kind().call_examples(s));
        self.record("examples()", r)
    }

    pub fn preview(&mut self, payload: &str) -> Result<String, CallFailure> {
        let r = self
            .pooled
            .call(|s, b| b.courier_plugin_kind().call_preview(s, payload));
        self.record(&format!("preview({})", snippet(payload)), r)
    }

    pub fn validate(&mut self, conversation_type: u8, payload: &str) -> Outcome {
        self.validate_in(false, conversation_type, payload, "c-check")
    }

    pub fn validate_fresh(&mut self, conversation_type: u8, payload: &str) -> Outcome {
        self.validate_in(true, conversation_type, payload, "c-check")
    }

    /// As `validate`, from another conversation (a context the warm instance has not
    /// seen), on the warm instance or a fresh one.
    pub fn validate_elsewhere(
        &mut self,
        fresh: bool,
        conversation_type: u8,
        payload: &str,
    ) -> Outcome {
        self.validate_in(fresh, conversation_type, payload, "c-elsewhere")
    }

    /// An example, as the registry would see it from the manifest's sender kind.
    pub fn validate_example(&mut self, conversation_type: u8, payload: &str) -> Outcome {
        let ctx = self.context(conversation_type, "c-check");
        self.validate_as(&ctx, payload.as_bytes())
    }

    /// The context the suite sends with: the manifest's sender kind, a fixed sender id.
    fn context<'a>(&self, conversation_type: u8, conversation_id: &'a str) -> SendContext<'a> {
        let sender = self
            .manifest
            .as_ref()
            .map(|m| m.sender)
            .unwrap_or(super::SenderKind::User);
        let sender_id = if sender == super::SenderKind::System {
            "system"
        } else {
            "u-check"
        };
        SendContext {
            sender_id,
            sender,
            conversation_type,
            conversation_id,
        }
    }

    /// Validates as the registry would: the host's prechecks, then the plugin.
    pub fn validate_as(&mut self, ctx: &SendContext<'_>, payload: &[u8]) -> Outcome {
        if let Some(m) = &self.manifest
            && let Err(e) = precheck(m, ctx, payload)
        {
            return match e {
                super::ValidateError::Invalid { code, message } => {
                    Outcome::Rejected { code, message }
                }
                other => Outcome::Refused(other.code()),
            };
        }
        let text = String::from_utf8_lossy(payload).into_owned();
        self.call_validate(false, ctx, &text)
    }

    fn validate_in(
        &mut self,
        fresh: bool,
        conversation_type: u8,
        payload: &str,
        conversation_id: &str,
    ) -> Outcome {
        let ctx = self.context(conversation_type, conversation_id);
        self.call_validate(fresh, &ctx, payload)
    }

    fn call_validate(&mut self, fresh: bool, ctx: &SendContext<'_>, payload: &str) -> Outcome {
        let pool = if fresh { &self.fresh } else { &self.pooled };
        let (r, cost) = pool.validate(ctx, payload);
        // The host's checks of what a plugin returns apply here as in the registry.
        let r = match &self.manifest {
            Some(m) => r.and_then(|res| check_output(m, res)),
            None => r,
        };
        match self.record(&format!("validate({})", snippet(payload)), (r, cost)) {
            Ok(Ok(out)) => Outcome::Accepted(out),
            Ok(Err((code, message))) => Outcome::Rejected { code, message },
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}
