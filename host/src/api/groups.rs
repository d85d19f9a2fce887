//! Groups and channels over HTTP: the changes (in `social::groups`) and the snapshots.

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AppState, Body, Code, Error, User, schema};
use crate::protocol::Refused;
use crate::social::groups_info as info;
use crate::social::{GroupPatch, NewGroup};
use crate::store::groups::{Group, Role};

type IdPath = Result<Path<i64>, axum::extract::rejection::PathRejection>;
type IdUserPath = Result<Path<(i64, String)>, axum::extract::rejection::PathRejection>;

fn group_id(path: IdPath) -> Result<i64, Error> {
    path.map(|Path(id)| id)
        .map_err(|_| Error::bad_request("the group id must be an integer"))
}

fn id_user(path: IdUserPath) -> Result<(i64, String), Error> {
    path.map(|Path(p)| p)
        .map_err(|_| Error::bad_request("the path is /v1/groups/{integer id}/…/{userId}"))
}

fn not_found(id: i64) -> Error {
    Error::new(Code::GroupNotFound, format!("no group or channel {id}"))
}

async fn group_of(s: &AppState, id: i64) -> Result<Group, Error> {
    s.core
        .store
        .group(id)
        .await
        .map_err(crate::store::unavailable)?
        .ok_or_else(|| not_found(id))
}

/// The group and the caller's current role in it, or `not_a_member`.
async fn current_role(s: &AppState, id: i64, user: &str) -> Result<(Group, Role), Error> {
    let g = group_of(s, id).await?;
    let role = s
        .core
        .store
        .member(id, user)
        .await
        .map_err(crate::store::unavailable)?
        .filter(|m| m.is_current())
        .map(|m| m.role)
        .ok_or(Refused::NotAMember(id))?;
    Ok((g, role))
}

#[utoipa::path(post, path = "/v1/groups", tag = "groups", security(("userToken" = [])),
    request_body = NewGroup,
    responses((status = 200, body = schema::GroupInfo)))]
pub async fn create(
    State(s): State<AppState>,
    User(user): User,
    Body(b): Body<NewGroup>,
) -> Result<Json<Value>, Error> {
    Ok(Json(s.core.create_group(&user, b).await?))
}

#[utoipa::path(get, path = "/v1/groups", tag = "groups", security(("userToken" = [])),
    responses((status = 200, body = schema::MyGroups)))]
pub async fn mine(State(s): State<AppState>, User(user): User) -> Result<Json<Value>, Error> {
    let list: Vec<Value> = s
        .core
        .store
        .my_groups(&user)
        .await
        .map_err(crate::store::unavailable)?
        .into_iter()
        .map(|(g, m)| {
            let mut v = info(&g);
            v["memberState"] = m.state.as_str().into();
            v["role"] = m.role.as_str().into();
            v["mutedUntil"] = m.muted_until.into();
            v
        })
        .collect();
    Ok(Json(json!({ "groups": list })))
}

#[utoipa::path(get, path = "/v1/groups/{id}", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    responses((status = 200, body = schema::GroupInfo)))]
pub async fn one(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
) -> Result<Json<Value>, Error> {
    let id = group_id(path)?;
    let g = group_of(&s, id).await?;
    let discoverable = !g.dissolved && matches!(g.join_policy.as_str(), "open" | "approval");
    if !discoverable {
        s.core
            .store
            .member(id, &user)
            .await
            .map_err(crate::store::unavailable)?
            .ok_or(Refused::NotAMember(id))?;
    }
    Ok(Json(info(&g)))
}

#[utoipa::path(patch, path = "/v1/groups/{id}", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    request_body = GroupPatch,
    responses((status = 200, body = schema::GroupInfo)))]
