//! Friend requests, friendships and blocks: the queries. The rules live in `social/`.

use std::collections::HashSet;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::{Dialect, Store, json, lookup, shaped_chunks};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    Pending = 0,
    Accepted = 1,
    Rejected = 2,
    Cancelled = 3,
}

impl RequestState {
    fn from_i64(v: i64) -> RequestState {
        match v {
            1 => RequestState::Accepted,
            2 => RequestState::Rejected,
            3 => RequestState::Cancelled,
            _ => RequestState::Pending,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RequestState::Pending => "pending",
            RequestState::Accepted => "accepted",
            RequestState::Rejected => "rejected",
            RequestState::Cancelled => "cancelled",
        }
    }
}

/// The latest friend request in one direction.
#[derive(Debug, Clone)]
pub struct FriendRequest {
    pub request_id: String,
    pub from_user: String,
    pub to_user: String,
    pub message: String,
    pub state: RequestState,
    pub created_at: i64,
    pub updated_at: i64,
}

const REQUEST_COLUMNS: &str =
    "request_id, from_user, to_user, message, state, created_at, updated_at";

fn request_from(r: &AnyRow) -> sqlx::Result<FriendRequest> {
    Ok(FriendRequest {
        request_id: r.try_get(0)?,
        from_user: r.try_get(1)?,
        to_user: r.try_get(2)?,
        message: r.try_get(3)?,
        state: RequestState::from_i64(r.try_get(4)?),
        created_at: r.try_get(5)?,
        updated_at: r.try_get(6)?,
    })
}

/// What a change finds of the users it names (`lock_users`).
#[derive(Debug, Default)]
pub struct Named {
    /// Those whose accounts exist and are not deleted.
    pub live: HashSet<String>,
    /// Those that are a deleted account's alias (the account's deletion acts as its alias).
    pub aliases: HashSet<String>,
}

/// Which of `users` exist, read in the caller's transaction before anything else it reads.
/// On PostgreSQL their rows stay locked `FOR SHARE`, in user order, until it ends: an
/// account's deletion locks its row before it renames anything (`accounts::lock_account`), so it
/// comes wholly before the transaction, which then finds the account deleted, or wholly
/// after it, and renames what the transaction wrote. SQLite's one writer orders them.
pub async fn lock_users(
    d: Dialect,
    conn: &mut AnyConnection,
    users: &[&str],
) -> sqlx::Result<Named> {
    let mut named = Named::default();
    if users.is_empty() {
        return Ok(named);
    }
    let (list, lock) = match d {
        Dialect::Postgres => (
            "SELECT jsonb_array_elements_text(CAST($1 AS jsonb))",
            " ORDER BY user_id FOR SHARE",
        ),
        Dialect::Sqlite => ("SELECT value FROM json_each($1)", ""),
    };
    let sql = format!(
        "SELECT user_id, CASE WHEN deleted_at IS NULL THEN 1 ELSE 0 END, \
         CASE WHEN alias = user_id THEN 1 ELSE 0 END FROM users WHERE user_id IN ({list}){lock}"
    );
    for row in sqlx::query(&sql).bind(json(users)).fetch_all(conn).await? {
        let user: String = row.try_get(0)?;
        if row.try_get::<i64, _>(2)? == 1 {
            named.aliases.insert(user);
        } else if row.try_get::<i64, _>(1)? == 1 {
            named.live.insert(user);
        }
    }
    Ok(named)
}

/// Whether either of two users blocks the other.
pub async fn either_blocks(conn: &mut AnyConnection, a: &str, b: &str) -> sqlx::Result<bool> {
    Ok(sqlx::query(
        "SELECT 1 FROM blocks WHERE active = 1 AND \
         ((blocker = $1 AND blocked = $2) OR (blocker = $2 AND blocked = $1))",
    )
    .bind(a)
    .bind(b)
    .fetch_optional(conn)
    .await?
    .is_some())
}

/// Of `(blocker, blocked)` pairs, those in force.
pub async fn blocked_pairs(
    d: Dialect,
    conn: &mut AnyConnection,
    pairs: &[(String, String)],
) -> sqlx::Result<HashSet<(String, String)>> {
    blocked_pairs_locking(d, conn, pairs, &[]).await
}

