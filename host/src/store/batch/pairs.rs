//! Private conversations by pair: found, or created by a first message.

use std::collections::HashMap;

use sqlx::{AnyConnection, Row as _};

use super::heads::created_private;
use super::{BatchError, ByConversation, Head, Members};
use crate::protocol::Pair;
use crate::store::accounts::existing_users;
use crate::store::{Dialect, json, lookup};

/// The private conversations a batch created: their ids by pair and, on PostgreSQL, their
/// heads and members as the creating statement wrote them (no other transaction sees
/// them before the commit, so the batch does not lock them). On SQLite the batch reads
/// them as it reads the others, a read inside the process.
#[derive(Default)]
pub struct Created {
    pub ids: HashMap<Pair, i64>,
    pub heads: ByConversation<Head>,
    pub members: ByConversation<Members>,
}

/// The key of a pair's lock on PostgreSQL (a transaction-level advisory lock), which orders
/// a block or unblock between the pair's users after, or before, the first message that
/// creates their conversation. The creating statement copies the blocks in force into the
/// new member rows, and a block writes itself into the member row of the conversation if
/// there is one: without the lock, each could miss the other's uncommitted write, leaving
/// a block that sends ignore (or an unblock they do not). The batch takes the lock shared
/// (`creation_locks`) in a statement before the ones that create the conversation (whose
/// snapshots then follow it); a block takes it exclusively before it looks for the
/// conversation; whichever comes second waits for the other's commit and sees its write.
/// (The statement that takes the locks also reads the blocks, with a snapshot from before
/// its wait: a block that committed meanwhile is seen only in the new member rows, and
/// the batch undoes a conversation made for refused sends alone, `uncreate_pairs`.)
/// SQLite has one writer, which orders them already.
///
/// Pairs share `LOCK_KEYS` keys (64-bit FNV-1a of both ids, the same on every node), so
/// a batch of thousands of first messages holds at most that many pair locks (and as many
/// user locks, `user_lock`) in PostgreSQL's shared lock table, where each advisory lock
/// takes a slot until the commit. A block then also waits for a batch creating another
/// pair of its key: one commit at most.
pub fn pair_lock((lo, hi): &Pair) -> i64 {
    // 0xFF is in no UTF-8 text: it ends the first id.
    lock_key(PAIR_LOCK_BASE, lo.bytes().chain([0xFF]).chain(hi.bytes()))
}

/// The key of a user's lock on PostgreSQL, which orders deleting the account after, or
/// before, a first message that creates a conversation with it: the batch takes the locks
/// of the pairs' users with the pairs' (`creation_locks`), before it reads which users
/// exist; the deletion (`accounts::rename_account`) takes it exclusively before it renames
/// the account's pairs and member rows and marks it deleted, the last of its transaction,
/// so it either finds the new pair or the batch finds the account deleted. Users share
/// `LOCK_KEYS` keys of their own.
pub fn user_lock(user: &str) -> i64 {
    lock_key(USER_LOCK_BASE, user.bytes())
}

/// The keys a transaction that may create the private conversations of `pairs` holds
/// shared first (`pair_lock`, `user_lock`), sorted, each once.
pub fn creation_locks(pairs: &[Pair]) -> Vec<i64> {
    let mut keys: Vec<i64> = pairs
        .iter()
        .flat_map(|p| [pair_lock(p), user_lock(&p.0), user_lock(&p.1)])
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// `sql` (a query), taking first, in the same statement and before it reads, the
/// transaction's shared advisory locks of the keys bound as `param` (a JSON array). An
/// uncorrelated condition: evaluated once, before the first row is read. The statement's
/// own snapshot is older than the locks; the transaction's later statements see what
/// committed before they were granted.
pub(crate) fn sharing_locks(sql: &str, param: &str) -> String {
    format!(
        "SELECT x.* FROM ({sql}) x WHERE (SELECT count(pg_advisory_xact_lock_shared(\
         CAST(k AS BIGINT))) FROM jsonb_array_elements_text(CAST({param} AS jsonb)) k) >= 0"
    )
}

/// One of the `LOCK_KEYS` keys from `base`, by the 64-bit FNV-1a of `bytes`.
fn lock_key(base: i64, bytes: impl Iterator<Item = u8>) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    base + (h % LOCK_KEYS) as i64
}

/// How many keys `pair_lock` spreads the pairs over, and `user_lock` the users.
const LOCK_KEYS: u64 = 256;
/// The first pair key: "Courier" in ASCII, then a zero byte (out of the way of small keys
/// another program on the database might lock).
const PAIR_LOCK_BASE: i64 = 0x436f_7572_6965_7200;
/// The first user key, after the pairs'.
const USER_LOCK_BASE: i64 = PAIR_LOCK_BASE + LOCK_KEYS as i64;

/// The private conversations of `pairs` that exist.
pub async fn find_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    pairs: &[Pair],
) -> sqlx::Result<HashMap<Pair, i64>> {
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
    if d == Dialect::Postgres {
        sqlx::query(&sharing_locks("SELECT 1", "$1"))
            .bind(json(&creation_locks(pairs)))
            .execute(&mut *conn)
            .await?;
    }
    let mut found = find_pairs(d, conn, pairs).await?;
    let missing: Vec<Pair> = pairs
        .iter()
        .filter(|p| !found.contains_key(*p))
        .cloned()
        .collect();
    found.extend(create_pairs(d, conn, &missing, now).await?.ids);
    Ok(found)
}

