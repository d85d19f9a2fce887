//! Who is asking: HS256 tokens (issued here on login, or signed by the deployer's own
//! backend with the shared key, `sub` = user id) and argon2 password hashes.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Clock skew tolerated on `exp`, `nbf` and `iat`, in seconds.
const LEEWAY_SECS: i64 = 30;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a JWT")]
    Malformed,
    #[error("the token is signed with {0:?}; only HS256 is accepted")]
    Algorithm(String),
    #[error("the token's signature does not match")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYet,
    /// An `iat` ahead of the clock would outlive every revoke-all until then.
    #[error("the token's iat is in the future")]
    IssuedLater,
    #[error("the token's sub is not a valid user id")]
    Subject,
}

#[derive(Serialize, Deserialize)]
struct Claims {
    sub: String,
    #[serde(deserialize_with = "numeric_date")]
    exp: i64,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_numeric_date"
    )]
    nbf: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_numeric_date"
    )]
    iat: Option<i64>,
    /// Makes every token this server issues unique, so logging one out leaves the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jti: Option<String>,
}

/// A JWT NumericDate (RFC 7519): seconds, which may have a fraction; the whole seconds
/// before it.
fn numeric_date<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    whole_seconds(f64::deserialize(d)?)
}

fn some_numeric_date<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Option::<f64>::deserialize(d)?
        .map(whole_seconds)
        .transpose()
}

fn whole_seconds<E: serde::de::Error>(secs: f64) -> Result<i64, E> {
    if !secs.is_finite() || secs.abs() > 1e15 {
        return Err(E::custom("a date out of range"));
    }
    Ok(secs.floor() as i64)
}

/// A token's identity for revocation: the first 16 bytes of its SHA-256.
pub type TokenId = [u8; 16];

/// The identity of `token` (see `TokenId`).
pub fn token_id(token: &str) -> TokenId {
    use sha2::Digest as _;
    let digest = Sha256::digest(token.as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub user_id: String,
    /// When it was issued (Unix seconds), if it says.
    pub issued_at: Option<i64>,
    /// When it expires (Unix seconds).
    pub expires_at: i64,
    pub id: TokenId,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

/// Issues and checks tokens with one HS256 key.
pub struct Tokens {
    key: Vec<u8>,
    ttl_secs: i64,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("ttl_secs", &self.ttl_secs)
            .finish()
    }
}

fn now_secs() -> i64 {
    crate::clock::now_ms() / 1000
}

impl Tokens {
    pub fn new(key: &[u8], ttl_secs: u64) -> Tokens {
        Tokens {
            key: key.to_vec(),
            ttl_secs: ttl_secs.min(i64::MAX as u64 / 2) as i64,
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length")
    }

    /// A token for `user_id` and its expiry (Unix seconds).
    pub fn issue(&self, user_id: &str) -> (String, i64) {
        self.issue_from(user_id, 0)
    }

    /// A token for `user_id` whose `iat` is at least `valid_from` (the user's tokens issued
    /// earlier were revoked), and its expiry (Unix seconds).
    pub fn issue_from(&self, user_id: &str, valid_from: i64) -> (String, i64) {
        let now = now_secs();
        let iat = now.max(valid_from);
        let exp = iat + self.ttl_secs;
        let header = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let claims = Claims {
            sub: user_id.to_string(),
            exp,
            nbf: None,
            iat: Some(iat),
            jti: Some(hex::encode(random_bytes::<12>())),
        };
        let body = B64.encode(serde_json::to_vec(&claims).expect("claims serialize"));
        let signed = format!("{header}.{body}");
        let mut mac = self.mac();
        mac.update(signed.as_bytes());
        let sig = B64.encode(mac.finalize().into_bytes());
        (format!("{signed}.{sig}"), exp)
    }

    /// What the token says, if it is valid (signature, times, subject). Whether it was
    /// revoked is the caller's question (`messaging::Core::authenticate`).
    pub fn verify(&self, token: &str) -> Result<Verified, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(c), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header: Header = B64
            .decode(h)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        if header.alg != "HS256" {
            return Err(TokenError::Algorithm(header.alg));
        }
        let sig = B64.decode(s).map_err(|_| TokenError::Malformed)?;
        let mut mac = self.mac();
        mac.update(&token.as_bytes()[..h.len() + 1 + c.len()]);
        mac.verify_slice(&sig).map_err(|_| TokenError::Signature)?;
        let claims: Claims = B64
            .decode(c)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        let now = now_secs();
        if claims.exp + LEEWAY_SECS < now {
            return Err(TokenError::Expired);
        }
        if claims.nbf.is_some_and(|nbf| nbf - LEEWAY_SECS > now) {
            return Err(TokenError::NotYet);
        }
        if claims.iat.is_some_and(|iat| iat - LEEWAY_SECS > now) {
            return Err(TokenError::IssuedLater);
        }
        if !valid_user_id(&claims.sub) {
            return Err(TokenError::Subject);
        }
        Ok(Verified {
            user_id: claims.sub,
            issued_at: claims.iat,
            expires_at: claims.exp,
            id: token_id(token),
        })
    }
}

/// User ids: 1–64 of `A–Z a–z 0–9 _ . - @`, not `.` or `..`. The one rule, shared with the kinds that
/// name users in their payloads (`courier_plugin_sdk::check::user_id`).
pub fn valid_user_id(s: &str) -> bool {
    courier_plugin_sdk::check::is_user_id(s)
}

/// Device ids: 1–64 of `A–Z a–z 0–9 _ . - :`, not `.` or `..` (a path segment clients
/// rewrite). The one rule, shared with the `encrypted` kind
/// (`courier_plugin_sdk::check::device_id`).
pub fn valid_device_id(s: &str) -> bool {
    courier_plugin_sdk::check::is_device_id(s)
}

/// `valid_user_id`'s rule, as answers say it.
pub const USER_ID_RULE: &str = "1 to 64 of A-Z a-z 0-9 _ . - @, not . or ..";

/// `valid_device_id`'s rule, as answers say it.
pub const DEVICE_ID_RULE: &str = "1 to 64 of A-Z a-z 0-9 _ . - :";

/// An argon2id hash (PHC string) with the crate's default cost. CPU-heavy: call from a
/// blocking thread.
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::encode_b64(&rand_salt()).expect("16 bytes encode");
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 with default params")
        .to_string()
}

