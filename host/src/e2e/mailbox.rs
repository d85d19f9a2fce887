//! Per-device mailboxes (to-device messages): one send names `(userId, deviceId)` targets,
//! each with its own payload checked by the `encrypted` kind's plugin; each entry gets a
//! seq in its device's mailbox, is pushed if the device is online, pulled by `afterSeq`
//! otherwise, and deleted once the device acknowledges it. Bounded per device, expiring.

use serde::Serialize;
use serde_json::value::RawValue;

use crate::clock::now_ms;
use crate::messaging::{Core, check_client_msg_id};
use crate::plugins::{Delivery as Class, SendContext, SenderKind};
use crate::protocol::frames::{
    self, DeviceEntry, DeviceMessage, DeviceSendAck, DeviceSendFrame, MailboxAck,
};
use crate::protocol::{Code, Error, Refused};
use crate::store::mailbox::{self as q, Entry, Send, SendRefused, Sent, Target};
use crate::store::unavailable;

/// The only kind a mailbox carries.
const ENCRYPTED: &str = "encrypted";

/// A page of a device's mailbox.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailboxPage {
    pub device_id: String,
    /// The highest seq the mailbox ever gave.
    pub last_seq: i64,
    pub has_more: bool,
    pub entries: Vec<MailboxEntry>,
}

/// One entry, as pulled.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MailboxEntry {
    pub seq: i64,
    pub sender_id: String,
    pub sender_device_id: String,
    pub content_type: u32,
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    pub server_time: i64,
    pub expires_at: i64,
}

impl From<Entry> for MailboxEntry {
    fn from(e: Entry) -> MailboxEntry {
        MailboxEntry {
            seq: e.seq,
            sender_id: e.sender_id,
            sender_device_id: e.sender_device_id,
            content_type: e.content_type,
            payload: frames::raw(&e.payload),
            server_time: e.server_time,
            expires_at: e.expires_at,
        }
    }
}

/// Attempts of a send that met a concurrent writer.
const RETRIES: usize = 5;

