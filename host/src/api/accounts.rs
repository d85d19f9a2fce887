//! The built-in account store (`POST /v1/auth/register`, `/login`), and what any account
//! can do to its tokens and itself: `/v1/auth/logout`, `/v1/auth/revoke-all`,
//! `DELETE /v1/account`, and the admin's `/admin/users/{id}/revoke-all` and
//! `DELETE /admin/users/{id}`.

use std::net::{IpAddr, Ipv4Addr};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;

use super::schema::{DeletedAnswer, LogoutAnswer, RevokeAnswer, TokenAnswer};
use super::{AppState, Authenticated, Body, Code, Error, Peer, require_admin};
use crate::auth::{Busy, valid_user_id};
use crate::limits::Guard;
use crate::store::accounts::DELETED_PREFIX;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credentials {
    #[schema(pattern = "^[A-Za-z0-9_.@-]{1,64}$")]
    user_id: String,
    #[schema(min_length = 8, max_length = 256)]
    password: String,
}

/// A new token for `user_id`, issued no earlier than the cut-off of its last revoke-all.
async fn token_body(s: &AppState, user_id: &str) -> Result<Json<TokenAnswer>, Error> {
    let valid_from = s
        .core
        .store
        .tokens_valid_from(user_id)
        .await
        .map_err(crate::store::unavailable)?;
    let (token, expires_at) = s.core.tokens.issue_from(user_id, valid_from);
    Ok(Json(TokenAnswer {
        user_id: user_id.to_string(),
        token,
        expires_at,
    }))
}

/// The client's address (unspecified for requests that did not come through a socket).
fn client_address(peer: Option<&Peer>) -> IpAddr {
    peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.addr.ip())
}

/// Counts a login or registration attempt against the client address's allowance.
fn attempt(s: &AppState, peer: Option<&Peer>) -> Result<(), Error> {
    s.attempts.attempt(client_address(peer)).map_err(|retry| {
        over_allowance(
            s,
            (peer, None),
            "auth.attempts_per_minute_per_address",
            "too many logins and registrations from your address; retry later",
            retry,
        )
    })
}

/// Checks `user_id`'s allowance of failed logins (for a login, or an account deletion's
/// password).
fn may_log_in(s: &AppState, user_id: &str, peer: Option<&Peer>) -> Result<(), Error> {
    s.attempts.may_log_in(user_id).map_err(|retry| {
        over_allowance(
            s,
            (peer, Some(user_id)),
            "auth.failed_logins_per_hour_per_account",
            "too many failed logins for this account; retry later",
            retry,
        )
    })
}

/// A login or registration over the allowance `limit` (its config key): counted, logged at
/// debug with the client's address (and the account, for an account's allowance), and
/// answered 429 with `message`.
fn over_allowance(
    s: &AppState,
    (peer, user): (Option<&Peer>, Option<&str>),
    limit: &str,
    message: &'static str,
    retry: std::time::Duration,
) -> Error {
    s.core.guards.count(Guard::AuthRateLimited);
    tracing::debug!(
        peer = %client_address(peer),
        user,
        guard = Guard::AuthRateLimited.name(),
        "answering 429: over {limit}"
    );
    Error::rate_limited(message, retry)
}

fn busy(s: &AppState, e: Busy, peer: Option<&Peer>) -> Error {
    s.core.guards.count(Guard::HashBusy);
    tracing::debug!(
        peer = %client_address(peer),
        guard = Guard::HashBusy.name(),
        "answering 503 busy: no hashing slot in auth.hash_queue_secs"
    );
    Error::busy(e.to_string())
}

#[utoipa::path(post, path = "/v1/auth/register", tag = "accounts", request_body = Credentials,
    responses((status = 201, body = TokenAnswer)))]
