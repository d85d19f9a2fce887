//! The one API error type: a stable, documented code and a human message.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::plugins::ValidateError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The plugin's own rejection code, for `payload_invalid`.
    pub reason: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            reason: None,
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
        }
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
        (self.status, Json(json!({ "error": body }))).into_response()
    }
}
