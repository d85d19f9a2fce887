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

/// Creates the private conversations of `missing` (pairs without one, of known users that
/// were not deleted).
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
    for (lo, hi) in missing {
        if !known.contains(lo) || !known.contains(hi) {
            continue;
        }
        let id: i64 = sqlx::query(
            "INSERT INTO conversations (conversation_type, last_seq, unread_acc, last_time, created_at) \
             VALUES (1, 0, 0, $1, $1) RETURNING conversation_id",
        )
        .bind(now)
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
        let claimed = sqlx::query(
            "INSERT INTO private_pairs (user_lo, user_hi, conversation_id) VALUES ($1, $2, $3) \
             ON CONFLICT (user_lo, user_hi) DO NOTHING",
        )
        .bind(lo.as_str())
        .bind(hi.as_str())
        .bind(id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if claimed == 0 {
            // Another node created it between our look-up and now: run the batch again.
            return Err(BatchError::Conflict);
        }
        sqlx::query(
            "INSERT INTO members (conversation_id, user_id, joined_after_seq, left_at_seq, joined_at) \
             VALUES ($1, $2, 0, NULL, $4), ($1, $3, 0, NULL, $4)",
        )
        .bind(id)
        .bind(lo.as_str())
        .bind(hi.as_str())
        .bind(now)
        .execute(&mut *conn)
        .await?;
        // Blocks made before the conversation existed.
        sqlx::query(
            "UPDATE members SET blocks_peer = 1 WHERE conversation_id = $1 AND EXISTS \
             (SELECT 1 FROM blocks b JOIN members p ON p.conversation_id = members.conversation_id \
             AND p.user_id = b.blocked WHERE b.blocker = members.user_id AND b.active = 1)",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
        found.insert((lo.clone(), hi.clone()), id);
    }
    Ok(found)
}
