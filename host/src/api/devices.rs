//! A user's devices over HTTP: list, register, remove, push tokens; and the notification
//! mute of a conversation.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;

use super::{AppState, Body, Error, User, schema};
use crate::auth::valid_device_id;
use crate::messaging::{DeviceInfo, valid_label};

use super::{Segment, device_id};

#[utoipa::path(get, path = "/v1/devices", tag = "devices", security(("userToken" = [])),
    responses((status = 200, body = schema::Devices)))]
pub async fn list(
    State(s): State<AppState>,
    User(user): User,
) -> Result<Json<schema::Devices>, Error> {
    Ok(Json(schema::Devices {
        devices: s.core.devices(&user).await?,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterBody {
    device_id: String,
    /// At most 64 characters; a known device keeps its name when left out.
    name: Option<String>,
    /// ios, android, web, … at most 64 characters; kept when left out.
    platform: Option<String>,
}

#[utoipa::path(post, path = "/v1/devices", tag = "devices", security(("userToken" = [])),
    description = "Registers a device, or registers again one that was removed (so it may connect with its id)",
    request_body = RegisterBody, responses((status = 200, body = DeviceInfo)))]
pub async fn register(
    State(s): State<AppState>,
    User(user): User,
    Body(b): Body<RegisterBody>,
) -> Result<Json<DeviceInfo>, Error> {
    if !valid_device_id(&b.device_id) {
        return Err(Error::bad_request(format!(
            "deviceId is {}",
            crate::auth::DEVICE_ID_RULE
        )));
    }
    if [&b.name, &b.platform]
        .into_iter()
        .flatten()
        .any(|l| !valid_label(l))
    {
        return Err(Error::bad_request(
            "name and platform are at most 64 characters without control characters",
        ));
    }
    let device = s
        .core
        .register_device(
            &user,
            &b.device_id,
            b.name.as_deref(),
            b.platform.as_deref(),
        )
        .await?;
    Ok(Json(device))
}

#[utoipa::path(delete, path = "/v1/devices/{deviceId}", tag = "devices", security(("userToken" = [])),
    description = "Removes a device: its push token goes, its connection is closed (4009 device_removed), and it may not connect again with its id until registered again",
    params(("deviceId" = String, Path)), responses((status = 200, body = schema::DeviceRemoved)))]
pub async fn remove(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<schema::DeviceRemoved>, Error> {
    let device_id = device_id(path)?;
    s.core.remove_device(&user, &device_id).await?;
    Ok(Json(schema::DeviceRemoved {
        device_id,
        removed: true,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PushBody {
    /// Who delivers the notice: 1 to 32 of a-z 0-9 _ - (apns, fcm, …).
    provider: String,
    /// The device's token with that provider: 1 to 4096 printable ASCII characters.
    token: String,
}

#[utoipa::path(put, path = "/v1/devices/{deviceId}/push", tag = "devices", security(("userToken" = [])),
    description = "The device's push token: offline notices for its user go to the deployment's webhook with it",
    params(("deviceId" = String, Path)), request_body = PushBody, responses((status = 200, body = schema::PushToken)))]
pub async fn set_push(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    Body(b): Body<PushBody>,
) -> Result<Json<schema::PushToken>, Error> {
    let device_id = device_id(path)?;
    let provider_ok = (1..=32).contains(&b.provider.len())
        && b.provider
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
    if !provider_ok {
        return Err(Error::bad_request("provider is 1 to 32 of a-z 0-9 _ -"));
    }
    if !(1..=4096).contains(&b.token.len()) || !b.token.bytes().all(|c| c.is_ascii_graphic()) {
        return Err(Error::bad_request(
            "token is 1 to 4096 printable ASCII characters",
        ));
    }
    s.core
        .set_push_token(&user, &device_id, Some((&b.provider, &b.token)))
        .await?;
    Ok(Json(schema::PushToken {
        device_id,
        provider: Some(b.provider),
    }))
}

#[utoipa::path(delete, path = "/v1/devices/{deviceId}/push", tag = "devices", security(("userToken" = [])),
    params(("deviceId" = String, Path)), responses((status = 200, body = schema::PushToken)))]
pub async fn clear_push(
    State(s): State<AppState>,
    User(user): User,
    path: Segment,
    _: super::NoBody,
) -> Result<Json<schema::PushToken>, Error> {
    let device_id = device_id(path)?;
    s.core.set_push_token(&user, &device_id, None).await?;
    Ok(Json(schema::PushToken {
        device_id,
        provider: None,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotificationsBody {
    /// `true`: no offline notice for this conversation.
    muted: bool,
}

#[utoipa::path(put, path = "/v1/conversations/{id}/notifications", tag = "devices", security(("userToken" = [])),
    description = "Mutes (or unmutes) the offline notices of one of your conversations",
    params(("id" = i64, Path, description = "the conversation id")), request_body = NotificationsBody,
    responses((status = 200, body = schema::Notifications)))]
pub async fn notifications(
    State(s): State<AppState>,
    User(user): User,
    path: Result<Path<i64>, axum::extract::rejection::PathRejection>,
    Body(b): Body<NotificationsBody>,
) -> Result<Json<schema::Notifications>, Error> {
    let id = path
        .map(|Path(id)| id)
        .map_err(|_| Error::bad_request("the conversation id must be an integer"))?;
    s.core.mute_notifications(&user, id, b.muted).await?;
    Ok(Json(schema::Notifications {
        conversation_id: id,
        muted: b.muted,
    }))
}
