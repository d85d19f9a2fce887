//! `group-update` (content type 9): the tip "X changed the group's name/notice/avatar" or
//! "X muted everyone". Emitted by the server; stored, does not count toward unread.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GroupUpdate {
    operator_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    notice: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    avatar: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mute_all: Option<bool>,
}

struct GroupUpdateKind;

impl Plugin for GroupUpdateKind {
    type Payload = GroupUpdate;

    fn manifest() -> Manifest {
        Manifest {
            name: "group-update",
            version: env!("CARGO_PKG_VERSION"),
            content_type: 9,
            delivery: Delivery::Persistent,
            counts_unread: false,
            conversation_types: &[2, 3],
            sender: Sender::System,
            max_payload_bytes: 8 * 1024,
            description: "Tip in a group or channel: name, notice, avatar or mute-all changed; emitted by the server",
        }
    }

    fn validate(_ctx: &Context, p: GroupUpdate) -> Result<GroupUpdate, Rejection> {
        check::id("operatorId", &p.operator_id, 64)?;
        if p.name.is_none() && p.notice.is_none() && p.avatar.is_none() && p.mute_all.is_none() {
            return Err(Rejection::new(
                "no_change",
                "at least one of name, notice, avatar, muteAll is required",
            ));
        }
        let name = p
            .name
            .as_deref()
            .map(|n| check::text("name", n, 64))
            .transpose()?;
        let notice = p
            .notice
            .as_deref()
            .map(|n| check::optional_text("notice", n, 2000))
            .transpose()?;
        if let Some(a) = &p.avatar {
            check::https_url("avatar", a)?;
        }
        Ok(GroupUpdate {
            operator_id: p.operator_id,
            name,
            notice,
            avatar: p.avatar,
            mute_all: p.mute_all,
        })
    }

    fn preview(p: &GroupUpdate) -> String {
        let who = &p.operator_id;
        if let Some(n) = &p.name {
            format!("{who} renamed the group to {n}")
        } else if let Some(n) = &p.notice {
            if n.is_empty() {
                format!("{who} cleared the notice")
            } else {
                format!("{who} posted a notice: {n}")
            }
        } else if p.avatar.is_some() {
            format!("{who} changed the group picture")
        } else if p.mute_all == Some(true) {
            format!("{who} muted everyone")
        } else {
            format!("{who} unmuted everyone")
        }
    }

    fn examples() -> Vec<Example> {
        vec![
            Example::accept(
                "rename",
                2,
                r#"{"operatorId":"owner","name":" Hiking club "}"#,
            ),
            Example::accept(
                "notice",
                3,
                r#"{"operatorId":"owner","notice":"Trip on Saturday"}"#,
            ),
            Example::accept(
                "avatar",
                2,
                r#"{"operatorId":"admin1","avatar":"https://cdn.example.com/g.png"}"#,
            ),
            Example::accept("mute-all", 2, r#"{"operatorId":"owner","muteAll":true}"#),
            Example::reject("nothing", 2, r#"{"operatorId":"owner"}"#),
            Example::reject("empty-name", 2, r#"{"operatorId":"owner","name":""}"#),
            Example::reject(
                "http-avatar",
                2,
                r#"{"operatorId":"owner","avatar":"http://x.example/g.png"}"#,
            ),
            Example::reject(
                "mute-string",
                2,
                r#"{"operatorId":"owner","muteAll":"yes"}"#,
            ),
        ]
    }
}

export_plugin!(GroupUpdateKind);