pub async fn register(
    State(s): State<AppState>,
    peer: Option<Extension<Peer>>,
    Body(c): Body<Credentials>,
) -> Result<(StatusCode, Json<TokenAnswer>), Error> {
    if !s.core.settings.registration {
        return Err(Error::new(
            Code::RegistrationClosed,
            "registration is switched off on this server",
        ));
    }
    attempt(&s, peer.as_deref())?;
    if !valid_user_id(&c.user_id) {
        return Err(Error::bad_request(format!(
            "userId must be {}",
            crate::auth::USER_ID_RULE
        )));
    }
    if c.user_id.starts_with(DELETED_PREFIX) {
        return Err(Error::bad_request(format!(
            "user ids starting with {DELETED_PREFIX:?} are reserved for deleted accounts"
        )));
    }
    if !(8..=256).contains(&c.password.chars().count()) {
        return Err(Error::bad_request("password must be 8 to 256 characters"));
    }
    let hash = s
        .passwords
        .hash(c.password)
        .await
        .map_err(|e| busy(&s, e, peer.as_deref()))?;
    let created = s
        .core
        .store
        .create_user(&c.user_id, &hash)
        .await
        .map_err(crate::store::unavailable)?;
    if !created {
        return Err(Error::new(
            Code::UserExists,
            format!("the user id {:?} is taken", c.user_id),
        ));
    }
    Ok((StatusCode::CREATED, token_body(&s, &c.user_id).await?))
}

#[utoipa::path(post, path = "/v1/auth/login", tag = "accounts", request_body = Credentials,
    responses((status = 200, body = TokenAnswer)))]
pub async fn login(
    State(s): State<AppState>,
    peer: Option<Extension<Peer>>,
    Body(c): Body<Credentials>,
) -> Result<Json<TokenAnswer>, Error> {
    let wrong = || Error::new(Code::InvalidCredentials, "unknown user or wrong password");
    attempt(&s, peer.as_deref())?;
    if !valid_user_id(&c.user_id) {
        return Err(wrong());
    }
    may_log_in(&s, &c.user_id, peer.as_deref())?;
    let hash = s
        .core
        .store
        .password_hash(&c.user_id)
        .await
        .map_err(crate::store::unavailable)?
        .flatten();
    let ok = s
        .passwords
        .verify(c.password, hash)
        .await
        .map_err(|e| busy(&s, e, peer.as_deref()))?;
    if !ok {
        s.attempts.failed(&c.user_id);
        return Err(wrong());
    }
    token_body(&s, &c.user_id).await
}

/// `POST /v1/auth/logout`: the token of this request stops working; the connections
/// opened with it close (4003).
#[utoipa::path(post, path = "/v1/auth/logout", tag = "accounts", security(("userToken" = [])),
    responses((status = 200, body = LogoutAnswer)))]
pub async fn logout(
    State(s): State<AppState>,
    Authenticated(session): Authenticated,
    _: super::NoBody,
) -> Result<Json<LogoutAnswer>, Error> {
    s.core.revoke_token(&session).await?;
    Ok(Json(LogoutAnswer {
        user_id: session.user_id,
        revoked: true,
    }))
}

/// `POST /v1/auth/revoke-all`: every token of the caller issued until now stops working,
/// this one included; every connection of the caller closes (4003).
#[utoipa::path(post, path = "/v1/auth/revoke-all", tag = "accounts", security(("userToken" = [])),
    responses((status = 200, body = RevokeAnswer)))]
