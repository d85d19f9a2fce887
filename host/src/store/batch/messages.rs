//! The messages of a batch: resends found by `clientMsgId`, new rows written, recalls
//! marked.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::{AnyConnection, Row as _};

use super::{BatchError, Pending, Stored, classify};
use crate::store::{Dialect, shaped_chunks, tuples};
use sqlx::any::AnyRow;

fn stored_from(row: &AnyRow) -> sqlx::Result<Stored> {
    Ok(Stored {
        conversation_id: row.try_get(2)?,
        conversation_type: row.try_get::<i64, _>(3)? as u8,
        seq: row.try_get(4)?,
        msg_id: row.try_get(5)?,
        sender_id: row.try_get(0)?,
        content_type: row.try_get::<i64, _>(6)? as u32,
        payload: row.try_get(7)?,
        server_time: row.try_get(8)?,
    })
}

/// The messages already stored under `(sender, clientMsgId)` keys, and whether each was
/// recalled since.
pub async fn find_stored(
    d: Dialect,
    conn: &mut AnyConnection,
    keys: &[(&str, &str)],
) -> Result<HashMap<(String, String), (Arc<Stored>, bool)>, BatchError> {
    let mut found = HashMap::new();
    for chunk in shaped_chunks(keys) {
        let sql = format!(
            "SELECT m.sender_id, m.client_msg_id, m.conversation_id, c.conversation_type, m.seq, \
             m.msg_id, m.content_type, m.payload, m.server_time, m.recalled_by \
             FROM messages m JOIN conversations c ON c.conversation_id = m.conversation_id \
             WHERE (m.sender_id, m.client_msg_id) IN (VALUES {})",
            tuples(d, chunk.len(), 2)
        );
        let mut q = sqlx::query(&sql);
        for (s, c) in chunk {
            q = q.bind(*s).bind(*c);
        }
        for row in q.fetch_all(&mut *conn).await? {
            let recalled = row.try_get::<i64, _>(9)? != 0;
            found.insert(
                (row.try_get(0)?, row.try_get(1)?),
                (Arc::new(stored_from(&row)?), recalled),
            );
        }
    }
    Ok(found)
}

/// Writes the messages and recall marks collected so far, so the statements that follow
/// in this transaction see them.
pub async fn flush(
    d: Dialect,
    conn: &mut AnyConnection,
    pending: &mut Pending,
) -> Result<(), BatchError> {
    for chunk in shaped_chunks(&pending.messages) {
        let sql = format!(
            "INSERT INTO messages (conversation_id, seq, msg_id, sender_id, client_msg_id, \
             content_type, payload, server_time, counts_unread, unread_acc) VALUES {}",
            tuples(d, chunk.len(), 10)
        );
        let mut q = sqlx::query(&sql);
        for (m, client_msg_id, counts, acc) in chunk {
            q = q
                .bind(m.conversation_id)
                .bind(m.seq)
                .bind(m.msg_id)
                .bind(m.sender_id.as_str())
                .bind(client_msg_id.as_str())
                .bind(i64::from(m.content_type))
                .bind(m.payload.as_str())
                .bind(m.server_time)
                .bind(i64::from(*counts))
                .bind(*acc);
        }
        q.execute(&mut *conn).await.map_err(classify)?;
    }
    pending.messages.clear();
    for (conversation_id, target, by) in pending.recalls.drain(..) {
        sqlx::query("UPDATE messages SET recalled_by = $1 WHERE conversation_id = $2 AND seq = $3")
            .bind(by)
            .bind(conversation_id)
            .bind(target)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
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
