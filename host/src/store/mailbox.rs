//! Per-device mailboxes (to-device messages): entries addressed to one device, each with
//! a seq of that device's mailbox (allocated under its head row, so per mailbox the order
//! of seq is the order of commit), deleted when the device acknowledges them or when they
//! expire. Queries only; who may send what is `e2e/`.

use std::collections::{HashMap, HashSet};

use sqlx::{AnyConnection, Row as _};

use super::{Dialect, Store, json};

/// An entry as stored and as a device pulls it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: i64,
    pub sender_id: String,
    pub sender_device_id: String,
    pub content_type: u32,
    /// JSON text (checked by the kind's plugin when sent).
    pub payload: String,
    pub server_time: i64,
    pub expires_at: i64,
}

/// One target of a send: the device and what it gets.
#[derive(Debug, Clone)]
pub struct Target {
    pub user_id: String,
    pub device_id: String,
    pub payload: String,
}

/// Why a send to devices stored nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendRefused {
    /// No such device (or it was removed).
    NoDevice(String, String),
    /// The device's mailbox holds its most entries.
    Full(String, String),
    /// The target user blocks the sender.
    Blocked(String),
}

/// What a send to devices did.
#[derive(Debug, Clone)]
pub enum Sent {
    /// Stored: each target's seq, in the order given.
    Stored(Vec<i64>),
    /// A resend of a `clientMsgId` already sent: the answer it got (JSON).
    Again(String),
}

/// The rules of one send: its sender, the kind and time, and the bounds it meets.
pub struct Send<'a> {
    pub sender_id: &'a str,
    pub sender_device_id: &'a str,
    pub client_msg_id: &'a str,
    pub content_type: u32,
    pub now: i64,
    pub expires_at: i64,
    pub max_entries: i64,
}

