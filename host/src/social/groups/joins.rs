//! Joining on one's own: an open group at once, an approval group by a request that
//! the owner or an admin decides.

use std::collections::HashSet;

use serde_json::{Value, json};
use sqlx::AnyConnection;

use super::{Locked, denied, group_not_found};
use crate::messaging::Core;
use crate::protocol::Refused;
use crate::protocol::{Code, Error};
use crate::social::{Change, OpError};
use crate::store::groups::lock_head;
use crate::store::groups::{self as q, JoinState, Member, MemberState, Role};

impl Core {
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
                let mut l = self.lock_for_joining(&mut c, id, actor).await?;
                let answer = match l.group.join_policy.as_str() {
                    "open" => self.join_open(&mut c, &mut l, actor).await?,
                    "approval" => self.ask_to_join(&mut c, &l, actor, message).await?,
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

    /// Locks a live group for someone who is not a member yet (the membership they would
    /// have).
    async fn lock_for_joining(
        &self,
        c: &mut Change,
        id: i64,
        actor: &str,
    ) -> Result<Locked, OpError> {
        let d = self.store.dialect();
        let named = c.named(actor, &[]).await?;
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
            joined_at: c.now,
        };
        Ok(Locked {
            head,
            group,
            me,
            named,
        })
    }

    /// Joins an open group; a request from when it needed approval is answered by the
    /// join.
    async fn join_open(
        &self,
        c: &mut Change,
        l: &mut Locked,
        actor: &str,
    ) -> Result<Value, OpError> {
        let id = l.head.conversation_id;
        let pending = q::join_request(&mut c.tx, id, actor)
            .await?
            .filter(|r| r.state == JoinState::Pending);
        if pending.is_some() {
            let mut affected = self.admins(&mut c.tx, id).await?;
            affected.push(actor.to_string());
            let refs: Vec<&str> = affected.iter().map(String::as_str).collect();
            c.lock_streams(&refs).await?;
        }
        self.admit_one(c, l, actor, actor).await?;
        if let Some(r) = pending {
            let r = q::JoinRequest {
                state: JoinState::Approved,
                ..r
            };
            q::save_join_request(&mut c.tx, id, &r, Some(actor), c.now).await?;
            self.join_request_events(c, l, &r, Some(actor)).await?;
        }
        Ok(json!({ "state": "joined" }))
    }

    /// Asks to join a group that needs approval (asking again updates the pending request).
    async fn ask_to_join(
        &self,
        c: &mut Change,
        l: &Locked,
        actor: &str,
        message: &str,
    ) -> Result<Value, OpError> {
        let (id, now) = (l.head.conversation_id, c.now);
        let request = match q::join_request(&mut c.tx, id, actor).await? {
            Some(r) if r.state == JoinState::Pending => q::JoinRequest {
                message: message.to_string(),
                ..r
            },
            _ => q::JoinRequest {
                request_id: self.ids.next(now).to_string(),
                user_id: actor.to_string(),
                message: message.to_string(),
                state: JoinState::Pending,
                created_at: now,
            },
        };
        q::save_join_request(&mut c.tx, id, &request, None, now).await?;
        self.join_request_events(c, l, &request, None).await?;
        Ok(json!({ "state": "pending", "requestId": request.request_id }))
    }

    /// The owner and admins now.
    pub(super) async fn admins(
        &self,
        tx: &mut AnyConnection,
        id: i64,
    ) -> Result<Vec<String>, OpError> {
        Ok(q::admins_in(tx, id).await?)
    }

    /// `group.joinRequest` to the requester, the owner and the admins.
    pub(super) async fn join_request_events(
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
            "state": r.state.as_str(),
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
                let mut l = self.lock_group(&mut c.tx, id, actor, &[user]).await?;
                if l.me.role < Role::Admin {
                    return Err(denied("only the owner and admins decide join requests"));
                }
                let r = q::join_request(&mut c.tx, id, user).await?.ok_or_else(|| {
                    Error::new(Code::RequestNotFound, format!("{user} did not ask to join"))
                })?;
                if r.state != JoinState::Pending {
                    return Err(Error::new(
                        Code::RequestNotPending,
                        format!("the request was already {}", r.state.as_str()),
                    )
                    .into());
                }
                let r = q::JoinRequest {
                    state: if approve {
                        JoinState::Approved
                    } else {
                        JoinState::Rejected
                    },
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
                    json!({ "requestId": r.request_id, "state": r.state.as_str() }),
                    c,
                ))
            })
        })
        .await
    }
}
