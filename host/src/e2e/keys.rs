//! The key directory (X3DH): a device uploads its public keys — an X25519 identity key,
//! the Ed25519 key that signs it and its prekeys, a signed prekey, a last-resort prekey,
//! one-time prekeys — and anyone may claim a bundle of each of a user's devices, each with
//! one one-time prekey no one else ever gets (the last-resort one when none is left).

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{
    IDENTITY_CONTEXT, LAST_RESORT_CONTEXT, SIGNED_PREKEY_CONTEXT, ed25519_key, invalid, verify,
    x25519_key,
};
use crate::clock::now_ms;
use crate::messaging::Core;
use crate::protocol::{Code, Error, Refused};
use crate::store::keys::{self as q, KeysUpload, Prekey, UploadRefused};
use crate::store::unavailable;

/// A prekey as a client gives it and a bundle carries it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrekeyBody {
    /// The device's own id for it: 0 to 2^53 − 1.
    pub key_id: i64,
    /// X25519, 32 bytes, standard padded base64.
    pub public_key: String,
    /// Ed25519 by the device's signing key (signed and last-resort prekeys), 64 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl From<Prekey> for PrekeyBody {
    fn from(p: Prekey) -> PrekeyBody {
        PrekeyBody {
            key_id: p.key_id,
            public_key: p.public_key,
            signature: p.signature,
        }
    }
}

impl PrekeyBody {
    fn prekey(&self) -> Prekey {
        Prekey {
            key_id: self.key_id,
            public_key: self.public_key.clone(),
            signature: self.signature.clone(),
        }
    }
}

/// `PUT /v1/devices/{deviceId}/keys`: the identity part always (the same every time), the
/// rest when it changes.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeysBody {
    /// X25519, 32 bytes, base64.
    pub identity_key: String,
    /// Ed25519, 32 bytes, base64: signs the identity key and the prekeys.
    pub signing_key: String,
    /// Ed25519 over "courier:identity-key:v1" and the identity key's bytes.
    pub identity_signature: String,
    /// Required on the first upload; a new `keyId` rotates it.
    #[serde(default)]
    pub signed_prekey: Option<PrekeyBody>,
    /// Required on the first upload; replaces the one held.
    #[serde(default)]
    pub last_resort_prekey: Option<PrekeyBody>,
    #[serde(default)]
    pub one_time_prekeys: Vec<PrekeyBody>,
}

/// What a device's keys are after an upload, or as its user asks.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeysStatus {
    pub device_id: String,
    /// The device has uploaded keys.
    pub uploaded: bool,
    /// One-time prekeys left.
    pub one_time_prekeys: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_prekey_id: Option<i64>,
    /// The signed prekey before the last rotation, while the bundles still carry it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_signed_prekey_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_resort_id: Option<i64>,
}

/// A claimed prekey: a one-time one, or the last-resort one (signed) when none was left.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedPrekey {
    pub key_id: i64,
    pub public_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    pub last_resort: bool,
}

/// The previous signed prekey and until when bundles carry it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviousPrekey {
    pub key_id: i64,
    pub public_key: String,
    pub signature: String,
    /// ms since the epoch.
    pub until: i64,
}

/// One device's bundle.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bundle {
    pub device_id: String,
    pub identity_key: String,
    pub signing_key: String,
    pub identity_signature: String,
    pub signed_prekey: PrekeyBody,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_signed_prekey: Option<PreviousPrekey>,
    pub prekey: ClaimedPrekey,
}

/// A user's bundles: one per device with keys.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bundles {
    pub user_id: String,
    pub devices: Vec<Bundle>,
}

/// Key ids travel as JSON numbers: kept exact in every language's doubles.
const MAX_KEY_ID: i64 = (1 << 53) - 1;

