//! Groups and channels: the queries. Every change runs under the lock of the group's
//! head row (the same lock sends take), so membership intervals and tips get their seqs
//! in commit order. The rules live in `social/groups.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::batch::Stored;
use super::{Dialect, Store, json, lines, lines_of, lookup};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Member = 0,
    Admin = 1,
    Owner = 2,
}

impl Role {
    pub fn from_i64(v: i64) -> Role {
        match v {
            2 => Role::Owner,
            1 => Role::Admin,
            _ => Role::Member,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }
}

/// How a membership stands (or ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Member = 0,
    Left = 1,
    Kicked = 2,
    Dissolved = 3,
}

impl MemberState {
    fn from_i64(v: i64) -> MemberState {
        match v {
            1 => MemberState::Left,
            2 => MemberState::Kicked,
            3 => MemberState::Dissolved,
            _ => MemberState::Member,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Member => "member",
            MemberState::Left => "left",
            MemberState::Kicked => "kicked",
            MemberState::Dissolved => "dissolved",
        }
    }
}

pub use super::Head;

#[derive(Debug, Clone)]
pub struct Group {
    pub conversation_id: i64,
    pub conversation_type: u8,
    pub owner_id: String,
    pub name: String,
    pub notice: String,
    pub avatar: String,
    pub join_policy: String,
    pub mute_all: bool,
    pub dissolved: bool,
    pub member_count: i64,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone)]
pub struct Member {
    pub user_id: String,
    pub role: Role,
    pub state: MemberState,
    pub joined_after_seq: i64,
    pub left_at_seq: Option<i64>,
    pub muted_until: i64,
    pub joined_at: i64,
}

impl Member {
    pub fn is_current(&self) -> bool {
        self.left_at_seq.is_none()
    }
}

const GROUP_COLUMNS: &str = "g.conversation_id, c.conversation_type, g.owner_id, g.name, g.notice, \
     g.avatar, g.join_policy, g.mute_all, g.state, g.member_count, g.version, g.created_at, g.updated_at";

fn group_from(r: &AnyRow) -> sqlx::Result<Group> {
    Ok(Group {
        conversation_id: r.try_get(0)?,
        conversation_type: r.try_get::<i64, _>(1)? as u8,
        owner_id: r.try_get(2)?,
        name: r.try_get(3)?,
        notice: r.try_get(4)?,
        avatar: r.try_get(5)?,
        join_policy: r.try_get(6)?,
        mute_all: r.try_get::<i64, _>(7)? != 0,
        dissolved: r.try_get::<i64, _>(8)? != 0,
        member_count: r.try_get(9)?,
        version: r.try_get(10)?,
        created_at: r.try_get(11)?,
        updated_at: r.try_get(12)?,
    })
}

const MEMBER_COLUMNS: &str =
    "m.user_id, m.role, m.state, m.joined_after_seq, m.left_at_seq, m.muted_until, m.joined_at";

fn member_from(r: &AnyRow, first: usize) -> sqlx::Result<Member> {
    Ok(Member {
        user_id: r.try_get(first)?,
        role: Role::from_i64(r.try_get(first + 1)?),
        state: MemberState::from_i64(r.try_get(first + 2)?),
        joined_after_seq: r.try_get(first + 3)?,
        left_at_seq: r.try_get(first + 4)?,
        muted_until: r.try_get(first + 5)?,
        joined_at: r.try_get(first + 6)?,
    })
}

/// Locks a conversation's head row.
pub async fn lock_head(
    d: Dialect,
    conn: &mut AnyConnection,
    conversation_id: i64,
) -> sqlx::Result<Option<Head>> {
    let lock = d.for_update();
    sqlx::query(&format!(
        "SELECT conversation_type, last_seq, unread_acc, version FROM conversations \
         WHERE conversation_id = $1{lock}"
    ))
    .bind(conversation_id)
    .fetch_optional(conn)
    .await?
    .map(|r| {
        Ok(Head::read(
            conversation_id,
            r.try_get::<i64, _>(0)? as u8,
            r.try_get(1)?,
            r.try_get(2)?,
            r.try_get(3)?,
        ))
    })
    .transpose()
}