impl Core {
    /// Stores one entry per target, each in its device's mailbox, then pushes each to its
    /// device if online. All or nothing: an unknown or full target, or a user who blocks
    /// the sender, refuses the whole send. A resend of its `clientMsgId` stores nothing
    /// and gets the original answer.
    pub async fn send_to_devices(
        &self,
        sender: &str,
        sender_device: &str,
        req: DeviceSendFrame,
    ) -> Result<DeviceSendAck, Error> {
        check_client_msg_id(&req.client_msg_id)?;
        let e2e = &self.settings.e2e;
        if req.messages.is_empty() || req.messages.len() > e2e.mailbox_max_targets as usize {
            return Err(Error::bad_request(format!(
                "messages lists 1 to {} devices",
                e2e.mailbox_max_targets
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for m in &req.messages {
            if !crate::auth::valid_user_id(&m.user_id) {
                return Err(Error::bad_request(format!(
                    "userId {:?} is not a user id ({})",
                    m.user_id,
                    crate::auth::USER_ID_RULE
                )));
            }
            if !crate::auth::valid_device_id(&m.device_id) {
                return Err(Error::bad_request(format!(
                    "deviceId {:?} is not a device id ({})",
                    m.device_id,
                    crate::auth::DEVICE_ID_RULE
                )));
            }
            if !seen.insert((m.user_id.as_str(), m.device_id.as_str())) {
                return Err(Error::bad_request(format!(
                    "device {}/{} is named twice",
                    m.user_id, m.device_id
                )));
            }
        }
        let kind = self
            .registry
            .get(req.content_type)
            .filter(|k| k.manifest.name == ENCRYPTED);
        if kind.is_none() {
            return Err(Error::new(
                Code::ContentTypeForbidden,
                format!(
                    "a mailbox carries the {ENCRYPTED} kind only, not content type {}",
                    req.content_type
                ),
            ));
        }
        self.active_device(sender, sender_device).await?;
        // Each payload goes to the plugin, as a private message would.
        let ctx = SendContext {
            sender_id: sender,
            sender: SenderKind::User,
            conversation_type: 1,
            conversation_id: "",
        };
        let mut targets = Vec::with_capacity(req.messages.len());
        for m in &req.messages {
            let v = self
                .registry
                .validate(req.content_type, &ctx, m.payload.get().as_bytes())?;
            targets.push(Target {
                user_id: m.user_id.clone(),
                device_id: m.device_id.clone(),
                payload: v.into_text(),
            });
        }
        let now = now_ms();
        let send = Send {
            sender_id: sender,
            sender_device_id: sender_device,
            client_msg_id: &req.client_msg_id,
            content_type: req.content_type,
            now,
            expires_at: now.saturating_add((e2e.mailbox_ttl_secs as i64).saturating_mul(1000)),
            max_entries: i64::from(e2e.mailbox_max_entries),
        };
        let answer = |seqs: &[i64]| DeviceSendAck {
            client_msg_id: req.client_msg_id.clone(),
            entries: targets
                .iter()
                .zip(seqs)
                .map(|(t, &seq)| DeviceEntry {
                    user_id: t.user_id.clone(),
                    device_id: t.device_id.clone(),
                    seq,
                })
                .collect(),
            duplicate: false,
        };
        let d = self.store.dialect();
        let mut attempt = 0;
        let sent = loop {
            let once = async {
                let mut tx = self.store.write().begin().await?;
                let sent = q::send(d, &mut tx, &send, &targets, |seqs| {
                    serde_json::to_string(&answer(seqs)).expect("an answer serializes")
                })
                .await?;
                if sent.is_ok() {
                    tx.commit().await?;
                }
                Ok::<_, sqlx::Error>(sent)
            };
            match self.store.pooled(once).await.flatten() {
                Ok(sent) => break sent,
                Err(e) if attempt < RETRIES && crate::store::batch::is_conflict(&e) => {
                    attempt += 1;
                }
                Err(e) => return Err(unavailable(e)),
            }
        };
        match sent {
            Ok(Sent::Again(answer)) => {
                let mut ack: DeviceSendAck = serde_json::from_str(&answer)
                    .map_err(|_| Error::internal("a stored answer does not read back"))?;
                ack.duplicate = true;
                Ok(ack)
            }
            Ok(Sent::Stored(seqs)) => {
                for (t, &seq) in targets.iter().zip(&seqs) {
                    let payload = frames::raw(&t.payload);
                    let frame = frames::device_message(&DeviceMessage {
                        kind: Some("device_message"),
                        device_id: &t.device_id,
                        seq,
                        sender_id: sender,
                        sender_device_id: sender_device,
                        content_type: req.content_type,
                        payload: &payload,
                        server_time: now,
                        expires_at: send.expires_at,
                    });
                    self.delivery.push_devices(
                        &t.user_id,
                        &[t.device_id.as_str()],
                        &frame,
                        Class::Persistent,
                    );
                }
                Ok(answer(&seqs))
            }
            Err(SendRefused::NoDevice(user, device)) => Err(Error::new(
                Code::DeviceNotFound,
                format!("{user} has no device {device:?}"),
            )),
            Err(SendRefused::Full(user, device)) => Err(Error::new(
                Code::MailboxFull,
                format!(
                    "the mailbox of {user}/{device} holds {} entries; it must take some first",
                    e2e.mailbox_max_entries
                ),
            )),
            Err(SendRefused::Blocked(_)) => Err(Refused::Blocked.into()),
        }
    }

    /// A page of a device's mailbox (the device must be the user's).
    pub async fn mailbox(
        &self,
        user_id: &str,
        device_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<MailboxPage, Error> {
        self.active_device(user_id, device_id).await?;
        let (mut entries, last_seq) = self
            .store
            .mailbox(user_id, device_id, after, limit + 1, now_ms())
            .await
            .map_err(unavailable)?;
        let has_more = entries.len() as i64 > limit;
        entries.truncate(limit as usize);
        Ok(MailboxPage {
            device_id: device_id.to_string(),
            last_seq,
            has_more,
            entries: entries.into_iter().map(MailboxEntry::from).collect(),
        })
    }

    /// A device processed its mailbox up to `upto`: those entries go.
    pub async fn ack_mailbox(
        &self,
        user_id: &str,
        device_id: &str,
        upto: i64,
    ) -> Result<MailboxAck, Error> {
        self.active_device(user_id, device_id).await?;
        let deleted = self
            .store
            .mailbox_ack(user_id, device_id, upto, now_ms())
            .await
            .map_err(unavailable)?;
        Ok(MailboxAck {
            device_id: device_id.to_string(),
            deleted,
        })
    }
}
