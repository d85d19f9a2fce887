//! Devices: the record of each of a user's devices (registered when it first connects or
//! explicitly, removed by its user), when each was last seen, and where an offline notice
//! for it goes. Queries only; what a device may do is `messaging/devices.rs`.

use std::collections::{HashMap, HashSet};

use sqlx::Row as _;

use super::{Dialect, Store, json, lookup};

/// What a device holds besides its row, all of it gone with the device: its keys, its
/// one-time prekeys, its mailbox's entries. (The mailbox's head stays: registered again,
/// the device's seqs go on from where they were, so no client cursor skips an entry.)
const DEVICE_STATE: [&str; 3] = ["device_keys", "one_time_prekeys", "mailbox_entries"];

/// A device as its user lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRow {
    pub device_id: String,
    pub name: String,
    pub platform: String,
    pub first_seen: i64,
    pub last_seen: i64,
    /// The provider of its push token, if it registered one.
    pub push_provider: Option<String>,
}

/// What a connecting device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Registered now, by this connection.
    New,
    Known,
    /// Its user removed it: it may not connect until registered again.
    Removed,
    /// New, and its user has the most devices a user may have.
    TooMany,
}

/// Whether `user_id` has room for `device_id` in the caller's transaction: it is one of
/// theirs already (not removed), or they have fewer than `max` others. On PostgreSQL the
/// user's row is locked first, so registrations racing each other count each other
/// (SQLite's one writer takes them in turn).
async fn room_for(
    d: Dialect,
    conn: &mut sqlx::AnyConnection,
    user_id: &str,
    device_id: &str,
    max: i64,
) -> sqlx::Result<bool> {
    super::accounts::lock_account(d, conn, user_id).await?;
    let row = sqlx::query(
        "SELECT COUNT(*), COALESCE(MAX(CASE WHEN device_id = $2 THEN 1 ELSE 0 END), 0) \
         FROM devices WHERE user_id = $1 AND removed_at IS NULL",
    )
    .bind(user_id)
    .bind(device_id)
    .fetch_one(&mut *conn)
    .await?;
    let (held, this): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    Ok(this == 1 || held < max)
}

/// Where an offline notice for a device goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushTarget {
    pub device_id: String,
    pub provider: String,
    pub token: String,
}

impl Store {
    /// A device connecting: registered if it never was (with `name` and `platform`; when
    /// its user has fewer than `max` devices), its name and platform updated when given
    /// and changed; `Removed` if its user removed it. A read, and a write only for a new
    /// device or a changed name.
    pub async fn device_connects(
        &self,
        user_id: &str,
        device_id: &str,
        name: Option<&str>,
        platform: Option<&str>,
        now: i64,
        max: i64,
    ) -> sqlx::Result<Seen> {
        let row = self
            .read_twice(|| async {
                sqlx::query(
                    "SELECT name, platform, removed_at FROM devices \
                     WHERE user_id = $1 AND device_id = $2",
                )
                .bind(user_id)
                .bind(device_id)
                .fetch_optional(self.read())
                .await
            })
            .await?;
        let Some(row) = row else {
            let mut tx = self.write().begin().await?;
            if !room_for(self.dialect, &mut tx, user_id, device_id, max).await? {
                return Ok(Seen::TooMany);
            }
            sqlx::query(
                "INSERT INTO devices (user_id, device_id, name, platform, first_seen, last_seen) \
                 VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (user_id, device_id) DO NOTHING",
            )
            .bind(user_id)
            .bind(device_id)
            .bind(name.unwrap_or(""))
            .bind(platform.unwrap_or(""))
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(Seen::New);
        };
        if row.try_get::<Option<i64>, _>(2)?.is_some() {
            return Ok(Seen::Removed);
        }
        let (was_name, was_platform): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let changed =
            name.is_some_and(|n| n != was_name) || platform.is_some_and(|p| p != was_platform);
        if changed {
            sqlx::query(
                "UPDATE devices SET name = $3, platform = $4 \
                 WHERE user_id = $1 AND device_id = $2 AND removed_at IS NULL",
            )
            .bind(user_id)
            .bind(device_id)
            .bind(name.unwrap_or(&was_name))
            .bind(platform.unwrap_or(&was_platform))
            .execute(self.write())
            .await?;
        }
        Ok(Seen::Known)
    }

