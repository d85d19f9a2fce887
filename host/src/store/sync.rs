//! What a device reads to catch up: pulls by seq, the conversation overview, read
//! positions. Every read is bounded by the reader's membership interval.

use std::collections::HashMap;

use sqlx::Row as _;
use sqlx::any::AnyRow;

use super::batch::{RECALLED_COUNTING, Stored, recalls_in};
use super::{Dialect, Store, json, lines, lines_of};
use crate::protocol::{Pair, Refused};

/// A member's view of one conversation: what seqs they may read.
#[derive(Debug, Clone)]
pub struct Membership {
    pub conversation_type: u8,
    pub last_seq: i64,
    /// The latest interval: the member sees seq in
    /// `(joined_after_seq, left_at_seq.unwrap_or(last_seq)]`.
    pub joined_after_seq: i64,
    pub left_at_seq: Option<i64>,
    /// Earlier intervals `(after, upto]` of a member who left and joined again, ascending.
    pub earlier: Vec<(i64, i64)>,
}

impl Membership {
    pub fn visible_end(&self) -> i64 {
        visible_end(self.last_seq, self.left_at_seq)
    }

    pub fn is_current(&self) -> bool {
        self.left_at_seq.is_none()
    }

    /// Every visible interval `(after, upto]`, ascending.
    pub fn intervals(&self) -> Vec<(i64, i64)> {
        let mut v = self.earlier.clone();
        v.push((self.joined_after_seq, self.visible_end()));
        v
    }

    /// Whether some visible seq is above `seq`.
    pub fn visible_after(&self, seq: i64) -> bool {
        self.intervals().iter().any(|&(lo, hi)| hi > seq.max(lo))
    }

    /// Whether some visible seq is below `seq`.
    pub fn visible_before(&self, seq: i64) -> bool {
        self.intervals()
            .iter()
            .any(|&(lo, hi)| lo + 1 < seq && lo < hi)
    }
}

/// A stored message as a reader sees it.
#[derive(Debug, Clone)]
pub struct MessageRow {
    /// Its payload is empty once recalled (not read from the database).
    pub message: Stored,
    /// The seq of the recall event, 0 if not recalled.
    pub recalled_by: i64,
}

impl MessageRow {
    /// The payload, `None` once recalled.
    pub fn payload(&self) -> Option<&str> {
        (self.recalled_by == 0).then_some(self.message.payload.as_str())
    }
}

/// A conversation as live sends see it.
#[derive(Debug, Clone)]
pub struct LiveMembers {
    pub conversation_type: u8,
    pub members: Vec<String>,
    /// Members with a role or a mute: `(role, muted_until)`.
    pub roles: std::collections::HashMap<String, (i64, i64)>,
    pub mute_all: bool,
    /// Private conversations: the member who blocks the other, if any.
    pub blockers: Vec<String>,
    /// Private conversations: the member whose account was deleted (its alias), if any.
    pub deleted: Option<String>,
}

#[derive(Debug, Clone)]
pub struct OverviewRow {
    pub conversation_id: i64,
    pub conversation_type: u8,
    /// The other party of a private conversation.
    pub peer_id: Option<String>,
    pub last_seq: i64,
    pub read_seq: i64,
    pub unread: i64,
    pub last_time: i64,
    pub last_message: Option<MessageRow>,
    pub member: bool,
    /// The user muted this conversation's offline notices.
    pub muted: bool,
}

pub enum Direction {
    After(i64),
    Before(i64),
}

/// A conversation's last activity as a member sees it: the last message visible to them in
/// their current (or last) interval (`lm`), or when they joined if there is none yet.
const LAST_TIME: &str = "(CASE WHEN m.left_at_seq IS NULL AND c.last_seq > m.joined_after_seq \
     THEN c.last_time ELSE COALESCE(lm.server_time, m.joined_at) END)";

/// From a member row `m`: its conversation's head `c`, the member's read position `rp`
/// (none before a first read), and the last message `lm` the member may see of its latest
/// interval (none if there is none yet) — what unread is computed from.
const HEAD_POSITION_LAST: &str = "JOIN conversations c ON c.conversation_id = m.conversation_id \
     LEFT JOIN read_positions rp ON rp.user_id = m.user_id AND rp.conversation_id = m.conversation_id \
     LEFT JOIN messages lm ON lm.conversation_id = c.conversation_id \
         AND lm.seq = COALESCE(m.left_at_seq, c.last_seq) AND lm.seq > m.joined_after_seq";

const MESSAGE_COLUMNS: &str =
    "seq, msg_id, sender_id, content_type, payload, server_time, recalled_by";

