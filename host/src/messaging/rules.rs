//! The rules of a send, one function for both paths: a stored kind's in the committer's
//! batch, a live kind's on the connection's task. Each path reads the conversation its own
//! way (the batch under the head lock, a live send from the member cache); the verdict is
//! the same.

use crate::protocol::Refused;

/// The conversation as the rules see it, for one sender.
pub struct SendView<'a> {
    pub conversation_id: i64,
    pub conversation_type: u8,
    /// The group was dissolved.
    pub dissolved: bool,
    /// Groups: everyone but owner and admins is muted.
    pub mute_all: bool,
    /// The sender's membership: `None` none, `Some(None)` current, `Some(Some(seq))` ended
    /// at `seq`.
    pub membership: Option<Option<i64>>,
    /// Groups and channels: the sender's role (0 member, 1 admin, 2 owner) and mute.
    pub role: Option<(i64, i64)>,
    /// Private conversations: the members who block the other.
    pub blockers: &'a [String],
    /// Private conversations: the alias of the other member, if their account was deleted.
    pub deleted: Option<&'a str>,
}

/// Whether `sender` may send a message of `conversation_type` (as the request says) now.
pub fn may_send(
    v: &SendView<'_>,
    sender: &str,
    conversation_type: u8,
    now: i64,
) -> Result<(), Refused> {
    let id = v.conversation_id;
    if v.dissolved && v.membership.is_some() {
        return Err(Refused::GroupDissolved(id));
    }
    if v.membership != Some(None) {
        return Err(Refused::NotAMember(id));
    }
    if v.conversation_type != conversation_type {
        return Err(Refused::ConversationTypeMismatch {
            conversation_id: id,
            actual: v.conversation_type,
            given: conversation_type,
        });
    }
    if let Some((role, muted_until)) = v.role {
        let privileged = role >= 1;
        if v.conversation_type == 3 && !privileged {
            return Err(Refused::PermissionDenied(
                "only the owner and admins post in a channel",
            ));
        }
        if muted_until > now || (v.mute_all && !privileged) {
            return Err(Refused::Muted(id));
        }
    }
    if v.blockers.iter().any(|u| u != sender) {
        return Err(Refused::Blocked);
    }
    if let Some(alias) = v.deleted {
        return Err(Refused::UserNotFound(alias.to_string()));
    }
    Ok(())
}
