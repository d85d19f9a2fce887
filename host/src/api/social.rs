//! The user stream, friends and blocks over HTTP.

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AppState, Body, Code, Error, User, schema};
use crate::protocol::frames::raw;
use crate::social::Decision;
use crate::store::social::FriendRequest;

type Rejected<T> = Result<T, axum::extract::rejection::QueryRejection>;
type Segment = Result<Path<String>, axum::extract::rejection::PathRejection>;

fn segment(path: Segment) -> Result<String, Error> {
    path.map(|Path(s)| s)
        .map_err(|e| Error::bad_request(format!("bad path: {e}")))
}

fn query<T>(q: Rejected<Query<T>>) -> Result<T, Error> {
    q.map(|Query(q)| q)
        .map_err(|e| Error::bad_request(format!("bad query: {e}")))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// The stream's epoch as last seen; leave it out only without a cursor.
    epoch: Option<i64>,
    after_seq: Option<i64>,
    /// Default 100; 0 answers only the position.
    #[param(minimum = 0, maximum = 500)]
    limit: Option<i64>,
}

#[utoipa::path(get, path = "/v1/user-stream", tag = "social", security(("userToken" = [])), params(StreamQuery),
    responses((status = 200, body = schema::UserStreamPage)))]
pub async fn user_stream(
    State(s): State<AppState>,
    User(user): User,
    q: Rejected<Query<StreamQuery>>,
) -> Result<Json<Value>, Error> {
    let q = query(q)?;
    let limit = q.limit.unwrap_or(100);
    if !(0..=500).contains(&limit) {
        return Err(Error::bad_request("limit must be 0 to 500"));
    }
    let after = q.after_seq.unwrap_or(0).max(0);
    let page = s
        .core
        .store
        .user_stream(&user, q.epoch, after, limit)
        .await
        .map_err(crate::store::unavailable)?
        .map_err(|m| {
            Error::new(Code::ResyncRequired,
                format!(
                    "the stream was rebuilt: its epoch is now {}; reload the snapshots and pull from 0",
                    m.current
                ),
            )
        })?;
    let has_more = page.events.last().is_some_and(|e| e.seq < page.last_seq)
        || (page.events.is_empty() && limit > 0 && after < page.last_seq);
    let events: Vec<Value> = page
        .events
        .iter()
        .map(|e| {
            let mut v = json!({
                "seq": e.seq,
                "event": e.event,
                "data": raw(&e.data),
                "serverTime": e.server_time,
            });
            if let Some(c) = e.content_type {
                v["contentType"] = c.into();
            }
            v
        })
        .collect();
    Ok(Json(json!({
        "epoch": page.epoch,
        "lastSeq": page.last_seq,
        "hasMore": has_more,
        "events": events,
    })))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestBody {
    user_id: String,
    #[serde(default)]
    message: String,
}

#[utoipa::path(post, path = "/v1/friends/requests", tag = "social", security(("userToken" = [])), request_body = RequestBody,
    responses((status = 200, body = schema::FriendRequestAnswer)))]
pub async fn request_friend(
    State(s): State<AppState>,
    User(user): User,
    Body(b): Body<RequestBody>,
) -> Result<Json<Value>, Error> {
    Ok(Json(
        s.core.friend_request(&user, &b.user_id, &b.message).await?,
    ))
}

async fn decide(
    s: AppState,
    user: String,
    path: Segment,
    decision: Decision,
) -> Result<Json<Value>, Error> {
    let id = segment(path)?;
    Ok(Json(
        s.core.decide_friend_request(&user, &id, decision).await?,
    ))
}

#[utoipa::path(post, path = "/v1/friends/requests/{id}/accept", tag = "social", security(("userToken" = [])), params(("id" = String, Path, description = "the request id")),
    responses((status = 200, body = schema::FriendRequestAnswer)))]
pub async fn accept(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    decide(s, user, path, Decision::Accept).await
}

#[utoipa::path(post, path = "/v1/friends/requests/{id}/reject", tag = "social", security(("userToken" = [])), params(("id" = String, Path, description = "the request id")),
    responses((status = 200, body = schema::FriendRequestAnswer)))]
pub async fn reject(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    decide(s, user, path, Decision::Reject).await
}

#[utoipa::path(post, path = "/v1/friends/requests/{id}/cancel", tag = "social", security(("userToken" = [])), params(("id" = String, Path, description = "the request id")),
    responses((status = 200, body = schema::FriendRequestAnswer)))]
