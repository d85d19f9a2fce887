//! The instances of one plugin and the call discipline: a fresh fuel budget for every
//! call, failures classified, a failed instance never entered again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use wasmtime::{Engine, Store};

use super::bindings::{Plugin as Bindings, PluginPre, WitContext};
use super::registry::SendContext;
use super::runtime::{
    CallCost, CallFailure, HostState, Limits, Runtime, ValidateOutcome, classify,
};
use crate::config::Isolation;

/// One live instance and its store. Counted in the pool's `Live` while it exists.
struct Slot {
    store: Store<HostState>,
    bindings: Bindings,
    calls: u64,
    live: Arc<Live>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.live.count.fetch_sub(1, Ordering::AcqRel);
        self.live.wake();
    }
}

/// How many instances of a plugin exist, against the cap (`runtime.max_instances`):
/// a call that finds no idle instance and the cap reached waits for one instead of
/// making another, so a burst of calls cannot multiply a large plugin's memory.
struct Live {
    count: AtomicUsize,
    max: usize,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    returned: Condvar,
}

impl Live {
    fn wake(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            let _guard = self.lock.lock().expect("pool wait lock");
            self.returned.notify_one();
        }
    }
}

/// The instances of one plugin. In `Pooled` mode warm instances are reused; a trapped
/// instance is never entered again. In `Fresh` mode every call gets a new one.
pub struct InstancePool {
    name: Arc<str>,
    engine: Engine,
    pre: PluginPre<HostState>,
    limits: Limits,
    idle: Idle,
    live: Arc<Live>,
}

/// Idle instances, one list per core. A thread takes from and returns to its own list
/// first, so two cores calling one plugin do not contend on one lock; an empty list
/// borrows from the others before a new instance is made.
struct Idle {
    shards: Box<[Mutex<Vec<Slot>>]>,
}

thread_local! {
    static THREAD_INDEX: usize = {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
}

impl Idle {
    fn new() -> Idle {
        let n = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 64);
        Idle {
            shards: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn home(&self) -> usize {
        THREAD_INDEX.with(|i| *i) % self.shards.len()
    }

    fn pop(&self) -> Option<Slot> {
        let home = self.home();
        if let Some(slot) = self.shards[home].lock().expect("pool lock").pop() {
            return Some(slot);
        }
        self.shards
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != home)
            .find_map(|(_, shard)| shard.try_lock().ok().and_then(|mut s| s.pop()))
    }

    fn push(&self, slot: Slot) {
        self.shards[self.home()]
            .lock()
            .expect("pool lock")
            .push(slot);
    }

    fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().expect("pool lock").clear();
        }
    }
}

impl InstancePool {
    pub fn new(
        name: &str,
        runtime: &Runtime,
        pre: PluginPre<HostState>,
        limits: Limits,
    ) -> InstancePool {
        InstancePool {
            name: name.into(),
            engine: runtime.engine().clone(),
            pre,
            limits,
            idle: Idle::new(),
            live: Arc::new(Live {
                count: AtomicUsize::new(0),
                max: limits.max_instances,
                waiters: AtomicUsize::new(0),
                lock: Mutex::new(()),
                returned: Condvar::new(),
            }),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Changes the fuel budget of every later call.
    pub fn set_fuel(&mut self, fuel_per_call: u64) {
        self.idle.clear();
        self.limits.fuel_per_call = fuel_per_call;
    }

    /// The same pool, logging under the plugin's own name (known once its manifest is read).
    pub fn renamed(self, name: &str) -> InstancePool {
        self.idle.clear();
        InstancePool {
            name: name.into(),
            ..self
        }
    }

    /// How many instances of this plugin exist now.
    pub fn live_instances(&self) -> usize {
        self.live.count.load(Ordering::Acquire)
    }

    /// An idle instance, or a new one while under the cap, or (at the cap) the next one
    /// returned.
    fn acquire(&self, pooled: bool) -> Result<Slot, CallFailure> {
        let deadline = Instant::now() + ACQUIRE_TIMEOUT;
        loop {
            if pooled && let Some(slot) = self.idle.pop() {
                return Ok(slot);
            }
            // A place is taken only while under the cap, so the count never reads above
            // it, not even for a moment (`live_instances`).
            let max = self.live.max;
            let placed = self
                .live
                .count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok();
            if placed {
                return self.instantiate();
            }
            // Registered as a waiter, then the count read again under the lock: an
            // instance dropped in between is seen there, one dropped after wakes us.
            self.live.waiters.fetch_add(1, Ordering::AcqRel);
            let guard = self.live.lock.lock().expect("pool wait lock");
            // An instance dropped before we took the lock: no need to wait. Otherwise
            // re-checked on wake-up or after a short while, whichever comes first.
            if self.live.count.load(Ordering::Acquire) >= self.live.max {
                let _ = self
                    .live
                    .returned
                    .wait_timeout(guard, Duration::from_millis(5));
            }
            self.live.waiters.fetch_sub(1, Ordering::AcqRel);
            if Instant::now() >= deadline {
                if pooled && let Some(slot) = self.idle.pop() {
                    return Ok(slot);
                }
                return Err(CallFailure::Busy {
                    max: self.live.max,
                    waited_ms: ACQUIRE_TIMEOUT.as_millis() as u64,
                });
            }
        }
    }

    /// A new instance; the caller has counted it in `live` already.
    fn instantiate(&self) -> Result<Slot, CallFailure> {
        let mut counted = LiveCount {
            live: &self.live,
            armed: true,
        };
        let state = HostState::new(self.name.clone(), self.limits);
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| s.limiter());
        store
            .set_fuel(self.limits.fuel_per_call)
            .map_err(|e| CallFailure::Instantiate(e.to_string()))?;
        let bindings = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| classify(e, self.limits, &store.data().stderr_tail()))?;
        // The slot carries the count from here on.
        counted.armed = false;
        Ok(Slot {
            store,
            bindings,
            calls: 0,
            live: self.live.clone(),
        })
    }