fn message_from(
    row: &AnyRow,
    first: usize,
    conversation_id: i64,
    conversation_type: u8,
) -> sqlx::Result<MessageRow> {
    let recalled_by: i64 = row.try_get(first + 6)?;
    Ok(MessageRow {
        message: Stored {
            conversation_id,
            conversation_type,
            seq: row.try_get(first)?,
            msg_id: row.try_get(first + 1)?,
            sender_id: row.try_get(first + 2)?,
            content_type: row.try_get::<i64, _>(first + 3)? as u32,
            payload: if recalled_by == 0 {
                row.try_get(first + 4)?
            } else {
                String::new()
            },
            server_time: row.try_get(first + 5)?,
        },
        recalled_by,
    })
}

impl Store {
    /// The user's membership of a conversation (past or present), or `NotAMember`.
    pub async fn membership(
        &self,
        user_id: &str,
        conversation_id: i64,
    ) -> Result<Result<Membership, Refused>, sqlx::Error> {
        // One statement, so a rejoin committing meanwhile cannot show an interval twice.
        let rows = sqlx::query(
            "SELECT c.conversation_type, c.last_seq, m.joined_after_seq, m.left_at_seq, \
             i.joined_after_seq, i.left_at_seq \
             FROM members m JOIN conversations c ON c.conversation_id = m.conversation_id \
             LEFT JOIN member_intervals i ON i.conversation_id = m.conversation_id AND i.user_id = m.user_id \
             WHERE m.conversation_id = $1 AND m.user_id = $2 ORDER BY i.joined_after_seq",
        )
        .bind(conversation_id)
        .bind(user_id)
        .fetch_all(self.read())
        .await?;
        let Some(row) = rows.first() else {
            return Ok(Err(Refused::NotAMember(conversation_id)));
        };
        let mut earlier = Vec::new();
        for r in &rows {
            if let (Some(a), Some(b)) = (
                r.try_get::<Option<i64>, _>(4)?,
                r.try_get::<Option<i64>, _>(5)?,
            ) {
                earlier.push((a, b));
            }
        }
        Ok(Ok(Membership {
            conversation_type: row.try_get::<i64, _>(0)? as u8,
            last_seq: row.try_get(1)?,
            joined_after_seq: row.try_get(2)?,
            left_at_seq: row.try_get(3)?,
            earlier,
        }))
    }

    /// What a live send needs of a conversation: its type, its current members with
    /// their role and mute, and whether everyone is muted. `None`: nobody is a member.
    pub async fn live_members(&self, conversation_id: i64) -> sqlx::Result<Option<LiveMembers>> {
        self.read_twice(|| self.live_members_once(conversation_id))
            .await
    }

    /// One statement, however many members: a first row with every current member's id
    /// joined into one text ([`lines_of`]), then a row for each member who is not plain (a
    /// role, a mute, a block, a deleted account) — few, where 10,000 rows would cost
    /// 10–20 ms to hand over. The conversation's type and mute are read once, not joined
    /// to each member (a join ran a lookup per member on PostgreSQL: 20 of 22 ms at
    /// 10,000 members).
    async fn live_members_once(&self, conversation_id: i64) -> sqlx::Result<Option<LiveMembers>> {
        let deleted = super::batch::MEMBER_DELETED;
        let rows = sqlx::query(&format!(
            "SELECT CAST(0 AS BIGINT) AS part, \
             (SELECT conversation_type FROM conversations WHERE conversation_id = $1), \
             COALESCE((SELECT mute_all FROM group_info WHERE conversation_id = $1), 0), {}, \
             CAST(NULL AS TEXT), 0, 0, 0, 0 \
             FROM members m WHERE m.conversation_id = $1 AND m.left_at_seq IS NULL \
             GROUP BY m.conversation_id \
             UNION ALL SELECT 1, 0, 0, NULL, user_id, role, muted_until, blocks_peer, state \
             FROM members WHERE conversation_id = $1 AND left_at_seq IS NULL \
             AND (role <> 0 OR muted_until <> 0 OR blocks_peer <> 0 OR state = {deleted}) \
             ORDER BY part",
            lines_of(self.dialect(), "m.user_id"),
        ))
        .bind(conversation_id)
        .fetch_all(self.read())
        .await?;
        // No members: no rows at all (the aggregate is grouped).
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let mut live = LiveMembers {
            conversation_type: first.try_get::<i64, _>(1)? as u8,
            mute_all: first.try_get::<i64, _>(2)? != 0,
            members: lines(first.try_get(3)?),
            roles: std::collections::HashMap::new(),
            blockers: Vec::new(),
            deleted: None,
        };
        for r in &rows[1..] {
            let user: String = r.try_get(4)?;
            let (role, muted): (i64, i64) = (r.try_get(5)?, r.try_get(6)?);
            if role != 0 || muted != 0 {
                live.roles.insert(user.clone(), (role, muted));
            }
            if r.try_get::<i64, _>(7)? != 0 {
                live.blockers.push(user.clone());
            }
            if r.try_get::<i64, _>(8)? == deleted && live.conversation_type == 1 {
                live.deleted = Some(user);
            }
        }
        Ok(Some(live))
    }

