//! Sync over HTTP: the conversation overview, pulls by seq, read positions, and the HTTP
//! send (same semantics as the WebSocket `send`).

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::schema::{self, MessageView};
use super::{AppState, Body, Code, Error, User};
use crate::messaging::batch::Op;
use crate::messaging::{Answer, Prepared, SendAnswer};
use crate::plugins::PluginRegistry;
use crate::protocol::frames::SendFrame;
use crate::store::sync::{Direction, MessageRow, OverviewRow};

type IdPath = Result<Path<i64>, axum::extract::rejection::PathRejection>;

fn conversation_id(path: IdPath) -> Result<i64, Error> {
    path.map(|Path(id)| id)
        .map_err(|_| Error::bad_request("the conversation id must be an integer"))
}

#[utoipa::path(post, path = "/v1/messages", tag = "sync", security(("userToken" = [])),
    request_body = SendFrame, responses((status = 200, body = schema::SendAnswer)))]
pub async fn send(
    State(s): State<AppState>,
    User(user): User,
    Body(req): Body<SendFrame>,
) -> Result<Json<SendAnswer>, Error> {
    super::no_frame_fields(req._kind.as_deref(), req.id.as_deref())?;
    s.http_sends.take(&user).map_err(|wait| {
        let rate = s.core.settings.send_rate_per_sec;
        Error::send_rate(rate, "over HTTP for this user", Some(wait))
    })?;
    let core = s.core.clone();
    let prepared = tokio::task::spawn_blocking({
        let core = core.clone();
        let user = user.clone();
        move || core.prepare(&user, req)
    })
    .await
    .map_err(|e| Error::internal(e.to_string()))??;
    match prepared {
        Prepared::Stored(m) => match core.submit_and_wait(Op::Send(m)).await? {
            Answer::Sent(ack) => Ok(Json(SendAnswer::Stored(ack))),
            _ => Err(Error::internal("a send was answered as something else")),
        },
        Prepared::Live(live) => Ok(Json(SendAnswer::Live(
            core.deliver_live(&user, live, 0).await?,
        ))),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PullQuery {
    after_seq: Option<i64>,
    before_seq: Option<i64>,
    /// Default 100 after, 50 before; above 500 means 500.
    #[param(minimum = 1)]
    limit: Option<i64>,
    /// Add each message's `preview` (the kind's one-line text), so a client can show a
    /// kind it does not know.
    #[serde(default)]
    previews: bool,
}

/// Largest page of a pull.
pub const PULL_MAX: i64 = 500;

#[utoipa::path(get, path = "/v1/conversations/{id}/messages", tag = "sync",
    security(("userToken" = [])), params(("id" = i64, Path, description = "the conversation id"), PullQuery),
    responses((status = 200, body = schema::MessagePage)))]
pub async fn pull(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    query: Result<Query<PullQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<schema::MessagePage>, Error> {
    let id = conversation_id(path)?;
    let Query(q) = query.map_err(|e| Error::bad_request(format!("bad query: {e}")))?;
    let (direction, default) = match (q.after_seq, q.before_seq) {
        (Some(_), Some(_)) => {
            return Err(Error::bad_request("give afterSeq or beforeSeq, not both"));
        }
        (None, Some(b)) => (Direction::Before(b), 50),
        (a, None) => (Direction::After(a.unwrap_or(0).max(0)), 100),
    };
    let limit = q.limit.unwrap_or(default);
    if limit < 1 {
        return Err(Error::bad_request("limit must be at least 1"));
    }
    let limit = limit.min(PULL_MAX);
    let store = &s.core.store;
    let m = store
        .membership(&user, id)
        .await
        .map_err(crate::store::unavailable)??;
    let after = matches!(direction, Direction::After(_));
    let rows = store
        .pull(id, &m, direction, limit)
        .await
        .map_err(crate::store::unavailable)?;
    let has_more = match (after, rows.first(), rows.last()) {
        (true, _, Some(last)) => rows.len() as i64 == limit && m.visible_after(last.message.seq),
        (false, Some(first), _) => {
            rows.len() as i64 == limit && m.visible_before(first.message.seq)
        }
        _ => false,
    };
    let messages: Vec<MessageView> = if q.previews {
        // Previews run plugins: off the async workers.
        let registry = s.registry.clone();
        tokio::task::spawn_blocking(move || {
            rows.into_iter()
                .map(|row| previewed(&registry, row))
                .collect()
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))?
    } else {
        rows.into_iter().map(MessageView::from).collect()
    };
    // Written straight from the rows: each payload as stored, not parsed into a value
    // and printed again.
    Ok(Json(schema::MessagePage {
        conversation_id: id,
        conversation_type: m.conversation_type,
        last_seq: m.visible_end(),
        messages,
        has_more,
    }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OverviewQuery {
    /// The previous page's `nextCursor`.
    cursor: Option<String>,
    /// Default 50.
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
}

/// A stored message with its kind's one-line preview (`[recalled]` once recalled).
fn previewed(registry: &PluginRegistry, row: MessageRow) -> MessageView {
    let preview = match row.payload() {
        Some(p) => registry.preview(row.message.content_type, p),
        None => "[recalled]".to_string(),
    };
    let mut view = MessageView::from(row);
    view.preview = Some(preview);
    view
}

/// An overview entry, written straight from the row: the last message's payload as stored.
fn overview_view(s: &AppState, r: OverviewRow) -> schema::ConversationEntry {
    schema::ConversationEntry {
        conversation_id: r.conversation_id,
        conversation_type: r.conversation_type,
        peer_id: r.peer_id,
        last_seq: r.last_seq,
        read_seq: r.read_seq,
        unread: r.unread,
        last_time: r.last_time,
        member: r.member,
        muted: r.muted,
        last_message: r.last_message.map(|m| previewed(&s.registry, m)),
    }
}

#[utoipa::path(get, path = "/v1/conversations", tag = "sync", security(("userToken" = [])),
    params(OverviewQuery), responses((status = 200, body = schema::Overview)))]
pub async fn overview(
    State(s): State<AppState>,
    User(user): User,
    query: Result<Query<OverviewQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<schema::Overview>, Error> {
    let Query(q) = query.map_err(|e| Error::bad_request(format!("bad query: {e}")))?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(Error::bad_request("limit must be 1 to 200"));
    }
    let cursor = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(
            c.split_once('.')
                .and_then(|(t, id)| Some((t.parse().ok()?, id.parse().ok()?)))
                .ok_or_else(|| Error::bad_request("cursor is not one this server gave"))?,
        ),
    };
    // One row more than the page: a cursor only where another page has something.
    let mut rows = s
        .core
        .store
        .overview(&user, cursor, None, limit + 1)
        .await
        .map_err(crate::store::unavailable)?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next = more
        .then(|| {
            rows.last()
                .map(|r| format!("{}.{}", r.last_time, r.conversation_id))
        })
        .flatten();
    // Previews run plugins: off the async workers.
    let state = s.clone();
    let conversations = tokio::task::spawn_blocking(move || {
        rows.into_iter().map(|r| overview_view(&state, r)).collect()
    })
    .await
    .map_err(|e| Error::internal(e.to_string()))?;
    Ok(Json(schema::Overview {
        conversations,
        next_cursor: next,
    }))
}

#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "sync", security(("userToken" = [])),
    params(("id" = i64, Path, description = "the conversation id")), responses((status = 200, body = schema::ConversationEntry)))]
