//! `group-kick` (content type 8): the tip "X removed Y" in a group's stream. Emitted by the
//! server when an owner or admin kicks members; stored, does not count toward unread.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

const MAX_KICKED: usize = 100;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GroupKick {
    operator_id: String,
    kicked_user_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reason: String,
}

struct GroupKickKind;

impl Plugin for GroupKickKind {
    type Payload = GroupKick;

    fn manifest() -> Manifest {
        Manifest {
            name: "group-kick",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 8,
            delivery: Delivery::Persistent,
            counts_unread: false,
            conversation_types: &[2],
            sender: Sender::System,
            max_payload_bytes: 8 * 1024,
            description: "Tip in a group: members were removed by an owner or admin; emitted by the server",
        }
    }

    fn validate(_ctx: &Context, p: GroupKick) -> Result<GroupKick, Rejection> {
        check::user_id("operatorId", &p.operator_id)?;
        if p.kicked_user_ids.is_empty() || p.kicked_user_ids.len() > MAX_KICKED {
            return Err(Rejection::new(
                "bad_member_list",
                format!("kickedUserIds must list 1 to {MAX_KICKED} users"),
            ));
        }
        let kicked = check::user_ids("kickedUserIds[]", p.kicked_user_ids)?;
        if kicked.contains(&p.operator_id) {
            return Err(Rejection::new(
                "self_kick",
                "the operator cannot kick themselves",
            ));
        }
        let reason = check::optional_text("reason", &p.reason, 200)?;
        Ok(GroupKick {
            operator_id: p.operator_id,
            kicked_user_ids: kicked,
            reason,
        })
    }

    fn preview(p: &GroupKick) -> String {
        match p.kicked_user_ids.as_slice() {
            [one] => format!("{} removed {}", p.operator_id, one),
            many => format!("{} removed {} members", p.operator_id, many.len()),
        }
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept(
                "one",
                2,
                r#"{"operatorId":"owner","kickedUserIds":["bob"]}"#,
            ),
            Example::accept(
                "dedup",
                2,
                r#"{"operatorId":"owner","kickedUserIds":["bob","carol","bob"],"reason":"spam"}"#,
            ),
            Example::accept(
                "dotted-ids",
                2,
                r#"{"operatorId":"o.wner","kickedUserIds":["x.y@z"]}"#,
            ),
            Example::reject("nobody", 2, r#"{"operatorId":"owner","kickedUserIds":[]}"#),
            Example::reject(
                "not-a-user-id",
                2,
                r#"{"operatorId":"owner","kickedUserIds":["bob smith"]}"#,
            ),
            Example::reject(
                "self",
                2,
                r#"{"operatorId":"owner","kickedUserIds":["owner"]}"#,
            ),
            Example::reject(
                "bad-id",
                2,
                r#"{"operatorId":"owner","kickedUserIds":[""]}"#,
            ),
        ]
    }
}

export_plugin!(GroupKickKind);
