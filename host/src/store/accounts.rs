//! Users, their revoked tokens, and the server's own secrets.

use std::collections::{HashMap, HashSet};

use sqlx::{AnyConnection, Row as _};

use super::{Dialect, Store, json, lookup};
use crate::clock::now_ms;

/// The start of a deleted account's alias (`rename_account`): no one registers an id that
/// starts with it, and an unknown one is no one's.
pub const DELETED_PREFIX: &str = "deleted-";

/// What authentication needs of an account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccountRow {
    /// Tokens issued before this Unix second are refused.
    pub tokens_valid_from: i64,
    pub deleted: bool,
    /// Tokens revoked one by one (hex id, expiry in Unix seconds), not yet expired.
    pub revoked: Vec<(String, i64)>,
}

/// Which of some users exist (and are not deleted), in one statement however many.
pub async fn existing_users(
    d: Dialect,
    conn: &mut AnyConnection,
    users: &[&str],
) -> sqlx::Result<HashSet<String>> {
    if users.is_empty() {
        return Ok(HashSet::new());
    }
    let keys: Vec<[&str; 1]> = users.iter().map(|u| [*u]).collect();
    let sql = lookup(
        d,
        "user_id",
        "users",
        &[("user_id", false)],
        "AND deleted_at IS NULL",
    );
    sqlx::query(&sql)
        .bind(json(&keys))
        .fetch_all(conn)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect()
}

/// Locks an account's row until the caller's transaction ends, before anything else it
/// reads: a device registration counting the user's devices, an account's deletion
/// (changes naming the account read it `FOR SHARE` first: `social::lock_users`). On
/// SQLite nothing: its one writer orders them.
pub async fn lock_account(d: Dialect, conn: &mut AnyConnection, user: &str) -> sqlx::Result<()> {
    if d == Dialect::Postgres {
        sqlx::query("SELECT 1 FROM users WHERE user_id = $1 FOR UPDATE")
            .bind(user)
            .execute(conn)
            .await?;
    }
    Ok(())
}

impl Store {
    /// Creates a user with a password hash; `false` if the id is taken.
    pub async fn create_user(&self, user_id: &str, password_hash: &str) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT INTO users (user_id, password_hash, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (user_id) DO NOTHING",
        )
        .bind(user_id)
        .bind(password_hash)
        .bind(now_ms())
        .execute(self.write())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `None`: no such user (or a deleted one); `Some(None)`: a user known only from
    /// tokens (no password).
    pub async fn password_hash(&self, user_id: &str) -> sqlx::Result<Option<Option<String>>> {
        let row = sqlx::query(
            "SELECT password_hash FROM users WHERE user_id = $1 AND deleted_at IS NULL",
        )
        .bind(user_id)
        .fetch_optional(self.read())
        .await?;
        row.map(|r| r.try_get::<Option<String>, _>(0)).transpose()
    }

    /// The account of a user seen in a valid token, recording a user first seen that way
    /// (so others can message them).
    pub async fn account(&self, user_id: &str) -> sqlx::Result<AccountRow> {
        // Every statement here is a read or an idempotent insert: safe to run twice.
        self.read_twice(|| self.account_once(user_id)).await
    }

    /// The accounts of `users` that have a row, by user, in two statements however many
    /// (a read each, run again if its connection broke). A user without a row is left
    /// out: `account` says what such a user is.
    pub async fn accounts(&self, users: &[&str]) -> sqlx::Result<HashMap<String, AccountRow>> {
        let mut found = HashMap::new();
        if users.is_empty() {
            return Ok(found);
        }
        let d = self.dialect;
        let keys = json(&users.iter().map(|u| [*u]).collect::<Vec<_>>());
        let by_user = [("user_id", false)];
        let rows = lookup(
            d,
            "user_id, tokens_valid_from, deleted_at",
            "users",
            &by_user,
            "",
        );
        let revoked = lookup(
            d,
            "user_id, token_id, expires_at",
            "revoked_tokens",
            &by_user,
            "",
        );
        let (rows, revoked) = self
            .read_twice(|| async {
                let rows = sqlx::query(&rows)
                    .bind(&keys)
                    .fetch_all(self.read())
                    .await?;
                let revoked = sqlx::query(&revoked)
                    .bind(&keys)
                    .fetch_all(self.read())
                    .await?;
                Ok((rows, revoked))
            })
            .await?;
        for row in rows {
            let account = AccountRow {
                tokens_valid_from: row.try_get(1)?,
                deleted: row.try_get::<Option<i64>, _>(2)?.is_some(),
                revoked: Vec::new(),
            };
            found.insert(row.try_get(0)?, account);
        }
        let now = now_ms() / 1000;
        for row in revoked {
            let (user, token, expires_at): (String, String, i64) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            if let Some(account) = found.get_mut(&user).filter(|_| expires_at >= now) {
                account.revoked.push((token, expires_at));
            }
        }
        Ok(found)
    }

