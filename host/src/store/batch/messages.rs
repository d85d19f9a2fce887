//! The writes of a batch (new messages, moved heads, read and delivered positions, recall
//! marks) and the message a recall reads.

use std::collections::HashMap;

use sqlx::{AnyConnection, Row as _};

use super::{BatchError, ByConversation, Head, Pending, classify};
use crate::store::{Dialect, pg_ints, pg_rows, pg_texts, placeholders};

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
    pub heads: (&'a ByConversation<Head>, Heads),
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
    pub versions: ByConversation<i64>,
}

/// Writes what a batch decided so far in one statement (one round trip; on SQLite one call
/// of four, or one per 1,024 rows of each kind): the new messages,
/// the heads (each written only if its last seq and version are still as read, else the
/// statement fails with `BatchError::Stale`), the read and delivered positions (they only
/// move forward, and a read moves the delivered position too); then the recall marks.
/// `opening` starts the statement (SQLite's `BEGIN` when nothing came before it) and
/// `closing` ends it when nothing follows it (SQLite's `COMMIT`, see `BatchTx`). On
/// PostgreSQL its arguments are arrays, a column of rows each (`postgres_columns`), so
/// every batch runs the same prepared statement (with generic plans) whatever its size; on
/// SQLite, which runs in the process and spent a quarter of a send's instructions taking
/// JSON arguments apart, the rows are bound as parameters, in a few prepared shapes
/// (`write_sqlite`).
pub async fn write(
    d: Dialect,
    conn: &mut AnyConnection,
    w: Writes<'_>,
    opening: &str,
    closing: &str,
) -> Result<Written, BatchError> {
    let (heads, which) = w.heads;
    let messages: Vec<MessageRow> = w
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
                i64::from(m.content_type),
                m.payload.as_str(),
                m.server_time,
                i64::from(*counts),
                *acc,
            )
        })
        .collect();
    let heads: Vec<HeadRow> = heads
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
    // Where positions are, read back only for a `received`'s answer.
    let answers = !w.delivered.is_empty();
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
        let rows = match d {
            Dialect::Postgres => {
                let sql = match (opening, closing) {
                    ("", "") => std::borrow::Cow::Borrowed(postgres_write_sql(answers)),
                    _ => std::borrow::Cow::Owned(format!(
                        "{opening}{}{closing}",
                        postgres_write_sql(answers)
                    )),
                };
                postgres_columns(
                    sqlx::query(&sql).bind(w.now),
                    (&heads, &messages, &positions),
                )
                .fetch_all(&mut *conn)
                .await
                .map_err(classify)?
            }
            Dialect::Sqlite => {
                let rows = (&heads[..], &messages[..], &positions[..]);
                write_sqlite(conn, rows, w.now, answers, (opening, closing)).await?
            }
        };
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

/// A new message's row: conversation, seq, msg id, sender, `clientMsgId`, content type,
/// payload, server time, counts toward unread, the running count.
type MessageRow<'a> = (i64, i64, i64, &'a str, &'a str, i64, &'a str, i64, i64, i64);

/// A head's row: id, last seq, count, the last seq and version as read, moved, created by
/// this transaction.
type HeadRow = (i64, i64, i64, i64, i64, i64, i64);

/// A position's row (`positions`).
type PositionRow<'a> = (&'a str, i64, i64, i64, i64, i64);

/// Rows of each kind one SQLite statement of a write takes at most: 22 parameters a row
/// stay within SQLite's 32,766.
const SQLITE_ROWS: usize = 1024;

/// The parameters of a `VALUES` row in SQLite's write: a head (`HeadRow` without
/// `created`), a message (`MessageRow`), a read position (`PositionRow`).
const HEAD_PARAMS: usize = 6;
const MESSAGE_PARAMS: usize = 10;
const POSITION_PARAMS: usize = 6;

