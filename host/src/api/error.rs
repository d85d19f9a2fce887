//! The HTTP side of an error: its status, by code, and the one JSON envelope
//! (`{"error": {"code", "message", "reason"?}}`, `Retry-After` when known).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::protocol::{Code, Error};

/// The HTTP status of a code (docs/protocol.md, "Error codes"). The WebSocket-only codes
/// never reach HTTP; they read as a bad request.
pub fn status(code: Code) -> StatusCode {
    use Code::*;
    match code {
        BadRequest | BadFrame | UnknownFrameType | FrameTooLarge | KeysInvalid => {
            StatusCode::BAD_REQUEST
        }
        MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        RequestTooLarge | PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Unauthorized | AccountDeleted | InvalidCredentials => StatusCode::UNAUTHORIZED,
        RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Busy | TooManyConnections | StoreUnavailable | PluginBusy => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        RegistrationClosed | NotAMember | RecallNotOwnMessage | AdminDisabled
        | ContentTypeForbidden | Blocked | Muted | PermissionDenied | JoinClosed
        | DeviceRemoved => StatusCode::FORBIDDEN,
        UserExists | RecallWindowExpired | AlreadyRecalled | MessageNotRecallable
        | ReloadRefused | AlreadyFriends | AlreadyMember | RequestNotPending | OwnerCannotQuit
        | GroupDissolved | GroupFull | ResyncRequired | IdentityKeyChanged | PrekeyIdTaken
        | TooManyPrekeys | MailboxFull | TooManyDevices => StatusCode::CONFLICT,
        UserNotFound | ConversationNotFound | MessageNotFound | NotFound | PluginNotFound
        | GroupNotFound | TargetNotMember | RequestNotFound | NotFriends | DeviceNotFound => {
            StatusCode::NOT_FOUND
        }
        ConversationTypeMismatch
        | ContentTypeUnknown
        | ContentTypeDisabled
        | ConversationTypeNotAllowed
        | PayloadInvalid
        | PluginFailed => StatusCode::UNPROCESSABLE_ENTITY,
        Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The one JSON envelope of an error: `{"error": {"code", "message", "reason"?}}`.
pub fn envelope(e: &Error) -> serde_json::Value {
    let mut body = json!({ "code": e.code.as_str(), "message": e.message });
    if let Some(reason) = &e.reason {
        body["reason"] = reason.as_str().into();
    }
    json!({ "error": body })
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = status(self.code);
        // A 503's cause is logged, or counted, where it arose (a database error once per
        // run of them, a guard in the summary line): one line per answer would repeat it
        // as often as clients retry.
        if self.code == Code::Internal {
            tracing::error!(code = self.code.as_str(), "{}", self.message);
        } else if status.is_server_error() {
            tracing::debug!(code = self.code.as_str(), "{}", self.message);
        }
        let mut res = (status, Json(envelope(&self))).into_response();
        if let Some(secs) = self.retry_after {
            res.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        res
    }
}