pub async fn one(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
) -> Result<Json<schema::ConversationEntry>, Error> {
    let id = conversation_id(path)?;
    let row = s
        .core
        .store
        .overview(&user, None, Some(id), 1)
        .await
        .map_err(crate::store::unavailable)?
        .pop()
        .ok_or(crate::protocol::Refused::NotAMember(id))?;
    Ok(Json(overview_view(&s, row)))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadBody {
    seq: i64,
}

#[utoipa::path(post, path = "/v1/conversations/{id}/read", tag = "sync",
    security(("userToken" = [])), params(("id" = i64, Path, description = "the conversation id")), request_body = ReadBody,
    responses((status = 200, body = crate::protocol::frames::ReadAck)))]
pub async fn read(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<ReadBody>,
) -> Result<Json<Value>, Error> {
    let id = conversation_id(path)?;
    let op = Op::Read {
        user_id: user,
        conversation_id: id,
        seq: b.seq,
    };
    match s.core.submit_and_wait(op).await? {
        Answer::Read(ack) => Ok(Json(serde_json::to_value(ack).unwrap_or(Value::Null))),
        _ => Err(Error::internal("a read was answered as something else")),
    }
}

#[utoipa::path(post, path = "/v1/conversations/{id}/received", tag = "sync",
    description = "Your devices received the conversation up to `seq` (the `received` frame over HTTP): your delivered position moves there if it is not there already",
    security(("userToken" = [])), params(("id" = i64, Path, description = "the conversation id")), request_body = ReadBody,
    responses((status = 200, body = crate::protocol::frames::ReceivedAck)))]
pub async fn received(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
    Body(b): Body<ReadBody>,
) -> Result<Json<Value>, Error> {
    let id = conversation_id(path)?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    s.core
        .receive(&user, id, b.seq, crate::messaging::Reply::Http(tx))
        .await;
    match rx
        .await
        .map_err(|_| Error::unavailable("the server is shutting down"))??
    {
        Answer::Received(ack) => Ok(Json(serde_json::to_value(ack).unwrap_or(Value::Null))),
        _ => Err(Error::internal("a received was answered as something else")),
    }
}

#[utoipa::path(get, path = "/v1/conversations/{id}/read-positions", tag = "sync",
    security(("userToken" = [])), params(("id" = i64, Path, description = "the conversation id")),
    responses((status = 200, body = schema::ReadPositions)))]
pub async fn read_positions(
    State(s): State<AppState>,
    User(user): User,
    path: IdPath,
) -> Result<Json<Value>, Error> {
    let id = conversation_id(path)?;
    let store = &s.core.store;
    let m = store
        .membership(&user, id)
        .await
        .map_err(crate::store::unavailable)??;
    // A group's members are its current members' business; a channel's, its owner's and
    // admins' only.
    if m.conversation_type >= 2 {
        let me = store
            .member(id, &user)
            .await
            .map_err(crate::store::unavailable)?
            .filter(|m| m.is_current())
            .ok_or(crate::protocol::Refused::NotAMember(id))?;
        if m.conversation_type == 3 && me.role < crate::store::groups::Role::Admin {
            return Err(Error::new(
                Code::PermissionDenied,
                "a channel's subscribers do not see who read what",
            ));
        }
    }
    let positions: Vec<Value> = store
        .read_positions(id, &user)
        .await
        .map_err(crate::store::unavailable)?
        .into_iter()
        .map(|(u, read, delivered)| {
            json!({ "userId": u, "readSeq": read, "deliveredSeq": delivered })
        })
        .collect();
    Ok(Json(
        json!({ "conversationId": id, "positions": positions }),
    ))
}
