//! Friend requests, friendships and blocks. Every change locks both users' stream heads
//! first, so the changes of one pair are serialized (two crossing requests see each
//! other) and each event gets its seq in commit order.

use serde_json::{Value, json};

use super::{Change, OpError, SystemKind, value};
use crate::auth::valid_user_id;
use crate::messaging::Core;
use crate::protocol::{Code, Error};
use crate::protocol::{Refused, pair};
use crate::store::batch::resolve_pairs;
use crate::store::groups::{append_system, lock_head};
use crate::store::social::{self as q, FriendRequest, RequestState};

/// The friend-request kind.
const FRIEND_REQUEST: SystemKind = SystemKind::FriendRequest;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Accept,
    Reject,
    Cancel,
}

fn peer_id(me: &str, other: &str) -> Result<(), Error> {
    if !valid_user_id(other) {
        return Err(Error::bad_request("not a valid user id"));
    }
    if me == other {
        return Err(Error::bad_request("that is you"));
    }
    Ok(())
}

impl Core {
    /// Sends (or renews) a friend request; crossing requests become a friendship.
    pub async fn friend_request(&self, me: &str, to: &str, message: &str) -> Result<Value, Error> {
        peer_id(me, to)?;
        self.change(|c| Box::pin(self.friend_request_once(c, me, to, message)))
            .await
    }

    async fn friend_request_once(
        &self,
        mut c: Change,
        me: &str,
        to: &str,
        message: &str,
    ) -> Result<(Value, Change), OpError> {
        let now = c.now;
        if !c.named(me, &[to]).await?.contains(to) {
            return Err(Refused::UserNotFound(to.to_string()).into());
        }
        c.lock_streams(&[me, to]).await?;
        if q::either_blocks(&mut c.tx, me, to).await? {
            return Err(Error::new(Code::Blocked, "one of you blocked the other").into());
        }
        if q::are_friends(&mut c.tx, me, to).await? {
            return Err(Error::new(Code::AlreadyFriends, format!("{to} is your friend")).into());
        }
        if let Some(theirs) = q::request_between(&mut c.tx, to, me).await?
            && theirs.state == RequestState::Pending
        {
            let id = theirs.request_id.clone();
            self.accept(&mut c, theirs, me).await?;
            return Ok((json!({ "requestId": id, "state": "accepted" }), c));
        }
        let request = match q::request_between(&mut c.tx, me, to).await? {
            Some(r) if r.state == RequestState::Pending => FriendRequest {
                message: message.to_string(),
                updated_at: now,
                ..r
            },
            _ => FriendRequest {
                request_id: self.ids.next(now).to_string(),
                from_user: me.to_string(),
                to_user: to.to_string(),
                message: message.to_string(),
                state: RequestState::Pending,
                created_at: now,
                updated_at: now,
            },
        };
        let (kind, data) = self.request_event(&request, "requested")?;
        // The plugin may normalize the message (trimmed); store what it returned.
        let request = FriendRequest {
            message: data["message"].as_str().unwrap_or("").to_string(),
            ..request
        };
        q::save_request(&mut c.tx, &request).await?;
        c.streams.append(me, "friend.request", Some(kind), &data);
        c.streams.append(to, "friend.request", Some(kind), &data);
        Ok((
            json!({ "requestId": request.request_id, "state": "pending" }),
            c,
        ))
    }

    /// The `friend-request` payload of a request in a new state, checked by its plugin.
    fn request_event(&self, r: &FriendRequest, action: &str) -> Result<(u32, Value), Error> {
        let payload = json!({
            "action": action,
            "requestId": r.request_id,
            "fromUserId": r.from_user,
            "toUserId": r.to_user,
            "message": r.message,
        });
        let (kind, checked) = self.system_payload(FRIEND_REQUEST, 0, 0, &payload)?;
        Ok((kind, value(&checked)))
    }

    /// Accepts a pending request inside the caller's transaction: the friendship, the
    /// events, and the tip in the pair's private conversation (created if need be).
    async fn accept(
        &self,
        c: &mut Change,
        request: FriendRequest,
        operator: &str,
    ) -> Result<(), OpError> {
        let (d, now) = (self.store.dialect(), c.now);
        let tx = &mut *c.tx;
        let request = FriendRequest {
            state: RequestState::Accepted,
            updated_at: now,
            ..request
        };
        q::save_request(tx, &request).await?;
        q::set_friends(tx, &request.from_user, &request.to_user, true, now).await?;
        let (kind, data) = self.request_event(&request, "accepted")?;
        let (a, b) = (&request.from_user, &request.to_user);
        for (user, friend) in [(a, b), (b, a)] {
            c.streams.append(user, "friend.request", Some(kind), &data);
            c.streams
                .append(user, "friend.added", None, &json!({ "userId": friend }));
        }
        let key = pair(a, b);
        let conversation = resolve_pairs(d, tx, std::slice::from_ref(&key), now)
            .await?
            .get(&key)
            .copied()
            .ok_or_else(|| Refused::UserNotFound(b.clone()))?;
        let mut head = lock_head(d, tx, conversation)
            .await?
            .ok_or(Refused::NotAMember(conversation))?;
        let (kind, tip) = self.system_payload(
            FRIEND_REQUEST,
            1,
            conversation,
            &json!({
                "action": "accepted",
                "requestId": request.request_id,
                "fromUserId": a,
                "toUserId": b,
            }),
        )?;
        let stored =
            append_system(tx, &mut head, operator, kind, tip, self.ids.next(now), now).await?;
        c.fx.tips.push((stored, vec![a.clone(), b.clone()]));
        Ok(())
    }

