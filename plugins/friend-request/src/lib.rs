//! `friend-request` (content type 7): a friend request and its outcome, written by the
//! server into the users' streams (conversation type 0), and the "you are now friends" tip
//! (`accepted`) in their private conversation (type 1). Clients never send it directly.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Action {
    Requested,
    Accepted,
    Rejected,
    Cancelled,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FriendRequest {
    action: Action,
    request_id: String,
    from_user_id: String,
    to_user_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
}

struct FriendRequestKind;

impl Plugin for FriendRequestKind {
    type Payload = FriendRequest;

    fn manifest() -> Manifest {
        Manifest {
            name: "friend-request",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 7,
            delivery: Delivery::Persistent,
            counts_unread: false,
            conversation_types: &[0, 1],
            sender: Sender::System,
            max_payload_bytes: 2048,
            description: "Friend request and its outcome, in the users' streams; emitted by the server",
        }
    }

    fn validate(ctx: &Context, p: FriendRequest) -> Result<FriendRequest, Rejection> {
        if ctx.conversation_type == 1 && p.action != Action::Accepted {
            return Err(Rejection::new(
                "not_a_tip",
                "in a private conversation only the accepted tip is stored",
            ));
        }
        check::id("requestId", &p.request_id, 64)?;
        check::user_id("fromUserId", &p.from_user_id)?;
        check::user_id("toUserId", &p.to_user_id)?;
        if p.from_user_id == p.to_user_id {
            return Err(Rejection::new(
                "self_request",
                "a user cannot befriend themselves",
            ));
        }
        let message = check::optional_text("message", &p.message, 200)?;
        Ok(FriendRequest { message, ..p })
    }

    fn preview(p: &FriendRequest) -> String {
        match p.action {
            Action::Requested if p.message.is_empty() => "new friend request".into(),
            Action::Requested => format!("friend request: {}", p.message),
            Action::Accepted => "you are now friends".into(),
            Action::Rejected => "friend request declined".into(),
            Action::Cancelled => "friend request withdrawn".into(),
        }
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept(
                "requested",
                0,
                r#"{"action":"requested","requestId":"r1","fromUserId":"alice","toUserId":"bob","message":"hi, it's Alice"}"#,
            ),
            Example::accept(
                "accepted",
                0,
                r#"{"action":"accepted","requestId":"r1","fromUserId":"alice","toUserId":"bob"}"#,
            ),
            Example::accept(
                "dotted-ids",
                0,
                r#"{"action":"requested","requestId":"r2","fromUserId":"dot.user","toUserId":"mail@example.com"}"#,
            ),
            Example::reject(
                "self",
                0,
                r#"{"action":"requested","requestId":"r1","fromUserId":"alice","toUserId":"alice"}"#,
            ),
            Example::reject(
                "bad-action",
                0,
                r#"{"action":"poke","requestId":"r1","fromUserId":"alice","toUserId":"bob"}"#,
            ),
            Example::reject("missing-ids", 0, r#"{"action":"requested"}"#),
            Example::accept(
                "friends-tip",
                1,
                r#"{"action":"accepted","requestId":"r1","fromUserId":"alice","toUserId":"bob"}"#,
            ),
            Example::reject(
                "request-in-private",
                1,
                r#"{"action":"requested","requestId":"r1","fromUserId":"alice","toUserId":"bob"}"#,
            ),
        ]
    }
}

export_plugin!(FriendRequestKind);