/// SQLite's `write`: the rows bound as parameters of `VALUES` lists (`sqlite_write_sql`),
/// in one call of a statement per 1,024 rows of each kind (one for any batch up to that),
/// the first call after `opening` and the last before `closing`. Each list is padded with
/// NULL rows to the next power of two, which the statements skip, so there are eleven
/// sizes of it, each with or without `answers` and the transaction's `BEGIN` and `COMMIT`,
/// and a connection prepares each it meets once (sqlx's cache keeps 100 statements).
async fn write_sqlite(
    conn: &mut AnyConnection,
    (heads, messages, positions): (&[HeadRow], &[MessageRow<'_>], &[PositionRow<'_>]),
    now: i64,
    answers: bool,
    (opening, closing): (&str, &str),
) -> Result<Vec<sqlx::any::AnyRow>, BatchError> {
    let longest = heads.len().max(messages.len()).max(positions.len());
    let calls = longest.div_ceil(SQLITE_ROWS).max(1);
    let mut rows = Vec::new();
    for call in 0..calls {
        let part = |len: usize| (call * SQLITE_ROWS).min(len)..((call + 1) * SQLITE_ROWS).min(len);
        let heads = &heads[part(heads.len())];
        let messages = &messages[part(messages.len())];
        let positions = &positions[part(positions.len())];
        let shape = heads
            .len()
            .max(messages.len())
            .max(positions.len())
            .next_power_of_two();
        let body = sqlite_write_sql(shape, answers);
        let opening = if call == 0 { opening } else { "" };
        let closing = if call + 1 == calls { closing } else { "" };
        let sql = match (opening, closing) {
            ("", "") => std::borrow::Cow::Borrowed(body),
            _ => std::borrow::Cow::Owned(format!("{opening}{body}{closing}")),
        };
        // In the order of the statements' parameters, their number known: the arguments'
        // list is made once at its size, not grown by copying as each is bound.
        let mut args = sqlx::any::AnyArguments::default();
        let positions_bound = 1 + usize::from(answers);
        let count = 2 + shape * (HEAD_PARAMS + MESSAGE_PARAMS + POSITION_PARAMS * positions_bound);
        sqlx::Arguments::reserve(&mut args, count, 0);
        let mut q = sqlx::query_with(&sql, args).bind(now);
        for i in 0..shape {
            q = match heads.get(i) {
                Some(&(id, last, acc, base, version, moved, _)) => q
                    .bind(id)
                    .bind(last)
                    .bind(acc)
                    .bind(base)
                    .bind(version)
                    .bind(moved),
                None => (0..HEAD_PARAMS).fold(q, |q, _| q.bind(None::<i64>)),
            };
        }
        for i in 0..shape {
            q = match messages.get(i) {
                Some(&(
                    conversation,
                    seq,
                    msg_id,
                    sender,
                    client,
                    kind,
                    payload,
                    time,
                    counts,
                    acc,
                )) => q
                    .bind(conversation)
                    .bind(seq)
                    .bind(msg_id)
                    .bind(sender)
                    .bind(client)
                    .bind(kind)
                    .bind(payload)
                    .bind(time)
                    .bind(counts)
                    .bind(acc),
                None => (0..MESSAGE_PARAMS).fold(q, |q, _| q.bind(None::<i64>)),
            };
        }
        if answers {
            q = bind_positions(q, positions, shape);
        }
        q = bind_positions(q.bind(now), positions, shape);
        rows.extend(q.fetch_all(&mut *conn).await.map_err(classify)?);
    }
    Ok(rows)
}

/// Binds `shape` rows of positions, the padding NULL.
fn bind_positions<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    positions: &[PositionRow<'q>],
    shape: usize,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    for i in 0..shape {
        q = match positions.get(i) {
            Some(&(user, conversation, read, acc, delivered, asked)) => q
                .bind(user)
                .bind(conversation)
                .bind(read)
                .bind(acc)
                .bind(delivered)
                .bind(asked),
            None => (0..POSITION_PARAMS).fold(q, |q, _| q.bind(None::<i64>)),
        };
    }
    q
}