    /// Accepts or rejects (the recipient) or cancels (the sender) a pending request.
    pub async fn decide_friend_request(
        &self,
        me: &str,
        request_id: &str,
        decision: Decision,
    ) -> Result<Value, Error> {
        self.change(|c| Box::pin(self.decide_once(c, me, request_id, decision)))
            .await
    }

    async fn decide_once(
        &self,
        mut c: Change,
        me: &str,
        request_id: &str,
        decision: Decision,
    ) -> Result<(Value, Change), OpError> {
        let now = c.now;
        let not_found = || Error::new(Code::RequestNotFound, "no such request of yours");
        let found = q::request_by_id(&mut c.tx, request_id)
            .await?
            .ok_or_else(not_found)?;
        let mine = match decision {
            Decision::Accept | Decision::Reject => found.to_user == me,
            Decision::Cancel => found.from_user == me,
        };
        if !mine {
            return Err(not_found().into());
        }
        let other = if found.from_user == me {
            &found.to_user
        } else {
            &found.from_user
        };
        let other_live = c.named(me, &[other]).await?.contains(other);
        c.lock_streams(&[&found.from_user, &found.to_user]).await?;
        // Read again under the locks: a concurrent decision may have come first, or the
        // other's deletion, which ends the request.
        let r = q::request_by_id(&mut c.tx, request_id)
            .await?
            .ok_or_else(not_found)?;
        let renamed = (&r.from_user, &r.to_user) != (&found.from_user, &found.to_user);
        if renamed || (!other_live && decision == Decision::Accept) {
            return Err(Error::new(
                Code::RequestNotPending,
                "the other account was deleted, which ends the request",
            )
            .into());
        }
        if r.state != RequestState::Pending {
            return Err(Error::new(
                Code::RequestNotPending,
                format!("the request was already {}", r.state.as_str()),
            )
            .into());
        }
        if decision == Decision::Accept
            && q::either_blocks(&mut c.tx, &r.from_user, &r.to_user).await?
        {
            return Err(Error::new(Code::Blocked, "one of you blocked the other").into());
        }
        let state = match decision {
            Decision::Accept => {
                self.accept(&mut c, r, me).await?;
                RequestState::Accepted
            }
            Decision::Reject | Decision::Cancel => {
                let state = match decision {
                    Decision::Reject => RequestState::Rejected,
                    _ => RequestState::Cancelled,
                };
                let r = FriendRequest {
                    state,
                    updated_at: now,
                    ..r
                };
                q::save_request(&mut c.tx, &r).await?;
                let (kind, data) = self.request_event(&r, state.as_str())?;
                c.streams
                    .append(&r.from_user, "friend.request", Some(kind), &data);
                c.streams
                    .append(&r.to_user, "friend.request", Some(kind), &data);
                state
            }
        };
        Ok((
            json!({ "requestId": request_id, "state": state.as_str() }),
            c,
        ))
    }

    /// Ends a friendship for both.
    pub async fn remove_friend(&self, me: &str, other: &str) -> Result<(), Error> {
        peer_id(me, other)?;
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                c.named(me, &[other]).await?;
                c.lock_streams(&[me, other]).await?;
                if !q::are_friends(&mut c.tx, me, other).await? {
                    return Err(Error::new(
                        Code::NotFriends,
                        format!("{other} is not your friend"),
                    )
                    .into());
                }
                q::set_friends(&mut c.tx, me, other, false, now).await?;
                c.streams.append(
                    me,
                    "friend.removed",
                    None,
                    &json!({ "userId": other, "by": me }),
                );
                c.streams.append(
                    other,
                    "friend.removed",
                    None,
                    &json!({ "userId": me, "by": me }),
                );
                Ok(((), c))
            })
        })
        .await
    }

    /// Blocks or unblocks `other`; only the blocker's stream learns of it.
    pub async fn set_block(&self, me: &str, other: &str, on: bool) -> Result<(), Error> {
        peer_id(me, other)?;
        self.change(|mut c| {
            Box::pin(async move {
                let now = c.now;
                if !c.named(me, &[other]).await?.contains(other) {
                    return Err(Refused::UserNotFound(other.to_string()).into());
                }
                c.lock_streams(&[me]).await?;
                let change = q::set_block(c.dialect, &mut c.tx, me, other, on, now).await?;
                if change.changed {
                    let event = if on { "block.added" } else { "block.removed" };
                    c.streams
                        .append(me, event, None, &json!({ "userId": other }));
                }
                // Live sends read the block with the conversation's members.
                c.fx.members_changed = change.conversation_id;
                Ok(((), c))
            })
        })
        .await
    }
}
