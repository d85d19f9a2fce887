//! Who is asking: HS256 tokens (issued here on login, or signed by the deployer's own
//! backend with the shared key, `sub` = user id) and argon2 password hashes.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Clock skew tolerated on `exp` and `nbf`, in seconds.
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
    #[error("the token's sub is not a valid user id")]
    Subject,
}

#[derive(Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<i64>,
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
    crate::store::now_ms() / 1000
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
        let now = now_secs();
        let exp = now + self.ttl_secs;
        let header = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let claims = Claims {
            sub: user_id.to_string(),
            exp,
            nbf: None,
            iat: Some(now),
        };
        let body = B64.encode(serde_json::to_vec(&claims).expect("claims serialize"));
        let signed = format!("{header}.{body}");
        let mut mac = self.mac();
        mac.update(signed.as_bytes());
        let sig = B64.encode(mac.finalize().into_bytes());
        (format!("{signed}.{sig}"), exp)
    }

    /// The user id the token speaks for.
    pub fn verify(&self, token: &str) -> Result<String, TokenError> {
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
        if !valid_user_id(&claims.sub) {
            return Err(TokenError::Subject);
        }
        Ok(claims.sub)
    }
}

/// User ids: 1–64 of `A–Z a–z 0–9 _ . - @`.
pub fn valid_user_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'@'))
}

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
        assert_eq!(t.verify(&token).unwrap(), "alice");
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
    fn passwords_verify() {
        let h = hash_password("correct horse");
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("wrong horse", &h));
    }
}
