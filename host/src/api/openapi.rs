//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of every HTTP endpoint, generated from
//! the handlers' `#[utoipa::path]` annotations and their types, built once. Each operation's
//! error answers come from [`errors`]: the codes it can answer, grouped by their status
//! (`api::error::status`), each status's body the one error envelope narrowed to its codes.

use std::borrow::Cow;
use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{Value, json};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use super::error::status;
use crate::protocol::Code;

/// The one error envelope.
#[derive(serde::Serialize, ToSchema)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(serde::Serialize, ToSchema)]
pub struct ErrorDetail {
    #[schema(value_type = Code)]
    code: &'static str,
    /// For people; never branch on it.
    message: String,
    /// With `payload_invalid`: the plugin's own rejection code, or `not_utf8`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// Every code that can reach HTTP (the WebSocket-only ones travel in `error` frames only).
pub fn http_codes() -> impl Iterator<Item = Code> {
    Code::ALL.iter().copied().filter(|c| !c.websocket_only())
}

impl PartialSchema for Code {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A stable error code (docs/protocol.md, \"Error codes\")",
            ))
            .enum_values(Some(http_codes().map(Code::as_str)))
            .into()
    }
}

impl ToSchema for Code {
    fn name() -> Cow<'static, str> {
        "ErrorCode".into()
    }
}

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer = |what: &str| {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(what.to_string());
            SecurityScheme::Http(http)
        };
        components.add_security_scheme(
            "userToken",
            bearer("a user's token (`POST /v1/auth/login`, or signed by the deployer)"),
        );
        components.add_security_scheme("adminToken", bearer("the server's `server.admin_token`"));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Courier", description = "The HTTP API of Courier; the WebSocket's frames are in docs/protocol.md"),
    modifiers(&Security),
    components(schemas(ErrorBody)),
    paths(
        super::healthz, serve, metrics,
        super::accounts::register, super::accounts::login, super::accounts::logout,
        super::accounts::revoke_all, super::accounts::delete_own,
        crate::gateway::upgrade,
        super::conversations::send, super::conversations::overview, super::conversations::one,
        super::conversations::pull, super::conversations::read,
        super::conversations::received, super::conversations::read_positions,
        super::devices::list, super::devices::register, super::devices::remove,
        super::devices::set_push, super::devices::clear_push, super::devices::notifications,
        super::e2e::upload, super::e2e::status, super::e2e::claim, super::e2e::send,
        super::e2e::mailbox, super::e2e::ack,
        super::social::user_stream, super::social::friends, super::social::remove_friend,
        super::social::requests, super::social::request_friend, super::social::accept,
        super::social::reject, super::social::cancel, super::social::presence,
        super::social::blocks, super::social::block, super::social::unblock,
        super::groups::mine, super::groups::create, super::groups::one, super::groups::patch,
        super::groups::members, super::groups::add, super::groups::kick, super::groups::quit,
        super::groups::dissolve, super::groups::transfer, super::groups::make_admin,
        super::groups::unmake_admin, super::groups::mute, super::groups::join,
        super::groups::join_requests, super::groups::approve, super::groups::reject,
        super::groups::receipts,
        super::list_plugins, super::admin_list, super::enable, super::disable, super::reload,
        super::dry_run, super::admin_node, super::reset_stream,
        super::accounts::admin_revoke_all, super::accounts::admin_delete,
    )
)]
struct ApiDoc;

/// The document, as served.
pub fn document() -> &'static Value {
    static DOC: LazyLock<Value> = LazyLock::new(build);
    &DOC
}

fn build() -> Value {
    let mut api = ApiDoc::openapi();
    api.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut doc = serde_json::to_value(&api).expect("the OpenAPI document serializes");
    doc["openapi"] = "3.1.0".into();
    let paths = doc["paths"].as_object_mut().expect("paths");
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            let key = format!("{} {path}", method.to_uppercase());
            let params = op.get_mut("parameters").and_then(Value::as_array_mut);
            for p in params.into_iter().flatten() {
                if p["name"] == "userId" {
                    p["schema"]["pattern"] = USER_ID.into();
                }
            }
            op["operationId"] = operation_id(&key).into();
            let codes = errors(&key, op);
            let responses = op["responses"].as_object_mut().expect("responses");
            for (status, codes) in by_status(&codes) {
                let names: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
                let listed: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                responses.insert(
                    status.to_string(),
                    json!({
                        "description": listed.join(", "),
                        "x-codes": names,
                        "content": {"application/json": {"schema": {"allOf": [
                            {"$ref": "#/components/schemas/ErrorBody"},
                            {"properties": {"error": {"properties": {"code": {"enum": names}}}}},
                        ]}}},
                    }),
                );
            }
        }
    }
    doc
}

/// What a user id is (docs/protocol.md, "Conventions").
pub const USER_ID: &str = "^[A-Za-z0-9_.@-]{1,64}$";