/// Removes private conversations this transaction just created (no message in them yet):
/// their members, pairs and heads.
pub async fn uncreate_pairs(conn: &mut AnyConnection, ids: &[i64]) -> sqlx::Result<()> {
    for id in ids {
        for table in ["members", "private_pairs", "conversations"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE conversation_id = $1"))
                .bind(*id)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

/// What a batch's new private conversations write, from `p(lo, hi, id)` (the pairs and
/// their ids): their heads, their pairs, and both members of each, each member row (`x.u`)
/// saying whether it blocks the other (`x.o`), for blocks made before the conversation
/// existed.
const CREATE: [&str; 3] = [
    "INSERT INTO conversations (conversation_id, conversation_type, last_seq, unread_acc, \
     last_time, created_at) SELECT id, 1, 0, 0, $2, $2 FROM p",
    "INSERT INTO private_pairs (user_lo, user_hi, conversation_id) SELECT lo, hi, id FROM p",
    "INSERT INTO members (conversation_id, user_id, joined_after_seq, left_at_seq, joined_at, \
     blocks_peer) SELECT x.id, x.u, 0, NULL, $2, CASE WHEN EXISTS (SELECT 1 FROM blocks b \
     WHERE b.blocker = x.u AND b.blocked = x.o AND b.active = 1) THEN 1 ELSE 0 END \
     FROM (SELECT id, lo AS u, hi AS o FROM p UNION ALL SELECT id, hi, lo FROM p) x",
];

/// Creates the private conversations of `missing` (pairs without one, of known users that
/// were not deleted): their heads, pairs and members written together, whatever their
/// number (`CREATE`; on PostgreSQL in one statement, on SQLite in one call after their
/// ids are taken). On PostgreSQL the transaction holds their `creation_locks` already,
/// taken by an earlier statement, so what it reads of blocks and deletions follows them. A
/// pair another node created since the batch looked is a unique violation: a conflict, and
/// the batch runs again.
pub async fn create_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    missing: &[Pair],
    now: i64,
) -> Result<Created, BatchError> {
    let mut created = Created::default();
    if missing.is_empty() {
        return Ok(created);
    }
    let mut users: Vec<&str> = missing
        .iter()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    users.sort_unstable();
    users.dedup();
    let known = existing_users(d, conn, &users).await?;
    let new: Vec<&Pair> = missing
        .iter()
        .filter(|(lo, hi)| known.contains(lo) && known.contains(hi))
        .collect();
    if new.is_empty() {
        return Ok(created);
    }
    let (pair, from) = crate::store::groups::elements(d, "$1", &[false, false]);
    match d {
        Dialect::Postgres => {
            // The ids from the sequence, found once (a subquery: as an argument of
            // `nextval` the name would be looked up again for every pair, ten times the
            // cost of the `nextval`); `p` is evaluated once (materialized), so every
            // insert reads the same ids (no foreign key checks them again: migration
            // 0009). Each pair comes back once per member row written.
            let [heads, pairs, members] = CREATE;
            let sql = format!(
                "WITH p(lo, hi, id) AS MATERIALIZED (SELECT {pair}, nextval((SELECT \
                 CAST(pg_get_serial_sequence('conversations', 'conversation_id') AS regclass))) \
                 FROM {from}), c AS ({heads}), pp AS ({pairs}), \
                 m AS ({members} RETURNING conversation_id, user_id, blocks_peer) \
                 SELECT p.lo, p.hi, p.id, m.user_id, m.blocks_peer \
                 FROM p JOIN m ON m.conversation_id = p.id"
            );
            let mut rows: HashMap<i64, Vec<(String, i64)>> = HashMap::new();
            for row in sqlx::query(&sql)
                .bind(json(&new))
                .bind(now)
                .fetch_all(&mut *conn)
                .await?
            {
                let id: i64 = row.try_get(2)?;
                created.ids.insert((row.try_get(0)?, row.try_get(1)?), id);
                rows.entry(id)
                    .or_default()
                    .push((row.try_get(3)?, row.try_get(4)?));
            }
            for (id, blocks) in rows {
                let (head, members) = created_private(id, &blocks);
                created.heads.insert(id, head);
                created.members.insert(id, members);
            }
        }
        Dialect::Sqlite => {
            // The only writer takes the ids after the highest ever given (`AUTOINCREMENT`
            // keeps it in `sqlite_sequence`), and sends them with the pairs.
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
            let sql = CREATE
                .map(|insert| {
                    format!(
                        "WITH p(lo, hi, id) AS (SELECT {pair}, e.value->>2 FROM {from}) {insert}"
                    )
                })
                .join("; ");
            sqlx::query(&sql)
                .bind(json(&rows))
                .bind(now)
                .execute(&mut *conn)
                .await?;
            created.ids.extend(
                rows.into_iter()
                    .map(|(lo, hi, id)| ((lo.into(), hi.into()), id)),
            );
        }
    }
    Ok(created)
}