/// Stores a send to devices in the caller's transaction: nothing if its `clientMsgId`
/// was sent already (then its answer), or if any target is unknown, full, or blocks the
/// sender. `answer` makes the answer of the seqs, kept for a resend.
pub async fn send(
    d: Dialect,
    conn: &mut AnyConnection,
    s: &Send<'_>,
    targets: &[Target],
    answer: impl FnOnce(&[i64]) -> String,
) -> sqlx::Result<Result<Sent, SendRefused>> {
    // The clientMsgId first: taken (its row written, an expired one taken over), or it
    // is a resend. A send racing with the same id waits here for the first to commit (its
    // answer) or to store nothing (then this one takes the id).
    let taken: Option<i64> = sqlx::query_scalar(
        "INSERT INTO mailbox_sends (sender_id, client_msg_id, answer, expires_at) \
         VALUES ($1, $2, '', $4) ON CONFLICT (sender_id, client_msg_id) DO UPDATE SET \
         answer = '', expires_at = excluded.expires_at WHERE mailbox_sends.expires_at <= $3 \
         RETURNING 1",
    )
    .bind(s.sender_id)
    .bind(s.client_msg_id)
    .bind(s.now)
    .bind(s.expires_at)
    .fetch_optional(&mut *conn)
    .await?;
    if taken.is_none() {
        let again: String = sqlx::query_scalar(
            "SELECT answer FROM mailbox_sends WHERE sender_id = $1 AND client_msg_id = $2",
        )
        .bind(s.sender_id)
        .bind(s.client_msg_id)
        .fetch_one(&mut *conn)
        .await?;
        return Ok(Ok(Sent::Again(again)));
    }
    // The devices, that they exist, and who blocks the sender.
    let keys: Vec<(&str, &str)> = targets
        .iter()
        .map(|t| (t.user_id.as_str(), t.device_id.as_str()))
        .collect();
    // Shared locks on PostgreSQL: a removal of one of them (which drops its mailbox's
    // entries) waits for this send, or this send for it and then finds it removed.
    let known: HashSet<(String, String)> = sqlx::query(&super::lookup(
        d,
        "user_id, device_id",
        "devices",
        &[("user_id", false), ("device_id", false)],
        match d {
            Dialect::Postgres => "AND removed_at IS NULL FOR SHARE",
            Dialect::Sqlite => "AND removed_at IS NULL",
        },
    ))
    .bind(json(&keys))
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
    .collect::<sqlx::Result<_>>()?;
    if let Some(t) = targets
        .iter()
        .find(|t| !known.contains(&(t.user_id.clone(), t.device_id.clone())))
    {
        return Ok(Err(SendRefused::NoDevice(
            t.user_id.clone(),
            t.device_id.clone(),
        )));
    }
    let mut users: Vec<&str> = targets.iter().map(|t| t.user_id.as_str()).collect();
    users.sort_unstable();
    users.dedup();
    let pairs: Vec<(String, String)> = users
        .iter()
        .filter(|u| **u != s.sender_id)
        .map(|u| (u.to_string(), s.sender_id.to_string()))
        .collect();
    if !pairs.is_empty()
        && let Some((blocker, _)) = super::social::blocked_pairs(d, conn, &pairs)
            .await?
            .into_iter()
            .next()
    {
        return Ok(Err(SendRefused::Blocked(blocker)));
    }
    // The heads, locked in order (created when missing), then how full each mailbox is.
    let mut order: Vec<(&str, &str)> = keys.clone();
    order.sort_unstable();
    sqlx::query(match d {
        Dialect::Postgres => {
            "INSERT INTO mailbox_heads (user_id, device_id, last_seq) \
             SELECT e->>0, e->>1, 0 FROM jsonb_array_elements(CAST($1 AS jsonb)) e \
             ON CONFLICT (user_id, device_id) DO NOTHING"
        }
        Dialect::Sqlite => {
            "INSERT INTO mailbox_heads (user_id, device_id, last_seq) \
             SELECT value->>0, value->>1, 0 FROM json_each($1) WHERE true \
             ON CONFLICT (user_id, device_id) DO NOTHING"
        }
    })
    .bind(json(&order))
    .execute(&mut *conn)
    .await?;
    let lock = d.for_update();
    let mut heads: HashMap<(String, String), i64> = HashMap::new();
    for (user, device) in &order {
        let last: i64 = sqlx::query_scalar(&format!(
            "SELECT last_seq FROM mailbox_heads WHERE user_id = $1 AND device_id = $2{lock}"
        ))
        .bind(*user)
        .bind(*device)
        .fetch_one(&mut *conn)
        .await?;
        let held: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM mailbox_entries WHERE user_id = $1 AND device_id = $2 \
             AND expires_at > $3",
        )
        .bind(*user)
        .bind(*device)
        .bind(s.now)
        .fetch_one(&mut *conn)
        .await?;
        if held >= s.max_entries {
            return Ok(Err(SendRefused::Full(user.to_string(), device.to_string())));
        }
        heads.insert((user.to_string(), device.to_string()), last);
    }
    let mut seqs = Vec::with_capacity(targets.len());
    let mut rows = Vec::with_capacity(targets.len());
    for t in targets {
        let head = heads
            .get_mut(&(t.user_id.clone(), t.device_id.clone()))
            .expect("every target's head was read");
        *head += 1;
        seqs.push(*head);
        rows.push((
            t.user_id.as_str(),
            t.device_id.as_str(),
            *head,
            t.payload.as_str(),
        ));
    }
    let moved: Vec<(&str, &str, i64)> = heads
        .iter()
        .map(|((u, dv), last)| (u.as_str(), dv.as_str(), *last))
        .collect();
    sqlx::query(match d {
        Dialect::Postgres => {
            "UPDATE mailbox_heads SET last_seq = CAST(e->>2 AS BIGINT) \
             FROM jsonb_array_elements(CAST($1 AS jsonb)) e \
             WHERE mailbox_heads.user_id = e->>0 AND mailbox_heads.device_id = e->>1"
        }
        Dialect::Sqlite => {
            "UPDATE mailbox_heads SET last_seq = e.value->>2 FROM json_each($1) e \
             WHERE mailbox_heads.user_id = e.value->>0 AND mailbox_heads.device_id = e.value->>1"
        }
    })
    .bind(json(&moved))
    .execute(&mut *conn)
    .await?;
    sqlx::query(match d {
        Dialect::Postgres => {
            "INSERT INTO mailbox_entries (user_id, device_id, seq, sender_id, sender_device_id, \
             content_type, payload, server_time, expires_at) \
             SELECT e->>0, e->>1, CAST(e->>2 AS BIGINT), $2, $3, $4, e->>3, $5, $6 \
             FROM jsonb_array_elements(CAST($1 AS jsonb)) e"
        }
        Dialect::Sqlite => {
            "INSERT INTO mailbox_entries (user_id, device_id, seq, sender_id, sender_device_id, \
             content_type, payload, server_time, expires_at) \
             SELECT value->>0, value->>1, value->>2, $2, $3, $4, value->>3, $5, $6 \
             FROM json_each($1)"
        }
    })
    .bind(json(&rows))
    .bind(s.sender_id)
    .bind(s.sender_device_id)
    .bind(i64::from(s.content_type))
    .bind(s.now)
    .bind(s.expires_at)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE mailbox_sends SET answer = $3 WHERE sender_id = $1 AND client_msg_id = $2")
        .bind(s.sender_id)
        .bind(s.client_msg_id)
        .bind(answer(&seqs))
        .execute(&mut *conn)
        .await?;
    Ok(Ok(Sent::Stored(seqs)))
}