pub async fn patch(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<GroupPatch>,
) -> Result<Json<Value>, Error> {
    Ok(Json(s.core.patch_group(&user, group_id(path)?, b).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MembersQuery {
    /// The last `userId` of the previous page.
    after: Option<String>,
    /// Default 200.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[utoipa::path(get, path = "/v1/groups/{id}/members", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id"), MembersQuery),
    responses((status = 200, body = schema::Members)))]
pub async fn members(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    q: Result<Query<MembersQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<schema::Members>, Error> {
    let id = group_id(path)?;
    let Query(q) = q.map_err(|e| Error::bad_request(format!("bad query: {e}")))?;
    let limit = q.limit.unwrap_or(200);
    if !(1..=1000).contains(&limit) {
        return Err(Error::bad_request("limit must be 1 to 1000"));
    }
    let (g, role) = current_role(&s, id, &user).await?;
    if g.conversation_type == 3 && role < Role::Admin {
        return Err(Error::new(
            Code::PermissionDenied,
            "a channel's subscribers do not see its member list",
        ));
    }
    let rows = s
        .core
        .store
        .group_members(id, q.after.as_deref().unwrap_or(""), limit + 1)
        .await
        .map_err(crate::store::unavailable)?;
    let has_more = rows.len() as i64 > limit;
    let members = rows
        .iter()
        .take(limit as usize)
        .map(|m| schema::MemberView {
            user_id: m.user_id.clone(),
            role: m.role.as_str().to_string(),
            muted_until: m.muted_until,
            joined_at: m.joined_at,
        })
        .collect();
    Ok(Json(schema::Members { members, has_more }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsersBody {
    user_ids: Vec<String>,
    #[serde(default)]
    reason: String,
}

#[utoipa::path(post, path = "/v1/groups/{id}/members", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    request_body = UsersBody,
    responses((status = 200, body = schema::Added)))]
pub async fn add(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<UsersBody>,
) -> Result<Json<schema::Added>, Error> {
    if !b.reason.is_empty() {
        return Err(Error::bad_request("adding members takes no reason"));
    }
    let added = s
        .core
        .add_members(&user, group_id(path)?, b.user_ids)
        .await?;
    Ok(Json(schema::Added { added }))
}

#[utoipa::path(post, path = "/v1/groups/{id}/kick", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    request_body = UsersBody,
    responses((status = 200, body = schema::Kicked)))]
pub async fn kick(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<UsersBody>,
) -> Result<Json<schema::Kicked>, Error> {
    let kicked = s
        .core
        .kick(&user, group_id(path)?, b.user_ids, b.reason)
        .await?;
    Ok(Json(schema::Kicked { kicked }))
}

#[utoipa::path(post, path = "/v1/groups/{id}/quit", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    responses((status = 200, body = schema::QuitAnswer)))]
pub async fn quit(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    _: super::NoBody,
) -> Result<Json<schema::QuitAnswer>, Error> {
    let id = group_id(path)?;
    s.core.quit(&user, id).await?;
    Ok(Json(schema::QuitAnswer {
        conversation_id: id,
        member_state: "left".to_string(),
    }))
}

#[utoipa::path(post, path = "/v1/groups/{id}/dissolve", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    responses((status = 200, body = schema::DissolveAnswer)))]
pub async fn dissolve(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    _: super::NoBody,
) -> Result<Json<schema::DissolveAnswer>, Error> {
    let id = group_id(path)?;
    s.core.dissolve(&user, id).await?;
    Ok(Json(schema::DissolveAnswer {
        conversation_id: id,
        state: "dissolved".to_string(),
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserBody {
    user_id: String,
}

#[utoipa::path(post, path = "/v1/groups/{id}/transfer", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    request_body = UserBody,
    responses((status = 200, body = schema::GroupInfo)))]
pub async fn transfer(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<UserBody>,
) -> Result<Json<Value>, Error> {
    Ok(Json(
        s.core.transfer(&user, group_id(path)?, &b.user_id).await?,
    ))
}

#[utoipa::path(put, path = "/v1/groups/{id}/admins/{userId}", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id"), ("userId" = String, Path)),
    responses((status = 200, body = schema::AdminAnswer)))]
pub async fn make_admin(
    State(s): State<AppState>,
    User(user): User,
    path: IdUserPath,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    let (id, other) = id_user(path)?;
    Ok(Json(s.core.set_admin(&user, id, &other, true).await?))
}

#[utoipa::path(delete, path = "/v1/groups/{id}/admins/{userId}", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id"), ("userId" = String, Path)),
    responses((status = 200, body = schema::AdminAnswer)))]
pub async fn unmake_admin(
    State(s): State<AppState>,
    User(user): User,
    path: IdUserPath,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    let (id, other) = id_user(path)?;
    Ok(Json(s.core.set_admin(&user, id, &other, false).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MuteBody {
    user_id: String,
    until: i64,
}

#[utoipa::path(post, path = "/v1/groups/{id}/mute", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    request_body = MuteBody,
    responses((status = 200, body = schema::MuteAnswer)))]
pub async fn mute(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<MuteBody>,
) -> Result<Json<Value>, Error> {
    Ok(Json(
        s.core
            .mute(&user, group_id(path)?, &b.user_id, b.until)
            .await?,
    ))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinBody {
    #[serde(default)]
    message: String,
}

#[utoipa::path(post, path = "/v1/groups/{id}/join", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    request_body = Option<JoinBody>,
    responses((status = 200, body = schema::JoinAnswer)))]
