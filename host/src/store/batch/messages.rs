//! The writes of a batch (new messages, moved heads, read and delivered positions, recall
//! marks) and the message a recall reads.

use std::collections::HashMap;

use sqlx::{AnyConnection, Row as _};

use super::{BatchError, Head, Pending, classify};
use crate::store::{Dialect, json};

/// Which heads a batch's write names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heads {
    /// Those it moved (the batch holds their locks).
    Moved,
    /// Every one it decided by, moved or not: heads remembered from an earlier batch, not
    /// locked before the write, whose version and last seq the write checks.
    Checked,
}

/// What a batch writes at once.
pub struct Writes<'a> {
    /// New messages and recall marks.
    pub pending: &'a mut Pending,
    /// The heads, and which of them the write names.
    pub heads: (&'a HashMap<i64, Head>, Heads),
    /// Read positions to move: (user, conversation) → (seq, its running count).
    pub reads: &'a HashMap<(String, i64), (i64, i64)>,
    /// Delivered positions to move: (user, conversation) → seq.
    pub delivered: &'a HashMap<(String, i64), i64>,
    pub now: i64,
}

/// What a write did.
#[derive(Debug, Default)]
pub struct Written {
    /// Its statement ended the transaction (`closing`).
    pub committed: bool,
    /// The delivered positions it moved that a `received` asked to move: (user,
    /// conversation) → where to.
    pub delivered: HashMap<(String, i64), i64>,
    /// Where the delivered positions it was asked to move are now, moved or not (a read
    /// position counts as delivered).
    pub positions: HashMap<(String, i64), i64>,
    /// The versions of the heads it wrote that this transaction created (`Head::created`).
    pub versions: HashMap<i64, i64>,
}

/// Writes what a batch decided so far in one statement (one round trip): the new messages,
/// the heads (each written only if its last seq and version are still as read, else the
/// statement fails with `BatchError::Stale`), the read and delivered positions (they only
/// move forward, and a read moves the delivered position too); then the recall marks.
/// `opening` starts the statement (SQLite's `BEGIN` when nothing came before it) and
/// `closing` ends it when nothing follows it (SQLite's `COMMIT`, see `BatchTx`). Its
/// arguments are JSON arrays, so every batch runs the same prepared statement whatever its
/// size.
pub async fn write(
    d: Dialect,
    conn: &mut AnyConnection,
    w: Writes<'_>,
    opening: &str,
    closing: &str,
) -> Result<Written, BatchError> {
    let (heads, which) = w.heads;
    let messages: Vec<_> = w
        .pending
        .messages
        .iter()
        .map(|(m, client_msg_id, counts, acc)| {
            (
                m.conversation_id,
                m.seq,
                m.msg_id,
                m.sender_id.as_str(),
                client_msg_id.as_str(),
                m.content_type,
                m.payload.as_str(),
                m.server_time,
                i64::from(*counts),
                *acc,
            )
        })
        .collect();
    let heads: Vec<_> = heads
        .values()
        .filter(|h| h.dirty || which == Heads::Checked)
        .map(|h| {
            (
                h.conversation_id,
                h.last_seq,
                h.unread_acc,
                h.base_seq,
                h.version,
                i64::from(h.dirty),
                // Only a batch that locked its heads created any (never a remembered one).
                i64::from(h.created && which == Heads::Moved),
            )
        })
        .collect();
    let positions = positions(w.reads, w.delivered);
    let mut written = Written::default();
    if !(messages.is_empty() && heads.is_empty() && positions.is_empty()) {
        // The transaction ends with it, unless recall marks follow.
        let closing = match (closing, w.pending.recalls.is_empty()) {
            ("", _) | (_, false) => "",
            (closing, true) => {
                written.committed = true;
                closing
            }
        };
        let sql = match (opening, closing) {
            ("", "") => std::borrow::Cow::Borrowed(write_sql(d)),
            _ => std::borrow::Cow::Owned(format!("{opening}{}{closing}", write_sql(d))),
        };
        let rows = sqlx::query(&sql)
            .bind(json(&messages))
            .bind(json(&heads))
            .bind(json(&positions))
            .bind(w.now)
            // PostgreSQL: the heads again as an array, so the update finds them by index.
            .bind(format!(
                "{{{}}}",
                heads
                    .iter()
                    .map(|h| h.0.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ))
            .fetch_all(&mut *conn)
            .await
            .map_err(classify)?;
        // (0 before or 1 after, user, conversation, delivered): where the positions a
        // `received` asked to move were (a read counting as delivered), and where those
        // the upsert wrote are.
        let mut after: Vec<((String, i64), i64)> = Vec::new();
        for row in rows {
            let kind: i64 = row.try_get(0)?;
            if kind == 2 {
                written.versions.insert(row.try_get(2)?, row.try_get(3)?);
                continue;
            }
            let key = (row.try_get::<String, _>(1)?, row.try_get::<i64, _>(2)?);
            let at: i64 = row.try_get(3)?;
            match kind {
                0 => {
                    written.positions.insert(key, at);
                }
                // A read's move is answered by nothing.
                _ if w.delivered.contains_key(&key) => after.push((key, at)),
                _ => {}
            }
        }
        for (key, at) in after {
            let was = written.positions.get(&key).copied().unwrap_or(0);
            if at > was {
                written.positions.insert(key.clone(), at);
                written.delivered.insert(key, at);
            }
        }
    }
    w.pending.messages.clear();
    for (conversation_id, target, by) in w.pending.recalls.drain(..) {
        sqlx::query("UPDATE messages SET recalled_by = $1 WHERE conversation_id = $2 AND seq = $3")
            .bind(by)
            .bind(conversation_id)
            .bind(target)
            .execute(&mut *conn)
            .await?;
    }
    Ok(written)
}

/// The position rows of a write: (user, conversation, read seq, its running count,
/// delivered seq, 1 where a `received` asked for it), 0 where the batch moves only the
/// other; a read delivers too. Only a `received` is answered with where the position is
/// (`Written::positions`), so only its rows are looked up before the write.
fn positions<'a>(
    reads: &'a HashMap<(String, i64), (i64, i64)>,
    delivered: &'a HashMap<(String, i64), i64>,
) -> Vec<(&'a str, i64, i64, i64, i64, i64)> {
    let mut rows: HashMap<(&str, i64), (i64, i64, i64, i64)> = HashMap::new();
    for ((user, conversation), (seq, acc)) in reads {
        rows.insert((user.as_str(), *conversation), (*seq, *acc, *seq, 0));
    }
    for ((user, conversation), seq) in delivered {
        let row = rows
            .entry((user.as_str(), *conversation))
            .or_insert((0, 0, 0, 0));
        row.2 = row.2.max(*seq);
        row.3 = 1;
    }
    rows.into_iter()
        .map(|((user, conversation), (seq, acc, at, asked))| {
            (user, conversation, seq, acc, at, asked)
        })
        .collect()
}

