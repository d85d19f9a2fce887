//! Deleting an account. The account's rows take an alias (`deleted-` and 16 hex digits;
//! no one can register an id starting with `deleted-`), so nothing stored shows the old
//! id again: its messages stay in their conversations as the alias's, and its
//! memberships, friendships and requests end as the alias's, with the usual tips and
//! events naming the alias. The `users` rows of the id and of the alias stay as
//! tombstones: neither can be registered or used again.

use serde_json::json;

use super::{Decision, SystemKind};
use crate::auth::random_bytes;
use crate::messaging::Core;
use crate::protocol::{Code, Error};
use crate::store::accounts::{DELETED_PREFIX, lock_account, rename_account};
use crate::store::groups::{self, Role};

/// How many times a deleted account's alias decides again how to leave a group.
const LEAVE_ATTEMPTS: usize = 5;

/// The alias is no longer in the group: dissolved or left meanwhile.
fn gone(e: &Error) -> bool {
    matches!(e.code, Code::GroupDissolved | Code::NotAMember)
}

impl Core {
    /// Deletes `user_id`'s account; its alias. Calling it again on a deleted account
    /// finishes a deletion that was interrupted (it is idempotent).
    pub async fn delete_account(&self, user_id: &str) -> Result<String, Error> {
        let alias = match self
            .store
            .deleted_alias(user_id)
            .await
            .map_err(crate::store::unavailable)?
        {
            Some(alias) => alias,
            None => format!("{DELETED_PREFIX}{}", hex::encode(random_bytes::<8>())),
        };
        // The tip kinds the deletion writes with, checked before anything changes: a kind
        // switched off refuses the deletion whole instead of leaving it half done.
        self.deletion_kinds_ready(&[user_id, &alias]).await?;
        // Refused from now on, on this node; its connections close.
        self.forget_account(user_id);
        if let Err(e) = self.rename(user_id, &alias).await {
            self.unforget_account(user_id);
            return Err(e);
        }
        self.leave_everything(&alias).await?;
        self.store
            .rename_in_payloads(user_id, &alias)
            .await
            .map_err(crate::store::unavailable)?;
        // Writes that raced the first rename (a send already queued) carry the old id:
        // renamed now. The alias's own user stream (the steps above wrote to it) goes.
        self.rename(user_id, &alias).await?;
        self.store
            .drop_user_stream(&alias)
            .await
            .map_err(crate::store::unavailable)?;
        // Other nodes read the account again now that it is marked deleted.
        self.forget_account(user_id);
        self.forget(crate::messaging::Forget::AllMembers);
        tracing::info!(alias = %alias, "account deleted");
        Ok(alias)
    }