pub async fn join(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<Option<JoinBody>>,
) -> Result<Json<Value>, Error> {
    let id = group_id(path)?;
    let message = b.map(|b| b.message).unwrap_or_default();
    Ok(Json(s.core.join(&user, id, &message).await?))
}

#[utoipa::path(get, path = "/v1/groups/{id}/join-requests", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    responses((status = 200, body = schema::JoinRequests)))]
pub async fn join_requests(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
) -> Result<Json<schema::JoinRequests>, Error> {
    let id = group_id(path)?;
    if current_role(&s, id, &user).await?.1 < Role::Admin {
        return Err(Error::new(
            Code::PermissionDenied,
            "only the owner and admins see join requests",
        ));
    }
    let requests = s
        .core
        .store
        .pending_join_requests(id)
        .await
        .map_err(crate::store::unavailable)?
        .into_iter()
        .map(|r| schema::JoinRequestView {
            state: r.state.as_str().to_string(),
            request_id: r.request_id,
            user_id: r.user_id,
            message: r.message,
            created_at: r.created_at,
        })
        .collect();
    Ok(Json(schema::JoinRequests { requests }))
}

#[utoipa::path(post, path = "/v1/groups/{id}/join-requests/{userId}/approve", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id"), ("userId" = String, Path)),
    responses((status = 200, body = schema::JoinDecision)))]
pub async fn approve(
    State(s): State<AppState>,
    User(user): User,
    path: IdUserPath,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    let (id, other) = id_user(path)?;
    Ok(Json(s.core.decide_join(&user, id, &other, true).await?))
}

#[utoipa::path(post, path = "/v1/groups/{id}/join-requests/{userId}/reject", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id"), ("userId" = String, Path)),
    responses((status = 200, body = schema::JoinDecision)))]
pub async fn reject(
    State(s): State<AppState>,
    User(user): User,
    path: IdUserPath,
    _: super::NoBody,
) -> Result<Json<Value>, Error> {
    let (id, other) = id_user(path)?;
    Ok(Json(s.core.decide_join(&user, id, &other, false).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReceiptsBody {
    seqs: Vec<i64>,
}

#[utoipa::path(post, path = "/v1/groups/{id}/receipts", tag = "groups", security(("userToken" = [])), params(("id" = i64, Path, description = "the group or channel id")),
    request_body = ReceiptsBody,
    responses((status = 200, body = schema::Receipts)))]
pub async fn receipts(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<ReceiptsBody>,
) -> Result<Json<schema::Receipts>, Error> {
    let id = group_id(path)?;
    if b.seqs.is_empty() || b.seqs.len() > 100 {
        return Err(Error::bad_request("seqs lists 1 to 100 seqs"));
    }
    let (g, role) = current_role(&s, id, &user).await?;
    // A channel's subscribers see no member list, nor its size.
    if g.conversation_type == 3 && role < Role::Admin {
        return Err(Error::new(
            Code::PermissionDenied,
            "a channel's receipts are its owner's and admins'",
        ));
    }
    // Only what the caller could see: a seq from before they joined is not theirs to ask.
    let m = s
        .core
        .store
        .membership(&user, id)
        .await
        .map_err(crate::store::unavailable)??;
    if let Some(seq) = b
        .seqs
        .iter()
        .find(|&&seq| !m.intervals().iter().any(|&(lo, hi)| seq > lo && seq <= hi))
    {
        return Err(Refused::MessageNotFound(*seq).into());
    }
    let mut list = Vec::with_capacity(b.seqs.len());
    for r in s
        .core
        .store
        .receipts(id, &b.seqs)
        .await
        .map_err(crate::store::unavailable)?
        .into_iter()
        .zip(&b.seqs)
    {
        match r {
            (Some(r), _) => list.push(schema::Receipt {
                seq: r.seq,
                read: r.read,
                delivered: r.delivered,
                of: r.of,
            }),
            (None, seq) => return Err(Refused::MessageNotFound(*seq).into()),
        }
    }
    Ok(Json(schema::Receipts { receipts: list }))
}