/// CPU-heavy: call from a blocking thread.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| {
        Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

/// Password hashing with a bound: at most `concurrency` hashes run at once (each holds
/// 19 MiB while it runs), on blocking threads; a caller waits up to `wait` for a slot,
/// then gets `Busy`.
pub struct Passwords {
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    wait: std::time::Duration,
}

/// Every hashing slot stayed taken for the whole wait.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the server is busy hashing passwords; retry in a moment")]
pub struct Busy;

impl Passwords {
    /// `concurrency` 0: the number of cores.
    pub fn new(concurrency: usize, wait: std::time::Duration) -> Passwords {
        let n = match concurrency {
            0 => std::thread::available_parallelism().map_or(2, usize::from),
            n => n,
        };
        Passwords {
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(n)),
            wait,
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Busy> {
        let slot = tokio::time::timeout(self.wait, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| Busy)?
            .map_err(|_| Busy)?;
        tokio::task::spawn_blocking(move || {
            let out = work();
            drop(slot);
            out
        })
        .await
        .map_err(|_| Busy)
    }

    /// The argon2id hash (PHC string) of `password`.
    pub async fn hash(&self, password: String) -> Result<String, Busy> {
        self.run(move || hash_password(&password)).await
    }

    /// Whether `password` matches `hash`; with no hash (an unknown user) the same work is
    /// done against a dummy, so timing does not tell which users exist.
    pub async fn verify(&self, password: String, hash: Option<String>) -> Result<bool, Busy> {
        self.run(move || match hash {
            Some(h) => verify_password(&password, &h),
            None => {
                let _ = verify_password(&password, dummy_hash());
                false
            }
        })
        .await
    }
}

/// The rate limits of logins and registrations: attempts per client address, failed
/// logins per account.
pub struct Attempts {
    per_address: crate::limits::Limiter<crate::limits::AddressKey>,
    failures: crate::limits::Limiter<String>,
}

impl Attempts {
    pub fn new(per_minute_per_address: u32, failures_per_hour_per_account: u32) -> Attempts {
        use std::time::Duration;
        Attempts {
            per_address: crate::limits::Limiter::new(
                per_minute_per_address,
                Duration::from_secs(60),
                100_000,
            ),
            failures: crate::limits::Limiter::new(
                failures_per_hour_per_account,
                Duration::from_secs(3600),
                100_000,
            ),
        }
    }

