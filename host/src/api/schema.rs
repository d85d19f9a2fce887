//! What the OpenAPI document says the answers built as JSON values look like. These types
//! describe bodies that handlers (and `social`) build with `json!`; they are never built
//! themselves. The schemathesis run in CI (`scripts/schemathesis.sh`) checks every answer
//! against them, so a description that drifts from the wire fails there.
#![allow(dead_code)]

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

// ---- accounts

/// A new token.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenAnswer {
    user_id: String,
    /// An HS256 JWT.
    token: String,
    /// Unix seconds.
    expires_at: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogoutAnswer {
    user_id: String,
    revoked: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevokeAnswer {
    user_id: String,
    /// Unix seconds: tokens with an earlier `iat` are refused.
    tokens_valid_from: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletedAnswer {
    user_id: String,
    deleted: bool,
    /// `deleted-` and 16 hex digits.
    alias: String,
}

// ---- sync

/// A conversation's last message: a pulled message with the kind's preview.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastMessage {
    conversation_type: u8,
    conversation_id: i64,
    seq: i64,
    msg_id: String,
    sender_id: String,
    content_type: u32,
    /// `null` once recalled.
    #[schema(required = true)]
    payload: Option<Value>,
    server_time: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    recalled_by: Option<i64>,
    preview: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationEntry {
    conversation_id: i64,
    conversation_type: u8,
    /// The other party of a private conversation, else `null`.
    #[schema(required = true)]
    peer_id: Option<String>,
    last_seq: i64,
    read_seq: i64,
    unread: i64,
    last_time: i64,
    member: bool,
    #[schema(required = true)]
    last_message: Option<LastMessage>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    conversations: Vec<ConversationEntry>,
    /// `null` on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessagePage {
    conversation_id: i64,
    conversation_type: u8,
    last_seq: i64,
    messages: Vec<super::conversations::MessageView>,
    has_more: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadPosition {
    user_id: String,
    read_seq: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadPositions {
    conversation_id: i64,
    positions: Vec<ReadPosition>,
}

/// A stored send's ack, or a live send's answer.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum SendAnswer {
    Stored(crate::protocol::frames::SendAck),
    Live(crate::protocol::frames::LiveAck),
}

// ---- the user stream, friends, blocks, presence

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamEvent {
    seq: i64,
    /// `friend.request`, `friend.added`, `group.joined`, …
    event: String,
    data: Value,
    server_time: i64,
    /// Present on events a plugin checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    content_type: Option<u32>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserStreamPage {
    epoch: i64,
    last_seq: i64,
    has_more: bool,
    events: Vec<StreamEvent>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequestState {
    Pending,
    Accepted,
    Rejected,
    Cancelled,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FriendRequestAnswer {
    request_id: String,
    state: RequestState,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FriendRequestView {
    request_id: String,
    from_user_id: String,
    to_user_id: String,
    message: String,
    state: RequestState,
    created_at: i64,
    updated_at: i64,
}

#[derive(Serialize, ToSchema)]
pub struct FriendRequests {
    requests: Vec<FriendRequestView>,
}

/// A friend or a block, and since when (ms).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Since {
    user_id: String,
    since: i64,
}

#[derive(Serialize, ToSchema)]
pub struct Friends {
    friends: Vec<Since>,
}

#[derive(Serialize, ToSchema)]
pub struct Blocks {
    blocks: Vec<Since>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Removed {
    user_id: String,
    removed: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockAnswer {
    user_id: String,
    blocked: bool,
}

#[derive(Serialize, ToSchema)]
pub struct PresenceAnswer {
    presence: Vec<crate::social::presence::Presence>,
}

// ---- groups and channels

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupInfo {
    conversation_id: i64,
    conversation_type: u8,
    name: String,
    notice: String,
    avatar: String,
    owner_id: String,
    /// `open`, `approval` or `invite`.
    join_policy: String,
    mute_all: bool,
    /// `active` or `dissolved`.
    state: String,
    member_count: i64,
    version: i64,
    created_at: i64,
    updated_at: i64,
}

/// The group info with the caller's own membership.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MyGroup {
    #[serde(flatten)]
    info: GroupInfo,
    /// `member`, `left`, `kicked` or `dissolved`.
    member_state: String,
    /// `owner`, `admin` or `member`.
    role: String,
    muted_until: i64,
}

#[derive(Serialize, ToSchema)]
pub struct MyGroups {
    groups: Vec<MyGroup>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    user_id: String,
    role: String,
    muted_until: i64,
    joined_at: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Members {
    members: Vec<MemberView>,
    has_more: bool,
}

#[derive(Serialize, ToSchema)]
pub struct Added {
    added: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Kicked {
    kicked: Vec<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuitAnswer {
    conversation_id: i64,
    /// `left`.
    member_state: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DissolveAnswer {
    conversation_id: i64,
    /// `dissolved`.
    state: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleAnswer {
    user_id: String,
    /// `admin` or `member`.
    role: String,
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
    user_id: String,
    /// ms since the epoch; 0: unmuted.
    muted_until: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinAnswer {
    /// `joined` or `pending`.
    state: String,
    /// With `pending`.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinRequestView {
    request_id: String,
    user_id: String,
    message: String,
    /// `pending`.
    state: String,
    created_at: i64,
}

#[derive(Serialize, ToSchema)]
pub struct JoinRequests {
    requests: Vec<JoinRequestView>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinDecision {
    request_id: String,
    /// `approved` or `rejected`.
    state: String,
}

#[derive(Serialize, ToSchema)]
pub struct Receipt {
    seq: i64,
    read: i64,
    of: i64,
}

#[derive(Serialize, ToSchema)]
pub struct Receipts {
    receipts: Vec<Receipt>,
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
    status: Status,
    /// With `degraded`: what this node cannot reach.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasons: Option<Vec<String>>,
}

/// What a cluster node forwarded since start-up.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStats {
    node_id: u16,
    rounds: u64,
    publishes: u64,
    lost: u64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    status: Status,
    reasons: Vec<String>,
    online_devices: u64,
    commit_batches: u64,
    /// `null` unless in cluster mode.
    #[schema(required = true)]
    cluster: Option<ClusterStats>,
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
    calls: u64,
    accepted: u64,
    rejected: u64,
    failed: u64,
}

/// A message kind as `GET /v1/plugins` lists it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    name: String,
    version: String,
    content_type: u32,
    delivery: DeliveryClass,
    counts_unread: bool,
    conversation_types: Vec<u8>,
    sender: Sender,
    max_payload_bytes: u32,
    description: String,
    enabled: bool,
    source: String,
    sha256: String,
    contract: String,
    /// Why the circuit breaker switched the kind off, else `null`.
    #[schema(required = true)]
    tripped: Option<String>,
    stats: PluginStats,
}

#[derive(Serialize, ToSchema)]
pub struct PluginList {
    plugins: Vec<PluginInfo>,
}

#[derive(Serialize, ToSchema)]
pub struct PluginAnswer {
    plugin: PluginInfo,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamReset {
    user_id: String,
    epoch: i64,
}

#[derive(Serialize, ToSchema)]
pub struct DryRunAnswer {
    /// The normalized payload.
    payload: Value,
    preview: String,
}
