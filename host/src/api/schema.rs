//! The answers of the HTTP API as the OpenAPI document shows them. The handlers of this
//! folder build most of them; the rest describe bodies built as JSON values (the group
//! info and the other answers of `social`, the overview with its previews, the user
//! stream) and are never built. The schemathesis run in CI (`scripts/schemathesis.sh`)
//! checks every answer against them, so a description that drifts from the wire fails
//! there.
#![allow(dead_code)]

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::protocol::frames::raw;
use crate::store::sync::MessageRow;

// ---- accounts

/// A new token.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenAnswer {
    pub user_id: String,
    /// An HS256 JWT.
    pub token: String,
    /// Unix seconds.
    pub expires_at: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogoutAnswer {
    pub user_id: String,
    pub revoked: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevokeAnswer {
    pub user_id: String,
    /// Unix seconds: tokens with an earlier `iat` are refused.
    pub tokens_valid_from: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletedAnswer {
    pub user_id: String,
    pub deleted: bool,
    /// `deleted-` and 16 hex digits.
    pub alias: String,
}

// ---- sync

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationEntry {
    pub conversation_id: i64,
    pub conversation_type: u8,
    /// The other party of a private conversation, else `null`.
    #[schema(required = true)]
    pub peer_id: Option<String>,
    pub last_seq: i64,
    pub read_seq: i64,
    pub unread: i64,
    pub last_time: i64,
    pub member: bool,
    /// You muted this conversation's offline notices (`PUT …/notifications`).
    pub muted: bool,
    /// The last message visible to you, as a pull gives it, with its kind's `preview`.
    #[schema(required = true)]
    pub last_message: Option<MessageView>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    pub conversations: Vec<ConversationEntry>,
    /// `null` on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// A stored message as pulls return it: the `notify` envelope without `type`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageView {
    conversation_type: u8,
    conversation_id: i64,
    seq: i64,
    msg_id: String,
    sender_id: String,
    content_type: u32,
    /// `null` once recalled.
    #[schema(value_type = Option<Object>, required = true)]
    payload: Option<Box<RawValue>>,
    server_time: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    recalled_by: Option<i64>,
    /// The kind's one-line preview (`[recalled]` once recalled): only in pulls asked
    /// with `previews=true` (and in the overview's last messages).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
}

impl From<MessageRow> for MessageView {
    fn from(row: MessageRow) -> MessageView {
        let payload = row.payload().map(raw);
        let m = row.message;
        MessageView {
            conversation_type: m.conversation_type,
            conversation_id: m.conversation_id,
            seq: m.seq,
            msg_id: m.msg_id.to_string(),
            sender_id: m.sender_id,
            content_type: m.content_type,
            payload,
            server_time: m.server_time,
            recalled_by: (row.recalled_by != 0).then_some(row.recalled_by),
            preview: None,
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessagePage {
    pub conversation_id: i64,
    pub conversation_type: u8,
    pub last_seq: i64,
    pub messages: Vec<MessageView>,
    pub has_more: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadPosition {
    pub user_id: String,
    pub read_seq: i64,
    /// How far the member's devices received the conversation (never below `readSeq`).
    pub delivered_seq: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadPositions {
    pub conversation_id: i64,
    pub positions: Vec<ReadPosition>,
}

/// A stored send's ack, or a live send's answer.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum SendAnswer {
    Stored(crate::protocol::frames::SendAck),
    Live(crate::protocol::frames::LiveAck),
}

// ---- devices

#[derive(Serialize, ToSchema)]
pub struct Devices {
    pub devices: Vec<crate::messaging::DeviceInfo>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRemoved {
    pub device_id: String,
    pub removed: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PushToken {
    pub device_id: String,
    /// The provider of the token in force; `null` once cleared.
    pub provider: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Notifications {
    pub conversation_id: i64,
    pub muted: bool,
}

// ---- the user stream, friends, blocks, presence

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamEvent {
    pub seq: i64,
    /// `friend.request`, `friend.added`, `group.joined`, …
    pub event: String,
    pub data: Value,
    pub server_time: i64,
    /// Present on events a plugin checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<u32>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserStreamPage {
    pub epoch: i64,
    pub last_seq: i64,
    pub has_more: bool,
    pub events: Vec<StreamEvent>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequestState {
    Pending,
    Accepted,
    Rejected,
    Cancelled,
}

impl From<crate::store::social::RequestState> for RequestState {
    fn from(state: crate::store::social::RequestState) -> RequestState {
        use crate::store::social::RequestState as S;
        match state {
            S::Pending => RequestState::Pending,
            S::Accepted => RequestState::Accepted,
            S::Rejected => RequestState::Rejected,
            S::Cancelled => RequestState::Cancelled,
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FriendRequestAnswer {
    pub request_id: String,
    pub state: RequestState,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FriendRequestView {
    pub request_id: String,
    pub from_user_id: String,
    pub to_user_id: String,
    pub message: String,
    pub state: RequestState,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Serialize, ToSchema)]
pub struct FriendRequests {
    pub requests: Vec<FriendRequestView>,
}

/// A friend or a block, and since when (ms).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Since {
    pub user_id: String,
    pub since: i64,
}

#[derive(Serialize, ToSchema)]
pub struct Friends {
    pub friends: Vec<Since>,
}

#[derive(Serialize, ToSchema)]
pub struct Blocks {
    pub blocks: Vec<Since>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Removed {
    pub user_id: String,
    pub removed: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockAnswer {
    pub user_id: String,
    pub blocked: bool,
}

#[derive(Serialize, ToSchema)]
pub struct PresenceAnswer {
    pub presence: Vec<crate::social::presence::Presence>,
}

// ---- groups and channels

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupInfo {
    pub conversation_id: i64,
    pub conversation_type: u8,
    pub name: String,
    pub notice: String,
    pub avatar: String,
    pub owner_id: String,
    /// `open`, `approval` or `invite`.
    pub join_policy: String,
    pub mute_all: bool,
    /// `active` or `dissolved`.
    pub state: String,
    pub member_count: i64,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The group info with the caller's own membership.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MyGroup {
    #[serde(flatten)]
    pub info: GroupInfo,
    /// `member`, `left`, `kicked` or `dissolved`.
    pub member_state: String,
    /// `owner`, `admin` or `member`.
    pub role: String,
    pub muted_until: i64,
}

#[derive(Serialize, ToSchema)]
pub struct MyGroups {
    pub groups: Vec<MyGroup>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    pub user_id: String,
    pub role: String,
    pub muted_until: i64,
    pub joined_at: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Members {
    pub members: Vec<MemberView>,
    pub has_more: bool,
}

#[derive(Serialize, ToSchema)]
pub struct Added {
    pub added: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Kicked {
    pub kicked: Vec<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuitAnswer {
    pub conversation_id: i64,
    /// `left`.
    pub member_state: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DissolveAnswer {
    pub conversation_id: i64,
    /// `dissolved`.
    pub state: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleAnswer {
    pub user_id: String,
    /// `admin` or `member`.
    pub role: String,
}

/// Making the owner an admin or member answers the group info; anyone else, the new role.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum AdminAnswer {
    Role(RoleAnswer),
    Info(GroupInfo),
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MuteAnswer {
    pub user_id: String,
    /// ms since the epoch; 0: unmuted.
    pub muted_until: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinAnswer {
    /// `joined` or `pending`.
    pub state: String,
    /// With `pending`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinRequestView {
    pub request_id: String,
    pub user_id: String,
    pub message: String,
    /// `pending`.
    pub state: String,
    pub created_at: i64,
}

#[derive(Serialize, ToSchema)]
pub struct JoinRequests {
    pub requests: Vec<JoinRequestView>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinDecision {
    pub request_id: String,
    /// `approved` or `rejected`.
    pub state: String,
}

#[derive(Serialize, ToSchema)]
pub struct Receipt {
    pub seq: i64,
    pub read: i64,
    /// Members whose devices received it (those who read it included).
    pub delivered: i64,
    pub of: i64,
}

#[derive(Serialize, ToSchema)]
pub struct Receipts {
    pub receipts: Vec<Receipt>,
}

// ---- health, plugins, admin

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Degraded,
}

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: Status,
    /// With `degraded`: what this node cannot reach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<String>>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    pub status: Status,
    pub reasons: Vec<String>,
    pub online_devices: u64,
    pub commit_batches: u64,
    /// `null` unless in cluster mode.
    #[schema(required = true)]
    pub cluster: Option<crate::messaging::ClusterStats>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryClass {
    Persistent,
    Live,
    Latest,
    Droppable,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Sender {
    User,
    System,
}

#[derive(Serialize, ToSchema)]
pub struct PluginStats {
    pub calls: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub failed: u64,
}

/// A message kind as `GET /v1/plugins` lists it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub content_type: u32,
    pub delivery: DeliveryClass,
    pub counts_unread: bool,
    pub conversation_types: Vec<u8>,
    pub sender: Sender,
    pub max_payload_bytes: u32,
    pub description: String,
    pub enabled: bool,
    pub source: String,
    pub sha256: String,
    pub contract: String,
    /// Why the circuit breaker switched the kind off, else `null`.
    #[schema(required = true)]
    pub tripped: Option<String>,
    pub stats: PluginStats,
}

#[derive(Serialize, ToSchema)]
pub struct PluginList {
    pub plugins: Vec<PluginInfo>,
}

#[derive(Serialize, ToSchema)]
pub struct PluginAnswer {
    pub plugin: PluginInfo,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamReset {
    pub user_id: String,
    pub epoch: i64,
}

#[derive(Serialize, ToSchema)]
pub struct DryRunAnswer {
    /// The normalized payload, as a send would store it.
    #[schema(value_type = Object)]
    pub payload: Box<serde_json::value::RawValue>,
    pub preview: String,
}
