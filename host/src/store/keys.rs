//! The key directory: each device's public keys for X3DH (identity, signing, signed
//! prekey with the previous one during its grace, last-resort prekey) and its one-time
//! prekeys, each handed out once. Queries only; what an upload must satisfy and who may
//! claim is `e2e/`.

use sqlx::{AnyConnection, Row as _};

use super::{Dialect, Store};

/// A prekey: its id, its public key (base64) and, for a signed one, its signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prekey {
    pub key_id: i64,
    pub public_key: String,
    pub signature: Option<String>,
}

/// A device's keys as stored.
#[derive(Debug, Clone)]
pub struct DeviceKeys {
    pub device_id: String,
    pub identity_key: String,
    pub signing_key: String,
    pub identity_signature: String,
    pub signed_prekey: Prekey,
    /// The signed prekey before the last rotation, and until when it is kept.
    pub previous_prekey: Option<(Prekey, i64)>,
    pub last_resort: Prekey,
    /// A `keys.low` event was appended since one-time prekeys were last uploaded.
    pub low_told: bool,
    /// The highest one-time prekey id handed out, -1 for none.
    pub max_claimed_id: i64,
}

const KEY_COLUMNS: &str = "device_id, identity_key, signing_key, identity_signature, \
     signed_prekey_id, signed_prekey, signed_prekey_signature, previous_prekey_id, \
     previous_prekey, previous_prekey_signature, previous_prekey_until, last_resort_id, \
     last_resort_key, last_resort_signature, low_told, max_claimed_id";

fn keys_from(r: &sqlx::any::AnyRow, now: i64) -> sqlx::Result<DeviceKeys> {
    let previous = match (
        r.try_get::<Option<i64>, _>(7)?,
        r.try_get::<Option<String>, _>(8)?,
        r.try_get::<Option<String>, _>(9)?,
        r.try_get::<Option<i64>, _>(10)?,
    ) {
        (Some(key_id), Some(public_key), signature, Some(until)) if until > now => Some((
            Prekey {
                key_id,
                public_key,
                signature,
            },
            until,
        )),
        _ => None,
    };
    Ok(DeviceKeys {
        device_id: r.try_get(0)?,
        identity_key: r.try_get(1)?,
        signing_key: r.try_get(2)?,
        identity_signature: r.try_get(3)?,
        signed_prekey: Prekey {
            key_id: r.try_get(4)?,
            public_key: r.try_get(5)?,
            signature: Some(r.try_get(6)?),
        },
        previous_prekey: previous,
        last_resort: Prekey {
            key_id: r.try_get(11)?,
            public_key: r.try_get(12)?,
            signature: Some(r.try_get(13)?),
        },
        low_told: r.try_get::<i64, _>(14)? != 0,
        max_claimed_id: r.try_get(15)?,
    })
}

/// What an upload writes (checked before).
pub struct KeysUpload<'a> {
    pub identity_key: &'a str,
    pub signing_key: &'a str,
    pub identity_signature: &'a str,
    pub signed_prekey: Option<&'a Prekey>,
    pub last_resort: Option<&'a Prekey>,
    pub one_time: &'a [Prekey],
}

/// Why an upload was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadRefused {
    /// The device has other identity keys.
    IdentityChanged,
    /// A first upload without a signed or a last-resort prekey.
    Incomplete,
    /// A prekey id the device holds with another key: which prekey ("one-time",
    /// "signed", "last-resort") and its id.
    PrekeyIdTaken(&'static str, i64),
    /// More one-time prekeys than a device may hold (how many it holds).
    TooMany(i64),
    /// The device was removed (while the upload waited for its lock).
    NoDevice,
}

/// What a device's keys are after an upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysState {
    pub one_time_prekeys: i64,
    pub signed_prekey_id: i64,
    pub last_resort_id: i64,
}

/// A device's bundle as a claim hands it out: its keys, and one one-time prekey (or the
/// last-resort one, when none is left).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub keys: DeviceKeys,
    /// The one-time prekey taken; `None`: none was left.
    pub one_time: Option<Prekey>,
    /// One-time prekeys left after this claim.
    pub remaining: i64,
}