/// Checks every key and signature of an upload; `max` one-time prekeys at most.
fn check(b: &KeysBody, max: usize) -> Result<(), Error> {
    x25519_key("identityKey", &b.identity_key)?;
    let signer = ed25519_key("signingKey", &b.signing_key)?;
    let identity = super::decode::<32>("identityKey", &b.identity_key)?;
    verify(
        &signer,
        "identitySignature",
        &b.identity_signature,
        IDENTITY_CONTEXT,
        &[&identity],
    )?;
    let signed = [
        ("signedPrekey", &b.signed_prekey, SIGNED_PREKEY_CONTEXT),
        (
            "lastResortPrekey",
            &b.last_resort_prekey,
            LAST_RESORT_CONTEXT,
        ),
    ];
    for (field, p, context) in signed {
        let Some(p) = p else { continue };
        check_id(field, p.key_id)?;
        let key = x25519_key(&format!("{field}.publicKey"), &p.public_key)?;
        let signature = p
            .signature
            .as_deref()
            .ok_or_else(|| invalid(format!("{field} needs its signature")))?;
        verify(
            &signer,
            &format!("{field}.signature"),
            signature,
            context,
            &[&p.key_id.to_be_bytes(), &key],
        )?;
    }
    if b.one_time_prekeys.len() > max {
        return Err(Error::new(
            Code::TooManyPrekeys,
            format!("a device holds at most {max} one-time prekeys"),
        ));
    }
    let mut ids = std::collections::HashSet::new();
    for p in &b.one_time_prekeys {
        check_id("oneTimePrekeys.keyId", p.key_id)?;
        x25519_key("oneTimePrekeys.publicKey", &p.public_key)?;
        if p.signature.is_some() {
            return Err(invalid("a one-time prekey carries no signature"));
        }
        if !ids.insert(p.key_id) {
            return Err(invalid(format!(
                "one-time prekey {} is in the upload twice",
                p.key_id
            )));
        }
    }
    Ok(())
}

fn check_id(field: &str, id: i64) -> Result<(), Error> {
    if !(0..=MAX_KEY_ID).contains(&id) {
        return Err(invalid(format!("{field} must be 0 to 2^53 - 1")));
    }
    Ok(())
}

impl Core {
    /// Checks and stores a device's keys (the device must be the user's).
    pub async fn upload_keys(
        &self,
        user_id: &str,
        device_id: &str,
        b: KeysBody,
    ) -> Result<KeysStatus, Error> {
        let e2e = &self.settings.e2e;
        check(&b, e2e.one_time_prekeys_max as usize)?;
        self.active_device(user_id, device_id).await?;
        let signed = b.signed_prekey.as_ref().map(PrekeyBody::prekey);
        let last_resort = b.last_resort_prekey.as_ref().map(PrekeyBody::prekey);
        let one_time: Vec<Prekey> = b.one_time_prekeys.iter().map(PrekeyBody::prekey).collect();
        let upload = KeysUpload {
            identity_key: &b.identity_key,
            signing_key: &b.signing_key,
            identity_signature: &b.identity_signature,
            signed_prekey: signed.as_ref(),
            last_resort: last_resort.as_ref(),
            one_time: &one_time,
        };
        let limits = (
            i64::from(e2e.one_time_prekeys_max),
            (e2e.signed_prekey_grace_secs as i64).saturating_mul(1000),
        );
        let d = self.store.dialect();
        let uploaded = self.store.pooled(async {
            let mut tx = self.store.write().begin().await?;
            let state =
                q::upload(d, &mut tx, user_id, device_id, &upload, limits, now_ms()).await?;
            match state {
                Ok(_) => tx.commit().await?,
                Err(_) => {
                    let _ = tx.rollback().await;
                }
            }
            Ok::<_, sqlx::Error>(state)
        });
        let state = match uploaded.await.flatten().map_err(unavailable)? {
            Ok(s) => s,
            Err(refused) => {
                return Err(match refused {
                    UploadRefused::IdentityChanged => Error::new(
                        Code::IdentityKeyChanged,
                        "this device has other identity keys: remove it and register it again to change them",
                    ),
                    UploadRefused::Incomplete => {
                        invalid("a device's first upload has its signedPrekey and lastResortPrekey")
                    }
                    UploadRefused::PrekeyIdTaken(what, id) => Error::new(
                        Code::PrekeyIdTaken,
                        format!("{what} prekey {id} is held with another key"),
                    ),
                    UploadRefused::TooMany(held) => Error::new(
                        Code::TooManyPrekeys,
                        format!(
                            "this device holds {held} one-time prekeys; at most {} in all",
                            e2e.one_time_prekeys_max
                        ),
                    ),
                    UploadRefused::NoDevice => Error::new(
                        Code::DeviceNotFound,
                        format!("you have no device {device_id:?}"),
                    ),
                });
            }
        };
        self.keys_status(user_id, device_id).await.map(|mut s| {
            s.one_time_prekeys = state.one_time_prekeys;
            s
        })
    }