    /// The private conversations of `pairs` that exist, in one statement.
    pub async fn private_conversations(&self, pairs: &[Pair]) -> sqlx::Result<HashMap<Pair, i64>> {
        self.read_twice(|| async {
            self.pooled(async {
                let mut conn = self.read().acquire().await?;
                super::batch::find_pairs(self.dialect(), &mut conn, pairs).await
            })
            .await?
        })
        .await
    }

    /// Which of `ids` are conversations, in one statement: with the pair of each private
    /// one (`None` for a group or a channel).
    pub async fn conversation_pairs(
        &self,
        ids: &[i64],
    ) -> sqlx::Result<HashMap<i64, Option<Pair>>> {
        let (id, from) = super::groups::elements(self.dialect(), "$1", &[true]);
        let sql = format!(
            "SELECT c.conversation_id, p.user_lo, p.user_hi FROM conversations c \
             LEFT JOIN private_pairs p ON p.conversation_id = c.conversation_id \
             WHERE c.conversation_id IN (SELECT {id} FROM {from})"
        );
        let ids: Vec<[i64; 1]> = ids.iter().map(|&id| [id]).collect();
        let ids = json(&ids);
        self.read_twice(|| async {
            self.pooled(async {
                let mut conn = self.read().acquire().await?;
                let mut found = HashMap::new();
                for row in sqlx::query(&sql).bind(&ids).fetch_all(&mut *conn).await? {
                    let lo: Option<String> = row.try_get(1)?;
                    let hi: Option<String> = row.try_get(2)?;
                    found.insert(row.try_get(0)?, lo.zip(hi));
                }
                Ok(found)
            })
            .await?
        })
        .await
    }

    /// Up to `limit` messages after or before a seq, ascending, within what `m` may see:
    /// one index range scan per visible interval, until the page is full.
    pub async fn pull(
        &self,
        conversation_id: i64,
        m: &Membership,
        direction: Direction,
        limit: i64,
    ) -> sqlx::Result<Vec<MessageRow>> {
        self.pooled(self.pull_on_a_connection(conversation_id, m, direction, limit))
            .await?
    }

    /// `pull`'s statements, on one connection of the pool.
    async fn pull_on_a_connection(
        &self,
        conversation_id: i64,
        m: &Membership,
        direction: Direction,
        limit: i64,
    ) -> sqlx::Result<Vec<MessageRow>> {
        let intervals = m.intervals();
        let mut conn = self.read().acquire().await?;
        let mut rows = Vec::new();
        match direction {
            Direction::After(after) => {
                for (lo, hi) in intervals {
                    let from = after.max(lo);
                    let left = limit - rows.len() as i64;
                    if from >= hi || left <= 0 {
                        continue;
                    }
                    rows.extend(
                        sqlx::query(&format!(
                            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = $1 \
                             AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4"
                        ))
                        .bind(conversation_id)
                        .bind(from)
                        .bind(hi)
                        .bind(left)
                        .fetch_all(&mut *conn)
                        .await?,
                    );
                }
            }
            Direction::Before(before) => {
                for (lo, hi) in intervals.into_iter().rev() {
                    let below = before.min(hi.saturating_add(1));
                    let left = limit - rows.len() as i64;
                    if below <= lo + 1 || left <= 0 {
                        continue;
                    }
                    rows.extend(
                        sqlx::query(&format!(
                            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = $1 \
                             AND seq > $2 AND seq < $3 ORDER BY seq DESC LIMIT $4"
                        ))
                        .bind(conversation_id)
                        .bind(lo)
                        .bind(below)
                        .bind(left)
                        .fetch_all(&mut *conn)
                        .await?,
                    );
                }
                rows.reverse();
            }
        }
        rows.iter()
            .map(|r| message_from(r, 0, conversation_id, m.conversation_type))
            .collect()
    }

