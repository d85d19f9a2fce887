//! `group-update` (content type 9): the tips of a group or channel other than kicks —
//! settings changed ("X renamed the group", "X muted everyone") and membership events
//! ("X added Y", "Y left", "X dissolved the group"). Emitted by the server; stored, does
//! not count toward unread.

use courier_plugin_sdk::{
    Context, Delivery, Example, Manifest, Plugin, Rejection, Sender, check, export_plugin,
};
use serde::{Deserialize, Serialize};

const MAX_USERS: usize = 2000;

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
enum Event {
    Created,
    MembersAdded,
    Joined,
    Left,
    Dissolved,
    OwnerChanged,
    AdminAdded,
    AdminRemoved,
    MemberMuted,
    MemberUnmuted,
}

impl Event {
    /// Whether the event names the users it concerns.
    fn needs_users(self) -> bool {
        !matches!(self, Event::Created | Event::Dissolved)
    }
}

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum JoinPolicy {
    Open,
    Approval,
    Invite,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GroupUpdate {
    operator_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event: Option<Event>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    user_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    muted_until: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    join_policy: Option<JoinPolicy>,
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
            max_payload_bytes: 160 * 1024,
            description: "Tip in a group or channel: settings changed or a membership event; emitted by the server",
        }
    }

    fn validate(_ctx: &Context, p: GroupUpdate) -> Result<GroupUpdate, Rejection> {
        check::user_id("operatorId", &p.operator_id)?;
        if p.name.is_none()
            && p.notice.is_none()
            && p.avatar.is_none()
            && p.mute_all.is_none()
            && p.join_policy.is_none()
            && p.event.is_none()
        {
            return Err(Rejection::new(
                "no_change",
                "at least one of event, name, notice, avatar, muteAll, joinPolicy is required",
            ));
        }
        if p.user_ids.len() > MAX_USERS {
            return Err(Rejection::new(
                "bad_member_list",
                format!("userIds lists at most {MAX_USERS} users"),
            ));
        }
        let user_ids = check::user_ids("userIds[]", p.user_ids)?;
        match p.event {
            Some(e) if e.needs_users() && user_ids.is_empty() => {
                return Err(Rejection::new(
                    "bad_member_list",
                    "this event names the users it concerns in userIds",
                ));
            }
            None if !user_ids.is_empty() => {
                return Err(Rejection::new(
                    "bad_member_list",
                    "userIds comes with an event",
                ));
            }
            _ => {}
        }
        if (p.event == Some(Event::MemberMuted)) != p.muted_until.is_some() {
            return Err(Rejection::new(
                "bad_mute",
                "mutedUntil comes with the memberMuted event, and only with it",
            ));
        }
        if p.muted_until.is_some_and(|t| t <= 0) {
            return Err(Rejection::new(
                "bad_mute",
                "mutedUntil must be a time in ms",
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
        // `""` removes the picture, as `notice: ""` clears the notice.
        if let Some(a) = p.avatar.as_deref().filter(|a| !a.is_empty()) {
            check::https_url("avatar", a)?;
        }
        Ok(GroupUpdate {
            operator_id: p.operator_id,
            event: p.event,
            user_ids,
            muted_until: p.muted_until,
            join_policy: p.join_policy,
            name,
            notice,
            avatar: p.avatar,
            mute_all: p.mute_all,
        })
    }

    fn preview(p: &GroupUpdate) -> String {
        let who = &p.operator_id;
        let users = match p.user_ids.as_slice() {
            [one] => one.clone(),
            many => format!("{} members", many.len()),
        };
        if let Some(e) = p.event {
            return match e {
                Event::Created => format!("{who} created the group"),
                Event::MembersAdded => format!("{who} added {users}"),
                Event::Joined => format!("{users} joined"),
                Event::Left => format!("{users} left"),
                Event::Dissolved => format!("{who} dissolved the group"),
                Event::OwnerChanged => format!("{users} is now the owner"),
                Event::AdminAdded => format!("{who} made {users} an admin"),
                Event::AdminRemoved => format!("{users} is no longer an admin"),
                Event::MemberMuted => format!("{who} muted {users}"),
                Event::MemberUnmuted => format!("{who} unmuted {users}"),
            };
        }
        if let Some(n) = &p.name {
            format!("{who} renamed the group to {n}")
        } else if let Some(n) = &p.notice {
            if n.is_empty() {
                format!("{who} cleared the notice")
            } else {
                format!("{who} posted a notice: {n}")
            }
        } else if let Some(a) = &p.avatar {
            if a.is_empty() {
                format!("{who} removed the group picture")
            } else {
                format!("{who} changed the group picture")
            }
        } else if let Some(j) = p.join_policy {
            let how = match j {
                JoinPolicy::Open => "anyone may join",
                JoinPolicy::Approval => "joining needs approval",
                JoinPolicy::Invite => "members are invited",
            };
            format!("{who} changed who may join: {how}")
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
            Example::accept("avatar-removed", 2, r#"{"operatorId":"owner","avatar":""}"#),
            Example::accept("mute-all", 2, r#"{"operatorId":"owner","muteAll":true}"#),
            Example::accept(
                "created",
                2,
                r#"{"operatorId":"owner","event":"created","userIds":["bob","carol"],"name":"Hiking"}"#,
            ),
            Example::accept(
                "added",
                2,
                r#"{"operatorId":"owner","event":"membersAdded","userIds":["dave","dave"]}"#,
            ),
            Example::accept(
                "muted",
                2,
                r#"{"operatorId":"owner","event":"memberMuted","userIds":["bob"],"mutedUntil":1795953560384}"#,
            ),
            Example::accept(
                "policy",
                3,
                r#"{"operatorId":"owner","joinPolicy":"approval"}"#,
            ),
            Example::reject(
                "added-nobody",
                2,
                r#"{"operatorId":"owner","event":"membersAdded"}"#,
            ),
            Example::reject(
                "mute-without-time",
                2,
                r#"{"operatorId":"owner","event":"memberMuted","userIds":["bob"]}"#,
            ),
            Example::reject(
                "bad-event",
                2,
                r#"{"operatorId":"owner","event":"exploded"}"#,
            ),
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
