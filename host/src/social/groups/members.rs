//! Who is in a group: adding members, kicking, quitting, dissolving.

use std::collections::{HashMap, HashSet};

use serde_json::json;

use super::{
    GROUP_KICK, GROUP_UPDATE, Locked, MAX_KICKED, MAX_USERS_PER_CHANGE, denied, group_full,
};
use crate::auth::valid_user_id;
use crate::messaging::Core;
use crate::protocol::Refused;
use crate::protocol::{Code, Error};
use crate::social::{Change, OpError};
use crate::store::groups::{self as q, JoinState, Member, MemberState, Role};

impl Core {
    /// Adds users (or one user joining by themselves when `actor` is in `users`), distinct
    /// and not current members; `previous` holds their membership rows read under the lock.
    async fn admit(
        &self,
        c: &mut Change,
        l: &mut Locked,
        operator: &str,
        users: &[String],
        previous: &HashMap<String, Member>,
        event: &str,
    ) -> Result<Option<std::sync::Arc<crate::protocol::Stored>>, OpError> {
        let now = c.now;
        if l.group.member_count + users.len() as i64 > i64::from(self.settings.max_group_members) {
            return Err(group_full(self.settings.max_group_members).into());
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
        let joining: Vec<(&str, Role)> = refs.iter().map(|u| (*u, Role::Member)).collect();
        let d = self.store.dialect();
        q::open_memberships(d, &mut c.tx, &l.head, &joining, previous, after, now).await?;
        for user in users {
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
    pub(super) async fn admit_one(
        &self,
        c: &mut Change,
        l: &mut Locked,
        operator: &str,
        user: &str,
    ) -> Result<(), OpError> {
        let users = [user.to_string()];
        let d = self.store.dialect();
        let previous = q::members_in(d, &mut c.tx, l.head.conversation_id, &[user]).await?;
        if let Some(tip) = self
            .admit(c, l, operator, &users, &previous, "joined")
            .await?
        {
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
        if users.is_empty() || users.len() > MAX_USERS_PER_CHANGE {
            return Err(Error::bad_request(format!(
                "userIds lists 1 to {MAX_USERS_PER_CHANGE} users"
            )));
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
                let refs: Vec<&str> = users.iter().map(String::as_str).collect();
                let mut l = self.lock_group(&mut c.tx, id, actor, &refs).await?;
                let may = l.me.role >= Role::Admin
                    || (l.head.conversation_type == 2 && l.group.join_policy != "approval");
                if !may {
                    return Err(denied("only the owner and admins add members here"));
                }
                let rows = q::members_in(d, &mut c.tx, id, &refs).await?;
                let mut new: Vec<String> = Vec::new();
                let mut seen = HashSet::new();
                for u in users {
                    if !rows.get(u).is_some_and(Member::is_current) && seen.insert(u.as_str()) {
                        new.push(u.clone());
                    }
                }
                if let Some(u) = new.iter().find(|u| !l.named.contains(*u)) {
                    return Err(Refused::UserNotFound(u.clone()).into());
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
                    .admit(&mut c, &mut l, actor, &new, &rows, "membersAdded")
                    .await?;
                // Adding someone who asked to join answers their request, whoever adds them
                // (a member may add once the policy is no longer `approval`): they are in.
                let named: Vec<&str> = new.iter().map(String::as_str).collect();
                let mut pending = q::pending_join_requests_of(d, &mut c.tx, id, &named).await?;
                for u in &new {
                    if let Some(r) = pending.remove(u) {
                        let r = q::JoinRequest {
                            state: JoinState::Approved,
                            ..r
                        };
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
        if users.is_empty() || users.len() > MAX_KICKED {
            return Err(Error::bad_request(format!(
                "userIds lists 1 to {MAX_KICKED} users"
            )));
        }
        if users.iter().any(|u| u == actor) {
            return Err(Error::bad_request("you cannot kick yourself: quit instead"));
        }
        let (users, reason) = (&users, &reason);
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let d = self.store.dialect();
                let refs: Vec<&str> = users.iter().map(String::as_str).collect();
                let mut l = self.lock_group(&mut c.tx, id, actor, &refs).await?;
                if l.me.role < Role::Admin {
                    return Err(denied("only the owner and admins kick"));
                }
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
                // A channel's kick makes no tip, but its reason is the client's: checked by
                // the kind as a group's, so both answer a request alike.
                if l.head.conversation_type != 2 {
                    self.system_payload(GROUP_KICK, 2, id, &payload)?;
                }
                let tip = self
                    .group_tip(&mut c.tx, &mut l, GROUP_KICK, actor, payload, now)
                    .await?;
                c.lock_streams(&refs).await?;
                for u in &kicked {
                    q::close_membership(
                        &mut c.tx,
                        id,
                        Some(u),
                        l.head.last_seq,
                        MemberState::Kicked,
                    )
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
                let mut l = self.lock_group(&mut c.tx, id, actor, &[]).await?;
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
                q::close_membership(
                    &mut c.tx,
                    id,
                    Some(actor),
                    l.head.last_seq,
                    MemberState::Left,
                )
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
                let mut l = self.lock_group(&mut c.tx, id, actor, &[]).await?;
                if l.me.role != Role::Owner {
                    return Err(denied("only the owner dissolves"));
                }
                let members = q::current_members(self.store.dialect(), &mut c.tx, id).await?;
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
                    let r = q::JoinRequest {
                        state: JoinState::Rejected,
                        ..r
                    };
                    q::save_join_request(&mut c.tx, id, &r, Some(actor), now).await?;
                    c.streams.append(
                        &r.user_id,
                        "group.joinRequest",
                        None,
                        &json!({
                            "conversationId": id, "conversationType": l.head.conversation_type,
                            "requestId": r.request_id, "userId": r.user_id, "message": r.message,
                            "state": r.state.as_str(), "by": actor,
                        }),
                    );
                }
                q::close_membership(&mut c.tx, id, None, l.head.last_seq, MemberState::Dissolved)
                    .await?;
                for u in &members {
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
}