    /// Counts an attempt from `address`; `Err(retry_after)` over its allowance.
    pub fn attempt(&self, address: std::net::IpAddr) -> Result<(), std::time::Duration> {
        self.per_address
            .take(&crate::limits::AddressKey::of(address))
    }

    /// `Err(retry_after)` while `user_id` has used up its failed logins.
    pub fn may_log_in(&self, user_id: &str) -> Result<(), std::time::Duration> {
        self.failures.check(&user_id.to_string())
    }

    pub fn failed(&self, user_id: &str) {
        let _ = self.failures.take(&user_id.to_string());
    }
}

/// A hash to check unknown users against, with the default cost.
fn dummy_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| hash_password("no such user"))
}

fn rand_salt() -> [u8; 16] {
    random_bytes()
}

/// Bytes from the operating system's generator.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use argon2::password_hash::rand_core::{OsRng, RngCore as _};
    let mut out = [0u8; N];
    OsRng.fill_bytes(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_a_changed_one_does_not() {
        let t = Tokens::new(b"0123456789abcdef0123456789abcdef", 60);
        let (token, _) = t.issue("alice");
        assert_eq!(t.verify(&token).unwrap().user_id, "alice");
        let (again, _) = t.issue("alice");
        assert_ne!(token_id(&token), token_id(&again), "every token is its own");
        let other = Tokens::new(b"another key another key another k", 60);
        assert_eq!(other.verify(&token), Err(TokenError::Signature));
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = B64.encode(br#"{"sub":"bob","exp":99999999999}"#);
        parts[1] = &forged;
        assert_eq!(t.verify(&parts.join(".")), Err(TokenError::Signature));
        assert_eq!(t.verify("abc"), Err(TokenError::Malformed));
    }

    #[test]
    fn none_and_expired_are_refused() {
        let t = Tokens::new(b"0123456789abcdef0123456789abcdef", 60);
        let none = format!(
            "{}.{}.",
            B64.encode(br#"{"alg":"none"}"#),
            B64.encode(br#"{"sub":"a","exp":99999999999}"#)
        );
        assert_eq!(t.verify(&none), Err(TokenError::Algorithm("none".into())));
        let expired = Tokens {
            key: t.key.clone(),
            ttl_secs: -3600,
        };
        let (token, _) = expired.issue("alice");
        assert_eq!(t.verify(&token), Err(TokenError::Expired));
    }

    #[test]
    fn times_may_have_a_fraction() {
        let t = Tokens::new(b"0123456789abcdef0123456789abcdef", 60);
        let now = now_secs();
        let signed = format!(
            "{}.{}",
            B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
            B64.encode(format!(
                r#"{{"sub":"a","exp":{}.5,"iat":{}.25}}"#,
                now + 60,
                now - 1
            ))
        );
        let mut mac = t.mac();
        mac.update(signed.as_bytes());
        let token = format!("{signed}.{}", B64.encode(mac.finalize().into_bytes()));
        let v = t.verify(&token).unwrap();
        assert_eq!((v.expires_at, v.issued_at), (now + 60, Some(now - 1)));
    }

    #[test]
    fn a_token_issued_in_the_future_is_refused() {
        let t = Tokens::new(b"0123456789abcdef0123456789abcdef", 60);
        let sign = |iat: i64| {
            let signed = format!(
                "{}.{}",
                B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
                B64.encode(format!(r#"{{"sub":"a","exp":{},"iat":{iat}}}"#, iat + 60))
            );
            let mut mac = t.mac();
            mac.update(signed.as_bytes());
            format!("{signed}.{}", B64.encode(mac.finalize().into_bytes()))
        };
        let now = now_secs();
        assert_eq!(t.verify(&sign(now + 25)).unwrap().issued_at, Some(now + 25));
        assert_eq!(t.verify(&sign(now + 3600)), Err(TokenError::IssuedLater));
    }

    #[test]
    fn passwords_verify() {
        let h = hash_password("correct horse");
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("wrong horse", &h));
    }
}
