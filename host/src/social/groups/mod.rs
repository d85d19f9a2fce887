//! Groups (conversation type 2) and channels (type 3): who may do what, and what each
//! change writes. A change reads the users it names (`social::named`), then locks the
//! group's head row (the lock sends take, so a
//! membership interval and the messages around it get their seqs in commit order), then
//! the affected users' stream heads.

mod joins;
mod members;
mod roles;
mod settings;

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::AnyConnection;

use super::{OpError, SystemKind};
use crate::messaging::Core;
use crate::protocol::Refused;
use crate::protocol::{Code, Error};
use crate::store::groups::{self as q, Group, Head, Member, append_system, lock_head};

const GROUP_KICK: SystemKind = SystemKind::GroupKick;
const GROUP_UPDATE: SystemKind = SystemKind::GroupUpdate;
/// The users one creation or one add may name besides the actor: their tip lists them
/// all, and the `group-update` kind takes up to 2000 ids of 64 characters.
const MAX_USERS_PER_CHANGE: usize = 1000;
/// The users one kick may name (the `group-kick` kind's bound).
const MAX_KICKED: usize = 100;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewGroup {
    pub name: String,
    #[serde(default = "group_type")]
    pub conversation_type: u8,
    #[serde(default)]
    pub members: Vec<String>,
    pub join_policy: Option<String>,
    #[serde(default)]
    pub notice: String,
    #[serde(default)]
    pub avatar: String,
}

fn group_type() -> u8 {
    2
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupPatch {
    pub name: Option<String>,
    pub notice: Option<String>,
    pub avatar: Option<String>,
    pub mute_all: Option<bool>,
    pub join_policy: Option<String>,
}

fn join_policy(p: &str) -> Result<String, Error> {
    match p {
        "open" | "approval" | "invite" => Ok(p.to_string()),
        _ => Err(Error::bad_request(
            "joinPolicy is one of open, approval, invite",
        )),
    }
}

fn group_not_found(id: i64) -> Error {
    Error::new(Code::GroupNotFound, format!("no group or channel {id}"))
}

fn group_full(max: u32) -> Error {
    Error::new(
        Code::GroupFull,
        format!("a group has at most {max} members"),
    )
}

fn denied(why: &str) -> OpError {
    Error::new(Code::PermissionDenied, why).into()
}

/// The group info as the API shows it.
pub fn info(g: &Group) -> Value {
    json!({
        "conversationId": g.conversation_id,
        "conversationType": g.conversation_type,
        "name": g.name,
        "notice": g.notice,
        "avatar": g.avatar,
        "ownerId": g.owner_id,
        "joinPolicy": g.join_policy,
        "muteAll": g.mute_all,
        "state": if g.dissolved { "dissolved" } else { "active" },
        "memberCount": g.member_count,
        "version": g.version,
        "createdAt": g.created_at,
        "updatedAt": g.updated_at,
    })
}

/// A change in progress: the locked head, the group, the actor's membership.
struct Locked {
    head: Head,
    group: Group,
    me: Member,
    /// Of the users the change names besides the actor, those whose accounts exist.
    named: HashSet<String>,
}

impl Core {
    /// Locks a live group and reads the actor's current membership, after the users the
    /// change names (`social::named`: the actor and `others`).
    async fn lock_group(
        &self,
        tx: &mut AnyConnection,
        id: i64,
        actor: &str,
        others: &[&str],
    ) -> Result<Locked, OpError> {
        let d = self.store.dialect();
        let named = super::named(d, tx, actor, others).await?;
        let head = lock_head(d, tx, id)
            .await?
            .filter(|h| h.conversation_type >= 2)
            .ok_or_else(|| group_not_found(id))?;
        let group = q::group_in(tx, id)
            .await?
            .ok_or_else(|| group_not_found(id))?;
        if group.dissolved {
            return Err(Refused::GroupDissolved(id).into());
        }
        let me = q::members_in(d, tx, id, &[actor])
            .await?
            .remove(actor)
            .filter(Member::is_current)
            .ok_or(Refused::NotAMember(id))?;
        Ok(Locked {
            head,
            group,
            me,
            named,
        })
    }

    /// Appends a tip (checked by its plugin) to a locked group.
    async fn tip(
        &self,
        tx: &mut AnyConnection,
        l: &mut Locked,
        kind: SystemKind,
        operator: &str,
        payload: Value,
        now: i64,
    ) -> Result<std::sync::Arc<crate::protocol::Stored>, OpError> {
        let (content_type, checked) = self.system_payload(
            kind,
            l.head.conversation_type,
            l.head.conversation_id,
            &payload,
        )?;
        Ok(append_system(
            tx,
            &mut l.head,
            operator,
            content_type,
            checked,
            self.ids.next(now),
            now,
        )
        .await?)
    }

    /// A tip in a group; nothing in a channel, whose subscribers are not announced.
    async fn group_tip(
        &self,
        tx: &mut AnyConnection,
        l: &mut Locked,
        kind: SystemKind,
        operator: &str,
        payload: Value,
        now: i64,
    ) -> Result<Option<std::sync::Arc<crate::protocol::Stored>>, OpError> {
        if l.head.conversation_type != 2 {
            return Ok(None);
        }
        Ok(Some(self.tip(tx, l, kind, operator, payload, now).await?))
    }

    /// Current members, to push a tip to (plus whoever just left, to see their own
    /// departure).
    async fn tip_recipients(
        &self,
        tx: &mut AnyConnection,
        id: i64,
        also: &[String],
    ) -> Result<Vec<String>, OpError> {
        let mut users = q::current_members(self.store.dialect(), tx, id).await?;
        users.extend(also.iter().cloned());
        Ok(users)
    }
}