    /// The user's conversations, most recently active first (a former member's activity
    /// ends with the last message they could see), after `cursor`
    /// (`(last_time, conversation_id)` of the previous page's last row).
    pub async fn overview(
        &self,
        user_id: &str,
        cursor: Option<(i64, i64)>,
        only: Option<i64>,
        limit: i64,
    ) -> sqlx::Result<Vec<OverviewRow>> {
        let (t, id) = cursor.unwrap_or((i64::MAX, i64::MAX));
        let filter = if only.is_some() {
            "c.conversation_id = $5"
        } else {
            "1 = 1"
        };
        let sql = format!(
            "SELECT c.conversation_id, c.conversation_type, c.last_seq, {LAST_TIME}, \
             COALESCE(rp.read_seq, 0), COALESCE(rp.read_acc, 0), pp.user_lo, pp.user_hi, \
             m.joined_after_seq, m.left_at_seq, lm.unread_acc, \
             lm.seq, lm.msg_id, lm.sender_id, lm.content_type, lm.payload, lm.server_time, lm.recalled_by, \
             m.push_muted FROM members m {HEAD_POSITION_LAST} \
             LEFT JOIN private_pairs pp ON pp.conversation_id = c.conversation_id \
             WHERE m.user_id = $1 AND ({LAST_TIME} < $2 OR ({LAST_TIME} = $2 AND c.conversation_id < $3)) \
               AND {filter} \
             ORDER BY {LAST_TIME} DESC, c.conversation_id DESC LIMIT $4"
        );
        let mut q = sqlx::query(&sql).bind(user_id).bind(t).bind(id).bind(limit);
        if let Some(only) = only {
            q = q.bind(only);
        }
        let rows = q.fetch_all(self.read()).await?;
        let mut out = Vec::with_capacity(rows.len());
        // Rows with something counting after their position (by index, with the counts),
        // and the seqs whose recalls to subtract: the others cost no query.
        let mut open: Vec<(usize, i64, i64)> = Vec::new();
        let mut ranges: Vec<[i64; 3]> = Vec::new();
        for row in &rows {
            let conversation_id: i64 = row.try_get(0)?;
            let conversation_type = row.try_get::<i64, _>(1)? as u8;
            let last_seq: i64 = row.try_get(2)?;
            let read_seq: i64 = row.try_get(4)?;
            let read_acc: i64 = row.try_get(5)?;
            let lo: Option<String> = row.try_get(6)?;
            let hi: Option<String> = row.try_get(7)?;
            let left_at: Option<i64> = row.try_get(9)?;
            let end_acc: Option<i64> = row.try_get(10)?;
            let visible_end = visible_end(last_seq, left_at);
            let peer_id = match (lo, hi) {
                (Some(lo), Some(hi)) => Some(if lo == user_id { hi } else { lo }),
                _ => None,
            };
            let last_message = match row.try_get::<Option<i64>, _>(11)? {
                Some(_) => Some(message_from(row, 11, conversation_id, conversation_type)?),
                None => None,
            };
            let end_acc = end_acc.unwrap_or(0);
            if end_acc > read_acc {
                open.push((out.len(), end_acc, read_acc));
                ranges.push([conversation_id, read_seq, visible_end]);
            }
            out.push(OverviewRow {
                conversation_id,
                conversation_type,
                peer_id,
                last_seq: visible_end,
                read_seq,
                unread: 0,
                last_time: row.try_get(3)?,
                last_message,
                member: left_at.is_none(),
                // Leaving ends a mute (a rejoin starts unmuted).
                muted: left_at.is_none() && row.try_get::<i64, _>(18)? != 0,
            });
        }
        let recalled = self.recalled_counts(&ranges).await?;
        for ((i, end_acc, read_acc), recalled) in open.into_iter().zip(recalled) {
            out[i].unread = unread(end_acc, read_acc, recalled);
        }
        Ok(out)
    }