impl Store {
    /// The keys of a device, if it uploaded any.
    pub async fn device_keys(
        &self,
        user_id: &str,
        device_id: &str,
        now: i64,
    ) -> sqlx::Result<Option<(DeviceKeys, i64)>> {
        let row = sqlx::query(&format!(
            "SELECT {KEY_COLUMNS}, (SELECT COUNT(*) FROM one_time_prekeys o \
             WHERE o.user_id = k.user_id AND o.device_id = k.device_id) \
             FROM device_keys k WHERE user_id = $1 AND device_id = $2"
        ))
        .bind(user_id)
        .bind(device_id)
        .fetch_optional(self.read())
        .await?;
        row.map(|r| Ok((keys_from(&r, now)?, r.try_get(16)?)))
            .transpose()
    }
}

/// Writes an upload for a device inside the caller's transaction (the device row locked
/// first, so uploads and claims of one device take turns).
pub async fn upload(
    d: Dialect,
    conn: &mut AnyConnection,
    user_id: &str,
    device_id: &str,
    u: &KeysUpload<'_>,
    limits: (i64, i64),
    now: i64,
) -> sqlx::Result<Result<KeysState, UploadRefused>> {
    let (max_one_time, grace_ms) = limits;
    if !lock_device(d, conn, user_id, device_id).await? {
        return Ok(Err(UploadRefused::NoDevice));
    }
    let existing = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM device_keys WHERE user_id = $1 AND device_id = $2"
    ))
    .bind(user_id)
    .bind(device_id)
    .fetch_optional(&mut *conn)
    .await?
    .map(|r| keys_from(&r, now))
    .transpose()?;
    match &existing {
        Some(k)
            if k.identity_key != u.identity_key
                || k.signing_key != u.signing_key
                || k.identity_signature != u.identity_signature =>
        {
            return Ok(Err(UploadRefused::IdentityChanged));
        }
        None if u.signed_prekey.is_none() || u.last_resort.is_none() => {
            return Ok(Err(UploadRefused::Incomplete));
        }
        _ => {}
    }
    // A signed or last-resort prekey's id names one key while the device holds it (the
    // previous signed prekey during its grace too), whichever of the three holds it: a
    // session begun with the id names the key. An upload's own two may share an id only
    // with the same key.
    let mut held: Vec<(&'static str, &Prekey)> = Vec::with_capacity(4);
    if let Some(k) = &existing {
        held.push(("signed", &k.signed_prekey));
        held.extend(k.previous_prekey.as_ref().map(|(p, _)| ("signed", p)));
        held.push(("last-resort", &k.last_resort));
    }
    held.extend(u.signed_prekey.map(|p| ("signed", p)));
    for new in [u.signed_prekey, u.last_resort].into_iter().flatten() {
        if let Some((what, _)) = held
            .iter()
            .find(|(_, h)| h.key_id == new.key_id && h.public_key != new.public_key)
        {
            return Ok(Err(UploadRefused::PrekeyIdTaken(what, new.key_id)));
        }
    }
    // One-time prekeys: the same id with the same key again is harmless (a retried
    // upload); with another key, refused; an id at or below the highest handed out was
    // uploaded before and handed out (claims take the lowest first): never offered again.
    let max_claimed = existing.as_ref().map_or(-1, |k| k.max_claimed_id);
    let mut fresh = Vec::new();
    for p in u.one_time {
        let held: Option<String> = sqlx::query_scalar(
            "SELECT public_key FROM one_time_prekeys \
             WHERE user_id = $1 AND device_id = $2 AND key_id = $3",
        )
        .bind(user_id)
        .bind(device_id)
        .bind(p.key_id)
        .fetch_optional(&mut *conn)
        .await?;
        match held {
            Some(k) if k == p.public_key => {}
            Some(_) => return Ok(Err(UploadRefused::PrekeyIdTaken("one-time", p.key_id))),
            None if p.key_id <= max_claimed => {}
            None => fresh.push(p),
        }
    }
    let held: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM one_time_prekeys WHERE user_id = $1 AND device_id = $2",
    )
    .bind(user_id)
    .bind(device_id)
    .fetch_one(&mut *conn)
    .await?;
    if held + fresh.len() as i64 > max_one_time {
        return Ok(Err(UploadRefused::TooMany(held)));
    }
    for p in &fresh {
        sqlx::query(
            "INSERT INTO one_time_prekeys (user_id, device_id, key_id, public_key) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(user_id)
        .bind(device_id)
        .bind(p.key_id)
        .bind(p.public_key.as_str())
        .execute(&mut *conn)
        .await?;
    }
    // The signed prekey: a new id rotates it, the current one kept for the grace period.
    let current = existing.as_ref().map(|k| &k.signed_prekey);
    let (signed, previous) = match (u.signed_prekey, current) {
        (Some(new), Some(cur)) if new.key_id != cur.key_id => {
            (new.clone(), Some((cur.clone(), now + grace_ms)))
        }
        (Some(new), _) => (
            new.clone(),
            existing.as_ref().and_then(|k| k.previous_prekey.clone()),
        ),
        (None, Some(cur)) => (
            cur.clone(),
            existing.as_ref().and_then(|k| k.previous_prekey.clone()),
        ),
        (None, None) => unreachable!("a first upload has a signed prekey"),
    };
    let last_resort = match (u.last_resort, &existing) {
        (Some(l), _) => l.clone(),
        (None, Some(k)) => k.last_resort.clone(),
        (None, None) => unreachable!("a first upload has a last-resort prekey"),
    };
    let low_told = existing.as_ref().is_some_and(|k| k.low_told) && fresh.is_empty();
    sqlx::query(
        "INSERT INTO device_keys (user_id, device_id, identity_key, signing_key, \
         identity_signature, signed_prekey_id, signed_prekey, signed_prekey_signature, \
         previous_prekey_id, previous_prekey, previous_prekey_signature, previous_prekey_until, \
         last_resort_id, last_resort_key, last_resort_signature, low_told, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
         ON CONFLICT (user_id, device_id) DO UPDATE SET \
         signed_prekey_id = excluded.signed_prekey_id, signed_prekey = excluded.signed_prekey, \
         signed_prekey_signature = excluded.signed_prekey_signature, \
         previous_prekey_id = excluded.previous_prekey_id, \
         previous_prekey = excluded.previous_prekey, \
         previous_prekey_signature = excluded.previous_prekey_signature, \
         previous_prekey_until = excluded.previous_prekey_until, \
         last_resort_id = excluded.last_resort_id, last_resort_key = excluded.last_resort_key, \
         last_resort_signature = excluded.last_resort_signature, low_told = excluded.low_told, \
         updated_at = excluded.updated_at",
    )
    .bind(user_id)
    .bind(device_id)
    .bind(u.identity_key)
    .bind(u.signing_key)
    .bind(u.identity_signature)
    .bind(signed.key_id)
    .bind(signed.public_key.as_str())
    .bind(signed.signature.as_deref())
    .bind(previous.as_ref().map(|p| p.0.key_id))
    .bind(previous.as_ref().map(|p| p.0.public_key.clone()))
    .bind(previous.as_ref().and_then(|p| p.0.signature.clone()))
    .bind(previous.as_ref().map(|p| p.1))
    .bind(last_resort.key_id)
    .bind(last_resort.public_key.as_str())
    .bind(last_resort.signature.as_deref())
    .bind(i64::from(low_told))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(Ok(KeysState {
        one_time_prekeys: held + fresh.len() as i64,
        signed_prekey_id: signed.key_id,
        last_resort_id: last_resort.key_id,
    }))
}

