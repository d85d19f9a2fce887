//! Why the server refused one request of a client: the refusals of a send or a read (the
//! rest of a batch goes on), each with its documented code.

use super::{Code, Error};

/// Why one operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("you are not a member of conversation {0}")]
    NotAMember(i64),
    #[error("no user {0:?}")]
    UserNotFound(String),
    #[error("a private conversation needs two different users")]
    SelfConversation,
    #[error(
        "there is no conversation with {0:?} yet: a stored message starts one, live kinds need one"
    )]
    NoConversation(String),
    #[error("conversation {conversation_id} has type {actual}, not {given}")]
    ConversationTypeMismatch {
        conversation_id: i64,
        actual: u8,
        given: u8,
    },
    #[error("no message with seq {0} in this conversation")]
    MessageNotFound(i64),
    #[error("message {0} was sent by someone else")]
    RecallNotOwn(i64),
    #[error("message {0} is older than the recall window")]
    RecallWindowExpired(i64),
    #[error("message {0} is already recalled")]
    AlreadyRecalled(i64),
    #[error("message {0} is a recall or a server tip and cannot be recalled")]
    NotRecallable(i64),
    #[error("this user blocked you")]
    Blocked,
    #[error("you are muted in conversation {0}")]
    Muted(i64),
    #[error("{0}")]
    PermissionDenied(&'static str),
    #[error("group {0} was dissolved")]
    GroupDissolved(i64),
}

impl Refused {
    pub fn code(&self) -> Code {
        match self {
            Refused::NotAMember(_) => Code::NotAMember,
            Refused::UserNotFound(_) => Code::UserNotFound,
            Refused::SelfConversation => Code::BadRequest,
            Refused::NoConversation(_) => Code::ConversationNotFound,
            Refused::ConversationTypeMismatch { .. } => Code::ConversationTypeMismatch,
            Refused::MessageNotFound(_) => Code::MessageNotFound,
            Refused::RecallNotOwn(_) => Code::RecallNotOwnMessage,
            Refused::RecallWindowExpired(_) => Code::RecallWindowExpired,
            Refused::AlreadyRecalled(_) => Code::AlreadyRecalled,
            Refused::NotRecallable(_) => Code::MessageNotRecallable,
            Refused::Blocked => Code::Blocked,
            Refused::Muted(_) => Code::Muted,
            Refused::PermissionDenied(_) => Code::PermissionDenied,
            Refused::GroupDissolved(_) => Code::GroupDissolved,
        }
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Error {
        Error::new(r.code(), r.to_string())
    }
}
