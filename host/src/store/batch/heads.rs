//! The head rows a batch locks, with the membership rows it needs.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::{AnyConnection, Row as _};

use super::MEMBER_DELETED;
use super::{BatchError, ByConversation, Head, Members, Pair, RecipientCache, Stored};
use crate::store::groups::current_members;
use crate::store::{Dialect, json, lookup};

/// What the first statement of a batch found: the head rows (locked) with the membership
/// rows of the private ones, the private conversations of the pairs asked for, and the
/// messages already stored under the `clientMsgId` keys asked for.
#[derive(Default)]
pub struct Found {
    pub heads: ByConversation<Head>,
    pub members: ByConversation<Members>,
    pub pairs: HashMap<Pair, i64>,
    /// By `(sender, clientMsgId)`: the message, and whether it was recalled since.
    pub stored: HashMap<(String, String), (Arc<Stored>, bool)>,
}

/// The first statement of a batch, one round trip: locks (in id order, so two writers
/// never deadlock) the head rows of `ids` and of the private conversations of `pairs`,
/// reads them with every membership row of the private ones and their pair, and finds the
/// messages already stored under `keys` (resends). `opening` goes first (SQLite's `BEGIN`,
/// see `BatchTx`). Its arguments are JSON arrays, so every batch runs the same prepared
/// statement whatever its size.
pub async fn lock_first(
    d: Dialect,
    conn: &mut AnyConnection,
    opening: &str,
    ids: &[i64],
    pairs: &[Pair],
    keys: &[(&str, &str)],
) -> Result<Found, BatchError> {
    let sql = match d {
        // Every lookup is a lateral subquery (`OFFSET 0` keeps it one): an index probe per
        // row asked for, whatever the planner guesses of a JSON array's length. The heads
        // are locked one by one in id order.
        Dialect::Postgres => {
            "WITH ids AS MATERIALIZED (\
             SELECT CAST(v AS BIGINT) AS id FROM jsonb_array_elements_text(CAST($1 AS jsonb)) v \
             UNION SELECT p.conversation_id FROM jsonb_array_elements(CAST($2 AS jsonb)) e \
             CROSS JOIN LATERAL (SELECT conversation_id FROM private_pairs \
             WHERE user_lo = e->>0 AND user_hi = e->>1 OFFSET 0) p), \
             c AS (SELECT h.* FROM (SELECT id FROM ids ORDER BY id) i CROSS JOIN LATERAL \
             (SELECT conversation_id, conversation_type, last_seq, unread_acc, version \
             FROM conversations WHERE conversation_id = i.id FOR UPDATE) h) \
             SELECT CAST(0 AS BIGINT), c.conversation_id, c.conversation_type, c.last_seq, \
             c.unread_acc, m.left_at_seq, m.blocks_peer, m.state, m.user_id, pp.user_lo, pp.user_hi, \
             c.version, CASE WHEN (SELECT s.version FROM conversations s \
             WHERE s.conversation_id = c.conversation_id) <> c.version THEN 1 ELSE 0 END \
             FROM c LEFT JOIN LATERAL (SELECT left_at_seq, blocks_peer, state, user_id FROM members \
             WHERE members.conversation_id = c.conversation_id AND c.conversation_type = 1 \
             OFFSET 0) m ON true \
             LEFT JOIN LATERAL (SELECT user_lo, user_hi FROM private_pairs \
             WHERE private_pairs.conversation_id = c.conversation_id OFFSET 0) pp ON true \
             UNION ALL SELECT CAST(1 AS BIGINT), s.* FROM jsonb_array_elements(CAST($3 AS jsonb)) e \
             CROSS JOIN LATERAL (SELECT m.conversation_id, c.conversation_type, m.seq, m.msg_id, \
             m.content_type, m.server_time, m.recalled_by, m.sender_id, m.client_msg_id, m.payload, \
             CAST(0 AS BIGINT), CAST(0 AS BIGINT) \
             FROM messages m JOIN conversations c ON c.conversation_id = m.conversation_id \
             WHERE m.sender_id = e->>0 AND m.client_msg_id = e->>1 OFFSET 0) s"
        }
        // The single writer connection already excludes every other writer.
        Dialect::Sqlite => {
            "SELECT 0, c.conversation_id, c.conversation_type, c.last_seq, c.unread_acc, \
             m.left_at_seq, m.blocks_peer, m.state, m.user_id, pp.user_lo, pp.user_hi, \
             c.version, 0 \
             FROM conversations c \
             LEFT JOIN members m ON m.conversation_id = c.conversation_id \
             AND c.conversation_type = 1 \
             LEFT JOIN private_pairs pp ON pp.conversation_id = c.conversation_id \
             WHERE c.conversation_id IN (SELECT value FROM json_each($1) \
             UNION SELECT conversation_id FROM private_pairs WHERE (user_lo, user_hi) IN \
             (SELECT value->>0, value->>1 FROM json_each($2))) \
             UNION ALL SELECT 1, m.conversation_id, c.conversation_type, m.seq, m.msg_id, \
             m.content_type, m.server_time, m.recalled_by, m.sender_id, m.client_msg_id, m.payload, \
             0, 0 FROM messages m JOIN conversations c ON c.conversation_id = m.conversation_id \
             WHERE (m.sender_id, m.client_msg_id) IN (SELECT value->>0, value->>1 FROM json_each($3))"
        }
    };
    let sql = match opening {
        "" => std::borrow::Cow::Borrowed(sql),
        opening => std::borrow::Cow::Owned(format!("{opening}{sql}")),
    };
    let (ids, pairs, keys) = (json(ids), json(pairs), json(keys));
    let mut rows = Vec::new();
    // PostgreSQL: a locking statement that waited for a head's lock reads the rows it
    // joins as they were before the wait. When the head's version moved meanwhile (a
    // block, a member left, a group changed), the same statement runs again: the locks are
    // held now, so it reads what they protect as it is.
    for sql in [&*sql, sql.trim_start_matches(opening)] {
        rows = sqlx::query(sql)
            .bind(&ids)
            .bind(&pairs)
            .bind(&keys)
            .fetch_all(&mut *conn)
            .await?;
        if !rows
            .iter()
            .any(|r| r.try_get::<i64, _>(12).is_ok_and(|stale| stale != 0))
        {
            break;
        }
    }
    let mut found = Found::default();
    // A row a conversation, or two (a private one's members): never grown by rehashing.
    found.heads.reserve(rows.len());
    found.members.reserve(rows.len());
    for row in rows {
        let id: i64 = row.try_get(1)?;
        if row.try_get::<i64, _>(0)? == 1 {
            let stored = Stored {
                conversation_id: id,
                conversation_type: row.try_get::<i64, _>(2)? as u8,
                seq: row.try_get(3)?,
                msg_id: row.try_get(4)?,
                content_type: row.try_get::<i64, _>(5)? as u32,
                server_time: row.try_get(6)?,
                sender_id: row.try_get(8)?,
                payload: row.try_get(10)?,
            };
            let recalled = row.try_get::<i64, _>(7)? != 0;
            let key = (stored.sender_id.clone(), row.try_get(9)?);
            found.stored.insert(key, (Arc::new(stored), recalled));
            continue;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = found.heads.entry(id) {
            slot.insert(Head::read(
                id,
                row.try_get::<i64, _>(2)? as u8,
                row.try_get(3)?,
                row.try_get(4)?,
                row.try_get(11)?,
            ));
        }
        if let (Some(lo), Some(hi)) = (
            row.try_get::<Option<String>, _>(9)?,
            row.try_get::<Option<String>, _>(10)?,
        ) {
            found.pairs.insert((lo, hi), id);
        }
        let entry = found.members.entry(id).or_default();
        if let Some(user) = row.try_get::<Option<String>, _>(8)? {
            let left_at = row.try_get::<Option<i64>, _>(5)?;
            member_row(entry, user, left_at, row.try_get(6)?, row.try_get(7)?);
        }
    }
    Ok(found)
}

/// The head and members of a private conversation the batch's own transaction created, as
/// the rows it wrote say: no seq yet, both members current, `blocks` of each the member
/// row's `blocks_peer`.
pub fn created_private(id: i64, blocks: &[(String, i64)]) -> (Head, Members) {
    let mut head = Head::read(id, 1, 0, 0, 0);
    head.created = true;
    let mut members = Members::default();
    for (user, blocks_peer) in blocks {
        member_row(&mut members, user.clone(), None, Some(*blocks_peer), None);
    }
    (head, members)
}

/// A private conversation's membership row, as the rules see it.
fn member_row(
    entry: &mut Members,
    user: String,
    left_at: Option<i64>,
    blocks_peer: Option<i64>,
    state: Option<i64>,
) {
    if left_at.is_none() {
        entry.current.push(user.clone());
    }
    if blocks_peer.unwrap_or(0) != 0 {
        entry.blockers.push(user.clone());
    }
    if state == Some(MEMBER_DELETED) {
        entry.deleted = Some(user.clone());
    }
    entry.any.insert(user, left_at);
}

/// The membership rows of the groups among `heads`: the rows of `actors` (the batch's
/// senders and readers) and the current members, from the cache when the group's version
/// has not moved. Private conversations have theirs already.
pub async fn complete(
    d: Dialect,
    conn: &mut AnyConnection,
    actors: &[(i64, &str)],
    cache: &RecipientCache,
    heads: &mut ByConversation<Head>,
    members: &mut ByConversation<Members>,
) -> Result<(), BatchError> {
    if heads.values().all(|h| h.conversation_type < 2) {
        return Ok(());
    }
    // Groups: their settings, read after the lock is held (a statement that waited for
    // the lock would see the rows it joined as they were before the wait).
    let versions = group_settings(d, conn, heads).await?;
    actor_rows(d, conn, actors, &versions, members).await?;
    group_recipients(d, conn, &versions, cache, members).await?;
    Ok(())
}

/// The settings of the groups among `heads` (mute-all, dissolved), and their versions.
async fn group_settings(
    d: Dialect,
    conn: &mut AnyConnection,
    heads: &mut ByConversation<Head>,
) -> Result<ByConversation<i64>, BatchError> {
    let mut versions = ByConversation::default();
    let groups: Vec<i64> = heads
        .iter()
        .filter(|(_, h)| h.conversation_type >= 2)
        .map(|(id, _)| *id)
        .collect();
    if groups.is_empty() {
        return Ok(versions);
    }
    let keys: Vec<[i64; 1]> = groups.iter().map(|id| [*id]).collect();
    let sql = lookup(
        d,
        "conversation_id, mute_all, state, version",
        "group_info",
        &[("conversation_id", true)],
        "",
    );
    for row in sqlx::query(&sql)
        .bind(json(&keys))
        .fetch_all(&mut *conn)
        .await?
    {
        let id: i64 = row.try_get(0)?;
        if let Some(h) = heads.get_mut(&id) {
            h.mute_all = row.try_get::<i64, _>(1)? != 0;
            h.dissolved = row.try_get::<i64, _>(2)? != 0;
        }
        versions.insert(id, row.try_get(3)?);
    }
    Ok(versions)
}

/// In groups, the membership rows of the batch's senders and readers (role and mute of the
/// current ones).
async fn actor_rows(
    d: Dialect,
    conn: &mut AnyConnection,
    actors: &[(i64, &str)],
    versions: &ByConversation<i64>,
    members: &mut ByConversation<Members>,
) -> Result<(), BatchError> {
    let mut pairs: Vec<(i64, &str)> = actors
        .iter()
        .filter(|(id, _)| versions.contains_key(id))
        .copied()
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    if pairs.is_empty() {
        return Ok(());
    }
    let sql = lookup(
        d,
        "conversation_id, user_id, left_at_seq, role, muted_until",
        "members",
        &[("conversation_id", true), ("user_id", false)],
        "",
    );
    for row in sqlx::query(&sql)
        .bind(json(&pairs))
        .fetch_all(&mut *conn)
        .await?
    {
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
    Ok(())
}

/// In groups, who gets the pushes: the current members, from the cache while the
/// group's version has not moved.
async fn group_recipients(
    d: Dialect,
    conn: &mut AnyConnection,
    versions: &ByConversation<i64>,
    cache: &RecipientCache,
    members: &mut ByConversation<Members>,
) -> Result<(), BatchError> {
    for (&id, &version) in versions {
        let current = match cache.get(id, version) {
            Some(c) => c,
            None => {
                let list: Arc<[String]> = current_members(d, conn, id).await?.into();
                cache.put(id, version, list.clone());
                list
            }
        };
        members.entry(id).or_default().current_arc = Some(current);
    }
    Ok(())
}