/// A new group or channel with its head row.
pub async fn create_group(conn: &mut AnyConnection, g: &Group) -> sqlx::Result<Head> {
    let id: i64 = sqlx::query(
        "INSERT INTO conversations (conversation_type, last_seq, unread_acc, last_time, created_at) \
         VALUES ($1, 0, 0, $2, $2) RETURNING conversation_id",
    )
    .bind(i64::from(g.conversation_type))
    .bind(g.created_at)
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    write_group(
        conn,
        &Group {
            conversation_id: id,
            ..g.clone()
        },
    )
    .await?;
    Ok(Head::read(id, g.conversation_type, 0, 0, 0))
}

pub async fn group_in(
    conn: &mut AnyConnection,
    conversation_id: i64,
) -> sqlx::Result<Option<Group>> {
    sqlx::query(&format!(
        "SELECT {GROUP_COLUMNS} FROM group_info g JOIN conversations c \
         ON c.conversation_id = g.conversation_id WHERE g.conversation_id = $1"
    ))
    .bind(conversation_id)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(group_from)
    .transpose()
}

/// Writes a group's settings back, one version later.
pub async fn save_group(conn: &mut AnyConnection, g: &mut Group, now: i64) -> sqlx::Result<()> {
    g.version += 1;
    g.updated_at = now;
    write_group(conn, g).await
}

/// Writes a group row as it is (new or not).
async fn write_group(conn: &mut AnyConnection, g: &Group) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO group_info (conversation_id, owner_id, name, notice, avatar, join_policy, \
         mute_all, state, member_count, version, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
         ON CONFLICT (conversation_id) DO UPDATE SET owner_id = excluded.owner_id, \
         name = excluded.name, notice = excluded.notice, avatar = excluded.avatar, \
         join_policy = excluded.join_policy, mute_all = excluded.mute_all, state = excluded.state, \
         member_count = excluded.member_count, version = excluded.version, \
         updated_at = excluded.updated_at",
    )
    .bind(g.conversation_id)
    .bind(g.owner_id.as_str())
    .bind(g.name.as_str())
    .bind(g.notice.as_str())
    .bind(g.avatar.as_str())
    .bind(g.join_policy.as_str())
    .bind(i64::from(g.mute_all))
    .bind(i64::from(g.dissolved))
    .bind(g.member_count)
    .bind(g.version)
    .bind(g.created_at)
    .bind(g.updated_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// The membership rows of some users (current or not), in one statement however many.
pub async fn members_in(
    d: Dialect,
    conn: &mut AnyConnection,
    conversation_id: i64,
    users: &[&str],
) -> sqlx::Result<HashMap<String, Member>> {
    let mut out = HashMap::new();
    if users.is_empty() {
        return Ok(out);
    }
    let keys: Vec<(i64, &str)> = users.iter().map(|u| (conversation_id, *u)).collect();
    let sql = lookup(
        d,
        &MEMBER_COLUMNS.replace("m.", ""),
        "members",
        &[("conversation_id", true), ("user_id", false)],
        "",
    );
    for r in sqlx::query(&sql)
        .bind(json(&keys))
        .fetch_all(&mut *conn)
        .await?
    {
        let m = member_from(&r, 0)?;
        out.insert(m.user_id.clone(), m);
    }
    Ok(out)
}

/// A conversation's current members' ids, read as one row however many ([`lines_of`]).
pub async fn current_members(
    d: Dialect,
    conn: &mut AnyConnection,
    conversation_id: i64,
) -> sqlx::Result<Vec<String>> {
    let joined: Option<String> = sqlx::query(&format!(
        "SELECT {} FROM members WHERE conversation_id = $1 AND left_at_seq IS NULL",
        lines_of(d, "user_id")
    ))
    .bind(conversation_id)
    .fetch_one(conn)
    .await?
    .try_get(0)?;
    Ok(lines(joined))
}

/// The current owner and admins.
pub async fn admins_in(
    conn: &mut AnyConnection,
    conversation_id: i64,
) -> sqlx::Result<Vec<String>> {
    sqlx::query(
        "SELECT user_id FROM members WHERE conversation_id = $1 AND left_at_seq IS NULL \
         AND role >= $2",
    )
    .bind(conversation_id)
    .bind(Role::Admin as i64)
    .fetch_all(conn)
    .await?
    .iter()
    .map(|r| r.try_get(0))
    .collect()
}

/// Appends a message the server emits (a tip) under the locked head; it never counts
/// toward unread and is never recallable.
pub async fn append_system(
    conn: &mut AnyConnection,
    head: &mut Head,
    sender_id: &str,
    content_type: u32,
    payload: String,
    msg_id: i64,
    now: i64,
) -> sqlx::Result<Arc<Stored>> {
    head.last_seq += 1;
    let stored = Stored {
        conversation_id: head.conversation_id,
        conversation_type: head.conversation_type,
        seq: head.last_seq,
        msg_id,
        sender_id: sender_id.to_string(),
        content_type,
        payload,
        server_time: now,
    };
    sqlx::query(
        "INSERT INTO messages (conversation_id, seq, msg_id, sender_id, client_msg_id, content_type, \
         payload, server_time, counts_unread, unread_acc, system) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, $9, 1)",
    )
    .bind(stored.conversation_id)
    .bind(stored.seq)
    .bind(stored.msg_id)
    .bind(stored.sender_id.as_str())
    .bind(format!("system:{msg_id}"))
    .bind(i64::from(content_type))
    .bind(stored.payload.as_str())
    .bind(now)
    .bind(head.unread_acc)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE conversations SET last_seq = $1, last_time = $2 WHERE conversation_id = $3",
    )
    .bind(head.last_seq)
    .bind(now)
    .bind(head.conversation_id)
    .execute(&mut *conn)
    .await?;
    Ok(Arc::new(stored))
}

