//! Roles and mutes: handing a group over, making and unmaking admins, muting members.

use serde_json::{Value, json};

use super::{GROUP_UPDATE, denied, info};
use crate::clock::now_ms;
use crate::messaging::Core;
use crate::protocol::{Code, Error};
use crate::store::groups::{self as q, Role};

impl Core {
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
                let mut l = self.lock_group(&mut c.tx, id, actor, &[user]).await?;
                if l.me.role != Role::Owner {
                    return Err(denied("only the owner changes roles"));
                }
                // A deleted account's alias is leaving: it takes no role.
                let target = q::members_in(d, &mut c.tx, id, &[user])
                    .await?
                    .remove(user)
                    .filter(|m| m.is_current() && l.named.contains(user))
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
            let mut l = self.lock_group(&mut c.tx, id, actor, &[user]).await?;
            if l.me.role < Role::Admin {
                return Err(denied("only the owner and admins mute"));
            }
            let target = q::members_in(d, &mut c.tx, id, &[user])
                .await?
                .remove(user)
                .filter(|m| m.is_current() && l.named.contains(user))
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
}