/// [`blocked_pairs`], and on PostgreSQL, in the same statement and before it reads, the
/// transaction's shared advisory locks of the keys `locks` (held until it ends; see
/// `batch::creation_locks`).
pub async fn blocked_pairs_locking(
    d: Dialect,
    conn: &mut AnyConnection,
    pairs: &[(String, String)],
    locks: &[i64],
) -> sqlx::Result<HashSet<(String, String)>> {
    let mut sql = lookup(
        d,
        "blocker, blocked",
        "blocks",
        &[("blocker", false), ("blocked", false)],
        "AND active = 1",
    );
    let locking = d == Dialect::Postgres && !locks.is_empty();
    if locking {
        sql = super::batch::sharing_locks(&sql, "$2");
    }
    let mut q = sqlx::query(&sql).bind(json(pairs));
    if locking {
        q = q.bind(json(locks));
    }
    let mut found = HashSet::new();
    for row in q.fetch_all(&mut *conn).await? {
        found.insert((row.try_get(0)?, row.try_get(1)?));
    }
    Ok(found)
}

pub async fn are_friends(conn: &mut AnyConnection, a: &str, b: &str) -> sqlx::Result<bool> {
    Ok(sqlx::query(
        "SELECT 1 FROM friendships WHERE user_id = $1 AND friend_id = $2 AND active = 1",
    )
    .bind(a)
    .bind(b)
    .fetch_optional(conn)
    .await?
    .is_some())
}

pub async fn request_between(
    conn: &mut AnyConnection,
    from: &str,
    to: &str,
) -> sqlx::Result<Option<FriendRequest>> {
    sqlx::query(&format!(
        "SELECT {REQUEST_COLUMNS} FROM friend_requests WHERE from_user = $1 AND to_user = $2"
    ))
    .bind(from)
    .bind(to)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(request_from)
    .transpose()
}

pub async fn request_by_id(
    conn: &mut AnyConnection,
    request_id: &str,
) -> sqlx::Result<Option<FriendRequest>> {
    sqlx::query(&format!(
        "SELECT {REQUEST_COLUMNS} FROM friend_requests WHERE request_id = $1"
    ))
    .bind(request_id)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(request_from)
    .transpose()
}