    async fn account_once(&self, user_id: &str) -> sqlx::Result<AccountRow> {
        let row = sqlx::query("SELECT tokens_valid_from, deleted_at FROM users WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(self.read())
            .await?;
        let Some(row) = row else {
            // The aliases of deleted accounts are reserved: a token for an unknown one
            // speaks for no one.
            if user_id.starts_with(DELETED_PREFIX) {
                return Ok(AccountRow {
                    deleted: true,
                    ..AccountRow::default()
                });
            }
            sqlx::query(
                "INSERT INTO users (user_id, password_hash, created_at) VALUES ($1, NULL, $2) \
                 ON CONFLICT (user_id) DO NOTHING",
            )
            .bind(user_id)
            .bind(now_ms())
            .execute(self.write())
            .await?;
            return Ok(AccountRow::default());
        };
        let mut account = AccountRow {
            tokens_valid_from: row.try_get(0)?,
            deleted: row.try_get::<Option<i64>, _>(1)?.is_some(),
            revoked: Vec::new(),
        };
        let now = now_ms() / 1000;
        for r in sqlx::query(
            "SELECT token_id, expires_at FROM revoked_tokens WHERE user_id = $1 AND expires_at >= $2",
        )
        .bind(user_id)
        .bind(now)
        .fetch_all(self.read())
        .await?
        {
            account.revoked.push((r.try_get(0)?, r.try_get(1)?));
        }
        Ok(account)
    }

    /// Revokes one token (hex id) until its expiry; forgets revocations that expired.
    pub async fn revoke_token(
        &self,
        user_id: &str,
        token_id: &str,
        expires_at: i64,
    ) -> sqlx::Result<()> {
        self.pooled(async {
            let mut tx = self.write().begin().await?;
            sqlx::query(
                "INSERT INTO revoked_tokens (token_id, user_id, expires_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (token_id) DO NOTHING",
            )
            .bind(token_id)
            .bind(user_id)
            .bind(expires_at)
            .execute(&mut *tx)
            .await?;
            // Past its exp (and the clock leeway) a token is refused anyway.
            sqlx::query("DELETE FROM revoked_tokens WHERE expires_at < $1")
                .bind(now_ms() / 1000 - 3600)
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        })
        .await?
    }

    /// Refuses every token of the user issued before `valid_from` (Unix seconds), and every
    /// token issued so far: a cut-off already at or past `valid_from` (tokens issued since
    /// the last revoke-all carry it as their `iat`) moves one second further. The cut-off
    /// in force.
    pub async fn revoke_tokens_before(&self, user_id: &str, valid_from: i64) -> sqlx::Result<i64> {
        sqlx::query(
            "UPDATE users SET tokens_valid_from = CASE WHEN tokens_valid_from >= $2 \
             THEN tokens_valid_from + 1 ELSE $2 END WHERE user_id = $1",
        )
        .bind(user_id)
        .bind(valid_from)
        .execute(self.write())
        .await?;
        sqlx::query("SELECT tokens_valid_from FROM users WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(self.write())
            .await?
            .map_or(Ok(valid_from), |r| r.try_get(0))
    }

    /// The cut-off of the user's last revoke-all (Unix seconds; 0: none).
    pub async fn tokens_valid_from(&self, user_id: &str) -> sqlx::Result<i64> {
        sqlx::query("SELECT tokens_valid_from FROM users WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(self.read())
            .await?
            .map_or(Ok(0), |r| r.try_get(0))
    }

    /// Drops a user stream (a deleted account's alias's: no one reads it).
    pub async fn drop_user_stream(&self, user_id: &str) -> sqlx::Result<()> {
        let mut tx = self.write().begin().await?;
        for table in ["user_events", "user_streams"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE user_id = $1"))
                .bind(user_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    /// Whether the user's account was deleted; `None`: no such user.
    pub async fn is_deleted(&self, user_id: &str) -> sqlx::Result<Option<bool>> {
        sqlx::query("SELECT deleted_at FROM users WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(self.read())
            .await?
            .map(|r| r.try_get::<Option<i64>, _>(0).map(|d| d.is_some()))
            .transpose()
    }

    /// The alias of a deleted account (`None`: not deleted, or no such user).
    pub async fn deleted_alias(&self, user_id: &str) -> sqlx::Result<Option<String>> {
        sqlx::query("SELECT alias FROM users WHERE user_id = $1 AND deleted_at IS NOT NULL")
            .bind(user_id)
            .fetch_optional(self.read())
            .await?
            .map(|r| r.try_get(0))
            .transpose()
            .map(Option::flatten)
    }

    /// The secret stored under `name`, storing `fresh` first if there is none. Two servers
    /// starting at once on one database agree on the first one written.
    pub async fn secret_or_insert(&self, name: &str, fresh: &str) -> sqlx::Result<String> {
        sqlx::query(
            "INSERT INTO server_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(fresh)
        .execute(self.write())
        .await?;
        sqlx::query("SELECT value FROM server_secrets WHERE name = $1")
            .bind(name)
            .fetch_one(self.write())
            .await?
            .try_get(0)
    }
}

/// Gives a deleted account's rows its alias: every membership, read position, message,
/// friendship, request and block of `from` becomes `to`'s, its pending join requests go,
/// its devices (and their push tokens) go, its own user stream goes, its private conversations are marked (members.state 4) so
/// sends to them are refused, and the groups it was in move to a new version (their
/// cached member lists name `from`). The `users` row stays as the tombstone: deleted, no
/// password, its alias noted, no token valid. Runs inside the caller's transaction. What
/// a first message to it may be writing at the same moment comes last, under its lock.
pub(crate) async fn rename_account(
    d: Dialect,
    conn: &mut sqlx::AnyConnection,
    from: &str,
    to: &str,
    now: i64,
) -> sqlx::Result<()> {
    // Its pending join requests, its own user stream, its revoked tokens and its devices:
    // no one's now.
    for gone in [
        "group_join_requests WHERE user_id = $1 AND state = 0",
        "user_events WHERE user_id = $1",
        "user_streams WHERE user_id = $1",
        "revoked_tokens WHERE user_id = $1",
        "devices WHERE user_id = $1",
        "device_keys WHERE user_id = $1",
        "one_time_prekeys WHERE user_id = $1",
        "mailbox_entries WHERE user_id = $1",
        "mailbox_heads WHERE user_id = $1",
        "mailbox_sends WHERE sender_id = $1",
    ] {
        sqlx::query(&format!("DELETE FROM {gone}"))
            .bind(from)
            .execute(&mut *conn)
            .await?;
    }
    // Every column naming users but the members' (below).
    const COLUMNS: [(&str, &str); 13] = [
        ("messages", "sender_id"),
        ("mailbox_entries", "sender_id"),
        ("member_intervals", "user_id"),
        ("read_positions", "user_id"),
        ("group_info", "owner_id"),
        ("group_join_requests", "user_id"),
        ("group_join_requests", "decided_by"),
        ("friend_requests", "from_user"),
        ("friend_requests", "to_user"),
        ("friendships", "user_id"),
        ("friendships", "friend_id"),
        ("blocks", "blocker"),
        ("blocks", "blocked"),
    ];
    for (table, column) in COLUMNS {
        sqlx::query(&format!(
            "UPDATE {table} SET {column} = $1 WHERE {column} = $2"
        ))
        .bind(to)
        .bind(from)
        .execute(&mut *conn)
        .await?;
    }
    // What a first message creating a conversation with it writes (its pair, the member
    // rows) and the mark that it is deleted, last: on PostgreSQL after the account's lock
    // (`user_lock`), so a batch holding it has committed and its rows are seen, and a
    // batch waiting for it sees the account deleted. Held from here to the commit only.
    if d == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(super::batch::user_lock(from))
            .execute(&mut *conn)
            .await?;
    }
    // Private pairs are ordered (lo < hi, as `batch::pair` orders, by bytes): rewritten
    // whole, in place, by one statement however many (the alias is in no other pair, so
    // no row meets another's key on the way).
    let mut moved: Vec<(String, String, String, String)> = Vec::new();
    for row in
        sqlx::query("SELECT user_lo, user_hi FROM private_pairs WHERE user_lo = $1 OR user_hi = $1")
            .bind(from)
            .fetch_all(&mut *conn)
            .await?
    {
        let (lo, hi): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        let other = if lo == from { &hi } else { &lo };
        let (new_lo, new_hi) = super::batch::pair(to, other);
        moved.push((lo, hi, new_lo, new_hi));
    }
    if !moved.is_empty() {
        let at = |i| super::groups::element(d, i, false);
        sqlx::query(&format!(
            "UPDATE private_pairs SET user_lo = {}, user_hi = {} FROM {} \
             WHERE private_pairs.user_lo = {} AND private_pairs.user_hi = {}",
            at(2),
            at(3),
            super::groups::elements_from(d, "$1"),
            at(0),
            at(1)
        ))
        .bind(json(&moved))
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query("UPDATE members SET user_id = $1 WHERE user_id = $2")
        .bind(to)
        .bind(from)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE members SET state = $2 WHERE user_id = $1 AND conversation_id IN \
         (SELECT conversation_id FROM conversations WHERE conversation_type = 1)",
    )
    .bind(to)
    .bind(super::batch::MEMBER_DELETED)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE group_info SET version = version + 1, updated_at = $2 WHERE conversation_id IN \
         (SELECT conversation_id FROM members WHERE user_id = $1)",
    )
    .bind(to)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE users SET password_hash = NULL, deleted_at = COALESCE(deleted_at, $2), alias = $3, \
         tokens_valid_from = $4 WHERE user_id = $1",
    )
    .bind(from)
    .bind(now)
    .bind(to)
    .bind(i64::MAX / 2)
    .execute(&mut *conn)
    .await?;
    // The alias is a user id too: its tombstone keeps anyone from taking it.
    sqlx::query(
        "INSERT INTO users (user_id, password_hash, created_at, tokens_valid_from, deleted_at, alias) \
         VALUES ($1, NULL, $2, $3, $2, $1) ON CONFLICT (user_id) DO NOTHING",
    )
    .bind(to)
    .bind(now)
    .bind(i64::MAX / 2)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Keys of stored payloads (tips, friend requests, user-stream events, mentions) whose
/// string values are user ids.
const USER_ID_KEYS: [&str; 10] = [
    "operatorId",
    "userId",
    "userIds",
    "kickedUserIds",
    "fromUserId",
    "toUserId",
    "ownerId",
    "senderId",
    "by",
    "mentions",
];

fn names_users(key: &str) -> bool {
    USER_ID_KEYS.contains(&key)
}

/// Replaces `from` by `to` wherever a user id field of `v` holds it; whether it did.
pub(crate) fn rename_in_json(v: &mut serde_json::Value, from: &str, to: &str) -> bool {
    use serde_json::Value;
    fn ids(v: &mut Value, from: &str, to: &str) -> bool {
        match v {
            Value::String(s) if s == from => {
                *s = to.to_string();
                true
            }
            Value::Array(items) => items.iter_mut().fold(false, |a, i| ids(i, from, to) | a),
            _ => false,
        }
    }
    match v {
        Value::Object(map) => map.iter_mut().fold(false, |changed, (k, v)| {
            let here = if names_users(k) {
                ids(v, from, to)
            } else {
                false
            };
            here | rename_in_json(v, from, to) | changed
        }),
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |a, i| rename_in_json(i, from, to) | a),
        _ => false,
    }
}

/// `text` (stored JSON) with `from` renamed `to` in its user id fields, if it names `from`.
fn renamed(text: &str, from: &str, to: &str) -> Option<String> {
    let mut v: serde_json::Value = serde_json::from_str(text).ok()?;
    rename_in_json(&mut v, from, to).then(|| v.to_string())
}

/// Rows rewritten per transaction by `rename_in_payloads`.
const REWRITE_CHUNK: usize = 256;

impl Store {
    /// Rewrites the user id `from` to `to` inside stored payloads that name it: messages of
    /// the conversations `to` is or was in (tips, mentions) and the user-stream events of
    /// the users who shared a conversation, a friendship or a request with it. In small
    /// transactions, so writers are not held up; safe to run again.
    pub async fn rename_in_payloads(&self, from: &str, to: &str) -> sqlx::Result<u64> {
        let pattern = format!("%\"{from}\"%");
        let locked = self.dialect().for_update();
        let mut rewritten = 0;
        // Its reads on a connection of their own, not held to the deadline for answers
        // (`Health::pooled`): a scan of a long history may take longer. Each is given back
        // before a write takes one: on PostgreSQL both come from one pool, and deletions
        // holding a reader each while waiting for a writer took every connection (eight
        // at once, the default pool, answered 503 after the deadline).
        let conversations: Vec<i64> =
            sqlx::query("SELECT conversation_id FROM members WHERE user_id = $1")
                .bind(to)
                .fetch_all(&mut *self.read().acquire().await?)
                .await?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
        for id in conversations {
            let mut after = 0i64;
            loop {
                let rows = sqlx::query(
                    "SELECT seq FROM messages WHERE conversation_id = $1 AND seq > $2 \
                     AND payload LIKE $3 ORDER BY seq LIMIT $4",
                )
                .bind(id)
                .bind(after)
                .bind(&pattern)
                .bind(REWRITE_CHUNK as i64)
                .fetch_all(&mut *self.read().acquire().await?)
                .await?;
                let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
                    break;
                };
                let first: i64 = first.try_get(0)?;
                after = last.try_get(0)?;
                // Read again in the writing transaction, locked: another account's deletion
                // may have rewritten the same payloads since (a tip naming both).
                let mut tx = self.write().begin().await?;
                let current = sqlx::query(&format!(
                    "SELECT seq, payload FROM messages WHERE conversation_id = $1 \
                     AND seq BETWEEN $2 AND $3 AND payload LIKE $4{locked}"
                ))
                .bind(id)
                .bind(first)
                .bind(after)
                .bind(&pattern)
                .fetch_all(&mut *tx)
                .await?;
                for row in &current {
                    let seq: i64 = row.try_get(0)?;
                    if let Some(payload) = renamed(&row.try_get::<String, _>(1)?, from, to) {
                        sqlx::query(
                            "UPDATE messages SET payload = $1 WHERE conversation_id = $2 AND seq = $3",
                        )
                        .bind(payload)
                        .bind(id)
                        .bind(seq)
                        .execute(&mut *tx)
                        .await?;
                        rewritten += 1;
                    }
                }
                tx.commit().await?;
                if rows.len() < REWRITE_CHUNK {
                    break;
                }
            }
        }
        let related: Vec<String> = sqlx::query(
            "SELECT user_id FROM members WHERE conversation_id IN \
               (SELECT conversation_id FROM members WHERE user_id = $1) \
             UNION SELECT friend_id FROM friendships WHERE user_id = $1 \
             UNION SELECT user_id FROM friendships WHERE friend_id = $1 \
             UNION SELECT from_user FROM friend_requests WHERE to_user = $1 \
             UNION SELECT to_user FROM friend_requests WHERE from_user = $1 \
             UNION SELECT blocker FROM blocks WHERE blocked = $1",
        )
        .bind(to)
        .fetch_all(&mut *self.read().acquire().await?)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
        for user in related.iter().filter(|u| *u != to) {
            let any = sqlx::query(
                "SELECT 1 FROM user_events WHERE user_id = $1 AND data LIKE $2 LIMIT 1",
            )
            .bind(user)
            .bind(&pattern)
            .fetch_optional(&mut *self.read().acquire().await?)
            .await?;
            if any.is_none() {
                continue;
            }
            // Read again in the writing transaction, locked (as the messages above).
            let mut tx = self.write().begin().await?;
            let rows = sqlx::query(&format!(
                "SELECT epoch, seq, data FROM user_events WHERE user_id = $1 AND data LIKE $2{locked}"
            ))
            .bind(user)
            .bind(&pattern)
            .fetch_all(&mut *tx)
            .await?;
            for row in &rows {
                let (epoch, seq): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
                if let Some(data) = renamed(&row.try_get::<String, _>(2)?, from, to) {
                    sqlx::query(
                        "UPDATE user_events SET data = $1 WHERE user_id = $2 AND epoch = $3 AND seq = $4",
                    )
                    .bind(data)
                    .bind(user)
                    .bind(epoch)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                    rewritten += 1;
                }
            }
            tx.commit().await?;
        }
        Ok(rewritten)
    }
}

#[cfg(test)]
mod tests {
    use super::rename_in_json;
    use serde_json::json;

    #[test]
    fn only_user_id_fields_are_renamed() {
        let mut v = json!({
            "operatorId": "alice", "userIds": ["bob", "alice"], "name": "alice",
            "kickedUserIds": ["alice"], "by": "alice", "mentions": ["alice"],
            "text": "hi \"alice\"", "nested": {"fromUserId": "alice", "message": "alice"},
        });
        assert!(rename_in_json(&mut v, "alice", "deleted:1"));
        assert_eq!(
            v,
            json!({
                "operatorId": "deleted:1", "userIds": ["bob", "deleted:1"], "name": "alice",
                "kickedUserIds": ["deleted:1"], "by": "deleted:1", "mentions": ["deleted:1"],
                "text": "hi \"alice\"", "nested": {"fromUserId": "deleted:1", "message": "alice"},
            })
        );
        assert!(!rename_in_json(&mut json!({"name": "alice"}), "alice", "x"));
    }
}
