//! `POST /v1/auth/register` and `POST /v1/auth/login`: the built-in account store.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState, Body};
use crate::auth::{hash_password, valid_user_id, verify_password};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credentials {
    user_id: String,
    password: String,
}

fn token_body(s: &AppState, user_id: &str) -> Json<Value> {
    let (token, expires_at) = s.core.tokens.issue(user_id);
    Json(json!({ "userId": user_id, "token": token, "expiresAt": expires_at }))
}

pub async fn register(
    State(s): State<AppState>,
    Body(c): Body<Credentials>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if !s.core.settings.registration {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "registration_closed",
            "registration is switched off on this server",
        ));
    }
    if !valid_user_id(&c.user_id) {
        return Err(ApiError::bad_request(
            "userId must be 1 to 64 of A-Z a-z 0-9 _ . - @",
        ));
    }
    if !(8..=256).contains(&c.password.chars().count()) {
        return Err(ApiError::bad_request(
            "password must be 8 to 256 characters",
        ));
    }
    let password = c.password;
    let hash = tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let created = s
        .core
        .store
        .create_user(&c.user_id, &hash)
        .await
        .map_err(ApiError::store)?;
    if !created {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "user_exists",
            format!("the user id {:?} is taken", c.user_id),
        ));
    }
    Ok((StatusCode::CREATED, token_body(&s, &c.user_id)))
}

pub async fn login(
    State(s): State<AppState>,
    Body(c): Body<Credentials>,
) -> Result<Json<Value>, ApiError> {
    let wrong = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_credentials",
            "unknown user or wrong password",
        )
    };
    if !valid_user_id(&c.user_id) {
        return Err(wrong());
    }
    let hash = s
        .core
        .store
        .password_hash(&c.user_id)
        .await
        .map_err(ApiError::store)?
        .flatten();
    let password = c.password;
    let ok = tokio::task::spawn_blocking(move || match hash {
        Some(h) => verify_password(&password, &h),
        None => {
            // The same work for an unknown user, so timing does not tell which ids exist.
            let _ = verify_password(&password, dummy_hash());
            false
        }
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    if !ok {
        return Err(wrong());
    }
    Ok(token_body(&s, &c.user_id))
}

/// A hash to check unknown users against, with the default cost.
fn dummy_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| hash_password("no such user"))
}
