//! The per-user state stream: `(epoch, seq)` per user, allocated under the lock of the
//! user's head row in the same transaction as the change it records, so per user the
//! order of seq is the order of commit.

use std::collections::{BTreeMap, HashSet};

use sqlx::{AnyConnection, Row as _};

use super::groups::{element, elements};
use super::{Dialect, Store, json, lookup};

pub use crate::protocol::UserEvent;

/// The streams a transaction writes to: their heads, locked, and the events so far.
pub struct StreamWriter {
    heads: BTreeMap<String, (i64, i64)>,
    events: Vec<UserEvent>,
    now: i64,
}

impl StreamWriter {
    pub fn new(now: i64) -> StreamWriter {
        StreamWriter {
            heads: BTreeMap::new(),
            events: Vec::new(),
            now,
        }
    }

    /// Locks the head rows of `users` (creating missing ones), in user order. Call it
    /// before reading the state the events will describe: the lock orders concurrent
    /// changes of one user.
    pub async fn lock(
        &mut self,
        d: Dialect,
        conn: &mut AnyConnection,
        users: &[&str],
    ) -> sqlx::Result<()> {
        let mut new: Vec<&str> = users
            .iter()
            .copied()
            .filter(|u| !self.heads.contains_key(*u))
            .collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return Ok(());
        }
        // A stream created here can be dropped by a deletion committing between the two
        // statements (the deleted account's own): created and locked once more then,
        // a bounded number of times.
        for _ in 0..3 {
            self.lock_existing(d, conn, &new).await?;
            new.retain(|u| !self.heads.contains_key(*u));
            if new.is_empty() {
                return Ok(());
            }
        }
        Err(sqlx::Error::Protocol(format!(
            "the user streams of {new:?} went away while being locked"
        )))
    }

    /// Creates the streams of `new` (sorted, none locked yet) that are missing and locks
    /// them all.
    async fn lock_existing(
        &mut self,
        d: Dialect,
        conn: &mut AnyConnection,
        new: &[&str],
    ) -> sqlx::Result<()> {
        // The users as one JSON argument: one statement of one shape each, whatever their
        // number (a list of placeholders was a shape per count, in chunks).
        let users = json(&new.iter().map(|u| [*u]).collect::<Vec<_>>());
        let (user, from) = elements(d, "$1", &[false]);
        sqlx::query(&format!(
            "INSERT INTO user_streams (user_id, epoch, last_seq) SELECT {user}, 1, 0 \
             FROM {from} WHERE true ON CONFLICT (user_id) DO NOTHING"
        ))
        .bind(&users)
        .execute(&mut *conn)
        .await?;
        // On PostgreSQL each head is locked as its index probe reads it, in the order of
        // `new` (sorted), the same order for every change.
        let sql = match d {
            Dialect::Postgres => format!(
                "SELECT s.user_id, s.epoch, s.last_seq FROM {from} CROSS JOIN LATERAL \
                 (SELECT user_id, epoch, last_seq FROM user_streams WHERE user_id = {user} \
                 OFFSET 0 FOR UPDATE) s"
            ),
            Dialect::Sqlite => lookup(
                d,
                "user_id, epoch, last_seq",
                "user_streams",
                &[("user_id", false)],
                "",
            ),
        };
        let q = sqlx::query(&sql).bind(&users);
        for row in q.fetch_all(&mut *conn).await? {
            self.heads
                .insert(row.try_get(0)?, (row.try_get(1)?, row.try_get(2)?));
        }
        Ok(())
    }

    /// Records an event for a locked user.
    pub fn append(
        &mut self,
        user_id: &str,
        event: &str,
        content_type: Option<u32>,
        data: &serde_json::Value,
    ) {
        let head = self
            .heads
            .get_mut(user_id)
            .unwrap_or_else(|| panic!("stream of {user_id} appended to without its lock"));
        head.1 += 1;
        self.events.push(UserEvent {
            user_id: user_id.to_string(),
            epoch: head.0,
            seq: head.1,
            event: event.to_string(),
            content_type,
            data: data.to_string(),
            server_time: self.now,
        });
    }

    /// Writes the events and the heads (two statements however many users a change
    /// concerns); returns the events to push after commit.
    pub async fn finish(
        self,
        d: Dialect,
        conn: &mut AnyConnection,
    ) -> sqlx::Result<Vec<UserEvent>> {
        if self.events.is_empty() {
            return Ok(self.events);
        }
        let events: Vec<_> = self
            .events
            .iter()
            .map(|e| {
                (
                    e.user_id.as_str(),
                    e.epoch,
                    e.seq,
                    e.event.as_str(),
                    e.content_type,
                    e.data.as_str(),
                    e.server_time,
                )
            })
            .collect();
        let (columns, from) = elements(d, "$1", &[false, true, true, false, true, false, true]);
        sqlx::query(&format!(
            "INSERT INTO user_events (user_id, epoch, seq, event, content_type, data, \
             server_time) SELECT {columns} FROM {from}"
        ))
        .bind(json(&events))
        .execute(&mut *conn)
        .await?;
        let appended: HashSet<&str> = self.events.iter().map(|e| e.user_id.as_str()).collect();
        let moved: Vec<(&str, i64)> = self
            .heads
            .iter()
            .filter(|(user, _)| appended.contains(user.as_str()))
            .map(|(user, (_, last))| (user.as_str(), *last))
            .collect();
        let (user, last) = (element(d, 0, false), element(d, 1, true));
        sqlx::query(&format!(
            "UPDATE user_streams SET last_seq = {last} FROM {from} \
             WHERE user_streams.user_id = {user}"
        ))
        .bind(json(&moved))
        .execute(&mut *conn)
        .await?;
        Ok(self.events)
    }
}

