//! Read positions: where a reader is and what unread subtracts (`write` moves them).

use sqlx::{AnyConnection, Row as _};

use crate::store::Dialect;

/// The messages unread subtracts from the running counts: recalled ones that counted (a
/// macro so that statements can be put together at compile time).
macro_rules! recalled_counting_sql {
    () => {
        "recalled_by <> 0 AND counts_unread = 1"
    };
}

/// The messages unread subtracts from the running counts (`recalled_counting_sql!`).
pub const RECALLED_COUNTING: &str = recalled_counting_sql!();

/// The table as the statements counting `RECALLED_COUNTING` in a range of seqs read it:
/// on SQLite through the partial index of those messages, by name. SQLite's planner has no
/// statistics (the server runs no `ANALYZE`) and took the primary key for the same range,
/// reading every message in it, large payloads' overflow pages included: 3.3 ms for a range
/// of 10,760 messages of a mega-group audit's database against 0.006 ms by the index.
pub fn recalls_in(d: Dialect) -> &'static str {
    match d {
        Dialect::Sqlite => "messages INDEXED BY messages_recalled_counting",
        Dialect::Postgres => "messages",
    }
}

/// Recalled messages that counted toward unread, in `(after, upto]`: what unread
/// subtracts from the running counts.
pub async fn recalled_counting(
    d: Dialect,
    conn: &mut AnyConnection,
    conversation_id: i64,
    after: i64,
    upto: i64,
) -> sqlx::Result<i64> {
    sqlx::query(&format!(
        "SELECT COUNT(*) FROM {} WHERE conversation_id = $1 AND seq > $2 \
         AND seq <= $3 AND {RECALLED_COUNTING}",
        recalls_in(d)
    ))
    .bind(conversation_id)
    .bind(after)
    .bind(upto)
    .fetch_one(conn)
    .await?
    .try_get(0)
}

/// A user's read position in a conversation: `(read_seq, read_acc)`, `(0, 0)` if none.
pub async fn read_position(
    conn: &mut AnyConnection,
    user_id: &str,
    conversation_id: i64,
) -> sqlx::Result<(i64, i64)> {
    Ok(sqlx::query(
        "SELECT read_seq, read_acc FROM read_positions WHERE user_id = $1 AND conversation_id = $2",
    )
    .bind(user_id)
    .bind(conversation_id)
    .fetch_optional(&mut *conn)
    .await?
    .map(|r| Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?)))
    .transpose()?
    .unwrap_or((0, 0)))
}

/// The running count of counting messages at `seq` (`None`: no message there).
pub async fn acc_at(
    conn: &mut AnyConnection,
    conversation_id: i64,
    seq: i64,
) -> sqlx::Result<Option<i64>> {
    sqlx::query("SELECT unread_acc FROM messages WHERE conversation_id = $1 AND seq = $2")
        .bind(conversation_id)
        .bind(seq)
        .fetch_optional(&mut *conn)
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}