/// The statement of `write`: `$1` messages, `$2` heads (id, last seq, count, the last seq
/// and version as read, moved, created by this transaction), `$3` positions (user,
/// conversation, read seq, its count, delivered seq, 1 if a `received` asked), `$4` now,
/// `$5` the heads' ids (PostgreSQL). A head whose last seq or version is not as read gets
/// a NULL last seq: a NOT NULL violation, which fails the statement (`BatchError::Stale`);
/// the version of a head this transaction created is not compared (none was read, and no
/// one else could move it). It answers where the delivered positions a `received` asked to
/// move were (kind 0: the greater of delivered and read), where every position it wrote
/// is (kind 1), and the versions of the created heads it wrote (kind 2: PostgreSQL, the
/// only one that creates heads without reading them).
fn write_sql(d: Dialect) -> &'static str {
    match d {
        // One statement: the inserts and the update run as data-modifying CTEs; the
        // positions as they were come from the statement's snapshot, before its upsert.
        Dialect::Postgres => {
            "WITH new_messages AS (INSERT INTO messages (conversation_id, seq, msg_id, \
             sender_id, client_msg_id, content_type, payload, server_time, counts_unread, \
             unread_acc) \
             SELECT CAST(e->>0 AS BIGINT), CAST(e->>1 AS BIGINT), CAST(e->>2 AS BIGINT), e->>3, \
             e->>4, CAST(e->>5 AS BIGINT), e->>6, CAST(e->>7 AS BIGINT), CAST(e->>8 AS BIGINT), \
             CAST(e->>9 AS BIGINT) FROM jsonb_array_elements(CAST($1 AS jsonb)) e), \
             moved_heads AS (UPDATE conversations SET last_seq = CASE \
             WHEN conversations.last_seq = CAST(e->>3 AS BIGINT) \
             AND (e->>6 = '1' OR conversations.version = CAST(e->>4 AS BIGINT)) \
             THEN CAST(e->>1 AS BIGINT) END, \
             unread_acc = CAST(e->>2 AS BIGINT), last_time = CASE \
             WHEN e->>5 = '1' THEN $4 ELSE conversations.last_time END \
             FROM jsonb_array_elements(CAST($2 AS jsonb)) e \
             WHERE conversations.conversation_id = CAST(e->>0 AS BIGINT) \
             AND conversations.conversation_id = ANY(CAST($5 AS BIGINT[])) \
             RETURNING conversations.conversation_id, conversations.version, e->>6 AS created), \
             before AS (SELECT p.user_id, p.conversation_id, p.delivered \
             FROM jsonb_array_elements(CAST($3 AS jsonb)) e CROSS JOIN LATERAL \
             (SELECT user_id, conversation_id, GREATEST(delivered_seq, read_seq) AS delivered \
             FROM read_positions \
             WHERE user_id = e->>0 AND conversation_id = CAST(e->>1 AS BIGINT) \
             AND e->>5 = '1' OFFSET 0) p), \
             moved AS (INSERT INTO read_positions (user_id, conversation_id, read_seq, read_acc, \
             delivered_seq, updated_at) \
             SELECT e->>0, CAST(e->>1 AS BIGINT), CAST(e->>2 AS BIGINT), CAST(e->>3 AS BIGINT), \
             CAST(e->>4 AS BIGINT), $4 FROM jsonb_array_elements(CAST($3 AS jsonb)) e \
             ON CONFLICT (user_id, conversation_id) DO UPDATE SET \
             read_seq = GREATEST(read_positions.read_seq, excluded.read_seq), \
             read_acc = CASE WHEN excluded.read_seq > read_positions.read_seq \
             THEN excluded.read_acc ELSE read_positions.read_acc END, \
             delivered_seq = GREATEST(read_positions.delivered_seq, excluded.delivered_seq), \
             updated_at = excluded.updated_at \
             WHERE excluded.read_seq > read_positions.read_seq \
             OR excluded.delivered_seq > read_positions.delivered_seq \
             RETURNING user_id, conversation_id, delivered_seq) \
             SELECT CAST(0 AS BIGINT), b.user_id, b.conversation_id, b.delivered FROM before b \
             UNION ALL SELECT CAST(1 AS BIGINT), m.user_id, m.conversation_id, m.delivered_seq \
             FROM moved m \
             UNION ALL SELECT CAST(2 AS BIGINT), '', h.conversation_id, h.version \
             FROM moved_heads h WHERE h.created = '1'"
        }
        // Statements in one call: one hand-off to the database's thread. The heads first:
        // a head that moved fails the call before anything else is written. `OR FAIL`: a
        // failed statement is never undone on its own (the whole transaction is rolled
        // back), so SQLite keeps no statement journal for it. The positions as they were
        // are read just before they are written. Each array's elements are taken once
        // into JSONB (`e`, materialized): `json_each`'s `value` is rendered as text anew
        // for every `->>` that names it (ten times a message, its payload each time).
        Dialect::Sqlite => {
            "WITH e(v) AS MATERIALIZED (SELECT jsonb(value) FROM json_each($2)) \
             UPDATE OR FAIL conversations SET last_seq = CASE WHEN last_seq = e.v->>3 \
             AND version = e.v->>4 THEN e.v->>1 END, unread_acc = e.v->>2, \
             last_time = CASE WHEN e.v->>5 = 1 THEN $4 ELSE last_time END \
             FROM e WHERE conversations.conversation_id = e.v->>0; \
             INSERT OR FAIL INTO messages (conversation_id, seq, msg_id, sender_id, \
             client_msg_id, content_type, payload, server_time, counts_unread, unread_acc) \
             WITH e(v) AS MATERIALIZED (SELECT jsonb(value) FROM json_each($1)) \
             SELECT v->>0, v->>1, v->>2, v->>3, v->>4, v->>5, v->>6, v->>7, v->>8, v->>9 \
             FROM e; \
             WITH e(v) AS MATERIALIZED (SELECT jsonb(value) FROM json_each($3)) \
             SELECT 0, p.user_id, p.conversation_id, max(p.delivered_seq, p.read_seq) \
             FROM e JOIN read_positions p ON p.user_id = e.v->>0 \
             AND p.conversation_id = e.v->>1 WHERE e.v->>5 = 1; \
             INSERT INTO read_positions (user_id, conversation_id, read_seq, read_acc, \
             delivered_seq, updated_at) \
             WITH e(v) AS MATERIALIZED (SELECT jsonb(value) FROM json_each($3)) \
             SELECT v->>0, v->>1, v->>2, v->>3, v->>4, $4 FROM e WHERE true \
             ON CONFLICT (user_id, conversation_id) DO UPDATE SET \
             read_seq = max(read_positions.read_seq, excluded.read_seq), \
             read_acc = CASE WHEN excluded.read_seq > read_positions.read_seq \
             THEN excluded.read_acc ELSE read_positions.read_acc END, \
             delivered_seq = max(read_positions.delivered_seq, excluded.delivered_seq), \
             updated_at = excluded.updated_at \
             WHERE excluded.read_seq > read_positions.read_seq \
             OR excluded.delivered_seq > read_positions.delivered_seq \
             RETURNING 1, user_id, conversation_id, delivered_seq"
        }
    }
}

/// What a recall needs to know of its target message.
pub struct RecallTarget {
    pub sender_id: String,
    pub server_time: i64,
    pub recalled_by: i64,
    pub content_type: u32,
    pub system: bool,
}

/// The message at `seq` of a conversation, as a recall sees it.
pub async fn recall_target(
    conn: &mut AnyConnection,
    conversation_id: i64,
    seq: i64,
) -> sqlx::Result<Option<RecallTarget>> {
    let row = sqlx::query(
        "SELECT sender_id, server_time, recalled_by, content_type, system FROM messages \
         WHERE conversation_id = $1 AND seq = $2",
    )
    .bind(conversation_id)
    .bind(seq)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| {
        Ok(RecallTarget {
            sender_id: row.try_get(0)?,
            server_time: row.try_get(1)?,
            recalled_by: row.try_get(2)?,
            content_type: row.try_get::<i64, _>(3)? as u32,
            system: row.try_get::<i64, _>(4)? != 0,
        })
    })
    .transpose()
}
