//! The one API error type: a stable, documented code and a human message.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::plugins::ValidateError;
use crate::store::batch::{BatchError, Refused};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The plugin's own rejection code, for `payload_invalid`.
    pub reason: Option<String>,
    /// Seconds after which a retry may succeed (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            reason: None,
            retry_after: None,
        }
    }

    /// `429 rate_limited`, with when to retry.
    pub fn rate_limited(message: impl Into<String>, retry_after: std::time::Duration) -> ApiError {
        ApiError {
            retry_after: Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
        }
    }

    /// `503 busy`: the server is at a bound of its own (password hashing); retry soon.
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        )
    }

    pub fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// `403`: not allowed (`blocked`, `permission_denied`, `join_closed`…).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, code, message)
    }

    /// `404` with a code of its own (`group_not_found`, `request_not_found`…).
    pub fn missing(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, code, message)
    }

    /// `409`: the state does not allow it (`already_friends`, `request_not_pending`…).
    pub fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }

    /// A frame-level error on the WebSocket (no HTTP status applies).
    pub fn frame(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn token(e: &crate::auth::TokenError) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string())
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The database (or the server) cannot take the request now; safe to retry.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            message,
        )
    }

    /// A database error: logged in full, answered as `store_unavailable`.
    pub fn store(e: sqlx::Error) -> ApiError {
        tracing::error!("database: {e}");
        ApiError::unavailable("the database did not answer; retry")
    }

    pub fn batch(e: BatchError) -> ApiError {
        tracing::error!("database: {e}");
        ApiError::unavailable("the database did not accept the write; retry")
    }
}

impl From<ValidateError> for ApiError {
    fn from(e: ValidateError) -> ApiError {
        let status = match &e {
            ValidateError::PluginFailed { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ValidateError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ValidateError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ValidateError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError {
            status,
            code: e.code(),
            message: e.to_string(),
            reason: e.reason().map(str::to_string),
            retry_after: None,
        }
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> ApiError {
        let status = match &r {
            Refused::NotAMember(_)
            | Refused::RecallNotOwn(_)
            | Refused::Blocked
            | Refused::Muted(_)
            | Refused::PermissionDenied(_) => StatusCode::FORBIDDEN,
            Refused::GroupDissolved(_) => StatusCode::CONFLICT,
            Refused::UserNotFound(_) | Refused::MessageNotFound(_) | Refused::NoConversation(_) => {
                StatusCode::NOT_FOUND
            }
            Refused::SelfConversation => StatusCode::BAD_REQUEST,
            Refused::ConversationTypeMismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Refused::RecallWindowExpired(_)
            | Refused::AlreadyRecalled(_)
            | Refused::NotRecallable(_) => StatusCode::CONFLICT,
        };
        ApiError::new(status, r.code(), r.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, "{}", self.message);
        }
        let mut body = json!({ "code": self.code, "message": self.message });
        if let Some(reason) = self.reason {
            body["reason"] = reason.into();
        }
        let mut res = (self.status, Json(json!({ "error": body }))).into_response();
        if let Some(secs) = self.retry_after {
            res.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        res
    }
}