/// A page of a user's stream.
pub struct StreamPage {
    pub epoch: i64,
    pub last_seq: i64,
    pub events: Vec<UserEvent>,
}

/// A pull with an epoch that is not the stream's.
#[derive(Debug, Clone, Copy)]
pub struct EpochMismatch {
    pub current: i64,
}

impl Store {
    /// Events after `after` in the stream's current epoch, at most `limit`. `epoch`, when
    /// given, must be the current one.
    pub async fn user_stream(
        &self,
        user_id: &str,
        epoch: Option<i64>,
        after: i64,
        limit: i64,
    ) -> sqlx::Result<Result<StreamPage, EpochMismatch>> {
        let head = sqlx::query("SELECT epoch, last_seq FROM user_streams WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(self.read())
            .await?;
        let (current, last_seq): (i64, i64) = match head {
            Some(r) => (r.try_get(0)?, r.try_get(1)?),
            None => (1, 0),
        };
        if epoch.is_some_and(|e| e != current) {
            return Ok(Err(EpochMismatch { current }));
        }
        let mut events = Vec::new();
        if limit > 0 && after < last_seq {
            // Bounded by the head read first: every event up to it committed with it.
            let rows = sqlx::query(
                "SELECT seq, event, content_type, data, server_time FROM user_events \
                 WHERE user_id = $1 AND epoch = $2 AND seq > $3 AND seq <= $4 ORDER BY seq LIMIT $5",
            )
            .bind(user_id)
            .bind(current)
            .bind(after)
            .bind(last_seq)
            .bind(limit)
            .fetch_all(self.read())
            .await?;
            for r in rows {
                events.push(UserEvent {
                    user_id: user_id.to_string(),
                    epoch: current,
                    seq: r.try_get(0)?,
                    event: r.try_get(1)?,
                    content_type: r.try_get::<Option<i64>, _>(2)?.map(|c| c as u32),
                    data: r.try_get(3)?,
                    server_time: r.try_get(4)?,
                });
            }
        }
        Ok(Ok(StreamPage {
            epoch: current,
            last_seq,
            events,
        }))
    }

    /// Compacts a user's stream: drops its events and moves to a new epoch.
    pub async fn reset_user_stream(&self, user_id: &str) -> sqlx::Result<i64> {
        let mut tx = self.write().begin().await?;
        let mut w = StreamWriter::new(0);
        w.lock(self.dialect(), &mut tx, &[user_id]).await?;
        let epoch: i64 = sqlx::query(
            "UPDATE user_streams SET epoch = epoch + 1, last_seq = 0 WHERE user_id = $1 RETURNING epoch",
        )
        .bind(user_id)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
        sqlx::query("DELETE FROM user_events WHERE user_id = $1 AND epoch < $2")
            .bind(user_id)
            .bind(epoch)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(epoch)
    }
}
