//! Creating a group or channel, and changing its settings (name, notice, avatar,
//! mute-all, join policy).

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{
    GROUP_UPDATE, GroupPatch, MAX_USERS_PER_CHANGE, NewGroup, denied, group_full, info, join_policy,
};
use crate::auth::valid_user_id;
use crate::messaging::Core;
use crate::protocol::Error;
use crate::protocol::Refused;
use crate::social::value;
use crate::store::groups::{self as q, Group, Role, append_system};

impl Core {
    /// What a creation asks for, checked: its other members (sorted, without the owner) and
    /// its join policy.
    fn creation(&self, owner: &str, spec: &NewGroup) -> Result<(Vec<String>, String), Error> {
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
        if members.len() > MAX_USERS_PER_CHANGE {
            return Err(Error::bad_request(format!(
                "members lists at most {MAX_USERS_PER_CHANGE} users besides you: add more with POST /v1/groups/{{id}}/members"
            )));
        }
        if members.len() + 1 > self.settings.max_group_members as usize {
            return Err(group_full(self.settings.max_group_members));
        }
        Ok((members, policy))
    }

    pub async fn create_group(&self, owner: &str, spec: NewGroup) -> Result<Value, Error> {
        let (members, policy) = self.creation(owner, &spec)?;
        let (spec, members, policy) = (&spec, &members, &policy);
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                let d = self.store.dialect();
                let named: Vec<&str> = members.iter().map(String::as_str).collect();
                let known = c.named(owner, &named).await?;
                if let Some(m) = members.iter().find(|m| !known.contains(*m)) {
                    return Err(Refused::UserNotFound(m.clone()).into());
                }
                let payload = created_tip(owner, spec, members, policy);
                // Checked before anything is written: the plugin normalizes the settings.
                let (update, checked) =
                    self.system_payload(GROUP_UPDATE, spec.conversation_type, 0, &payload)?;
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
                    update,
                    checked,
                    self.ids.next(now),
                    now,
                )
                .await?;
                let mut everyone: Vec<&str> = vec![owner];
                everyone.extend(members.iter().map(String::as_str));
                c.lock_streams(&everyone).await?;
                let role = |user: &str| {
                    if user == owner {
                        Role::Owner
                    } else {
                        Role::Member
                    }
                };
                let joining: Vec<(&str, Role)> = everyone.iter().map(|u| (*u, role(u))).collect();
                // A new conversation: nobody was a member before.
                q::open_memberships(d, &mut c.tx, &head, &joining, &HashMap::new(), 0, now).await?;
                for user in &everyone {
                    let role = role(user);
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
            })
        })
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
                let mut l = self.lock_group(&mut c.tx, id, actor, &[]).await?;
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
}

/// The `created` tip of a new group or channel.
fn created_tip(owner: &str, spec: &NewGroup, members: &[String], policy: &str) -> Value {
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
    payload
}