/// Locks a device's row (PostgreSQL; SQLite's one writer already serializes); whether the
/// device is there, not removed, once locked.
async fn lock_device(
    d: Dialect,
    conn: &mut AnyConnection,
    user_id: &str,
    device_id: &str,
) -> sqlx::Result<bool> {
    let lock = d.for_update();
    let removed: Option<Option<i64>> = sqlx::query_scalar(&format!(
        "SELECT removed_at FROM devices WHERE user_id = $1 AND device_id = $2{lock}"
    ))
    .bind(user_id)
    .bind(device_id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(matches!(removed, Some(None)))
}

/// Claims a bundle of each of a user's devices that has keys (and is not removed), in the
/// caller's transaction: one one-time prekey each, taken so that no key is ever handed out
/// twice. Each device's row is locked first (on PostgreSQL; SQLite's one writer already
/// serializes), in the order of their ids, and its keys read after the lock: claims and
/// uploads of one device take turns, so the highest id handed out and whether the device
/// was told it is low are each moved by one claim at a time. A device whose count falls
/// below `low` for the first time since its last upload is marked told (`low_told`), and
/// its `Claimed::keys.low_told` says whether it already was.
pub async fn claim(
    d: Dialect,
    conn: &mut AnyConnection,
    user_id: &str,
    except_device: Option<&str>,
    low: i64,
    now: i64,
) -> sqlx::Result<Vec<Claimed>> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT k.device_id FROM device_keys k WHERE k.user_id = $1 AND EXISTS \
         (SELECT 1 FROM devices v WHERE v.user_id = k.user_id AND v.device_id = k.device_id \
         AND v.removed_at IS NULL) ORDER BY k.device_id",
    )
    .bind(user_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut devices = Vec::with_capacity(ids.len());
    for id in ids.iter().filter(|id| Some(id.as_str()) != except_device) {
        lock_device(d, conn, user_id, id).await?;
        let keys = sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} FROM device_keys k WHERE k.user_id = $1 AND k.device_id = $2 \
             AND EXISTS (SELECT 1 FROM devices v WHERE v.user_id = k.user_id \
             AND v.device_id = k.device_id AND v.removed_at IS NULL)"
        ))
        .bind(user_id)
        .bind(id.as_str())
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(r) = keys {
            devices.push(keys_from(&r, now)?);
        }
    }
    // The device is locked: the lowest key is this claim's alone.
    let take = "DELETE FROM one_time_prekeys WHERE (user_id, device_id, key_id) IN \
         (SELECT user_id, device_id, key_id FROM one_time_prekeys \
         WHERE user_id = $1 AND device_id = $2 ORDER BY key_id LIMIT 1) \
         RETURNING key_id, public_key";
    let mut out = Vec::with_capacity(devices.len());
    for keys in devices {
        let one_time = sqlx::query(take)
            .bind(user_id)
            .bind(keys.device_id.as_str())
            .fetch_optional(&mut *conn)
            .await?
            .map(|r| {
                Ok::<_, sqlx::Error>(Prekey {
                    key_id: r.try_get(0)?,
                    public_key: r.try_get(1)?,
                    signature: None,
                })
            })
            .transpose()?;
        let remaining: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM one_time_prekeys WHERE user_id = $1 AND device_id = $2",
        )
        .bind(user_id)
        .bind(keys.device_id.as_str())
        .fetch_one(&mut *conn)
        .await?;
        let told = remaining < low || keys.low_told;
        let max_claimed = one_time
            .as_ref()
            .map_or(keys.max_claimed_id, |p| p.key_id.max(keys.max_claimed_id));
        if told != keys.low_told || max_claimed != keys.max_claimed_id {
            sqlx::query(
                "UPDATE device_keys SET low_told = $3, max_claimed_id = $4 \
                 WHERE user_id = $1 AND device_id = $2",
            )
            .bind(user_id)
            .bind(keys.device_id.as_str())
            .bind(i64::from(told))
            .bind(max_claimed)
            .execute(&mut *conn)
            .await?;
        }
        out.push(Claimed {
            keys,
            one_time,
            remaining,
        });
    }
    Ok(out)
}