impl Store {
    /// A device's entries after `after` (not expired), at most `limit`, and its mailbox's
    /// last seq.
    pub async fn mailbox(
        &self,
        user_id: &str,
        device_id: &str,
        after: i64,
        limit: i64,
        now: i64,
    ) -> sqlx::Result<(Vec<Entry>, i64)> {
        let entries = sqlx::query(
            "SELECT seq, sender_id, sender_device_id, content_type, payload, server_time, \
             expires_at FROM mailbox_entries WHERE user_id = $1 AND device_id = $2 AND seq > $3 \
             AND expires_at > $4 ORDER BY seq LIMIT $5",
        )
        .bind(user_id)
        .bind(device_id)
        .bind(after)
        .bind(now)
        .bind(limit)
        .fetch_all(self.read())
        .await?
        .iter()
        .map(|r| {
            Ok(Entry {
                seq: r.try_get(0)?,
                sender_id: r.try_get(1)?,
                sender_device_id: r.try_get(2)?,
                content_type: r.try_get::<i64, _>(3)? as u32,
                payload: r.try_get(4)?,
                server_time: r.try_get(5)?,
                expires_at: r.try_get(6)?,
            })
        })
        .collect::<sqlx::Result<_>>()?;
        let last: Option<i64> = sqlx::query_scalar(
            "SELECT last_seq FROM mailbox_heads WHERE user_id = $1 AND device_id = $2",
        )
        .bind(user_id)
        .bind(device_id)
        .fetch_optional(self.read())
        .await?;
        Ok((entries, last.unwrap_or(0)))
    }

    /// Deletes a device's entries up to `upto`: how many it could still have pulled
    /// (expired ones go too; the purge would take them within a minute anyway).
    pub async fn mailbox_ack(
        &self,
        user_id: &str,
        device_id: &str,
        upto: i64,
        now: i64,
    ) -> sqlx::Result<u64> {
        Ok(sqlx::query(
            "DELETE FROM mailbox_entries WHERE user_id = $1 AND device_id = $2 AND seq <= $3 \
             RETURNING expires_at",
        )
        .bind(user_id)
        .bind(device_id)
        .bind(upto)
        .fetch_all(self.write())
        .await?
        .iter()
        .filter(|r| r.try_get::<i64, _>(0).is_ok_and(|at| at > now))
        .count() as u64)
    }

    /// Deletes expired entries and send records: how many entries.
    pub async fn purge_mailboxes(&self, now: i64) -> sqlx::Result<u64> {
        let n = sqlx::query("DELETE FROM mailbox_entries WHERE expires_at <= $1")
            .bind(now)
            .execute(self.write())
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM mailbox_sends WHERE expires_at <= $1")
            .bind(now)
            .execute(self.write())
            .await?;
        Ok(n)
    }
}