/// `POST /v1/groups/{id}/join` → `post_v1_groups_id_join` (unique: one per method and path).
fn operation_id(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect::<String>()
        .to_lowercase()
        .split('_')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

fn by_status(codes: &[Code]) -> Vec<(u16, Vec<Code>)> {
    let mut out: Vec<(u16, Vec<Code>)> = Vec::new();
    for &c in codes {
        let s = status(c).as_u16();
        match out.iter_mut().find(|(t, _)| *t == s) {
            Some((_, list)) if !list.contains(&c) => list.push(c),
            Some(_) => {}
            None => out.push((s, vec![c])),
        }
    }
    out.sort_by_key(|(s, _)| *s);
    out
}

/// The codes an operation can answer: what its token, body and path can fail with, and
/// its own (docs/protocol.md, under its heading).
fn errors(key: &str, op: &Value) -> Vec<Code> {
    use Code::*;
    let mut codes = Vec::new();
    let schemes: Vec<&str> = op["security"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_object())
        .flat_map(|s| s.keys().map(String::as_str))
        .collect();
    if schemes.contains(&"userToken") {
        codes.extend([Unauthorized, AccountDeleted, StoreUnavailable]);
    }
    if schemes.contains(&"adminToken") {
        codes.extend([Unauthorized, AdminDisabled]);
    }
    if op.get("requestBody").is_some() {
        codes.extend([BadRequest, RequestTooLarge, RequestTimeout]);
    }
    if op.get("parameters").is_some() {
        codes.push(BadRequest);
    }
    codes.extend_from_slice(own_errors(key));
    codes
}

/// A group or channel named by id.
const GROUP: &[Code] = &[Code::GroupNotFound, Code::NotAMember];
/// What a change that writes a tip can meet: its kind refused or failed.
const TIP: &[Code] = &[
    Code::ContentTypeDisabled,
    Code::PayloadInvalid,
    Code::PayloadTooLarge,
    Code::PluginFailed,
    Code::PluginBusy,
    Code::GroupDissolved,
    Code::PermissionDenied,
    Code::StoreUnavailable,
];
/// What a plugin's checks can answer.
const CHECKS: &[Code] = &[
    Code::ContentTypeUnknown,
    Code::ContentTypeDisabled,
    Code::ContentTypeForbidden,
    Code::ConversationTypeNotAllowed,
    Code::PayloadTooLarge,
    Code::PayloadInvalid,
    Code::PluginFailed,
    Code::PluginBusy,
];

fn own_errors(key: &str) -> &'static [Code] {
    use Code::*;
    static GROUP_CHANGE: LazyLock<Vec<Code>> =
        LazyLock::new(|| [GROUP, TIP, &[TargetNotMember]].concat());
    static GROUP_READ: LazyLock<Vec<Code>> =
        LazyLock::new(|| [GROUP, &[PermissionDenied]].concat());
    static SEND: LazyLock<Vec<Code>> = LazyLock::new(|| {
        [
            CHECKS,
            &[
                NotAMember,
                UserNotFound,
                ConversationNotFound,
                ConversationTypeMismatch,
                MessageNotFound,
                RecallNotOwnMessage,
                RecallWindowExpired,
                AlreadyRecalled,
                MessageNotRecallable,
                Blocked,
                Muted,
                PermissionDenied,
                GroupDissolved,
                RateLimited,
            ],
        ]
        .concat()
    });
    static FRIEND: LazyLock<Vec<Code>> = LazyLock::new(|| {
        [
            TIP,
            &[
                UserNotFound,
                AlreadyFriends,
                Blocked,
                RequestNotFound,
                RequestNotPending,
            ],
        ]
        .concat()
    });
    static CREATE: LazyLock<Vec<Code>> =
        LazyLock::new(|| [TIP, &[UserNotFound, GroupFull]].concat());
    static ADD: LazyLock<Vec<Code>> =
        LazyLock::new(|| [&GROUP_CHANGE[..], &[AlreadyMember, UserNotFound, GroupFull]].concat());
    static JOIN: LazyLock<Vec<Code>> = LazyLock::new(|| {
        [
            &GROUP_CHANGE[..],
            &[
                JoinClosed,
                AlreadyMember,
                GroupFull,
                RequestNotFound,
                RequestNotPending,
            ],
        ]
        .concat()
    });
    static QUIT: LazyLock<Vec<Code>> =
        LazyLock::new(|| [&GROUP_CHANGE[..], &[OwnerCannotQuit]].concat());
    static CONVERSATION: &[Code] = &[NotAMember];
    // A deletion writes the `left` tips of the account's groups.
    static DELETE: LazyLock<Vec<Code>> = LazyLock::new(|| [TIP, &[UserNotFound]].concat());
    static DELETE_OWN: LazyLock<Vec<Code>> =
        LazyLock::new(|| [TIP, &[InvalidCredentials, RateLimited, Busy]].concat());
    match key {
        "GET /healthz" | "GET /v1/openapi.json" => &[],
        "POST /v1/auth/register" => &[RegistrationClosed, RateLimited, Busy, UserExists],
        "POST /v1/auth/login" => &[InvalidCredentials, RateLimited, Busy],
        "POST /v1/auth/logout" | "POST /v1/auth/revoke-all" => &[],
        "DELETE /v1/account" => &DELETE_OWN,
        "GET /v1/ws" => &[BadRequest, DeviceRemoved, TooManyDevices],
        "POST /v1/messages" => &SEND,
        "GET /v1/conversations" => &[BadRequest],
        "GET /v1/conversations/{id}"
        | "GET /v1/conversations/{id}/messages"
        | "POST /v1/conversations/{id}/read"
        | "POST /v1/conversations/{id}/received"
        | "PUT /v1/conversations/{id}/notifications" => CONVERSATION,
        "GET /v1/devices" => &[],
        "POST /v1/devices" => &[BadRequest, TooManyDevices],
        "DELETE /v1/devices/{deviceId}"
        | "PUT /v1/devices/{deviceId}/push"
        | "DELETE /v1/devices/{deviceId}/push"
        | "GET /v1/devices/{deviceId}/keys"
        | "GET /v1/devices/{deviceId}/mailbox"
        | "POST /v1/devices/{deviceId}/mailbox/ack" => &[BadRequest, DeviceNotFound],
        "PUT /v1/devices/{deviceId}/keys" => &[
            BadRequest,
            DeviceNotFound,
            KeysInvalid,
            IdentityKeyChanged,
            PrekeyIdTaken,
            TooManyPrekeys,
        ],
        "GET /v1/keys/{userId}" => &[BadRequest, UserNotFound, RateLimited, Blocked],
        "POST /v1/device-messages" => &[
            BadRequest,
            DeviceNotFound,
            MailboxFull,
            Blocked,
            ContentTypeForbidden,
            ContentTypeUnknown,
            ContentTypeDisabled,
            PayloadTooLarge,
            PayloadInvalid,
            PluginFailed,
            PluginBusy,
        ],
        "GET /v1/conversations/{id}/read-positions" => &[NotAMember, PermissionDenied],
        "GET /v1/user-stream" => &[BadRequest, ResyncRequired],
        "GET /v1/friends" | "GET /v1/blocks" | "GET /v1/groups" | "GET /v1/plugins" => &[],
        "GET /v1/friends/requests" => &[BadRequest],
        "POST /v1/friends/requests"
        | "POST /v1/friends/requests/{id}/accept"
        | "POST /v1/friends/requests/{id}/reject"
        | "POST /v1/friends/requests/{id}/cancel" => &FRIEND,
        "DELETE /v1/friends/{userId}" => &[NotFriends, UserNotFound],
        "PUT /v1/blocks/{userId}" | "DELETE /v1/blocks/{userId}" => &[UserNotFound],
        "GET /v1/presence" => &[BadRequest],
        "POST /v1/groups" => &CREATE,
        "GET /v1/groups/{id}" => GROUP,
        "GET /v1/groups/{id}/members" | "GET /v1/groups/{id}/join-requests" => &GROUP_READ,
        "POST /v1/groups/{id}/receipts" => {
            &[GroupNotFound, NotAMember, MessageNotFound, PermissionDenied]
        }
        "POST /v1/groups/{id}/members" => &ADD,
        "POST /v1/groups/{id}/join"
        | "POST /v1/groups/{id}/join-requests/{userId}/approve"
        | "POST /v1/groups/{id}/join-requests/{userId}/reject" => &JOIN,
        "POST /v1/groups/{id}/quit" => &QUIT,
        "PATCH /v1/groups/{id}"
        | "POST /v1/groups/{id}/kick"
        | "POST /v1/groups/{id}/dissolve"
        | "POST /v1/groups/{id}/transfer"
        | "PUT /v1/groups/{id}/admins/{userId}"
        | "DELETE /v1/groups/{id}/admins/{userId}"
        | "POST /v1/groups/{id}/mute" => &GROUP_CHANGE,
        "GET /admin/plugins" | "GET /admin/node" | "GET /metrics" => &[],
        "POST /admin/plugins/{name}/enable" | "POST /admin/plugins/{name}/disable" => {
            &[PluginNotFound]
        }
        "POST /admin/plugins/reload" => &[ReloadRefused],
        "POST /admin/validate" => CHECKS,
        "POST /admin/users/{userId}/stream/reset" => &[UserNotFound, StoreUnavailable],
        "DELETE /admin/users/{userId}" => &DELETE,
        "POST /admin/users/{userId}/revoke-all" => {
            &[UserNotFound, AccountDeleted, StoreUnavailable]
        }
        other => panic!("{other}: no error codes listed in api::openapi::own_errors"),
    }
}

/// `GET /metrics` on the main listener (`api::metrics`), described here; the same text is
/// served without a token on `server.metrics_listen` when that is set.
#[utoipa::path(get, path = "/metrics", tag = "admin", security(("adminToken" = [])),
    description = "Prometheus text format (docs/operations.md lists every metric)",
    responses((status = 200, description = "The metrics", content_type = "text/plain", body = String)))]
#[allow(dead_code)]
fn metrics() {}

/// The document (no token needed).
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta",
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json", body = Object)))]
pub async fn serve() -> impl IntoResponse {
    static TEXT: LazyLock<String> = LazyLock::new(|| document().to_string());
    ([(header::CONTENT_TYPE, "application/json")], TEXT.as_str())
}
