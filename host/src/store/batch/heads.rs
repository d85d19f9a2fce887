//! The head rows a batch locks (with the membership rows it needs) and the heads it moves.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::{AnyConnection, Row as _};

use super::MEMBER_DELETED;
use super::{BatchError, Head, Members, RecipientCache};
use crate::store::{Dialect, placeholders, shaped_chunks, tuples};

/// Locks the head rows of `ids` (in id order, so two writers never deadlock) and reads
/// them with the membership rows that matter: every member of a private conversation; of a
/// group, the rows of `actors` (its senders and readers in this batch) and the current
/// members, from the cache when the group's version has not moved.
pub async fn lock_heads(
    d: Dialect,
    conn: &mut AnyConnection,
    ids: &[i64],
    actors: &[(i64, &str)],
    cache: &RecipientCache,
) -> Result<(HashMap<i64, Head>, HashMap<i64, Members>), BatchError> {
    let mut heads = HashMap::new();
    let mut members: HashMap<i64, Members> = HashMap::new();
    lock_rows(d, conn, ids, &mut heads, &mut members).await?;
    // Groups: their settings, read after the lock is held (a statement that waited for
    // the lock would see the rows it joined as they were before the wait).
    let versions = group_settings(d, conn, &mut heads).await?;
    actor_rows(d, conn, actors, &versions, &mut members).await?;
    group_recipients(conn, &versions, cache, &mut members).await?;
    Ok((heads, members))
}

/// The head rows, locked in id order, with every membership row of the private ones.
async fn lock_rows(
    d: Dialect,
    conn: &mut AnyConnection,
    ids: &[i64],
    heads: &mut HashMap<i64, Head>,
    members: &mut HashMap<i64, Members>,
) -> Result<(), BatchError> {
    for chunk in shaped_chunks(ids) {
        let lock = match d {
            Dialect::Postgres => " FOR UPDATE OF c",
            // The single writer connection already excludes every other writer.
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "SELECT c.conversation_id, c.conversation_type, c.last_seq, c.unread_acc, \
             m.user_id, m.left_at_seq, \
             m.blocks_peer, m.state \
             FROM conversations c \
             LEFT JOIN members m ON m.conversation_id = c.conversation_id AND c.conversation_type = 1 \
             WHERE c.conversation_id IN ({}) ORDER BY c.conversation_id{lock}",
            placeholders(d, 1, chunk.len())
        );
        let mut q = sqlx::query(&sql);
        for id in chunk {
            q = q.bind(*id);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let id: i64 = row.try_get(0)?;
            heads.entry(id).or_insert(Head {
                conversation_id: id,
                conversation_type: row.try_get::<i64, _>(1)? as u8,
                last_seq: row.try_get(2)?,
                unread_acc: row.try_get(3)?,
                dirty: false,
                mute_all: false,
                dissolved: false,
            });
            let entry = members.entry(id).or_default();
            if let Some(user) = row.try_get::<Option<String>, _>(4)? {
                let left_at = row.try_get::<Option<i64>, _>(5)?;
                if left_at.is_none() {
                    entry.current.push(user.clone());
                }
                if row.try_get::<Option<i64>, _>(6)?.unwrap_or(0) != 0 {
                    entry.blockers.push(user.clone());
                }
                if row.try_get::<Option<i64>, _>(7)? == Some(MEMBER_DELETED) {
                    entry.deleted = Some(user.clone());
                }
                entry.any.insert(user, left_at);
            }
        }
    }
    Ok(())
}

/// The settings of the groups among `heads` (mute-all, dissolved), and their versions.
async fn group_settings(
    d: Dialect,
    conn: &mut AnyConnection,
    heads: &mut HashMap<i64, Head>,
) -> Result<HashMap<i64, i64>, BatchError> {
    let mut versions: HashMap<i64, i64> = HashMap::new();
    let groups: Vec<i64> = heads
        .iter()
        .filter(|(_, h)| h.conversation_type >= 2)
        .map(|(id, _)| *id)
        .collect();
    for chunk in shaped_chunks(&groups) {
        let sql = format!(
            "SELECT conversation_id, mute_all, state, version FROM group_info \
             WHERE conversation_id IN ({})",
            placeholders(d, 1, chunk.len())
        );
        let mut q = sqlx::query(&sql);
        for id in chunk {
            q = q.bind(*id);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let id: i64 = row.try_get(0)?;
            if let Some(h) = heads.get_mut(&id) {
                h.mute_all = row.try_get::<i64, _>(1)? != 0;
                h.dissolved = row.try_get::<i64, _>(2)? != 0;
            }
            versions.insert(id, row.try_get(3)?);
        }
    }
    Ok(versions)
}

/// In groups, the membership rows of the batch's senders and readers (role and mute of the
/// current ones).
async fn actor_rows(
    d: Dialect,
    conn: &mut AnyConnection,
    actors: &[(i64, &str)],
    versions: &HashMap<i64, i64>,
    members: &mut HashMap<i64, Members>,
) -> Result<(), BatchError> {
    let mut pairs: Vec<(i64, &str)> = actors
        .iter()
        .filter(|(id, _)| versions.contains_key(id))
        .copied()
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    for chunk in shaped_chunks(&pairs) {
        let sql = format!(
            "SELECT conversation_id, user_id, left_at_seq, role, muted_until FROM members \
             WHERE (conversation_id, user_id) IN (VALUES {})",
            tuples(d, chunk.len(), 2)
        );
        let mut q = sqlx::query(&sql);
        for (id, user) in chunk {
            q = q.bind(*id).bind(*user);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let entry = members.entry(row.try_get(0)?).or_default();
            let user: String = row.try_get(1)?;
            let left_at = row.try_get::<Option<i64>, _>(2)?;
            if left_at.is_none() {
                entry
                    .roles
                    .insert(user.clone(), (row.try_get(3)?, row.try_get(4)?));
            }
            entry.any.insert(user, left_at);
        }
    }
    Ok(())
}

/// In groups, who gets the pushes: the current members, from the cache while the
/// group's version has not moved.
async fn group_recipients(
    conn: &mut AnyConnection,
    versions: &HashMap<i64, i64>,
    cache: &RecipientCache,
    members: &mut HashMap<i64, Members>,
) -> Result<(), BatchError> {
    for (&id, &version) in versions {
        let current = match cache.get(id, version) {
            Some(c) => c,
            None => {
                let list: Vec<String> = sqlx::query(
                    "SELECT user_id FROM members WHERE conversation_id = $1 AND left_at_seq IS NULL",
                )
                .bind(id)
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
                let list: Arc<[String]> = list.into();
                cache.put(id, version, list.clone());
                list
            }
        };
        members.entry(id).or_default().current_arc = Some(current);
    }
    Ok(())
}

pub async fn update_heads(
    d: Dialect,
    conn: &mut AnyConnection,
    heads: &HashMap<i64, Head>,
    now: i64,
) -> Result<(), BatchError> {
    let dirty: Vec<(&i64, &Head)> = heads.iter().filter(|(_, h)| h.dirty).collect();
    for chunk in shaped_chunks(&dirty) {
        let sql = format!(
            "UPDATE conversations SET last_seq = v.column2, unread_acc = v.column3, last_time = v.column4 \
             FROM (VALUES {}) AS v WHERE conversations.conversation_id = v.column1",
            tuples(d, chunk.len(), 4)
        );
        let mut q = sqlx::query(&sql);
        for (id, h) in chunk {
            q = q.bind(**id).bind(h.last_seq).bind(h.unread_acc).bind(now);
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}