    /// The unread count over all conversations of each of `users` (distinct; the badge of
    /// an offline notice): what each one's overview rows sum to, in two statements
    /// whatever the number of users — their conversations, then the recalls to subtract
    /// where something counts after a position.
    pub async fn unread_totals(&self, users: &[&str]) -> sqlx::Result<HashMap<String, i64>> {
        let mut totals: HashMap<String, i64> = users.iter().map(|u| (u.to_string(), 0)).collect();
        if users.is_empty() {
            return Ok(totals);
        }
        // On PostgreSQL each user is an index probe of its own (see `lookup`): a join
        // with the array was planned as a scan of every member row.
        let columns = "m.user_id, c.last_seq, m.left_at_seq, COALESCE(rp.read_seq, 0), \
             COALESCE(rp.read_acc, 0), lm.unread_acc, c.conversation_id";
        let sql = match self.dialect() {
            Dialect::Postgres => format!(
                "SELECT x.* FROM jsonb_array_elements_text(CAST($1 AS jsonb)) e(v) CROSS JOIN LATERAL \
                 (SELECT {columns} FROM members m {HEAD_POSITION_LAST} WHERE m.user_id = e.v OFFSET 0) x"
            ),
            Dialect::Sqlite => format!(
                "SELECT {columns} FROM json_each($1) e JOIN members m ON m.user_id = e.value \
                 {HEAD_POSITION_LAST}"
            ),
        };
        // Per conversation with something counting after the position: the user, the
        // counts, and the seqs whose recalls to subtract.
        let mut open: Vec<(String, i64, i64)> = Vec::new();
        let mut ranges: Vec<[i64; 3]> = Vec::new();
        for r in sqlx::query(&sql)
            .bind(json(users))
            .fetch_all(self.read())
            .await?
        {
            let user: String = r.try_get(0)?;
            let end = visible_end(r.try_get(1)?, r.try_get(2)?);
            let (read_seq, read_acc): (i64, i64) = (r.try_get(3)?, r.try_get(4)?);
            let end_acc = r.try_get::<Option<i64>, _>(5)?.unwrap_or(0);
            if end_acc > read_acc {
                open.push((user, end_acc, read_acc));
                ranges.push([r.try_get(6)?, read_seq, end]);
            }
        }
        let recalled = self.recalled_counts(&ranges).await?;
        for ((user, end_acc, read_acc), recalled) in open.into_iter().zip(recalled) {
            *totals.entry(user).or_default() += unread(end_acc, read_acc, recalled);
        }
        Ok(totals)
    }

    /// For each `[conversation_id, after, upto]`, the recalled messages in `(after, upto]`
    /// that counted toward unread (what unread subtracts), in one statement.
    async fn recalled_counts(&self, ranges: &[[i64; 3]]) -> sqlx::Result<Vec<i64>> {
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let messages = recalls_in(self.dialect());
        let sql = match self.dialect() {
            Dialect::Postgres => format!(
                "SELECT (SELECT COUNT(*) FROM {messages} WHERE conversation_id = CAST(e.v->>0 AS BIGINT) \
                 AND seq > CAST(e.v->>1 AS BIGINT) AND seq <= CAST(e.v->>2 AS BIGINT) \
                 AND {RECALLED_COUNTING}) FROM jsonb_array_elements(CAST($1 AS jsonb)) \
                 WITH ORDINALITY e(v, i) ORDER BY e.i"
            ),
            Dialect::Sqlite => format!(
                "SELECT (SELECT COUNT(*) FROM {messages} WHERE conversation_id = e.value->>0 \
                 AND seq > e.value->>1 AND seq <= e.value->>2 AND {RECALLED_COUNTING}) \
                 FROM json_each($1) e ORDER BY e.key"
            ),
        };
        sqlx::query(&sql)
            .bind(json(ranges))
            .fetch_all(self.read())
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect()
    }

    /// Read positions of the other members (0 for one who never read).
    pub async fn read_positions(
        &self,
        conversation_id: i64,
        except: &str,
    ) -> sqlx::Result<Vec<(String, i64, i64)>> {
        // A read delivers too: the delivered position is never below the read one.
        sqlx::query(
            "SELECT m.user_id, COALESCE(rp.read_seq, 0), \
             COALESCE(CASE WHEN rp.delivered_seq > rp.read_seq THEN rp.delivered_seq \
             ELSE rp.read_seq END, 0) FROM members m \
             LEFT JOIN read_positions rp ON rp.user_id = m.user_id AND rp.conversation_id = m.conversation_id \
             WHERE m.conversation_id = $1 AND m.user_id <> $2 AND m.left_at_seq IS NULL \
             ORDER BY m.user_id LIMIT 500",
        )
        .bind(conversation_id)
        .bind(except)
        .fetch_all(self.read())
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
    }
}

/// The last seq a member sees of their latest interval: the head's, or where they left.
pub fn visible_end(last_seq: i64, left_at_seq: Option<i64>) -> i64 {
    left_at_seq.map_or(last_seq, |l| l.min(last_seq))
}

/// Unread, never counted up and down: the counting messages after the read position
/// (`end_acc − read_acc`, the running counts at the end of what the reader may see and at
/// its position), less the counting ones recalled since.
pub fn unread(end_acc: i64, read_acc: i64, recalled: i64) -> i64 {
    (end_acc - read_acc - recalled).max(0)
}
