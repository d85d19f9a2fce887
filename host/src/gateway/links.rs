//! What a node does beyond its hub when a device connects or goes. On a node alone: tell
//! the user's friends when it comes online or goes offline. In cluster mode (`cluster`)
//! the device's route in Redis is written and removed too, and presence is what the
//! routes say.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::hub::Device;
use crate::messaging::Core;

/// Connections as the rest of the deployment sees them.
pub trait Links: Send + Sync {
    /// `device` is in the hub now (before its hello is written); `first` if it is its
    /// user's first device on this node.
    fn connected<'a>(&'a self, device: &'a Device, first: bool) -> BoxFuture<'a, ()>;

    /// `device` left the hub; `last` if it was its user's last device on this node.
    fn disconnected<'a>(&'a self, device: &'a Device, last: bool) -> BoxFuture<'a, ()>;

    /// The node stops (its connections are closed).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// A node alone: its hub is every connection there is.
pub struct Alone {
    pub presence: Arc<PresenceThrottle>,
}

impl Links for Alone {
    fn connected<'a>(&'a self, device: &'a Device, first: bool) -> BoxFuture<'a, ()> {
        if first {
            self.presence.changed(&device.user_id);
        }
        Box::pin(std::future::ready(()))
    }

    fn disconnected<'a>(&'a self, device: &'a Device, last: bool) -> BoxFuture<'a, ()> {
        if last {
            self.presence.changed(&device.user_id);
        }
        Box::pin(std::future::ready(()))
    }
}

/// At most one presence frame per user per interval from this node: a change within the
/// interval of the last one told is told at its end, if the user's presence then still
/// differs from what friends were last told (`Delivery::must_tell`: in a cluster, by any
/// node); going offline is told only if it still holds an interval later. A change whose
/// presence could not be read (in a cluster: Redis away, or just back) waits in
/// `unsettled` until `settle`. Users in `again` are told even if their friends were told
/// the same last (`retell`: in a cluster, the bus may have lost what was told).
pub struct PresenceThrottle {
    core: Arc<Core>,
    interval: Duration,
    told: Mutex<HashMap<String, Told>>,
    unsettled: Mutex<HashSet<String>>,
    again: Mutex<HashSet<String>>,
}

struct Told {
    at: Instant,
    online: Option<bool>,
    /// A task will look again and tell.
    pending: bool,
}

/// Users whose last presence is remembered before old entries are pruned.
const REMEMBERED: usize = 100_000;

impl PresenceThrottle {
    pub fn new(core: Arc<Core>, interval: Duration) -> Arc<PresenceThrottle> {
        Arc::new(PresenceThrottle {
            core,
            interval,
            told: Mutex::new(HashMap::new()),
            unsettled: Mutex::new(HashSet::new()),
            again: Mutex::new(HashSet::new()),
        })
    }

    /// Looks again at the changes whose presence could not be read (cluster mode: once
    /// Redis answers again).
    pub fn settle(self: &Arc<Self>) {
        let users = std::mem::take(&mut *self.unsettled.lock().expect("presence"));
        for user in users {
            self.changed(&user);
        }
    }

    /// Tells the friends of `users` their presence now, whatever they were told last (in a
    /// cluster: the bus was away when it was told, and may have lost it).
    pub fn retell(self: &Arc<Self>, users: &HashSet<String>) {
        {
            let mut again = self.again.lock().expect("presence");
            for user in users {
                if again.len() < REMEMBERED {
                    again.insert(user.clone());
                }
            }
        }
        for user in users {
            self.changed(user);
        }
    }

    /// `user_id` may have come online or gone offline.
    pub fn changed(self: &Arc<Self>, user_id: &str) {
        let now = Instant::now();
        let wait = {
            let mut told = self.told.lock().expect("presence");
            if told.len() >= REMEMBERED && !told.contains_key(user_id) {
                let interval = self.interval;
                told.retain(|_, t| t.pending || now.duration_since(t.at) < interval);
            }
            let t = told.entry(user_id.to_string()).or_insert(Told {
                at: now.checked_sub(self.interval).unwrap_or(now),
                online: None,
                pending: false,
            });
            if t.pending {
                return;
            }
            t.pending = true;
            (t.at + self.interval).saturating_duration_since(now)
        };
        let this = self.clone();
        let user = user_id.to_string();
        tokio::spawn(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let mut online = this.core.is_online(&user).await;
            // Going offline is told only if it holds for an interval: a device that
            // reconnects at once (to this node or another) is never told at all.
            if online == Some(false) {
                tokio::time::sleep(this.interval).await;
                online = this.core.is_online(&user).await;
            }
            let last = {
                let mut told = this.told.lock().expect("presence");
                let Some(t) = told.get_mut(&user) else { return };
                t.pending = false;
                t.online
            };
            let Some(online) = online else {
                let mut unsettled = this.unsettled.lock().expect("presence");
                if unsettled.len() < REMEMBERED {
                    unsettled.insert(user);
                }
                return;
            };
            let again = this.again.lock().expect("presence").remove(&user);
            if !this
                .core
                .delivery
                .must_tell(&user, online, last, again)
                .await
            {
                return;
            }
            if let Some(t) = this.told.lock().expect("presence").get_mut(&user) {
                t.online = Some(online);
                t.at = Instant::now();
            }
            this.core.tell_friends(&user, online).await;
        });
    }
}
