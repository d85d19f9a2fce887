//! The per-user state stream: `(epoch, seq)` per user, allocated under the lock of the
//! user's head row in the same transaction as the change it records, so per user the
//! order of seq is the order of commit.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, Row as _};

use super::{Dialect, Store, placeholders, shaped_chunks, tuples};

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
        let values: Vec<String> = (0..new.len())
            .map(|i| match d {
                Dialect::Sqlite => "(?, 1, 0)".to_string(),
                Dialect::Postgres => format!("(${}, 1, 0)", i + 1),
            })
            .collect();
        let sql = format!(
            "INSERT INTO user_streams (user_id, epoch, last_seq) VALUES {} \
             ON CONFLICT (user_id) DO NOTHING",
            values.join(", ")
        );
        let mut q = sqlx::query(&sql);
        for u in &new {
            q = q.bind(*u);
        }
        q.execute(&mut *conn).await?;
        let lock = match d {
            Dialect::Postgres => " FOR UPDATE",
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "SELECT user_id, epoch, last_seq FROM user_streams WHERE user_id IN ({}) \
             ORDER BY user_id{lock}",
            placeholders(d, 1, new.len())
        );
        let mut q = sqlx::query(&sql);
        for u in &new {
            q = q.bind(*u);
        }
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

    /// Writes the events and the heads (a few multi-row statements however many users a
    /// change concerns); returns the events to push after commit.
    pub async fn finish(
        self,
        d: Dialect,
        conn: &mut AnyConnection,
    ) -> sqlx::Result<Vec<UserEvent>> {
        for chunk in shaped_chunks(&self.events) {
            let sql = format!(
                "INSERT INTO user_events (user_id, epoch, seq, event, content_type, data, server_time) \
                 VALUES {}",
                tuples(d, chunk.len(), 7)
            );
            let mut q = sqlx::query(&sql);
            for e in chunk {
                q = q
                    .bind(e.user_id.as_str())
                    .bind(e.epoch)
                    .bind(e.seq)
                    .bind(e.event.as_str())
                    .bind(e.content_type.map(i64::from))
                    .bind(e.data.as_str())
                    .bind(e.server_time);
            }
            q.execute(&mut *conn).await?;
        }
        let moved: Vec<(&String, i64)> = self
            .heads
            .iter()
            .filter(|(user, _)| self.events.iter().any(|e| &e.user_id == *user))
            .map(|(user, (_, last))| (user, *last))
            .collect();
        for chunk in shaped_chunks(&moved) {
            let sql = format!(
                "UPDATE user_streams SET last_seq = v.column2 FROM (VALUES {}) AS v \
                 WHERE user_streams.user_id = v.column1",
                tuples(d, chunk.len(), 2)
            );
            let mut q = sqlx::query(&sql);
            for (user, last) in chunk {
                q = q.bind(user.as_str()).bind(*last);
            }
            q.execute(&mut *conn).await?;
        }
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
