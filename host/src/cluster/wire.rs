//! What nodes say to each other over the bus, as JSON: the frames they carry are JSON
//! already and travel unescaped (`RawValue`).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::messaging::{Forget, LatestKey};
use crate::plugins::Delivery as Class;
use crate::protocol::Close;

/// One push for a node to hand to its own devices.
#[derive(Debug, Serialize, Deserialize)]
pub struct Push<'a> {
    /// Every device of these users on the receiving node…
    #[serde(borrow)]
    pub users: Vec<&'a str>,
    /// …or, if set, only these devices of the one user.
    #[serde(default, skip_serializing_if = "Option::is_none", borrow)]
    pub devices: Option<Vec<&'a str>>,
    #[serde(borrow)]
    pub frame: &'a RawValue,
    pub class: Class,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<LatestKey>,
    /// The session that sent it (its own push skips it), 0: none.
    #[serde(default)]
    pub except: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Message<'a> {
    /// Every push of one round of the sender's forwarder for this node, in commit order.
    Push(#[serde(borrow)] Vec<Push<'a>>),
    /// Close a device's connection if `session` is still its current one.
    Kick {
        user: &'a str,
        device: &'a str,
        session: u64,
    },
    /// Close a user's connections (all, those of one token, hex, or one device's), telling
    /// them `why`.
    Close {
        user: &'a str,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// Only this device's connection.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<&'a str>,
        why: Close,
    },
    Forget(Forget),
    /// The sender's bus came back: every node answers with `Switches`, the runtime plugin
    /// switches it knows, which the sender may have missed.
    Resync,
    /// The newest runtime switch of each plugin the sender knows: (name, enabled, when).
    Switches(Vec<(String, bool, i64)>),
    /// A node's probe of the bus, sent to itself every second (`Cluster::watch_bus`).
    Probe(u64),
}

/// A message, the node that sent it, and when by its clock (ms; 0 from a node that does
/// not say).
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope<'a> {
    pub from: u16,
    #[serde(default)]
    pub at: i64,
    #[serde(borrow)]
    pub message: Message<'a>,
}

pub fn encode(from: u16, message: Message<'_>) -> Vec<u8> {
    let at = crate::clock::now_ms();
    serde_json::to_vec(&Envelope { from, at, message }).expect("bus messages serialize")
}

pub fn decode(bytes: &[u8]) -> Result<Envelope<'_>, serde_json::Error> {
    serde_json::from_slice(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_push_round_trips_with_its_frame_unescaped() {
        let frame = RawValue::from_string(r#"{"type":"notify","seq":7}"#.into()).unwrap();
        let bytes = encode(
            3,
            Message::Push(vec![Push {
                users: vec!["alice", "bob"],
                devices: None,
                frame: &frame,
                class: Class::Latest,
                key: Some((9, 1, 5)),
                except: 42,
            }]),
        );
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(
            text.contains(r#""frame":{"type":"notify","seq":7}"#),
            "{text}"
        );
        let back = decode(&bytes).unwrap();
        assert_eq!(back.from, 3);
        let Message::Push(pushes) = back.message else {
            panic!("not a push")
        };
        assert_eq!(pushes[0].users, ["alice", "bob"]);
        assert_eq!(pushes[0].frame.get(), frame.get());
        assert_eq!(
            (pushes[0].class, pushes[0].key, pushes[0].except),
            (Class::Latest, Some((9, 1, 5)), 42)
        );
    }
}
