//! Private conversations by pair: found, or created by a first message.

use std::collections::HashMap;

use sqlx::{AnyConnection, Row as _};

use super::BatchError;
use crate::protocol::Pair;
use crate::store::{Dialect, json, lookup};

/// The private conversations of `pairs` that exist.
pub async fn find_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    pairs: &[Pair],
) -> Result<HashMap<Pair, i64>, BatchError> {
    let mut found = HashMap::new();
    if pairs.is_empty() {
        return Ok(found);
    }
    let sql = lookup(
        d,
        "user_lo, user_hi, conversation_id",
        "private_pairs",
        &[("user_lo", false), ("user_hi", false)],
        "",
    );
    for row in sqlx::query(&sql)
        .bind(json(pairs))
        .fetch_all(&mut *conn)
        .await?
    {
        found.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
    }
    Ok(found)
}

/// The private conversations of `pairs`, creating the missing ones (of known users).
pub async fn resolve_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    pairs: &[Pair],
    now: i64,
) -> Result<HashMap<Pair, i64>, BatchError> {
    let mut found = find_pairs(d, conn, pairs).await?;
    let missing: Vec<Pair> = pairs
        .iter()
        .filter(|p| !found.contains_key(*p))
        .cloned()
        .collect();
    found.extend(create_pairs(d, conn, &missing, now).await?);
    Ok(found)
}

/// A new private conversation's member row, `x.u`, says whether it blocks the other
/// member, `x.o`: blocks made before the conversation existed.
const BLOCKS_PEER: &str = "CASE WHEN EXISTS (SELECT 1 FROM blocks b WHERE b.blocker = x.u \
     AND b.blocked = x.o AND b.active = 1) THEN 1 ELSE 0 END";

/// Creates the private conversations of `missing` (pairs without one, of known users that
/// were not deleted): their heads, pairs and members written together, whatever their
/// number (on PostgreSQL in one statement, on SQLite in one call after their ids are
/// taken). A pair another node created since the batch looked is a unique violation: a
/// conflict, and the batch runs again.
pub async fn create_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    missing: &[Pair],
    now: i64,
) -> Result<HashMap<Pair, i64>, BatchError> {
    let mut found = HashMap::new();
    if missing.is_empty() {
        return Ok(found);
    }
    let mut users: Vec<&str> = missing
        .iter()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    users.sort_unstable();
    users.dedup();
    let known = crate::store::accounts::existing_users(d, conn, &users).await?;
    let new: Vec<&Pair> = missing
        .iter()
        .filter(|(lo, hi)| known.contains(lo) && known.contains(hi))
        .collect();
    if new.is_empty() {
        return Ok(found);
    }
    match d {
        Dialect::Postgres => {
            // `p` is evaluated once (it is materialized), so every insert reads the same
            // ids; the keys the inserts reference are checked at the statement's end.
            let sql = format!(
                "WITH p AS MATERIALIZED (SELECT e->>0 AS lo, e->>1 AS hi, \
                 nextval(pg_get_serial_sequence('conversations', 'conversation_id')) AS id \
                 FROM jsonb_array_elements(CAST($1 AS jsonb)) e), \
                 c AS (INSERT INTO conversations (conversation_id, conversation_type, \
                 last_seq, unread_acc, last_time, created_at) SELECT id, 1, 0, 0, $2, $2 FROM p), \
                 pp AS (INSERT INTO private_pairs (user_lo, user_hi, conversation_id) \
                 SELECT lo, hi, id FROM p), \
                 m AS (INSERT INTO members (conversation_id, user_id, joined_after_seq, \
                 left_at_seq, joined_at, blocks_peer) SELECT x.id, x.u, 0, NULL, $2, {BLOCKS_PEER} \
                 FROM (SELECT id, lo AS u, hi AS o FROM p UNION ALL SELECT id, hi, lo FROM p) x) \
                 SELECT lo, hi, id FROM p"
            );
            for row in sqlx::query(&sql)
                .bind(json(&new))
                .bind(now)
                .fetch_all(&mut *conn)
                .await?
            {
                found.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
            }
        }
        Dialect::Sqlite => {
            // The only writer takes the ids after the highest ever given (`AUTOINCREMENT`
            // keeps it in `sqlite_sequence`).
            let last: i64 = sqlx::query(
                "SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'conversations'), 0)",
            )
            .fetch_one(&mut *conn)
            .await?
            .try_get(0)?;
            let rows: Vec<(&str, &str, i64)> = new
                .iter()
                .zip(last + 1..)
                .map(|((lo, hi), id)| (lo.as_str(), hi.as_str(), id))
                .collect();
            let sql = format!(
                "INSERT INTO conversations (conversation_id, conversation_type, last_seq, \
                 unread_acc, last_time, created_at) SELECT value->>2, 1, 0, 0, $2, $2 \
                 FROM json_each($1); \
                 INSERT INTO private_pairs (user_lo, user_hi, conversation_id) \
                 SELECT value->>0, value->>1, value->>2 FROM json_each($1); \
                 INSERT INTO members (conversation_id, user_id, joined_after_seq, left_at_seq, \
                 joined_at, blocks_peer) SELECT x.id, x.u, 0, NULL, $2, {BLOCKS_PEER} \
                 FROM (SELECT value->>2 AS id, value->>0 AS u, value->>1 AS o FROM json_each($1) \
                 UNION ALL SELECT value->>2, value->>1, value->>0 FROM json_each($1)) x"
            );
            sqlx::query(&sql)
                .bind(json(&rows))
                .bind(now)
                .execute(&mut *conn)
                .await?;
            found.extend(
                rows.into_iter()
                    .map(|(lo, hi, id)| ((lo.into(), hi.into()), id)),
            );
        }
    }
    Ok(found)
}