    /// A device's keys as its user sees them.
    pub async fn keys_status(&self, user_id: &str, device_id: &str) -> Result<KeysStatus, Error> {
        self.active_device(user_id, device_id).await?;
        let keys = self
            .store
            .device_keys(user_id, device_id, now_ms())
            .await
            .map_err(unavailable)?;
        Ok(match keys {
            None => KeysStatus {
                device_id: device_id.to_string(),
                uploaded: false,
                one_time_prekeys: 0,
                signed_prekey_id: None,
                previous_signed_prekey_id: None,
                last_resort_id: None,
            },
            Some((k, left)) => KeysStatus {
                device_id: device_id.to_string(),
                uploaded: true,
                one_time_prekeys: left,
                signed_prekey_id: Some(k.signed_prekey.key_id),
                previous_signed_prekey_id: k.previous_prekey.map(|p| p.0.key_id),
                last_resort_id: Some(k.last_resort.key_id),
            },
        })
    }

    /// Claims a bundle of each of `target`'s devices for `claimer`: rate-limited per
    /// claimer and target; a device left with few one-time prekeys is told in its user's
    /// stream (`keys.low`), once until it uploads more.
    pub async fn claim_keys(
        &self,
        claimer: &str,
        target: &str,
        except_device: Option<&str>,
    ) -> Result<Bundles, Error> {
        if !crate::auth::valid_user_id(target) {
            return Err(Error::bad_request("not a user id"));
        }
        if let Some(d) = except_device.filter(|d| !crate::auth::valid_device_id(d)) {
            return Err(Error::bad_request(format!(
                "exceptDeviceId {d:?} is not a device id ({})",
                crate::auth::DEVICE_ID_RULE
            )));
        }
        if let Err(wait) = self
            .key_claims
            .take(&(claimer.to_string(), target.to_string()))
        {
            return Err(Error::rate_limited(
                format!(
                    "more than {} claims of {target}'s keys per minute",
                    self.settings.e2e.claims_per_minute
                ),
                wait,
            ));
        }
        let low = i64::from(self.settings.e2e.one_time_prekeys_low);
        let d = self.store.dialect();
        let claimed = self
            .change(|mut c| {
                Box::pin(async move {
                    if !c.named(claimer, &[target]).await?.contains(target) {
                        return Err(Refused::UserNotFound(target.to_string()).into());
                    }
                    // A user who blocks the claimer hands out nothing to them.
                    let pair = [(target.to_string(), claimer.to_string())];
                    if target != claimer
                        && !crate::store::social::blocked_pairs(d, &mut c.tx, &pair)
                            .await?
                            .is_empty()
                    {
                        return Err(Refused::Blocked.into());
                    }
                    let claimed = q::claim(d, &mut c.tx, target, except_device, low, c.now).await?;
                    let told: Vec<&q::Claimed> = claimed
                        .iter()
                        .filter(|k| k.remaining < low && !k.keys.low_told)
                        .collect();
                    if !told.is_empty() {
                        c.lock_streams(&[target]).await?;
                        for k in told {
                            c.streams.append(
                                target,
                                "keys.low",
                                None,
                                &json!({"deviceId": k.keys.device_id, "remaining": k.remaining}),
                            );
                        }
                    }
                    Ok((claimed, c))
                })
            })
            .await?;
        let devices = claimed
            .into_iter()
            .map(|k| {
                let prekey = match k.one_time {
                    Some(p) => ClaimedPrekey {
                        key_id: p.key_id,
                        public_key: p.public_key,
                        signature: None,
                        last_resort: false,
                    },
                    None => ClaimedPrekey {
                        key_id: k.keys.last_resort.key_id,
                        public_key: k.keys.last_resort.public_key.clone(),
                        signature: k.keys.last_resort.signature.clone(),
                        last_resort: true,
                    },
                };
                Bundle {
                    device_id: k.keys.device_id,
                    identity_key: k.keys.identity_key,
                    signing_key: k.keys.signing_key,
                    identity_signature: k.keys.identity_signature,
                    signed_prekey: k.keys.signed_prekey.into(),
                    previous_signed_prekey: k.keys.previous_prekey.map(|(p, until)| {
                        PreviousPrekey {
                            key_id: p.key_id,
                            public_key: p.public_key,
                            signature: p.signature.unwrap_or_default(),
                            until,
                        }
                    }),
                    prekey,
                }
            })
            .collect();
        Ok(Bundles {
            user_id: target.to_string(),
            devices,
        })
    }
}
