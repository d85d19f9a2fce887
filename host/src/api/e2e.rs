//! End-to-end encryption support over HTTP: a device's keys, users' key bundles, sends to
//! devices, and a device's mailbox.

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;

use super::{AppState, Body, Error, User};
use crate::auth::valid_device_id;
use crate::e2e::keys::{Bundles, KeysBody, KeysStatus};
use crate::e2e::mailbox::MailboxPage;
use crate::protocol::frames::{DeviceSendAck, DeviceSendFrame, MailboxAck};

use super::{Segment, device_id};

#[utoipa::path(put, path = "/v1/devices/{deviceId}/keys", tag = "e2e", security(("userToken" = [])),
    description = "Uploads the device's public keys: identity and signing keys (the same every time), a signed prekey (a new keyId rotates it), a last-resort prekey, one-time prekeys",
    params(("deviceId" = String, Path)), request_body = KeysBody, responses((status = 200, body = KeysStatus)))]
pub async fn upload(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    Body(b): Body<KeysBody>,
) -> Result<Json<KeysStatus>, Error> {
    let device = device_id(path)?;
    Ok(Json(s.core.upload_keys(&user, &device, b).await?))
}

#[utoipa::path(get, path = "/v1/devices/{deviceId}/keys", tag = "e2e", security(("userToken" = [])),
    params(("deviceId" = String, Path)), responses((status = 200, body = KeysStatus)))]
pub async fn status(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
) -> Result<Json<KeysStatus>, Error> {
    let device = device_id(path)?;
    Ok(Json(s.core.keys_status(&user, &device).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ClaimQuery {
    /// A device of the user claimed for to leave out (your own asking device, when you
    /// claim your own user's bundles).
    except_device_id: Option<String>,
}

#[utoipa::path(get, path = "/v1/keys/{userId}", tag = "e2e", security(("userToken" = [])),
    description = "Claims a bundle of each of the user's devices with keys: each with one one-time prekey no one else gets, or the last-resort prekey when none is left",
    params(("userId" = String, Path), ClaimQuery), responses((status = 200, body = Bundles)))]
pub async fn claim(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    query: Result<Query<ClaimQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Bundles>, Error> {
    let target = path
        .map(|Path(u)| u)
        .map_err(|e| Error::bad_request(format!("bad path: {e}")))?;
    let Query(q) = query.map_err(|e| Error::bad_request(format!("bad query: {e}")))?;
    Ok(Json(
        s.core
            .claim_keys(&user, &target, q.except_device_id.as_deref())
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/device-messages", tag = "e2e", security(("userToken" = [])),
    description = "Sends to devices' mailboxes: one entry per target device, each with its own payload of the encrypted kind",
    request_body = DeviceSendFrame, responses((status = 200, body = DeviceSendAck)))]
pub async fn send(
    State(s): State<AppState>,
    User(user): User,
    Body(b): Body<DeviceSendFrame>,
) -> Result<Json<DeviceSendAck>, Error> {
    super::no_frame_fields(b._kind.as_deref(), b.id.as_deref())?;
    let device = match b.device_id.clone() {
        Some(d) if valid_device_id(&d) => d,
        Some(d) => {
            return Err(Error::bad_request(format!(
                "deviceId {d:?} is not a device id ({})",
                crate::auth::DEVICE_ID_RULE
            )));
        }
        None => {
            return Err(Error::bad_request(
                "deviceId (the sending device) is required",
            ));
        }
    };
    Ok(Json(s.core.send_to_devices(&user, &device, b).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MailboxQuery {
    /// Entries after this seq (default 0).
    after_seq: Option<i64>,
    /// Default 100.
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
}

#[utoipa::path(get, path = "/v1/devices/{deviceId}/mailbox", tag = "e2e", security(("userToken" = [])),
    params(("deviceId" = String, Path), MailboxQuery), responses((status = 200, body = MailboxPage)))]
pub async fn mailbox(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    query: Result<Query<MailboxQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<MailboxPage>, Error> {
    let device = device_id(path)?;
    let Query(q) = query.map_err(|e| Error::bad_request(format!("bad query: {e}")))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(Error::bad_request("limit must be 1 to 500"));
    }
    let after = q.after_seq.unwrap_or(0).max(0);
    Ok(Json(s.core.mailbox(&user, &device, after, limit).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AckBody {
    /// Entries up to this seq go.
    seq: i64,
}

#[utoipa::path(post, path = "/v1/devices/{deviceId}/mailbox/ack", tag = "e2e", security(("userToken" = [])),
    params(("deviceId" = String, Path)), request_body = AckBody, responses((status = 200, body = MailboxAck)))]
pub async fn ack(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    Body(b): Body<AckBody>,
) -> Result<Json<MailboxAck>, Error> {
    let device = device_id(path)?;
    Ok(Json(s.core.ack_mailbox(&user, &device, b.seq).await?))
}