    /// Runs `f` on an instance under the budget. A failed call drops its instance.
    /// The cost is reported whether the call succeeded or not.
    pub fn call<R>(
        &self,
        f: impl FnOnce(&mut Store<HostState>, &Bindings) -> wasmtime::Result<R>,
    ) -> (Result<R, CallFailure>, CallCost) {
        let started = Instant::now();
        let pooled = self.limits.isolation == Isolation::Pooled;
        let mut slot = match self.acquire(pooled) {
            Ok(s) => s,
            Err(e) => {
                return (
                    Err(e),
                    CallCost {
                        micros: started.elapsed().as_micros() as u64,
                        ..CallCost::default()
                    },
                );
            }
        };
        slot.store.data_mut().start_call();
        if let Err(e) = slot.store.set_fuel(self.limits.fuel_per_call) {
            return (
                Err(CallFailure::Instantiate(e.to_string())),
                CallCost::default(),
            );
        }
        let result = f(&mut slot.store, &slot.bindings);
        let left = slot.store.get_fuel().unwrap_or(0);
        let cost = CallCost {
            fuel: self.limits.fuel_per_call.saturating_sub(left),
            memory_bytes: slot.store.data().memory_bytes(),
            micros: started.elapsed().as_micros() as u64,
        };
        match result {
            Ok(r) => {
                slot.calls += 1;
                if pooled
                    && slot.calls < self.limits.recycle_after_calls
                    && cost.memory_bytes <= self.limits.recycle_above_bytes
                    && !slot.store.data().stderr_full()
                {
                    self.idle.push(slot);
                    self.live.wake();
                }
                (Ok(r), cost)
            }
            // A trapped instance is never entered again: `slot` is dropped here.
            Err(e) => {
                let tail = slot.store.data().stderr_tail();
                (Err(classify(e, self.limits, &tail)), cost)
            }
        }
    }

    /// `validate` under the budget: the normalized payload, or the rejection as
    /// `(code, message)`, or the failure.
    pub fn validate(&self, ctx: &SendContext<'_>, payload: &str) -> (ValidateOutcome, CallCost) {
        let wit = WitContext {
            sender_id: ctx.sender_id.into(),
            conversation_type: ctx.conversation_type,
            conversation_id: ctx.conversation_id.into(),
        };
        let (r, cost) = self.call(|s, b| b.courier_plugin_kind().call_validate(s, &wit, payload));
        (
            r.map(|res| res.map_err(|rej| (rej.code, rej.message))),
            cost,
        )
    }

    /// Drops every idle instance (after a failure streak or on unload).
    pub fn clear(&self) {
        self.idle.clear();
    }
}

/// Uncounts an instance whose creation failed (dropped while still armed).
struct LiveCount<'a> {
    live: &'a Live,
    armed: bool,
}

impl Drop for LiveCount<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.live.count.fetch_sub(1, Ordering::AcqRel);
            self.live.wake();
        }
    }
}

/// How long a call waits for a free instance when the cap is reached.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