    /// Whether the device is one of the user's, not removed.
    pub async fn device_active(&self, user_id: &str, device_id: &str) -> sqlx::Result<bool> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM devices WHERE user_id = $1 AND device_id = $2 AND removed_at IS NULL",
        )
        .bind(user_id)
        .bind(device_id)
        .fetch_optional(self.read())
        .await?;
        Ok(found.is_some())
    }

    /// Whether the device was removed by its user (a connection that registered while its
    /// removal committed asks once more).
    pub async fn device_removed(&self, user_id: &str, device_id: &str) -> sqlx::Result<bool> {
        let removed: Option<Option<i64>> = sqlx::query_scalar(
            "SELECT removed_at FROM devices WHERE user_id = $1 AND device_id = $2",
        )
        .bind(user_id)
        .bind(device_id)
        .fetch_optional(self.read())
        .await?;
        Ok(matches!(removed, Some(Some(_))))
    }

    /// Which of the devices `(user, device)` were removed, in one statement however many
    /// (a read, run again if its connection broke).
    pub async fn devices_removed(
        &self,
        devices: &[(&str, &str)],
    ) -> sqlx::Result<HashSet<(String, String)>> {
        if devices.is_empty() {
            return Ok(HashSet::new());
        }
        let sql = lookup(
            self.dialect,
            "user_id, device_id",
            "devices",
            &[("user_id", false), ("device_id", false)],
            "AND removed_at IS NOT NULL",
        );
        let keys = json(devices);
        let rows = self
            .read_twice(|| sqlx::query(&sql).bind(&keys).fetch_all(self.read()))
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Registers a device explicitly (or again, after its removal: then as new), with its
    /// name and platform; a known device keeps those not given. `false`: it is not one of
    /// the user's, who has `max` devices already.
    pub async fn register_device(
        &self,
        user_id: &str,
        device_id: &str,
        name: Option<&str>,
        platform: Option<&str>,
        now: i64,
        max: i64,
    ) -> sqlx::Result<bool> {
        let mut tx = self.write().begin().await?;
        if !room_for(self.dialect, &mut tx, user_id, device_id, max).await? {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO devices (user_id, device_id, name, platform, first_seen, last_seen) \
             VALUES ($1, $2, COALESCE($3, ''), COALESCE($4, ''), $5, $5) \
             ON CONFLICT (user_id, device_id) DO UPDATE SET \
             name = CASE WHEN devices.removed_at IS NULL THEN COALESCE($3, devices.name) \
             ELSE excluded.name END, \
             platform = CASE WHEN devices.removed_at IS NULL \
             THEN COALESCE($4, devices.platform) ELSE excluded.platform END, \
             first_seen = CASE WHEN devices.removed_at IS NULL THEN devices.first_seen \
             ELSE excluded.first_seen END, \
             last_seen = CASE WHEN devices.removed_at IS NULL THEN devices.last_seen \
             ELSE excluded.last_seen END, \
             removed_at = NULL",
        )
        .bind(user_id)
        .bind(device_id)
        .bind(name)
        .bind(platform)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The user's devices (not removed), by id.
    pub async fn devices(&self, user_id: &str) -> sqlx::Result<Vec<DeviceRow>> {
        sqlx::query(
            "SELECT device_id, name, platform, first_seen, last_seen, push_provider FROM devices \
             WHERE user_id = $1 AND removed_at IS NULL ORDER BY device_id",
        )
        .bind(user_id)
        .fetch_all(self.read())
        .await?
        .iter()
        .map(|r| {
            Ok(DeviceRow {
                device_id: r.try_get(0)?,
                name: r.try_get(1)?,
                platform: r.try_get(2)?,
                first_seen: r.try_get(3)?,
                last_seen: r.try_get(4)?,
                push_provider: r.try_get(5)?,
            })
        })
        .collect()
    }

    /// Removes a device: it keeps its row (so its id cannot come back unannounced), loses
    /// its push token, its keys and its mailbox. `false` if there was no such device, or it
    /// was removed already.
    pub async fn remove_device(
        &self,
        user_id: &str,
        device_id: &str,
        now: i64,
    ) -> sqlx::Result<bool> {
        self.pooled(async {
            let mut tx = self.write().begin().await?;
            let done = sqlx::query(
                "UPDATE devices SET removed_at = $3, push_provider = NULL, push_token = NULL \
                 WHERE user_id = $1 AND device_id = $2 AND removed_at IS NULL",
            )
            .bind(user_id)
            .bind(device_id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 1 {
                for table in DEVICE_STATE {
                    sqlx::query(&format!(
                        "DELETE FROM {table} WHERE user_id = $1 AND device_id = $2"
                    ))
                    .bind(user_id)
                    .bind(device_id)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            tx.commit().await?;
            Ok(done.rows_affected() == 1)
        })
        .await?
    }

    /// Sets (or with `None` clears) a device's push token; `false` if the device is not
    /// one of the user's.
    pub async fn set_push_token(
        &self,
        user_id: &str,
        device_id: &str,
        token: Option<(&str, &str)>,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "UPDATE devices SET push_provider = $3, push_token = $4 \
             WHERE user_id = $1 AND device_id = $2 AND removed_at IS NULL",
        )
        .bind(user_id)
        .bind(device_id)
        .bind(token.map(|t| t.0))
        .bind(token.map(|t| t.1))
        .execute(self.write())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records when devices were last seen (each at least this late), in one statement.
    pub async fn devices_seen(&self, seen: &[(&str, &str, i64)]) -> sqlx::Result<()> {
        if seen.is_empty() {
            return Ok(());
        }
        let sql = match self.dialect() {
            Dialect::Postgres => {
                "UPDATE devices SET last_seen = CAST(e->>2 AS BIGINT) \
                 FROM jsonb_array_elements(CAST($1 AS jsonb)) e \
                 WHERE devices.user_id = e->>0 AND devices.device_id = e->>1 \
                 AND devices.last_seen < CAST(e->>2 AS BIGINT)"
            }
            Dialect::Sqlite => {
                "UPDATE devices SET last_seen = e.value->>2 FROM json_each($1) e \
                 WHERE devices.user_id = e.value->>0 AND devices.device_id = e.value->>1 \
                 AND devices.last_seen < e.value->>2"
            }
        };
        sqlx::query(sql)
            .bind(json(seen))
            .execute(self.write())
            .await?;
        Ok(())
    }

    /// Mutes (or unmutes) a member's offline notices of a conversation; `false` if the
    /// user is not a current member.
    pub async fn set_push_muted(
        &self,
        user_id: &str,
        conversation_id: i64,
        muted: bool,
    ) -> sqlx::Result<bool> {
        let mut tx = self.write().begin().await?;
        // The member trigger moves the conversation's version: its row is locked first, in
        // the order every change of a conversation's members takes (head, then members),
        // or a group change racing this one deadlocks with it (PostgreSQL).
        if self.dialect == Dialect::Postgres {
            sqlx::query("SELECT 1 FROM conversations WHERE conversation_id = $1 FOR UPDATE")
                .bind(conversation_id)
                .fetch_optional(&mut *tx)
                .await?;
        }
        let done = sqlx::query(
            "UPDATE members SET push_muted = $3 \
             WHERE conversation_id = $1 AND user_id = $2 AND left_at_seq IS NULL",
        )
        .bind(conversation_id)
        .bind(user_id)
        .bind(i64::from(muted))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Which of `(user, conversation)` have the conversation's notices muted.
    pub async fn push_muted(
        &self,
        pairs: &[(&str, i64)],
    ) -> sqlx::Result<std::collections::HashSet<(String, i64)>> {
        if pairs.is_empty() {
            return Ok(Default::default());
        }
        let keys: Vec<(i64, &str)> = pairs.iter().map(|(u, c)| (*c, *u)).collect();
        let sql = lookup(
            self.dialect(),
            "user_id, conversation_id",
            "members",
            &[("conversation_id", true), ("user_id", false)],
            "AND push_muted = 1",
        );
        sqlx::query(&sql)
            .bind(json(&keys))
            .fetch_all(self.read())
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Which of `(conversation, seq)` were recalled.
    pub async fn recalled(
        &self,
        seqs: &[(i64, i64)],
    ) -> sqlx::Result<std::collections::HashSet<(i64, i64)>> {
        if seqs.is_empty() {
            return Ok(Default::default());
        }
        let sql = lookup(
            self.dialect(),
            "conversation_id, seq",
            "messages",
            &[("conversation_id", true), ("seq", true)],
            "AND recalled_by <> 0",
        );
        sqlx::query(&sql)
            .bind(json(seqs))
            .fetch_all(self.read())
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// The push targets of `users` (their devices not removed that have a token), by user.
    pub async fn push_targets(
        &self,
        users: &[&str],
    ) -> sqlx::Result<HashMap<String, Vec<PushTarget>>> {
        let mut out: HashMap<String, Vec<PushTarget>> = HashMap::new();
        if users.is_empty() {
            return Ok(out);
        }
        let keys: Vec<[&str; 1]> = users.iter().map(|u| [*u]).collect();
        let sql = lookup(
            self.dialect(),
            "user_id, device_id, push_provider, push_token",
            "devices",
            &[("user_id", false)],
            "AND removed_at IS NULL AND push_token IS NOT NULL",
        );
        for r in sqlx::query(&sql)
            .bind(json(&keys))
            .fetch_all(self.read())
            .await?
        {
            out.entry(r.try_get(0)?).or_default().push(PushTarget {
                device_id: r.try_get(1)?,
                provider: r.try_get(2)?,
                token: r.try_get(3)?,
            });
        }
        Ok(out)
    }
}
