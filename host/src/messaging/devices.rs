//! Devices as first-class records: registered the first time they connect (or
//! explicitly), listed with whether they are online anywhere, removed by their user — which
//! closes the device's connection, drops its push token, and keeps it from connecting
//! again with the same id until its user registers it again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{Core, Which};
use crate::clock::now_ms;
use crate::protocol::{Close, Code, Error};
use crate::store::devices::{DeviceRow, Seen};
use crate::store::{Store, unavailable};

/// A device as `GET /v1/devices` shows it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    pub device_id: String,
    pub name: String,
    pub platform: String,
    /// When it was registered, ms since the epoch.
    pub first_seen: i64,
    /// When it last connected or went away (to within 30 s).
    pub last_seen: i64,
    /// Connected now, to any node.
    pub online: bool,
    /// The provider of its push token, if it registered one (the token is not shown).
    pub push_provider: Option<String>,
}

/// How often what devices were last seen is written (once for all of them).
pub const LAST_SEEN_EVERY: Duration = Duration::from_secs(30);

/// When each device connected or went away, since the last write: written every
/// `LAST_SEEN_EVERY` in one statement, so a connect storm costs no write per device.
#[derive(Default)]
pub struct LastSeen(Mutex<HashMap<(String, String), i64>>);

impl LastSeen {
    pub fn note(&self, user_id: &str, device_id: &str, at: i64) {
        self.0
            .lock()
            .expect("last seen")
            .insert((user_id.to_string(), device_id.to_string()), at);
    }

    fn pending(&self, user_id: &str, device_id: &str) -> Option<i64> {
        self.0
            .lock()
            .expect("last seen")
            .get(&(user_id.to_string(), device_id.to_string()))
            .copied()
    }

    /// Writes what was noted since the last write (kept for the next round if the
    /// database refused it).
    pub async fn flush(&self, store: &Store) {
        let taken = std::mem::take(&mut *self.0.lock().expect("last seen"));
        if taken.is_empty() {
            return;
        }
        let rows: Vec<(&str, &str, i64)> = taken
            .iter()
            .map(|((u, d), at)| (u.as_str(), d.as_str(), *at))
            .collect();
        if let Err(e) = store.devices_seen(&rows).await {
            tracing::warn!(
                "could not record when {} devices were seen: {e}",
                rows.len()
            );
            let mut map = self.0.lock().expect("last seen");
            for ((u, d), at) in taken {
                map.entry((u, d)).or_insert(at);
            }
        }
    }
}

/// Writes what devices were last seen every `LAST_SEEN_EVERY`, until the store closes.
pub async fn record_last_seen(seen: std::sync::Arc<LastSeen>, store: Store) {
    let mut tick = tokio::time::interval(LAST_SEEN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        seen.flush(&store).await;
    }
}

/// A device's name or platform as a client gives it: at most 64 characters, no control
/// characters.
pub fn valid_label(s: &str) -> bool {
    s.chars().count() <= 64 && !s.chars().any(char::is_control)
}

fn removed() -> Error {
    Error::new(
        Code::DeviceRemoved,
        "this device was removed; register it again (POST /v1/devices) to connect with its id",
    )
}

fn not_found(device_id: &str) -> Error {
    Error::new(
        Code::DeviceNotFound,
        format!("you have no device {device_id:?}"),
    )
}

impl Core {
    /// A device connecting (before its upgrade is answered): registered if new;
    /// `device_removed` if its user removed it.
    pub async fn device_connects(
        &self,
        user_id: &str,
        device_id: &str,
        name: Option<&str>,
        platform: Option<&str>,
    ) -> Result<(), Error> {
        let now = now_ms();
        match self
            .store
            .device_connects(
                user_id,
                device_id,
                name,
                platform,
                now,
                i64::from(self.settings.max_devices),
            )
            .await
            .map_err(unavailable)?
        {
            Seen::Removed => Err(removed()),
            Seen::TooMany => Err(self.too_many_devices()),
            Seen::New | Seen::Known => {
                self.last_seen.note(user_id, device_id, now);
                Ok(())
            }
        }
    }