pub async fn revoke_all(
    State(s): State<AppState>,
    Authenticated(session): Authenticated,
    _: super::NoBody,
) -> Result<Json<RevokeAnswer>, Error> {
    let tokens_valid_from = s.core.revoke_all_tokens(&session.user_id).await?;
    Ok(Json(RevokeAnswer {
        user_id: session.user_id,
        tokens_valid_from,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Confirm {
    password: Option<String>,
}

/// `DELETE /v1/account`: deletes the caller's account. An account with a password must
/// give it again (`{"password": "…"}`); one known only from tokens needs no body.
#[utoipa::path(delete, path = "/v1/account", tag = "accounts", security(("userToken" = [])),
    request_body(content = Option<Confirm>, description = "the password of an account that has one"),
    responses((status = 200, body = DeletedAnswer)))]
pub async fn delete_own(
    State(s): State<AppState>,
    peer: Option<Extension<Peer>>,
    Authenticated(session): Authenticated,
    Body(confirm): Body<Option<Confirm>>,
) -> Result<Json<Value>, Error> {
    let user = session.user_id;
    let hash = s
        .core
        .store
        .password_hash(&user)
        .await
        .map_err(crate::store::unavailable)?
        .flatten();
    if let Some(hash) = hash {
        // The password is checked as a login's is: counted, limited, locked.
        attempt(&s, peer.as_deref())?;
        may_log_in(&s, &user, peer.as_deref())?;
        let wrong = || {
            Error::new(
                Code::InvalidCredentials,
                "deleting an account with a password needs the password: {\"password\": \"…\"}",
            )
        };
        let password = confirm.and_then(|c| c.password).ok_or_else(wrong)?;
        let ok = s
            .passwords
            .verify(password, Some(hash))
            .await
            .map_err(|e| busy(&s, e, peer.as_deref()))?;
        if !ok {
            s.attempts.failed(&user);
            return Err(wrong());
        }
    }
    let alias = delete(&s, &user).await?;
    Ok(Json(crate::social::deleted_answer(&user, &alias)))
}

/// Runs a deletion to its end even if the client goes away meanwhile (it takes a while
/// for an account with much history; an interrupted one is finished by deleting again).
async fn delete(s: &AppState, user: &str) -> Result<String, Error> {
    let (core, user) = (s.core.clone(), user.to_string());
    tokio::spawn(async move { core.delete_account(&user).await })
        .await
        .map_err(|e| Error::internal(e.to_string()))?
}

fn user_path(
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<String, Error> {
    let user = path
        .map(|Path(u)| u)
        .map_err(|e| Error::bad_request(format!("bad path: {e}")))?;
    if !valid_user_id(&user) {
        return Err(Error::bad_request("not a valid user id"));
    }
    Ok(user)
}

/// A user the admin names: it must exist; whether its account was deleted.
async fn known_user(s: &AppState, user: &str) -> Result<bool, Error> {
    s.core
        .store
        .is_deleted(user)
        .await
        .map_err(crate::store::unavailable)?
        .ok_or_else(|| crate::protocol::Refused::UserNotFound(user.to_string()).into())
}

/// `POST /admin/users/{userId}/revoke-all`.
#[utoipa::path(post, path = "/admin/users/{userId}/revoke-all", tag = "admin",
    security(("adminToken" = [])), params(("userId" = String, Path)),
    responses((status = 200, body = RevokeAnswer)))]
pub async fn admin_revoke_all(
    State(s): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    _: super::NoBody,
) -> Result<Json<RevokeAnswer>, Error> {
    require_admin(&s, &headers)?;
    let user = user_path(path)?;
    if known_user(&s, &user).await? {
        return Err(crate::messaging::account_deleted());
    }
    let tokens_valid_from = s.core.revoke_all_tokens(&user).await?;
    Ok(Json(RevokeAnswer {
        user_id: user,
        tokens_valid_from,
    }))
}

/// `DELETE /admin/users/{userId}`: deletes the account (again: finishes an interrupted
/// deletion).
#[utoipa::path(delete, path = "/admin/users/{userId}", tag = "admin",
    security(("adminToken" = [])), params(("userId" = String, Path)),
    responses((status = 200, body = DeletedAnswer)))]
pub async fn admin_delete(
    State(s): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    require_admin(&s, &headers)?;
    let user = user_path(path)?;
    known_user(&s, &user).await?;
    let alias = delete(&s, &user).await?;
    Ok(Json(crate::social::deleted_answer(&user, &alias)))
}