/// Opens a membership interval after `joined_after_seq` for each of `joining` (distinct
/// users, each with their role), closing a user's previous one into `member_intervals`, and
/// moves their read positions there so nothing earlier counts as unread. `previous` holds
/// their membership rows as read under the head's lock (a user without one never was a
/// member). Three statements at most, however many join.
pub async fn open_memberships(
    d: Dialect,
    conn: &mut AnyConnection,
    head: &Head,
    joining: &[(&str, Role)],
    previous: &HashMap<String, Member>,
    joined_after_seq: i64,
    now: i64,
) -> sqlx::Result<()> {
    if joining.is_empty() {
        return Ok(());
    }
    // An empty interval (a channel left before anything was posted) is not kept.
    let closed: Vec<(&str, i64, i64)> = joining
        .iter()
        .filter_map(|(u, _)| {
            let m = previous.get(*u)?;
            let left = m.left_at_seq.filter(|&left| left > m.joined_after_seq)?;
            Some((*u, m.joined_after_seq, left))
        })
        .collect();
    if !closed.is_empty() {
        let (values, from) = elements(d, "$2", &[false, true, true]);
        sqlx::query(&format!(
            "INSERT INTO member_intervals (conversation_id, user_id, joined_after_seq, left_at_seq) \
             SELECT $1, {values} FROM {from} WHERE true \
             ON CONFLICT (conversation_id, user_id, joined_after_seq) \
             DO UPDATE SET left_at_seq = excluded.left_at_seq \
             WHERE excluded.left_at_seq > member_intervals.left_at_seq"
        ))
        .bind(head.conversation_id)
        .bind(json(&closed))
        .execute(&mut *conn)
        .await?;
    }
    // A new row, or the previous one reopened as a new membership.
    let roles: Vec<(&str, i64)> = joining.iter().map(|(u, r)| (*u, *r as i64)).collect();
    let (values, from) = elements(d, "$2", &[false, true]);
    sqlx::query(&format!(
        "INSERT INTO members (conversation_id, user_id, role, joined_after_seq, joined_at) \
         SELECT $1, {values}, $3, $4 FROM {from} WHERE true \
         ON CONFLICT (conversation_id, user_id) DO UPDATE SET \
         joined_after_seq = excluded.joined_after_seq, left_at_seq = NULL, role = excluded.role, \
         push_muted = 0, \
         muted_until = 0, state = 0, joined_at = excluded.joined_at"
    ))
    .bind(head.conversation_id)
    .bind(json(&roles))
    .bind(joined_after_seq)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    // Read up to the head: tips do not count, so the running count there is the one at
    // the join.
    let users: Vec<[&str; 1]> = joining.iter().map(|(u, _)| [*u]).collect();
    let (values, from) = elements(d, "$1", &[false]);
    sqlx::query(&format!(
        "INSERT INTO read_positions (user_id, conversation_id, read_seq, read_acc, updated_at) \
         SELECT {values}, $2, $3, $4, $5 FROM {from} WHERE true \
         ON CONFLICT (user_id, conversation_id) DO UPDATE SET \
         read_seq = excluded.read_seq, read_acc = excluded.read_acc, updated_at = excluded.updated_at \
         WHERE excluded.read_seq > read_positions.read_seq"
    ))
    .bind(json(&users))
    .bind(head.conversation_id)
    .bind(head.last_seq)
    .bind(head.unread_acc)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// For an `INSERT … SELECT` of the tuples of the JSON array `arg` (`[[a, b], …]`): their
/// values as columns (`true` for an integer one) and the `FROM` that yields them.
pub(super) fn elements(d: Dialect, arg: &str, ints: &[bool]) -> (String, String) {
    let columns: Vec<String> = ints
        .iter()
        .enumerate()
        .map(|(i, int)| element(d, i, *int))
        .collect();
    (columns.join(", "), elements_from(d, arg))
}

/// The value at index `i` of a tuple that `elements_from` yields (`int`: as an integer).
pub(super) fn element(d: Dialect, i: usize, int: bool) -> String {
    match (d, int) {
        (Dialect::Postgres, true) => format!("CAST(e->>{i} AS BIGINT)"),
        (Dialect::Postgres, false) => format!("e->>{i}"),
        (Dialect::Sqlite, _) => format!("e.value->>{i}"),
    }
}

/// The `FROM` item yielding the tuples of the JSON array `arg`, each as `e`.
pub(super) fn elements_from(d: Dialect, arg: &str) -> String {
    match d {
        Dialect::Postgres => format!("jsonb_array_elements(CAST({arg} AS jsonb)) e"),
        Dialect::Sqlite => format!("json_each({arg}) e"),
    }
}

/// Closes the current membership of `user` at `left_at_seq` (the member still sees that
/// seq), or with `None` every current membership of the conversation (a dissolution: one
/// statement, where a dissolved group of 10,000 members was 10,000 of them, 2.7–2.9 s on
/// PostgreSQL). A kick closes its users one by one: one statement over the list was
/// planned by PostgreSQL as a nested loop over the list for every member (232 ms for 100
/// users of a 10,000-member group).
pub async fn close_membership(
    conn: &mut AnyConnection,
    conversation_id: i64,
    user: Option<&str>,
    left_at_seq: i64,
    state: MemberState,
) -> sqlx::Result<()> {
    let one = if user.is_some() {
        " AND user_id = $4"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE members SET left_at_seq = $1, state = $2, role = 0, muted_until = 0 \
         WHERE conversation_id = $3 AND left_at_seq IS NULL{one}"
    );
    let mut q = sqlx::query(&sql)
        .bind(left_at_seq)
        .bind(state as i64)
        .bind(conversation_id);
    if let Some(user) = user {
        q = q.bind(user);
    }
    q.execute(conn).await?;
    Ok(())
}

pub async fn set_role(
    conn: &mut AnyConnection,
    conversation_id: i64,
    user_id: &str,
    role: Role,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE members SET role = $1 WHERE conversation_id = $2 AND user_id = $3")
        .bind(role as i64)
        .bind(conversation_id)
        .bind(user_id)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn set_muted(
    conn: &mut AnyConnection,
    conversation_id: i64,
    user_id: &str,
    until: i64,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE members SET muted_until = $1 WHERE conversation_id = $2 AND user_id = $3")
        .bind(until)
        .bind(conversation_id)
        .bind(user_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// A join request: the latest per (group, user).
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub request_id: String,
    pub user_id: String,
    pub message: String,
    pub state: JoinState,
    pub created_at: i64,
}

/// Where a join request stands (stored as 0, 1, 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinState {
    Pending = 0,
    Approved = 1,
    Rejected = 2,
}

impl JoinState {
    fn from_i64(v: i64) -> JoinState {
        match v {
            1 => JoinState::Approved,
            2 => JoinState::Rejected,
            _ => JoinState::Pending,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JoinState::Pending => "pending",
            JoinState::Approved => "approved",
            JoinState::Rejected => "rejected",
        }
    }
}

pub async fn join_request(
    conn: &mut AnyConnection,
    conversation_id: i64,
    user_id: &str,
) -> sqlx::Result<Option<JoinRequest>> {
    sqlx::query(
        "SELECT request_id, user_id, message, state, created_at FROM group_join_requests \
         WHERE conversation_id = $1 AND user_id = $2",
    )
    .bind(conversation_id)
    .bind(user_id)
    .fetch_optional(conn)
    .await?
    .map(|r| join_request_from(&r))
    .transpose()
}

/// The pending join requests of some users, in one statement however many.
pub async fn pending_join_requests_of(
    d: Dialect,
    conn: &mut AnyConnection,
    conversation_id: i64,
    users: &[&str],
) -> sqlx::Result<HashMap<String, JoinRequest>> {
    let mut out = HashMap::new();
    if users.is_empty() {
        return Ok(out);
    }
    let keys: Vec<(i64, &str)> = users.iter().map(|u| (conversation_id, *u)).collect();
    let sql = lookup(
        d,
        "request_id, user_id, message, state, created_at",
        "group_join_requests",
        &[("conversation_id", true), ("user_id", false)],
        "AND state = 0",
    );
    for r in sqlx::query(&sql)
        .bind(json(&keys))
        .fetch_all(&mut *conn)
        .await?
    {
        let r = join_request_from(&r)?;
        out.insert(r.user_id.clone(), r);
    }
    Ok(out)
}

fn join_request_from(r: &AnyRow) -> sqlx::Result<JoinRequest> {
    Ok(JoinRequest {
        request_id: r.try_get(0)?,
        user_id: r.try_get(1)?,
        message: r.try_get(2)?,
        state: JoinState::from_i64(r.try_get(3)?),
        created_at: r.try_get(4)?,
    })
}

pub async fn save_join_request(
    conn: &mut AnyConnection,
    conversation_id: i64,
    r: &JoinRequest,
    decided_by: Option<&str>,
    now: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO group_join_requests (conversation_id, user_id, request_id, message, state, \
         decided_by, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (conversation_id, user_id) DO UPDATE SET request_id = excluded.request_id, \
         message = excluded.message, state = excluded.state, decided_by = excluded.decided_by, \
         created_at = excluded.created_at, updated_at = excluded.updated_at",
    )
    .bind(conversation_id)
    .bind(r.user_id.as_str())
    .bind(r.request_id.as_str())
    .bind(r.message.as_str())
    .bind(r.state as i64)
    .bind(decided_by)
    .bind(r.created_at)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// A user's pending join requests in every group, with each group's conversation type
/// (inside a change).
pub async fn pending_join_requests_by(
    conn: &mut AnyConnection,
    user_id: &str,
) -> sqlx::Result<Vec<(i64, i64, JoinRequest)>> {
    sqlx::query(
        "SELECT r.request_id, r.user_id, r.message, r.state, r.created_at, r.conversation_id, \
         c.conversation_type FROM group_join_requests r \
         JOIN conversations c ON c.conversation_id = r.conversation_id \
         WHERE r.user_id = $1 AND r.state = 0 ORDER BY r.conversation_id",
    )
    .bind(user_id)
    .fetch_all(conn)
    .await?
    .iter()
    .map(|r| Ok((r.try_get(5)?, r.try_get(6)?, join_request_from(r)?)))
    .collect()
}

/// A group's pending join requests (inside a change).
pub async fn pending_join_requests_in(
    conn: &mut AnyConnection,
    conversation_id: i64,
) -> sqlx::Result<Vec<JoinRequest>> {
    sqlx::query(
        "SELECT request_id, user_id, message, state, created_at FROM group_join_requests \
         WHERE conversation_id = $1 AND state = 0 ORDER BY created_at, user_id",
    )
    .bind(conversation_id)
    .fetch_all(conn)
    .await?
    .iter()
    .map(join_request_from)
    .collect()
}

impl Store {
    pub async fn group(&self, conversation_id: i64) -> sqlx::Result<Option<Group>> {
        self.pooled(async {
            let mut conn = self.read().acquire().await?;
            group_in(&mut conn, conversation_id).await
        })
        .await?
    }

    /// The user's membership row of a conversation.
    pub async fn member(
        &self,
        conversation_id: i64,
        user_id: &str,
    ) -> sqlx::Result<Option<Member>> {
        self.pooled(async {
            let mut conn = self.read().acquire().await?;
            Ok(
                members_in(self.dialect(), &mut conn, conversation_id, &[user_id])
                    .await?
                    .remove(user_id),
            )
        })
        .await?
    }

    /// Every group and channel the user is or was in, most recently changed first.
    pub async fn my_groups(&self, user_id: &str) -> sqlx::Result<Vec<(Group, Member)>> {
        sqlx::query(&format!(
            "SELECT {GROUP_COLUMNS}, {MEMBER_COLUMNS} FROM members m \
             JOIN group_info g ON g.conversation_id = m.conversation_id \
             JOIN conversations c ON c.conversation_id = g.conversation_id \
             WHERE m.user_id = $1 ORDER BY g.updated_at DESC, g.conversation_id DESC LIMIT 5000"
        ))
        .bind(user_id)
        .fetch_all(self.read())
        .await?
        .iter()
        .map(|r| Ok((group_from(r)?, member_from(r, 13)?)))
        .collect()
    }

    /// Current members after `after` (by user id), at most `limit`.
    pub async fn group_members(
        &self,
        conversation_id: i64,
        after: &str,
        limit: i64,
    ) -> sqlx::Result<Vec<Member>> {
        sqlx::query(&format!(
            "SELECT {MEMBER_COLUMNS} FROM members m WHERE m.conversation_id = $1 \
             AND m.left_at_seq IS NULL AND m.user_id > $2 ORDER BY m.user_id LIMIT $3"
        ))
        .bind(conversation_id)
        .bind(after)
        .bind(limit)
        .fetch_all(self.read())
        .await?
        .iter()
        .map(|r| member_from(r, 0))
        .collect()
    }

    pub async fn pending_join_requests(
        &self,
        conversation_id: i64,
    ) -> sqlx::Result<Vec<JoinRequest>> {
        self.pooled(async {
            let mut conn = self.read().acquire().await?;
            pending_join_requests_in(&mut conn, conversation_id).await
        })
        .await?
    }
}