/// SQLite's statements of `write` for `shape` rows of each kind (a power of two up to
/// `SQLITE_ROWS`), whose parameters are positional (`placeholders`): now and six a head
/// (as `HeadRow`, without `created`), ten a message, with `answers` six a position, now
/// and six a position again. Statements in one call: one hand-off to the
/// database's thread. The heads first: a head that moved fails the call before anything
/// else is written. `OR FAIL`: a failed statement is never undone on its own (the whole
/// transaction is rolled back), so SQLite keeps no statement journal for it. The positions
/// as they were are read just before they are written (with `answers`, as PostgreSQL's).
/// A padding row is all NULL: it matches no head and no position, and the inserts skip it.
fn sqlite_write_sql(shape: usize, answers: bool) -> &'static str {
    const SHAPES: usize = SQLITE_ROWS.trailing_zeros() as usize + 1;
    static SQL: [[std::sync::OnceLock<String>; 2]; SHAPES] = [const {
        [
            const { std::sync::OnceLock::new() },
            const { std::sync::OnceLock::new() },
        ]
    }; SHAPES];
    debug_assert!(shape.is_power_of_two() && shape <= SQLITE_ROWS);
    SQL[shape.trailing_zeros() as usize][usize::from(answers)].get_or_init(|| {
        // `VALUES` rows of `width` parameters each.
        let values = |width: usize| {
            let row = format!("({})", placeholders(Dialect::Sqlite, 1, width));
            format!("(VALUES {})", vec![row; shape].join(","))
        };
        let (heads, messages, positions) = (
            values(HEAD_PARAMS),
            values(MESSAGE_PARAMS),
            values(POSITION_PARAMS),
        );
        let mut sql = format!(
            "UPDATE OR FAIL conversations SET last_seq = CASE WHEN last_seq = e.column4 \
             AND version = e.column5 THEN e.column2 END, unread_acc = e.column3, \
             last_time = CASE WHEN e.column6 = 1 THEN ? ELSE last_time END \
             FROM {heads} AS e WHERE conversations.conversation_id = e.column1; \
             INSERT OR FAIL INTO messages (conversation_id, seq, msg_id, sender_id, \
             client_msg_id, content_type, payload, server_time, counts_unread, unread_acc) \
             SELECT * FROM {messages} WHERE column1 IS NOT NULL; "
        );
        if answers {
            sql += &format!(
                "SELECT 0, p.user_id, p.conversation_id, max(p.delivered_seq, p.read_seq) \
                 FROM {positions} AS e JOIN read_positions p ON p.user_id = e.column1 \
                 AND p.conversation_id = e.column2 WHERE e.column6 = 1; "
            );
        }
        sql += &UPSERT.replace("GREATEST", "max").replace(
            "{rows}",
            &format!(
                "SELECT column1, column2, column3, column4, column5, ? \
                 FROM {positions} WHERE column1 IS NOT NULL"
            ),
        );
        if answers {
            sql += " RETURNING 1, user_id, conversation_id, delivered_seq";
        }
        sql
    })
}

/// The position rows of a write: (user, conversation, read seq, its running count,
/// delivered seq, 1 where a `received` asked for it), 0 where the batch moves only the
/// other; a read delivers too. Only a `received` is answered with where the position is
/// (`Written::positions`), so only its rows are looked up before the write.
fn positions<'a>(
    reads: &'a HashMap<(String, i64), (i64, i64)>,
    delivered: &'a HashMap<(String, i64), i64>,
) -> Vec<PositionRow<'a>> {
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

/// The read positions' upsert (`{rows}` the rows to write): they only move forward, and
/// a read delivers too.
const UPSERT: &str = "INSERT INTO read_positions (user_id, conversation_id, read_seq, \
     read_acc, delivered_seq, updated_at) {rows} \
     ON CONFLICT (user_id, conversation_id) DO UPDATE SET \
     read_seq = GREATEST(read_positions.read_seq, excluded.read_seq), \
     read_acc = CASE WHEN excluded.read_seq > read_positions.read_seq \
     THEN excluded.read_acc ELSE read_positions.read_acc END, \
     delivered_seq = GREATEST(read_positions.delivered_seq, excluded.delivered_seq), \
     updated_at = excluded.updated_at \
     WHERE excluded.read_seq > read_positions.read_seq \
     OR excluded.delivered_seq > read_positions.delivered_seq";

/// PostgreSQL's arguments of `write` after `$1` (now), a column of rows each in an array's
/// text form: `$2`–`$11` the messages (`MessageRow`, its numbers first), `$12`–`$18` the
/// heads (`HeadRow`), `$19`–`$24` the positions (`PositionRow`).
fn postgres_columns<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    (heads, messages, positions): (&[HeadRow], &[MessageRow<'_>], &[PositionRow<'_>]),
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    let numbers = messages.iter().map(|m| [m.0, m.1, m.2, m.5, m.7, m.8, m.9]);
    let texts = [
        pg_texts(messages.iter().map(|m| m.3)),
        pg_texts(messages.iter().map(|m| m.4)),
        pg_texts(messages.iter().map(|m| m.6)),
    ];
    let heads = heads.iter().map(|h| [h.0, h.1, h.2, h.3, h.4, h.5, h.6]);
    let users = pg_texts(positions.iter().map(|p| p.0));
    let positions = positions.iter().map(|p| [p.1, p.2, p.3, p.4, p.5]);
    let columns = (pg_ints(numbers).into_iter().chain(texts))
        .chain(pg_ints(heads))
        .chain([users])
        .chain(pg_ints(positions));
    for column in columns {
        q = q.bind(column);
    }
    q
}