    /// Each tip kind that ending the memberships and requests of `ids` writes is loaded and
    /// switched on.
    async fn deletion_kinds_ready(&self, ids: &[&str]) -> Result<(), Error> {
        let mut needs = Vec::new();
        for id in ids {
            let groups = self
                .store
                .my_groups(id)
                .await
                .map_err(crate::store::unavailable)?;
            if groups.iter().any(|(g, me)| me.is_current() && !g.dissolved) {
                needs.push(SystemKind::GroupUpdate);
            }
            for incoming in [true, false] {
                let pending = self
                    .store
                    .pending_requests(id, incoming)
                    .await
                    .map_err(crate::store::unavailable)?;
                if !pending.is_empty() {
                    needs.push(SystemKind::FriendRequest);
                }
            }
        }
        for kind in needs {
            let name = kind.name();
            match self.registry.by_name(name) {
                None => {
                    return Err(Error::new(
                        Code::ContentTypeUnknown,
                        format!(
                            "deleting this account writes {name} tips, and no plugin named {name} is loaded"
                        ),
                    ));
                }
                Some(p) if !p.is_enabled() => {
                    return Err(Error::new(
                        Code::ContentTypeDisabled,
                        format!(
                            "deleting this account writes {name} tips, and that kind is switched off: switch it on, then delete again (nothing was changed)"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Renames the account's rows to the alias; its pending join requests go, and the
    /// owner and admins of each group they were for hear so (`group.joinRequest`,
    /// `withdrawn`, by the alias), as they heard of the request.
    async fn rename(&self, user_id: &str, alias: &str) -> Result<(), Error> {
        self.change_within(false, |mut c| {
            Box::pin(async move {
                // First: a change naming the account comes wholly before or after this.
                lock_account(c.dialect, &mut c.tx, user_id).await?;
                let pending = groups::pending_join_requests_by(&mut c.tx, user_id).await?;
                let mut told = Vec::with_capacity(pending.len());
                for (id, conversation_type, r) in pending {
                    let admins = groups::admins_in(&mut c.tx, id).await?;
                    told.push((id, conversation_type, r, admins));
                }
                let mut to: Vec<&str> = told
                    .iter()
                    .flat_map(|t| t.3.iter().map(String::as_str))
                    .collect();
                to.sort_unstable();
                to.dedup();
                c.lock_streams(&to).await?;
                for (id, conversation_type, r, admins) in &told {
                    let data = json!({
                        "conversationId": id, "conversationType": conversation_type,
                        "requestId": r.request_id, "userId": alias, "message": r.message,
                        "state": "withdrawn", "by": alias,
                    });
                    for admin in admins {
                        c.streams.append(admin, "group.joinRequest", None, &data);
                    }
                }
                rename_account(c.dialect, &mut c.tx, user_id, alias, c.now).await?;
                Ok(((), c))
            })
        })
        .await
    }

    /// The alias leaves a group: an owner hands it to its longest-standing admin (else
    /// member) first, or dissolves it when no one else is left. Other deletions may be
    /// ending memberships of the same group at the same moment: a deleted account's alias
    /// is never the heir, and when the heir left or this alias became the owner between
    /// the steps, they are decided again (a few times; then the deletion is answered
    /// `503` and, run again, finishes).
    async fn leave_group(&self, alias: &str, id: i64) -> Result<(), Error> {
        let unavailable = crate::store::unavailable;
        for _ in 0..LEAVE_ATTEMPTS {
            let group = self.store.group(id).await.map_err(unavailable)?;
            let me = self.store.member(id, alias).await.map_err(unavailable)?;
            let (Some(g), Some(me)) = (group, me) else {
                return Ok(());
            };
            if !me.is_current() || g.dissolved {
                return Ok(());
            }
            if me.role == Role::Owner {
                let members = self
                    .store
                    .group_members(id, "", i64::MAX)
                    .await
                    .map_err(unavailable)?;
                let heir = members
                    .iter()
                    .filter(|m| m.user_id != alias && !m.user_id.starts_with(DELETED_PREFIX))
                    .min_by_key(|m| (m.role != Role::Admin, m.joined_at, m.user_id.clone()));
                let Some(heir) = heir else {
                    return match self.dissolve(alias, id).await {
                        Err(e) if !gone(&e) => Err(e),
                        _ => Ok(()),
                    };
                };
                match self.transfer(alias, id, &heir.user_id).await {
                    Ok(_) => {}
                    Err(e) if e.code == Code::TargetNotMember => continue,
                    Err(e) if gone(&e) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
            match self.quit(alias, id).await {
                Ok(()) => return Ok(()),
                Err(e) if e.code == Code::OwnerCannotQuit => continue,
                Err(e) if gone(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        tracing::warn!(
            user = %alias,
            "a deletion gave up: the account's groups kept changing while it left them"
        );
        Err(Error::unavailable(
            "the account's groups kept changing while it left them; delete it again",
        ))
    }

    /// Ends every membership, friendship and pending request of `alias`, as its own
    /// actions: an owner hands the group to its longest-standing admin (else member)
    /// first, or dissolves it when no one else is left.
    async fn leave_everything(&self, alias: &str) -> Result<(), Error> {
        let groups = self
            .store
            .my_groups(alias)
            .await
            .map_err(crate::store::unavailable)?;
        for (g, me) in groups {
            if me.is_current() && !g.dissolved {
                self.leave_group(alias, g.conversation_id).await?;
            }
        }
        let friends = self
            .store
            .friends(alias)
            .await
            .map_err(crate::store::unavailable)?;
        for (friend, _) in friends {
            self.remove_friend(alias, &friend).await?;
        }
        for (incoming, decision) in [(true, Decision::Reject), (false, Decision::Cancel)] {
            let pending = self
                .store
                .pending_requests(alias, incoming)
                .await
                .map_err(crate::store::unavailable)?;
            for r in pending {
                self.decide_friend_request(alias, &r.request_id, decision)
                    .await?;
            }
        }
        Ok(())
    }
}

/// What `DELETE /v1/account` answers.
pub fn deleted_answer(user_id: &str, alias: &str) -> serde_json::Value {
    json!({ "userId": user_id, "deleted": true, "alias": alias })
}