    /// Whether a device that just registered its connection was removed meanwhile (its
    /// removal's close may have come before the connection was there to close).
    pub async fn device_was_removed(&self, user_id: &str, device_id: &str) -> bool {
        self.store
            .device_removed(user_id, device_id)
            .await
            .unwrap_or(false)
    }

    fn too_many_devices(&self) -> Error {
        Error::new(
            Code::TooManyDevices,
            format!(
                "you have {} devices, the most a user may have: remove one first",
                self.settings.max_devices
            ),
        )
    }

    /// A device's connection went away.
    pub fn device_left(&self, user_id: &str, device_id: &str) {
        self.last_seen.note(user_id, device_id, now_ms());
    }

    /// The user's devices, with whether each is online anywhere.
    pub async fn devices(&self, user_id: &str) -> Result<Vec<DeviceInfo>, Error> {
        let rows = self
            .store
            .read_twice(|| self.store.devices(user_id))
            .await
            .map_err(unavailable)?;
        let online = self
            .delivery
            .devices_online(user_id)
            .await
            .unwrap_or_else(|| self.delivery.online(user_id));
        Ok(rows
            .into_iter()
            .map(|r: DeviceRow| DeviceInfo {
                online: online.contains(&r.device_id),
                last_seen: self
                    .last_seen
                    .pending(user_id, &r.device_id)
                    .map_or(r.last_seen, |p| p.max(r.last_seen)),
                device_id: r.device_id,
                name: r.name,
                platform: r.platform,
                first_seen: r.first_seen,
                push_provider: r.push_provider,
            })
            .collect())
    }

    /// Registers a device (again, if it was removed); a known one keeps the name and
    /// platform not given.
    pub async fn register_device(
        &self,
        user_id: &str,
        device_id: &str,
        name: Option<&str>,
        platform: Option<&str>,
    ) -> Result<DeviceInfo, Error> {
        let registered = self
            .store
            .register_device(
                user_id,
                device_id,
                name,
                platform,
                now_ms(),
                i64::from(self.settings.max_devices),
            )
            .await
            .map_err(unavailable)?;
        if !registered {
            return Err(self.too_many_devices());
        }
        self.devices(user_id)
            .await?
            .into_iter()
            .find(|d| d.device_id == device_id)
            .ok_or_else(|| not_found(device_id))
    }

    /// Removes a device: its push token goes, its connection (on any node) is closed with
    /// `device_removed`, and it may not connect again with its id until registered again.
    pub async fn remove_device(&self, user_id: &str, device_id: &str) -> Result<(), Error> {
        if !self
            .store
            .remove_device(user_id, device_id, now_ms())
            .await
            .map_err(unavailable)?
        {
            return Err(not_found(device_id));
        }
        self.delivery
            .close(user_id, Which::Device(device_id), Close::DeviceRemoved);
        Ok(())
    }

    /// `device_not_found` unless the device is one of the user's, not removed.
    pub async fn active_device(&self, user_id: &str, device_id: &str) -> Result<(), Error> {
        match self
            .store
            .device_active(user_id, device_id)
            .await
            .map_err(unavailable)?
        {
            true => Ok(()),
            false => Err(not_found(device_id)),
        }
    }

    /// Mutes (or unmutes) the user's offline notices of a conversation.
    pub async fn mute_notifications(
        &self,
        user_id: &str,
        conversation_id: i64,
        muted: bool,
    ) -> Result<(), Error> {
        match self
            .store
            .set_push_muted(user_id, conversation_id, muted)
            .await
            .map_err(unavailable)?
        {
            true => Ok(()),
            false => Err(crate::protocol::Refused::NotAMember(conversation_id).into()),
        }
    }

    /// Sets or (`None`) clears a device's push token.
    pub async fn set_push_token(
        &self,
        user_id: &str,
        device_id: &str,
        token: Option<(&str, &str)>,
    ) -> Result<(), Error> {
        match self
            .store
            .set_push_token(user_id, device_id, token)
            .await
            .map_err(unavailable)?
        {
            true => Ok(()),
            false => Err(not_found(device_id)),
        }
    }
}