/// PostgreSQL's statement of `write`, its arguments as `postgres_columns` binds them: the
/// messages' and the positions' rows taken apart by `pg_rows` where they are read (the
/// positions twice with `answers`); the heads' by one `unnest` in `FROM`, joined to
/// `conversations` by hash in the generic plan (their select list measured no faster, and a
/// join could rescan it). A head whose last seq or version is not as read gets a NULL last
/// seq: a NOT NULL violation, which fails the statement (`BatchError::Stale`); the version
/// of a head this transaction created is not compared (none was read, and no one else could
/// move it). It answers the versions of the created heads it wrote (kind 2: PostgreSQL is
/// the only one that creates heads without reading them) and, with `answers` (a `received`
/// asks where a delivered position is), where the delivered positions a `received` asked to
/// move were (kind 0: the greater of delivered and read) and where every position it wrote
/// is (kind 1). Without a `received` in the batch nothing reads those, so that statement
/// neither looks them up nor sends a row back for every read position a send moved. One
/// statement: the inserts and the update run as data-modifying CTEs; the positions as they
/// were come from the statement's snapshot, before its upsert.
fn postgres_write_sql(answers: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 2] = [
        const { std::sync::OnceLock::new() },
        const { std::sync::OnceLock::new() },
    ];
    SQL[usize::from(answers)].get_or_init(|| {
        let messages = pg_rows(
            2,
            &[
                ("conversation_id", "BIGINT"),
                ("seq", "BIGINT"),
                ("msg_id", "BIGINT"),
                ("content_type", "BIGINT"),
                ("server_time", "BIGINT"),
                ("counts_unread", "BIGINT"),
                ("unread_acc", "BIGINT"),
                ("sender_id", "TEXT"),
                ("client_msg_id", "TEXT"),
                ("payload", "TEXT"),
            ],
        );
        let positions = pg_rows(
            19,
            &[
                ("user_id", "TEXT"),
                ("conversation_id", "BIGINT"),
                ("read_seq", "BIGINT"),
                ("read_acc", "BIGINT"),
                ("delivered_seq", "BIGINT"),
                ("asked", "BIGINT"),
            ],
        );
        let upsert = UPSERT.replace(
            "{rows}",
            &format!(
                "SELECT p.user_id, p.conversation_id, p.read_seq, p.read_acc, \
                 p.delivered_seq, $1 FROM {positions} AS p"
            ),
        );
        let mut sql = format!(
            "WITH new_messages AS (INSERT INTO messages (conversation_id, seq, msg_id, \
             sender_id, client_msg_id, content_type, payload, server_time, counts_unread, \
             unread_acc) \
             SELECT m.conversation_id, m.seq, m.msg_id, m.sender_id, m.client_msg_id, \
             m.content_type, m.payload, m.server_time, m.counts_unread, m.unread_acc \
             FROM {messages} AS m), \
             moved_heads AS (UPDATE conversations SET last_seq = CASE \
             WHEN conversations.last_seq = h.base_seq \
             AND (h.created = 1 OR conversations.version = h.version) \
             THEN h.last_seq END, \
             unread_acc = h.unread_acc, last_time = CASE \
             WHEN h.moved = 1 THEN $1 ELSE conversations.last_time END \
             FROM unnest(CAST($12 AS BIGINT[]), CAST($13 AS BIGINT[]), \
             CAST($14 AS BIGINT[]), CAST($15 AS BIGINT[]), CAST($16 AS BIGINT[]), \
             CAST($17 AS BIGINT[]), CAST($18 AS BIGINT[])) \
             AS h(id, last_seq, unread_acc, base_seq, version, moved, created) \
             WHERE conversations.conversation_id = h.id \
             AND conversations.conversation_id = ANY(CAST($12 AS BIGINT[])) \
             RETURNING conversations.conversation_id, conversations.version, h.created), "
        );
        if answers {
            sql += &format!(
                "before AS (SELECT r.user_id, r.conversation_id, r.delivered \
                 FROM {positions} AS p CROSS JOIN LATERAL \
                 (SELECT user_id, conversation_id, \
                 GREATEST(delivered_seq, read_seq) AS delivered FROM read_positions \
                 WHERE user_id = p.user_id AND conversation_id = p.conversation_id \
                 AND p.asked = 1 OFFSET 0) r), moved AS ("
            );
            sql += &upsert;
            sql += " RETURNING user_id, conversation_id, delivered_seq) \
                 SELECT CAST(0 AS BIGINT), b.user_id, b.conversation_id, b.delivered \
                 FROM before b UNION ALL SELECT CAST(1 AS BIGINT), m.user_id, \
                 m.conversation_id, m.delivered_seq FROM moved m UNION ALL ";
        } else {
            sql += "moved AS (";
            sql += &upsert;
            sql += ") ";
        }
        sql + "SELECT CAST(2 AS BIGINT), '', h.conversation_id, h.version \
             FROM moved_heads h WHERE h.created = 1"
    })
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sqlx::Executor as _;

    use super::*;
    use crate::store::{Writer, tests::scratch_store};

    /// A message of `sender` at `seq` of conversation 1, whose payload needs escaping in
    /// any text format.
    fn message(seq: i64, sender: &str) -> (Arc<crate::protocol::Stored>, String, bool, i64) {
        let stored = crate::protocol::Stored {
            conversation_id: 1,
            conversation_type: 1,
            seq,
            msg_id: 1_000 + seq,
            sender_id: sender.into(),
            content_type: 1,
            payload: format!(r#"{{"text":"n°{seq} \"q\" \\ ✓"}}"#),
            server_time: 7,
        };
        (Arc::new(stored), format!("c{seq}"), true, seq)
    }

    /// Writes `pending`, `reads` and `delivered` as one batch with conversation 1's `head`
    /// (checked, as remembered) and commits it, or rolls it back and answers why.
    async fn write_batch(
        store: &crate::store::Store,
        writer: &mut Writer,
        head: &Head,
        pending: &mut Pending,
        reads: &HashMap<(String, i64), (i64, i64)>,
        delivered: &HashMap<(String, i64), i64>,
    ) -> Result<Written, BatchError> {
        let heads = ByConversation::from_iter([(1, head.clone())]);
        let mut tx = store.begin_batch(writer, false).await.unwrap();
        let (opening, closing) = (tx.opening(), tx.closing());
        let w = Writes {
            pending,
            heads: (&heads, Heads::Checked),
            reads,
            delivered,
            now: 9,
        };
        match write(store.dialect(), tx.conn(), w, opening, closing).await {
            Ok(written) => {
                tx.finish(written.committed).await.unwrap();
                Ok(written)
            }
            Err(e) => {
                tx.abort().await;
                Err(e)
            }
        }
    }

    /// More rows than one SQLite statement of a write takes (`SQLITE_ROWS`) go in several
    /// calls of one transaction, and a batch of any size writes each row exactly as given:
    /// 1 message (a padded shape), then 2,500 messages and read positions with a
    /// `received` (the statements that answer where positions are) and a read that moves
    /// an existing position; then two writes that fail and leave nothing of themselves: one
    /// whose 1,300th message reuses a stored `clientMsgId` (a later call fails after an
    /// earlier one wrote), one whose head moved meanwhile.
    #[tokio::test]
    async fn a_write_of_any_size_stores_every_row_as_given() {
        let (dir, store) = scratch_store("write-rows").await;
        writes_every_row_as_given(&store).await;
        let _ = std::fs::remove_dir_all(dir);
        if let Some((store, db)) = crate::store::tests::scratch_postgres("write-rows").await {
            writes_every_row_as_given(&store).await;
            crate::store::tests::drop_postgres(store, db).await;
        }
    }

    async fn writes_every_row_as_given(store: &crate::store::Store) {
        let mut writer = Writer::default();
        let mut head = Head::read(1, 1, 0, 0, 0);
        {
            let mut tx = store.begin_batch(&mut writer, true).await.unwrap();
            tx.conn()
                .execute(
                    "INSERT INTO conversations (conversation_id, conversation_type, last_time, \
                     created_at) VALUES (1, 1, 0, 0)",
                )
                .await
                .unwrap();
            tx.finish(false).await.unwrap();
        }
        let mut next = 1;
        for size in [1, 2_500] {
            let mut pending = Pending::default();
            let mut reads = HashMap::new();
            for seq in next..next + size {
                let sender = format!("u{seq}");
                pending.messages.push(message(seq, &sender));
                reads.insert((sender, 1), (seq, seq + 10_000));
            }
            let mut delivered = HashMap::new();
            if size > 1 {
                // u1 read up to 1 in the first batch; a `received` of a user with no
                // position yet.
                reads.insert(("u1".to_string(), 1), (2_000, 12_000));
                delivered.insert(("r".to_string(), 1), 1_500);
            }
            next += size;
            head.last_seq = next - 1;
            head.unread_acc = next - 1;
            head.dirty = true;
            let written =
                write_batch(store, &mut writer, &head, &mut pending, &reads, &delivered).await;
            let written = written.unwrap();
            if size > 1 {
                let key = ("r".to_string(), 1);
                assert_eq!(written.positions.get(&key), Some(&1_500));
                assert_eq!(written.delivered.get(&key), Some(&1_500));
            }
            head.base_seq = head.last_seq;
        }
        type Row = (i64, i64, String, String, i64, String, i64, i64, i64);
        let stored: Vec<Row> = sqlx::query_as(
            "SELECT seq, msg_id, sender_id, client_msg_id, content_type, payload, server_time, \
             counts_unread, unread_acc FROM messages ORDER BY seq",
        )
        .fetch_all(store.read())
        .await
        .unwrap();
        assert_eq!(stored.len(), 2_501);
        for (i, row) in stored.iter().enumerate() {
            let (m, c, _, acc) = message(i as i64 + 1, &format!("u{}", i + 1));
            let want: Row = (
                m.seq,
                m.msg_id,
                m.sender_id.clone(),
                c,
                1,
                m.payload.clone(),
                7,
                1,
                acc,
            );
            assert_eq!(row, &want);
        }
        let positions: Vec<(String, i64, i64, i64)> =
            sqlx::query_as("SELECT user_id, read_seq, read_acc, delivered_seq FROM read_positions")
                .fetch_all(store.read())
                .await
                .unwrap();
        assert_eq!(positions.len(), 2_502);
        for (user, read, acc, delivered) in positions {
            let want = match user.as_str() {
                "u1" => (2_000, 12_000, 2_000),
                "r" => (0, 0, 1_500),
                u => {
                    let n: i64 = u[1..].parse().unwrap();
                    (n, n + 10_000, n)
                }
            };
            assert_eq!((read, acc, delivered), want, "{user}");
        }
        let heads = || async {
            sqlx::query_scalar::<_, i64>("SELECT last_seq FROM conversations")
                .fetch_one(store.read())
                .await
                .unwrap()
        };
        assert_eq!(heads().await, 2_501);

        // 1,500 messages on a head as it is, the 1,300th a resend of u7's: its call (the
        // second) fails after the first wrote 1,024. Then a head remembered at seq 2,000
        // that has moved since.
        let mut resend = Pending::default();
        for seq in 2_502..4_002 {
            resend.messages.push(message(seq, "v"));
        }
        resend.messages[1_299] = message(7, "u7");
        let mut late = Pending::default();
        late.messages.push(message(2_001, "late"));
        for (mut pending, base, last, conflict) in
            [(resend, 2_501, 4_001, true), (late, 2_000, 2_001, false)]
        {
            (head.base_seq, head.last_seq) = (base, last);
            let none = HashMap::new();
            let failed = write_batch(
                store,
                &mut writer,
                &head,
                &mut pending,
                &none,
                &HashMap::new(),
            )
            .await;
            match conflict {
                true => assert!(matches!(failed, Err(BatchError::Conflict)), "{failed:?}"),
                false => assert!(matches!(failed, Err(BatchError::Stale)), "{failed:?}"),
            }
        }
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages")
            .fetch_one(store.read())
            .await
            .unwrap();
        assert_eq!((count, heads().await), (2_501, 2_501));
        writer.release();
    }
}
