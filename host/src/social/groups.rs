//! Groups (conversation type 2) and channels (type 3): who may do what, and what each
//! change writes. A change locks the group's head row first (the lock sends take, so a
//! membership interval and the messages around it get their seqs in commit order), then
//! the affected users' stream heads.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::AnyConnection;

use super::{Change, OpError, value};
use crate::auth::valid_user_id;
use crate::clock::now_ms;
use crate::messaging::Core;
use crate::protocol::{Code, Error};
use crate::store::batch::Refused;
use crate::store::groups::{
    self as q, Group, Head, Member, MemberState, Role, append_system, lock_head,
};
use crate::store::social::user_exists;

const GROUP_KICK: u32 = 8;
const GROUP_UPDATE: u32 = 9;

#[derive(Deserialize)]
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

#[derive(Deserialize, Default)]
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
}

impl Core {
    /// Locks a live group and reads the actor's current membership.
    async fn lock_group(
        &self,
        tx: &mut AnyConnection,
        id: i64,
        actor: &str,
    ) -> Result<Locked, OpError> {
        let d = self.store.dialect();
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
        Ok(Locked { head, group, me })
    }

    /// Appends a tip (checked by its plugin) to a locked group.
    async fn tip(
        &self,
        tx: &mut AnyConnection,
        l: &mut Locked,
        content_type: u32,
        operator: &str,
        payload: Value,
        now: i64,
    ) -> Result<std::sync::Arc<crate::store::batch::Stored>, OpError> {
        let checked = self.system_payload(
            content_type,
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
        content_type: u32,
        operator: &str,
        payload: Value,
        now: i64,
    ) -> Result<Option<std::sync::Arc<crate::store::batch::Stored>>, OpError> {
        if l.head.conversation_type != 2 {
            return Ok(None);
        }
        Ok(Some(
            self.tip(tx, l, content_type, operator, payload, now)
                .await?,
        ))
    }

    /// Current members, to push a tip to (plus whoever just left, to see their own
    /// departure).
    async fn tip_recipients(
        &self,
        tx: &mut AnyConnection,
        id: i64,
        also: &[String],
    ) -> Result<Vec<String>, OpError> {
        let mut users: Vec<String> = q::current_in(tx, id)
            .await?
            .into_iter()
            .map(|(u, _)| u)
            .collect();
        users.extend(also.iter().cloned());
        Ok(users)
    }

    pub async fn create_group(&self, owner: &str, spec: NewGroup) -> Result<Value, Error> {
        if !matches!(spec.conversation_type, 2 | 3) {
            return Err(Error::bad_request(
                "conversationType is 2 (group) or 3 (channel)",
            ));
        }
        let policy = join_policy(spec.join_policy.as_deref().unwrap_or(
            if spec.conversation_type == 3 {
                "open"
            } else {
                "invite"
            },
        ))?;
        let mut members: Vec<String> = spec
            .members
            .iter()
            .filter(|m| *m != owner)
            .cloned()
            .collect();
        members.sort();
        members.dedup();
        if let Some(bad) = members.iter().find(|m| !valid_user_id(m)) {
            return Err(Error::bad_request(format!(
                "{bad:?} is not a valid user id"
            )));
        }
        if members.len() + 1 > self.settings.max_group_members as usize {
            return Err(Error::new(
                Code::GroupFull,
                format!(
                    "a group has at most {} members",
                    self.settings.max_group_members
                ),
            ));
        }
        let (spec, members, policy) = (&spec, &members, &policy);
        self.change(|mut c| Box::pin(async move {
            let now = c.now;
            for m in members {
                if !user_exists(&mut c.tx, m).await? {
                    return Err(Refused::UserNotFound(m.clone()).into());
                }
            }
            let mut payload = json!({
                "operatorId": owner, "event": "created", "name": spec.name, "joinPolicy": policy,
            });
            // A channel's subscribers are not announced.
            if spec.conversation_type == 2 {
                payload["userIds"] = json!(members);
            }
            if !spec.notice.is_empty() {
                payload["notice"] = spec.notice.clone().into();
            }
            if !spec.avatar.is_empty() {
                payload["avatar"] = spec.avatar.clone().into();
            }
            // Checked before anything is written: the plugin normalizes the settings.
            let checked = self.system_payload(GROUP_UPDATE, spec.conversation_type, 0, &payload)?;
            let v = value(&checked);
            let mut group = Group {
                conversation_id: 0,
                conversation_type: spec.conversation_type,
                owner_id: owner.to_string(),
                name: v["name"].as_str().unwrap_or_default().to_string(),
                notice: v["notice"].as_str().unwrap_or_default().to_string(),
                avatar: v["avatar"].as_str().unwrap_or_default().to_string(),
                join_policy: policy.clone(),
                mute_all: false,
                dissolved: false,
                member_count: members.len() as i64 + 1,
                version: 1,
                created_at: now,
                updated_at: now,
            };
            let mut head = q::create_group(&mut c.tx, &group).await?;
            group.conversation_id = head.conversation_id;
            let tip = append_system(
                &mut c.tx,
                &mut head,
                owner,
                GROUP_UPDATE,
                checked,
                self.ids.next(now),
                now,
            )
            .await?;
            let mut everyone: Vec<&str> = vec![owner];
            everyone.extend(members.iter().map(String::as_str));
            c.lock_streams(&everyone).await?;
            for user in &everyone {
                let role = if *user == owner {
                    Role::Owner
                } else {
                    Role::Member
                };
                q::open_membership(&mut c.tx, &head, user, 0, role, now).await?;
                c.streams.append(
                    user,
                    "group.joined",
                    None,
                    &json!({
                        "conversationId": head.conversation_id,
                        "conversationType": head.conversation_type,
                        "role": role.as_str(),
                        "by": owner,
                    }),
                );
            }
            c.fx.tips = vec![(tip, everyone.iter().map(|u| u.to_string()).collect())];
            c.fx.members_changed = Some(head.conversation_id);
            Ok((info(&group), c))
        }))
        .await
    }

    pub async fn patch_group(&self, actor: &str, id: i64, p: GroupPatch) -> Result<Value, Error> {
        let policy = p.join_policy.as_deref().map(join_policy).transpose()?;
        if p.name.is_none()
            && p.notice.is_none()
            && p.avatar.is_none()
            && p.mute_all.is_none()
            && policy.is_none()
        {
            return Err(Error::bad_request("nothing to change"));
        }
        let (p, policy) = (&p, &policy);
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let mut l = self.lock_group(&mut c.tx, id, actor).await?;
                if l.me.role < Role::Admin {
                    return Err(denied("only the owner and admins change the settings"));
                }
                // Only what changes goes into the tip; a patch that changes nothing makes none.
                let g = &l.group;
                let mut payload = json!({ "operatorId": actor });
                for (k, v, now_is) in [
                    ("name", &p.name, &g.name),
                    ("notice", &p.notice, &g.notice),
                    ("avatar", &p.avatar, &g.avatar),
                ] {
                    if let Some(v) = v
                        && v.trim() != now_is
                    {
                        payload[k] = v.clone().into();
                    }
                }
                if let Some(m) = p.mute_all
                    && m != g.mute_all
                {
                    payload["muteAll"] = m.into();
                }
                if let Some(j) = policy
                    && j != &g.join_policy
                {
                    payload["joinPolicy"] = j.clone().into();
                }
                if payload.as_object().is_some_and(|o| o.len() == 1) {
                    return Ok((info(&l.group), c));
                }
                let tip = self
                    .tip(&mut c.tx, &mut l, GROUP_UPDATE, actor, payload, now)
                    .await?;
                let v = value(&tip.payload);
                let g = &mut l.group;
                if let Some(n) = v["name"].as_str() {
                    g.name = n.to_string();
                }
                if p.notice.is_some() {
                    g.notice = v["notice"].as_str().unwrap_or_default().to_string();
                }
                if let Some(a) = v["avatar"].as_str() {
                    g.avatar = a.to_string();
                }
                if let Some(m) = p.mute_all {
                    g.mute_all = m;
                }
                if let Some(j) = policy {
                    g.join_policy = j.clone();
                }
                q::save_group(&mut c.tx, g, now).await?;
                let recipients = self.tip_recipients(&mut c.tx, id, &[]).await?;
                c.fx.tips = vec![(tip, recipients)];
                // Live sends cache the group's mute-all with its members.
                c.fx.members_changed = Some(id);
                Ok((info(&l.group), c))
            })
        })
        .await
    }

    /// Adds users (or one user joining by themselves when `actor` is in `users`).
    async fn admit(
        &self,
        c: &mut Change,
        l: &mut Locked,
        operator: &str,
        users: &[String],
        event: &str,
    ) -> Result<Option<std::sync::Arc<crate::store::batch::Stored>>, OpError> {
        let now = c.now;
        if l.group.member_count + users.len() as i64 > i64::from(self.settings.max_group_members) {
            return Err(Error::new(
                Code::GroupFull,
                format!(
                    "a group has at most {} members",
                    self.settings.max_group_members
                ),
            )
            .into());
        }
        // Channels announce no subscriptions.
        let payload = json!({ "operatorId": operator, "event": event, "userIds": users });
        let tip = self
            .group_tip(&mut c.tx, l, GROUP_UPDATE, operator, payload, now)
            .await?;
        // The new members see the tip of their own arrival.
        let after = l.head.last_seq - i64::from(tip.is_some());
        let refs: Vec<&str> = users.iter().map(String::as_str).collect();
        c.lock_streams(&refs).await?;
        for user in users {
            q::open_membership(&mut c.tx, &l.head, user, after, Role::Member, now).await?;
            c.streams.append(
                user,
                "group.joined",
                None,
                &json!({
                    "conversationId": l.head.conversation_id,
                    "conversationType": l.head.conversation_type,
                    "role": "member",
                    "by": operator,
                }),
            );
        }
        l.group.member_count += users.len() as i64;
        q::save_group(&mut c.tx, &mut l.group, now).await?;
        Ok(tip)
    }

    /// One user joins (by themselves, or approved by `operator`): the `joined` tip.
    async fn admit_one(
        &self,
        c: &mut Change,
        l: &mut Locked,
        operator: &str,
        user: &str,
    ) -> Result<(), OpError> {
        let users = [user.to_string()];
        if let Some(tip) = self.admit(c, l, operator, &users, "joined").await? {
            let id = l.head.conversation_id;
            let recipients = self.tip_recipients(&mut c.tx, id, &[]).await?;
            c.fx.tips.push((tip, recipients));
        }
        c.fx.members_changed = Some(l.head.conversation_id);
        Ok(())
    }

    pub async fn add_members(
        &self,
        actor: &str,
        id: i64,
        users: Vec<String>,
    ) -> Result<Vec<String>, Error> {
        if users.is_empty() || users.len() > 1000 {
            return Err(Error::bad_request("userIds lists 1 to 1000 users"));
        }
        if let Some(bad) = users.iter().find(|m| !valid_user_id(m)) {
            return Err(Error::bad_request(format!(
                "{bad:?} is not a valid user id"
            )));
        }
        let users = &users;
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let d = self.store.dialect();
                let mut l = self.lock_group(&mut c.tx, id, actor).await?;
                let may = l.me.role >= Role::Admin
                    || (l.head.conversation_type == 2 && l.group.join_policy != "approval");
                if !may {
                    return Err(denied("only the owner and admins add members here"));
                }
                let refs: Vec<&str> = users.iter().map(String::as_str).collect();
                let rows = q::members_in(d, &mut c.tx, id, &refs).await?;
                let mut new: Vec<String> = Vec::new();
                for u in users {
                    if rows.get(u).is_some_and(Member::is_current) || new.contains(u) {
                        continue;
                    }
                    if !user_exists(&mut c.tx, u).await? {
                        return Err(Refused::UserNotFound(u.clone()).into());
                    }
                    new.push(u.clone());
                }
                if new.is_empty() {
                    return Err(Error::new(
                        Code::AlreadyMember,
                        "everyone named is a member already",
                    )
                    .into());
                }
                // Every stream this change may write to, locked at once in user order.
                let mut affected: Vec<String> = self.admins(&mut c.tx, id).await?;
                affected.extend(new.iter().cloned());
                let refs: Vec<&str> = affected.iter().map(String::as_str).collect();
                c.lock_streams(&refs).await?;
                let tip = self
                    .admit(&mut c, &mut l, actor, &new, "membersAdded")
                    .await?;
                // An owner or admin adding someone who asked to join answers their request.
                for u in &new {
                    if l.me.role < Role::Admin {
                        break;
                    }
                    if let Some(r) = q::join_request(&mut c.tx, id, u).await?
                        && r.state == 0
                    {
                        let r = q::JoinRequest { state: 1, ..r };
                        q::save_join_request(&mut c.tx, id, &r, Some(actor), now).await?;
                        self.join_request_events(&mut c, &l, &r, Some(actor))
                            .await?;
                    }
                }
                c.fx.members_changed = Some(id);
                if let Some(tip) = tip {
                    c.fx.tips
                        .push((tip, self.tip_recipients(&mut c.tx, id, &[]).await?));
                }
                Ok((new, c))
            })
        })
        .await
    }

    pub async fn kick(
        &self,
        actor: &str,
        id: i64,
        users: Vec<String>,
        reason: String,
    ) -> Result<Vec<String>, Error> {
        if users.is_empty() || users.len() > 100 {
            return Err(Error::bad_request("userIds lists 1 to 100 users"));
        }
        if users.iter().any(|u| u == actor) {
            return Err(Error::bad_request("you cannot kick yourself: quit instead"));
        }
        let (users, reason) = (&users, &reason);
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let d = self.store.dialect();
                let mut l = self.lock_group(&mut c.tx, id, actor).await?;
                if l.me.role < Role::Admin {
                    return Err(denied("only the owner and admins kick"));
                }
                let refs: Vec<&str> = users.iter().map(String::as_str).collect();
                let rows = q::members_in(d, &mut c.tx, id, &refs).await?;
                let mut kicked: Vec<String> = Vec::new();
                for u in users {
                    let Some(m) = rows.get(u).filter(|m| m.is_current()) else {
                        return Err(Error::new(
                            Code::TargetNotMember,
                            format!("{u} is not a member"),
                        )
                        .into());
                    };
                    if m.role >= l.me.role {
                        return Err(denied(
                            "admins kick ordinary members only; nobody kicks the owner",
                        ));
                    }
                    if !kicked.contains(u) {
                        kicked.push(u.clone());
                    }
                }
                let mut payload = json!({ "operatorId": actor, "kickedUserIds": kicked });
                if !reason.is_empty() {
                    payload["reason"] = reason.clone().into();
                }
                let tip = self
                    .group_tip(&mut c.tx, &mut l, GROUP_KICK, actor, payload, now)
                    .await?;
                c.lock_streams(&refs).await?;
                for u in &kicked {
                    q::close_membership(&mut c.tx, id, u, l.head.last_seq, MemberState::Kicked)
                        .await?;
                    c.streams.append(u, "group.kicked", None, &json!({
                    "conversationId": id, "conversationType": l.head.conversation_type, "by": actor,
                }));
                }
                l.group.member_count -= kicked.len() as i64;
                q::save_group(&mut c.tx, &mut l.group, now).await?;
                c.fx.members_changed = Some(id);
                if let Some(tip) = tip {
                    c.fx.tips
                        .push((tip, self.tip_recipients(&mut c.tx, id, &kicked).await?));
                }
                Ok((kicked, c))
            })
        })
        .await
    }

    pub async fn quit(&self, actor: &str, id: i64) -> Result<(), Error> {
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let mut l = self.lock_group(&mut c.tx, id, actor).await?;
                if l.me.role == Role::Owner {
                    return Err(Error::new(
                        Code::OwnerCannotQuit,
                        "the owner transfers the group or dissolves it",
                    )
                    .into());
                }
                let payload = json!({ "operatorId": actor, "event": "left", "userIds": [actor] });
                let tip = self
                    .group_tip(&mut c.tx, &mut l, GROUP_UPDATE, actor, payload, now)
                    .await?;
                c.lock_streams(&[actor]).await?;
                q::close_membership(&mut c.tx, id, actor, l.head.last_seq, MemberState::Left)
                    .await?;
                c.streams.append(
                    actor,
                    "group.left",
                    None,
                    &json!({
                        "conversationId": id, "conversationType": l.head.conversation_type,
                    }),
                );
                l.group.member_count -= 1;
                q::save_group(&mut c.tx, &mut l.group, now).await?;
                c.fx.members_changed = Some(id);
                if let Some(tip) = tip {
                    c.fx.tips.push((
                        tip,
                        self.tip_recipients(&mut c.tx, id, &[actor.to_string()])
                            .await?,
                    ));
                }
                Ok(((), c))
            })
        })
        .await
    }

    pub async fn dissolve(&self, actor: &str, id: i64) -> Result<(), Error> {
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let mut l = self.lock_group(&mut c.tx, id, actor).await?;
                if l.me.role != Role::Owner {
                    return Err(denied("only the owner dissolves"));
                }
                let members: Vec<String> = q::current_in(&mut c.tx, id)
                    .await?
                    .into_iter()
                    .map(|(u, _)| u)
                    .collect();
                let payload = json!({ "operatorId": actor, "event": "dissolved" });
                let tip = self
                    .tip(&mut c.tx, &mut l, GROUP_UPDATE, actor, payload, now)
                    .await?;
                // Pending join requests are answered: rejected, with the group.
                let pending = q::pending_join_requests_in(&mut c.tx, id).await?;
                let mut refs: Vec<&str> = members.iter().map(String::as_str).collect();
                refs.extend(pending.iter().map(|r| r.user_id.as_str()));
                c.lock_streams(&refs).await?;
                for r in pending {
                    let r = q::JoinRequest { state: 2, ..r };
                    q::save_join_request(&mut c.tx, id, &r, Some(actor), now).await?;
                    c.streams.append(
                        &r.user_id,
                        "group.joinRequest",
                        None,
                        &json!({
                            "conversationId": id, "conversationType": l.head.conversation_type,
                            "requestId": r.request_id, "userId": r.user_id, "message": r.message,
                            "state": r.state_str(), "by": actor,
                        }),
                    );
                }
                for u in &members {
                    q::close_membership(&mut c.tx, id, u, l.head.last_seq, MemberState::Dissolved)
                        .await?;
                    c.streams.append(u, "group.dissolved", None, &json!({
                    "conversationId": id, "conversationType": l.head.conversation_type, "by": actor,
                }));
                }
                l.group.dissolved = true;
                l.group.member_count = 0;
                q::save_group(&mut c.tx, &mut l.group, now).await?;
                c.fx.tips = vec![(tip, members)];
                c.fx.members_changed = Some(id);
                Ok(((), c))
            })
        })
        .await
    }

    /// Owner-only role changes: make or unmake an admin, or hand the group over.
    async fn change_role(
        &self,
        actor: &str,
        id: i64,
        user: &str,
        role: Role,
    ) -> Result<Value, Error> {
        if user == actor {
            return Err(Error::bad_request("that is you"));
        }
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let d = self.store.dialect();
                let mut l = self.lock_group(&mut c.tx, id, actor).await?;
                if l.me.role != Role::Owner {
                    return Err(denied("only the owner changes roles"));
                }
                let target = q::members_in(d, &mut c.tx, id, &[user])
                    .await?
                    .remove(user)
                    .filter(Member::is_current)
                    .ok_or_else(|| {
                        Error::new(Code::TargetNotMember, format!("{user} is not a member"))
                    })?;
                let event = match role {
                    Role::Owner => "ownerChanged",
                    Role::Admin => "adminAdded",
                    Role::Member => "adminRemoved",
                };
                c.fx.members_changed = Some(id);
                if target.role != role {
                    let payload = json!({ "operatorId": actor, "event": event, "userIds": [user] });
                    let tip = self
                        .tip(&mut c.tx, &mut l, GROUP_UPDATE, actor, payload, now)
                        .await?;
                    q::set_role(&mut c.tx, id, user, role).await?;
                    let mut changed = vec![(user, role)];
                    if role == Role::Owner {
                        q::set_role(&mut c.tx, id, actor, Role::Member).await?;
                        l.group.owner_id = user.to_string();
                        changed.push((actor, Role::Member));
                    }
                    q::save_group(&mut c.tx, &mut l.group, now).await?;
                    c.lock_streams(&[actor, user]).await?;
                    for (u, r) in changed {
                        c.streams.append(
                            u,
                            "group.role",
                            None,
                            &json!({
                                "conversationId": id, "conversationType": l.head.conversation_type,
                                "role": r.as_str(), "by": actor,
                            }),
                        );
                    }
                    c.fx.tips
                        .push((tip, self.tip_recipients(&mut c.tx, id, &[]).await?));
                }
                let answer = match role {
                    Role::Owner => info(&l.group),
                    _ => json!({ "userId": user, "role": role.as_str() }),
                };
                Ok((answer, c))
            })
        })
        .await
    }

    pub async fn transfer(&self, actor: &str, id: i64, user: &str) -> Result<Value, Error> {
        self.change_role(actor, id, user, Role::Owner).await
    }

    pub async fn set_admin(
        &self,
        actor: &str,
        id: i64,
        user: &str,
        on: bool,
    ) -> Result<Value, Error> {
        let role = if on { Role::Admin } else { Role::Member };
        self.change_role(actor, id, user, role).await
    }

    pub async fn mute(&self, actor: &str, id: i64, user: &str, until: i64) -> Result<Value, Error> {
        if user == actor {
            return Err(Error::bad_request("that is you"));
        }
        if until < 0 || (until != 0 && until <= now_ms()) {
            return Err(Error::bad_request(
                "until is a time in ms in the future, or 0 to unmute",
            ));
        }
        self.change(|mut c| Box::pin(async move {
            let now = c.now;
            let d = self.store.dialect();
            let mut l = self.lock_group(&mut c.tx, id, actor).await?;
            if l.me.role < Role::Admin {
                return Err(denied("only the owner and admins mute"));
            }
            let target = q::members_in(d, &mut c.tx, id, &[user])
                .await?
                .remove(user)
                .filter(Member::is_current)
                .ok_or_else(|| Error::new(Code::TargetNotMember, format!("{user} is not a member")))?;
            if target.role >= l.me.role {
                return Err(denied("admins mute ordinary members only; nobody mutes the owner"));
            }
            // Unmuting someone not muted (or muting to the same time) changes nothing.
            if until == target.muted_until || (until == 0 && target.muted_until <= now) {
                return Ok((json!({ "userId": user, "mutedUntil": until }), c));
            }
            let payload = if until > 0 {
                json!({ "operatorId": actor, "event": "memberMuted", "userIds": [user], "mutedUntil": until })
            } else {
                json!({ "operatorId": actor, "event": "memberUnmuted", "userIds": [user] })
            };
            // A channel's subscribers are not announced.
            let tip = self
                .group_tip(&mut c.tx, &mut l, GROUP_UPDATE, actor, payload, now)
                .await?;
            q::set_muted(&mut c.tx, id, user, until).await?;
            q::save_group(&mut c.tx, &mut l.group, now).await?;
            c.lock_streams(&[user]).await?;
            c.streams.append(user, "group.muted", None, &json!({
                "conversationId": id, "conversationType": l.head.conversation_type,
                "mutedUntil": until, "by": actor,
            }));
            c.fx.members_changed = Some(id);
            if let Some(tip) = tip {
                c.fx.tips.push((tip, self.tip_recipients(&mut c.tx, id, &[]).await?));
            }
            Ok((json!({ "userId": user, "mutedUntil": until }), c))
        }))
        .await
    }

    /// Joins an open group, or asks to join one that needs approval.
    pub async fn join(&self, actor: &str, id: i64, message: &str) -> Result<Value, Error> {
        let message = message.trim();
        if message.chars().count() > 200 || message.chars().any(char::is_control) {
            return Err(Error::bad_request(
                "message is at most 200 characters, without control characters",
            ));
        }
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let d = self.store.dialect();
                let head = lock_head(d, &mut c.tx, id)
                    .await?
                    .filter(|h| h.conversation_type >= 2)
                    .ok_or_else(|| group_not_found(id))?;
                let group = q::group_in(&mut c.tx, id)
                    .await?
                    .ok_or_else(|| group_not_found(id))?;
                if group.dissolved {
                    return Err(Refused::GroupDissolved(id).into());
                }
                let mine = q::members_in(d, &mut c.tx, id, &[actor])
                    .await?
                    .remove(actor);
                if mine.as_ref().is_some_and(Member::is_current) {
                    return Err(Error::new(Code::AlreadyMember, "you are a member").into());
                }
                let me = Member {
                    user_id: actor.to_string(),
                    role: Role::Member,
                    state: MemberState::Member,
                    joined_after_seq: head.last_seq,
                    left_at_seq: None,
                    muted_until: 0,
                    joined_at: now,
                };
                let mut l = Locked { head, group, me };
                let answer = match l.group.join_policy.as_str() {
                    "open" => {
                        // A request from when the group needed approval is answered by the join.
                        let pending = q::join_request(&mut c.tx, id, actor)
                            .await?
                            .filter(|r| r.state == 0);
                        if pending.is_some() {
                            let mut affected = self.admins(&mut c.tx, id).await?;
                            affected.push(actor.to_string());
                            let refs: Vec<&str> = affected.iter().map(String::as_str).collect();
                            c.lock_streams(&refs).await?;
                        }
                        self.admit_one(&mut c, &mut l, actor, actor).await?;
                        if let Some(r) = pending {
                            let r = q::JoinRequest { state: 1, ..r };
                            q::save_join_request(&mut c.tx, id, &r, Some(actor), now).await?;
                            self.join_request_events(&mut c, &l, &r, Some(actor))
                                .await?;
                        }
                        json!({ "state": "joined" })
                    }
                    "approval" => {
                        let request = match q::join_request(&mut c.tx, id, actor).await? {
                            Some(r) if r.state == 0 => q::JoinRequest {
                                message: message.to_string(),
                                ..r
                            },
                            _ => q::JoinRequest {
                                request_id: self.ids.next(now).to_string(),
                                user_id: actor.to_string(),
                                message: message.to_string(),
                                state: 0,
                                created_at: now,
                            },
                        };
                        q::save_join_request(&mut c.tx, id, &request, None, now).await?;
                        self.join_request_events(&mut c, &l, &request, None).await?;
                        json!({ "state": "pending", "requestId": request.request_id })
                    }
                    _ => {
                        return Err(Error::new(
                            Code::JoinClosed,
                            "members of this group are invited",
                        )
                        .into());
                    }
                };
                Ok((answer, c))
            })
        })
        .await
    }

    /// The owner and admins now.
    async fn admins(&self, tx: &mut AnyConnection, id: i64) -> Result<Vec<String>, OpError> {
        Ok(q::current_in(tx, id)
            .await?
            .into_iter()
            .filter(|(_, role)| *role >= Role::Admin)
            .map(|(u, _)| u)
            .collect())
    }

    /// `group.joinRequest` to the requester, the owner and the admins.
    async fn join_request_events(
        &self,
        c: &mut Change,
        l: &Locked,
        r: &q::JoinRequest,
        by: Option<&str>,
    ) -> Result<(), OpError> {
        let mut to = self.admins(&mut c.tx, l.head.conversation_id).await?;
        to.push(r.user_id.clone());
        let unique: HashSet<&str> = to.iter().map(String::as_str).collect();
        let refs: Vec<&str> = unique.into_iter().collect();
        c.lock_streams(&refs).await?;
        let mut data = json!({
            "conversationId": l.head.conversation_id,
            "conversationType": l.head.conversation_type,
            "requestId": r.request_id,
            "userId": r.user_id,
            "message": r.message,
            "state": r.state_str(),
        });
        if let Some(by) = by {
            data["by"] = by.into();
        }
        for u in refs {
            c.streams.append(u, "group.joinRequest", None, &data);
        }
        Ok(())
    }

    /// Approves or rejects a pending join request (owner and admins).
    pub async fn decide_join(
        &self,
        actor: &str,
        id: i64,
        user: &str,
        approve: bool,
    ) -> Result<Value, Error> {
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let d = self.store.dialect();
                let mut l = self.lock_group(&mut c.tx, id, actor).await?;
                if l.me.role < Role::Admin {
                    return Err(denied("only the owner and admins decide join requests"));
                }
                let r = q::join_request(&mut c.tx, id, user).await?.ok_or_else(|| {
                    Error::new(Code::RequestNotFound, format!("{user} did not ask to join"))
                })?;
                if r.state != 0 {
                    return Err(Error::new(
                        Code::RequestNotPending,
                        format!("the request was already {}", r.state_str()),
                    )
                    .into());
                }
                let r = q::JoinRequest {
                    state: if approve { 1 } else { 2 },
                    ..r
                };
                q::save_join_request(&mut c.tx, id, &r, Some(actor), now).await?;
                // Every stream this change may write to, locked at once in user order.
                let mut affected: Vec<String> = self.admins(&mut c.tx, id).await?;
                affected.push(user.to_string());
                let refs: Vec<&str> = affected.iter().map(String::as_str).collect();
                c.lock_streams(&refs).await?;
                let already = q::members_in(d, &mut c.tx, id, &[user])
                    .await?
                    .remove(user)
                    .is_some_and(|m| m.is_current());
                if approve && !already {
                    self.admit_one(&mut c, &mut l, actor, user).await?;
                }
                self.join_request_events(&mut c, &l, &r, Some(actor))
                    .await?;
                Ok((
                    json!({ "requestId": r.request_id, "state": r.state_str() }),
                    c,
                ))
            })
        })
        .await
    }
}