/// Writes the latest request of its direction.
pub async fn save_request(conn: &mut AnyConnection, r: &FriendRequest) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO friend_requests (request_id, from_user, to_user, message, state, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (from_user, to_user) DO UPDATE SET \
         request_id = excluded.request_id, message = excluded.message, state = excluded.state, \
         created_at = excluded.created_at, updated_at = excluded.updated_at",
    )
    .bind(r.request_id.as_str())
    .bind(r.from_user.as_str())
    .bind(r.to_user.as_str())
    .bind(r.message.as_str())
    .bind(r.state as i64)
    .bind(r.created_at)
    .bind(r.updated_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Sets the friendship of two users on both sides (`since` moves only when it starts).
pub async fn set_friends(
    conn: &mut AnyConnection,
    a: &str,
    b: &str,
    active: bool,
    now: i64,
) -> sqlx::Result<()> {
    for (u, f) in [(a, b), (b, a)] {
        sqlx::query(
            "INSERT INTO friendships (user_id, friend_id, active, since, updated_at) \
             VALUES ($1, $2, $3, $4, $4) ON CONFLICT (user_id, friend_id) DO UPDATE SET \
             active = excluded.active, updated_at = excluded.updated_at, \
             since = CASE WHEN friendships.active = 0 THEN excluded.since ELSE friendships.since END",
        )
        .bind(u)
        .bind(f)
        .bind(i64::from(active))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// What a block or unblock changed.
pub struct BlockChange {
    /// The block itself moved (an event is due).
    pub changed: bool,
    /// The private conversation of the two, whose member row now carries it.
    pub conversation_id: Option<i64>,
}

/// Blocks or unblocks.
pub async fn set_block(
    d: Dialect,
    conn: &mut AnyConnection,
    blocker: &str,
    blocked: &str,
    active: bool,
    now: i64,
) -> sqlx::Result<BlockChange> {
    let pair = super::batch::pair(blocker, blocked);
    if d == Dialect::Postgres {
        // Ordered with a first message that creates the pair's conversation (`pair_lock`).
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(super::batch::pair_lock(&pair))
            .execute(&mut *conn)
            .await?;
    }
    let q = if active {
        sqlx::query(
            "INSERT INTO blocks (blocker, blocked, active, since, updated_at) VALUES ($1, $2, 1, $3, $3) \
             ON CONFLICT (blocker, blocked) DO UPDATE SET active = 1, since = excluded.since, \
             updated_at = excluded.updated_at WHERE blocks.active = 0",
        )
    } else {
        sqlx::query(
            "UPDATE blocks SET active = 0, updated_at = $3 \
             WHERE blocker = $1 AND blocked = $2 AND active = 1",
        )
    };
    let done = q
        .bind(blocker)
        .bind(blocked)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    // The private conversation of the two carries it for sends.
    let (lo, hi) = pair;
    let conversation_id: Option<i64> = sqlx::query(
        "SELECT conversation_id FROM private_pairs WHERE user_lo = $1 AND user_hi = $2",
    )
    .bind(lo)
    .bind(hi)
    .fetch_optional(&mut *conn)
    .await?
    .map(|r| r.try_get(0))
    .transpose()?;
    if let Some(id) = conversation_id {
        sqlx::query(
            "UPDATE members SET blocks_peer = $1 WHERE conversation_id = $2 AND user_id = $3",
        )
        .bind(i64::from(active))
        .bind(id)
        .bind(blocker)
        .execute(conn)
        .await?;
    }
    Ok(BlockChange {
        changed: done.rows_affected() == 1,
        conversation_id,
    })
}

impl Store {
    /// Which of `users` `viewer` may see the presence of: friends, and the other current
    /// members of a group (not a channel) the viewer is a current member of — unless they
    /// block the viewer.
    pub async fn presence_visible(
        &self,
        viewer: &str,
        users: &[String],
    ) -> sqlx::Result<HashSet<String>> {
        let d = self.dialect();
        let mut out = HashSet::new();
        for chunk in shaped_chunks(users) {
            let n = chunk.len();
            let one = |at| super::placeholders(d, at, 1);
            let list = |at| super::placeholders(d, at, n);
            let sql = format!(
                "SELECT v.u FROM (
                   SELECT friend_id AS u FROM friendships
                    WHERE user_id = {} AND active = 1 AND friend_id IN ({})
                   UNION
                   SELECT m2.user_id AS u FROM members m1
                     JOIN conversations c ON c.conversation_id = m1.conversation_id
                     JOIN members m2 ON m2.conversation_id = m1.conversation_id
                    WHERE m1.user_id = {} AND m1.left_at_seq IS NULL AND m1.state = 0
                      AND c.conversation_type = 2
                      AND m2.left_at_seq IS NULL AND m2.state = 0 AND m2.user_id IN ({})
                 ) v
                 WHERE NOT EXISTS (SELECT 1 FROM blocks b
                                    WHERE b.blocker = v.u AND b.blocked = {} AND b.active = 1)",
                one(1),
                list(2),
                one(2 + n),
                list(3 + n),
                one(3 + 2 * n),
            );
            let mut q = sqlx::query(&sql).bind(viewer);
            for u in chunk {
                q = q.bind(u.as_str());
            }
            q = q.bind(viewer);
            for u in chunk {
                q = q.bind(u.as_str());
            }
            for row in q.bind(viewer).fetch_all(self.read()).await? {
                out.insert(row.try_get::<String, _>(0)?);
            }
        }
        Ok(out)
    }

    /// Who hears of `user_id`'s presence changes: its friends, but those it blocks.
    pub async fn presence_audience(&self, user_id: &str) -> sqlx::Result<Vec<String>> {
        sqlx::query(
            "SELECT f.friend_id FROM friendships f
              WHERE f.user_id = $1 AND f.active = 1
                AND NOT EXISTS (SELECT 1 FROM blocks b
                                 WHERE b.blocker = $1 AND b.blocked = f.friend_id AND b.active = 1)",
        )
        .bind(user_id)
        .fetch_all(self.read())
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect()
    }

    /// `(friend, since)`, sorted.
    pub async fn friends(&self, user_id: &str) -> sqlx::Result<Vec<(String, i64)>> {
        self.users_since(
            "SELECT friend_id, since FROM friendships WHERE user_id = $1 AND active = 1 ORDER BY friend_id",
            user_id,
        )
        .await
    }

    /// `(user, since)` rows of a query about one user.
    async fn users_since(&self, sql: &str, user_id: &str) -> sqlx::Result<Vec<(String, i64)>> {
        sqlx::query(sql)
            .bind(user_id)
            .fetch_all(self.read())
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Pending requests to (`incoming`) or from the user, newest first.
    pub async fn pending_requests(
        &self,
        user_id: &str,
        incoming: bool,
    ) -> sqlx::Result<Vec<FriendRequest>> {
        let column = if incoming { "to_user" } else { "from_user" };
        sqlx::query(&format!(
            "SELECT {REQUEST_COLUMNS} FROM friend_requests WHERE {column} = $1 AND state = 0 \
             ORDER BY updated_at DESC, request_id DESC LIMIT 1000"
        ))
        .bind(user_id)
        .fetch_all(self.read())
        .await?
        .iter()
        .map(request_from)
        .collect()
    }

    /// `(blocked, since)`, sorted.
    pub async fn blocks(&self, user_id: &str) -> sqlx::Result<Vec<(String, i64)>> {
        self.users_since(
            "SELECT blocked, since FROM blocks WHERE blocker = $1 AND active = 1 ORDER BY blocked",
            user_id,
        )
        .await
    }
}
