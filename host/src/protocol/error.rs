//! Every error code a client can see (docs/protocol.md, "Error codes"), and the one error
//! value every layer answers with. How a code maps to an HTTP status is the API's business
//! (`api::error`); over the WebSocket a code travels in an `error` frame.

use std::time::Duration;

macro_rules! codes {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// A stable, documented error code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($(#[$doc])* $variant,)*
        }

        impl Code {
            /// Every code, in the order of the docs' table.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code of a name (`None`: not a documented code).
            pub fn from_name(name: &str) -> Option<Code> {
                Code::ALL.iter().copied().find(|c| c.as_str() == name)
            }

            /// The code as it travels.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $name,)*
                }
            }
        }
    };
}

codes! {
    BadRequest = "bad_request",
    MethodNotAllowed = "method_not_allowed",
    RequestTooLarge = "request_too_large",
    Unauthorized = "unauthorized",
    AccountDeleted = "account_deleted",
    InvalidCredentials = "invalid_credentials",
    RateLimited = "rate_limited",
    Busy = "busy",
    RequestTimeout = "request_timeout",
    TooManyConnections = "too_many_connections",
    RegistrationClosed = "registration_closed",
    UserExists = "user_exists",
    NotAMember = "not_a_member",
    UserNotFound = "user_not_found",
    ConversationNotFound = "conversation_not_found",
    ConversationTypeMismatch = "conversation_type_mismatch",
    MessageNotFound = "message_not_found",
    RecallNotOwnMessage = "recall_not_own_message",
    RecallWindowExpired = "recall_window_expired",
    AlreadyRecalled = "already_recalled",
    MessageNotRecallable = "message_not_recallable",
    StoreUnavailable = "store_unavailable",
    AdminDisabled = "admin_disabled",
    ContentTypeForbidden = "content_type_forbidden",
    NotFound = "not_found",
    PluginNotFound = "plugin_not_found",
    ReloadRefused = "reload_refused",
    PayloadTooLarge = "payload_too_large",
    ContentTypeUnknown = "content_type_unknown",
    ContentTypeDisabled = "content_type_disabled",
    ConversationTypeNotAllowed = "conversation_type_not_allowed",
    PayloadInvalid = "payload_invalid",
    PluginFailed = "plugin_failed",
    PluginBusy = "plugin_busy",
    Blocked = "blocked",
    Muted = "muted",
    PermissionDenied = "permission_denied",
    JoinClosed = "join_closed",
    GroupNotFound = "group_not_found",
    TargetNotMember = "target_not_member",
    RequestNotFound = "request_not_found",
    NotFriends = "not_friends",
    AlreadyFriends = "already_friends",
    AlreadyMember = "already_member",
    RequestNotPending = "request_not_pending",
    OwnerCannotQuit = "owner_cannot_quit",
    GroupDissolved = "group_dissolved",
    GroupFull = "group_full",
    ResyncRequired = "resync_required",
    DeviceRemoved = "device_removed",
    DeviceNotFound = "device_not_found",
    KeysInvalid = "keys_invalid",
    IdentityKeyChanged = "identity_key_changed",
    PrekeyIdTaken = "prekey_id_taken",
    TooManyPrekeys = "too_many_prekeys",
    MailboxFull = "mailbox_full",
    TooManyDevices = "too_many_devices",
    Internal = "internal",
    /// WebSocket only: not JSON, no `type`, a bad `id`, binary data, a missing field.
    BadFrame = "bad_frame",
    /// WebSocket only: `type` is not a frame the server reads.
    UnknownFrameType = "unknown_frame_type",
    /// WebSocket only: a frame over `maxFrameBytes`.
    FrameTooLarge = "frame_too_large",
}

impl Code {
    /// Whether the code exists only in WebSocket `error` frames.
    pub fn websocket_only(self) -> bool {
        matches!(
            self,
            Code::BadFrame | Code::UnknownFrameType | Code::FrameTooLarge
        )
    }
}

/// A code reads as its name: `code == "payload_invalid"`.
impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a refused request is answered with: its code, a message for people, the plugin's
/// own rejection code (`payload_invalid`), and when a retry may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
    /// The plugin's own rejection code, for `payload_invalid`.
    pub reason: Option<String>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            reason: None,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Error {
        Error::new(Code::BadRequest, message)
    }

    pub fn unauthorized() -> Error {
        Error::new(Code::Unauthorized, "missing or wrong bearer token")
    }

    pub fn not_found(what: impl Into<String>) -> Error {
        Error::new(Code::NotFound, what)
    }

    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(Code::Internal, message)
    }

    /// The database (or the server) cannot take the request now; safe to retry.
    pub fn unavailable(message: impl Into<String>) -> Error {
        Error::new(Code::StoreUnavailable, message)
    }

    /// `rate_limited`, with when to retry.
    pub fn rate_limited(message: impl Into<String>, retry_after: Duration) -> Error {
        Error {
            retry_after: Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            ..Error::new(Code::RateLimited, message)
        }
    }

    /// `rate_limited` for sends over `rate` a second `over` (a connection, a user's HTTP
    /// sends); with when to retry where the answer can say it (HTTP).
    pub fn send_rate(rate: u32, over: &str, retry_after: Option<Duration>) -> Error {
        let message = format!("more than {rate} sends per second {over}; slow down");
        match retry_after {
            Some(wait) => Error::rate_limited(message, wait),
            None => Error::new(Code::RateLimited, message),
        }
    }

    /// `busy`: the server is at a bound of its own (password hashing); retry soon.
    pub fn busy(message: impl Into<String>) -> Error {
        Error {
            retry_after: Some(1),
            ..Error::new(Code::Busy, message)
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}
