//! What of the cluster's services this node cannot reach now, for `/healthz`: each part
//! fails and recovers by itself, and each change is logged once.

use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Redis: the device routes, presence, the node leases.
    Routes = 0,
    /// The bus between nodes.
    Bus = 1,
    /// This node's claim on its number.
    Lease = 2,
}

impl Part {
    pub fn name(self) -> &'static str {
        match self {
            Part::Routes => "redis",
            Part::Bus => "bus",
            Part::Lease => "lease",
        }
    }
}

#[derive(Default)]
pub struct Health {
    parts: Mutex<[Option<String>; 3]>,
}

impl Health {
    /// Notes that `part` fails for `reason`; whether it was working until now.
    pub fn fail(&self, part: Part, reason: &str) -> bool {
        let mut parts = self.parts.lock().expect("health");
        let slot = &mut parts[part as usize];
        let newly = slot.is_none();
        if newly {
            tracing::warn!(?part, "cluster degraded: {reason}");
        }
        *slot = Some(reason.to_string());
        newly
    }

    /// Notes that `part` works; whether it had failed until now.
    pub fn recover(&self, part: Part) -> bool {
        let mut parts = self.parts.lock().expect("health");
        let was = parts[part as usize].take();
        if let Some(reason) = &was {
            tracing::info!(?part, "cluster recovered (was: {reason})");
        }
        was.is_some()
    }

    /// Whether `part` fails now.
    pub fn failing(&self, part: Part) -> bool {
        self.parts.lock().expect("health")[part as usize].is_some()
    }

    /// Why the cluster is degraded, if it is: each reason starts with its part's name
    /// (`redis: `, `bus: `, `lease: `), then says what failed in words.
    pub fn reasons(&self) -> Vec<String> {
        let parts = self.parts.lock().expect("health");
        [Part::Routes, Part::Bus, Part::Lease]
            .iter()
            .filter_map(|p| {
                let reason = parts[*p as usize].as_ref()?;
                Some(format!("{}: {reason}", p.name()))
            })
            .collect()
    }
}