pub async fn cancel(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    decide(s, user, path, Decision::Cancel).await
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RequestsQuery {
    /// `in` (the default) or `out`.
    #[param(pattern = "^(in|out)$")]
    direction: Option<String>,
}

fn request_view(r: &FriendRequest) -> schema::FriendRequestView {
    schema::FriendRequestView {
        request_id: r.request_id.clone(),
        from_user_id: r.from_user.clone(),
        to_user_id: r.to_user.clone(),
        message: r.message.clone(),
        state: r.state.into(),
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

#[utoipa::path(get, path = "/v1/friends/requests", tag = "social", security(("userToken" = [])), params(RequestsQuery),
    responses((status = 200, body = schema::FriendRequests)))]
pub async fn requests(
    State(s): State<AppState>,
    User(user): User,
    q: Rejected<Query<RequestsQuery>>,
) -> Result<Json<schema::FriendRequests>, Error> {
    let incoming = match query(q)?.direction.as_deref() {
        None | Some("in") => true,
        Some("out") => false,
        Some(_) => return Err(Error::bad_request("direction is in or out")),
    };
    let list = s
        .core
        .store
        .pending_requests(&user, incoming)
        .await
        .map_err(crate::store::unavailable)?;
    let requests = list.iter().map(request_view).collect();
    Ok(Json(schema::FriendRequests { requests }))
}

#[utoipa::path(get, path = "/v1/friends", tag = "social", security(("userToken" = [])),
    responses((status = 200, body = schema::Friends)))]
pub async fn friends(
    State(s): State<AppState>,
    User(user): User,
) -> Result<Json<schema::Friends>, Error> {
    let friends = s
        .core
        .store
        .friends(&user)
        .await
        .map_err(crate::store::unavailable)?
        .into_iter()
        .map(|(user_id, since)| schema::Since { user_id, since })
        .collect();
    Ok(Json(schema::Friends { friends }))
}

#[utoipa::path(delete, path = "/v1/friends/{userId}", tag = "social", security(("userToken" = [])), params(("userId" = String, Path)),
    responses((status = 200, body = schema::Removed)))]
pub async fn remove_friend(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<schema::Removed>, Error> {
    let other = segment(path)?;
    s.core.remove_friend(&user, &other).await?;
    Ok(Json(schema::Removed {
        user_id: other,
        removed: true,
    }))
}

#[utoipa::path(get, path = "/v1/blocks", tag = "social", security(("userToken" = [])),
    responses((status = 200, body = schema::Blocks)))]
pub async fn blocks(
    State(s): State<AppState>,
    User(user): User,
) -> Result<Json<schema::Blocks>, Error> {
    let blocks = s
        .core
        .store
        .blocks(&user)
        .await
        .map_err(crate::store::unavailable)?
        .into_iter()
        .map(|(user_id, since)| schema::Since { user_id, since })
        .collect();
    Ok(Json(schema::Blocks { blocks }))
}

#[utoipa::path(put, path = "/v1/blocks/{userId}", tag = "social", security(("userToken" = [])), params(("userId" = String, Path)),
    responses((status = 200, body = schema::BlockAnswer)))]
pub async fn block(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<schema::BlockAnswer>, Error> {
    let other = segment(path)?;
    s.core.set_block(&user, &other, true).await?;
    Ok(Json(schema::BlockAnswer {
        user_id: other,
        blocked: true,
    }))
}

#[utoipa::path(delete, path = "/v1/blocks/{userId}", tag = "social", security(("userToken" = [])), params(("userId" = String, Path)),
    responses((status = 200, body = schema::BlockAnswer)))]
pub async fn unblock(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<schema::BlockAnswer>, Error> {
    let other = segment(path)?;
    s.core.set_block(&user, &other, false).await?;
    Ok(Json(schema::BlockAnswer {
        user_id: other,
        blocked: false,
    }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PresenceQuery {
    /// User ids separated by commas, at most 200.
    user_ids: String,
}

/// `GET /v1/presence?userIds=a,b`: who of them is online, of those the caller may see.
#[utoipa::path(get, path = "/v1/presence", tag = "social", security(("userToken" = [])), params(PresenceQuery),
    responses((status = 200, body = schema::PresenceAnswer)))]
pub async fn presence(
    State(s): State<AppState>,
    User(user): User,
    q: Rejected<Query<PresenceQuery>>,
) -> Result<Json<schema::PresenceAnswer>, Error> {
    let q = query(q)?;
    let users: Vec<String> = q
        .user_ids
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    if users.iter().any(|u| !crate::auth::valid_user_id(u)) {
        return Err(Error::bad_request(
            "userIds must be user ids separated by commas",
        ));
    }
    let presence = s.core.presence_of(&user, &users).await?;
    Ok(Json(schema::PresenceAnswer { presence }))
}
