//! End-to-end encryption support, as `impl Core`: the server is a directory of devices'
//! public keys for X3DH (`keys.rs`) and a set of per-device mailboxes that carry pairwise
//! ciphertexts and group sender keys (`mailbox.rs`). It checks what it can of what it is
//! given — sizes, encodings, that each signature verifies under the device's signing key,
//! that no key is of small order — and never sees a private key or a plaintext.

pub mod keys;
pub mod mailbox;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::protocol::{Code, Error};

/// What the signature of a device's identity key covers: this, then the key's 32 bytes.
pub const IDENTITY_CONTEXT: &[u8] = b"courier:identity-key:v1";
/// … of a signed prekey: this, the key id (8 bytes, big-endian), the key's 32 bytes.
pub const SIGNED_PREKEY_CONTEXT: &[u8] = b"courier:signed-prekey:v1";
/// … of a last-resort prekey: the same shape.
pub const LAST_RESORT_CONTEXT: &[u8] = b"courier:last-resort-prekey:v1";

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::KeysInvalid, message)
}

/// `n` bytes in standard padded base64.
fn decode<const N: usize>(field: &str, b64: &str) -> Result<[u8; N], Error> {
    let bytes = STANDARD
        .decode(b64)
        .map_err(|_| invalid(format!("{field} is not standard padded base64")))?;
    <[u8; N]>::try_from(bytes.as_slice())
        .map_err(|_| invalid(format!("{field} must be {N} bytes, not {}", bytes.len())))
}

/// An X25519 public key of no small order (a key of order dividing 8 would make every
/// agreement with it the same, public, value).
fn x25519_key(field: &str, b64: &str) -> Result<[u8; 32], Error> {
    let key = decode::<32>(field, b64)?;
    let eight = curve25519_dalek::Scalar::from(8u8);
    if (curve25519_dalek::montgomery::MontgomeryPoint(key) * eight).to_bytes() == [0u8; 32] {
        return Err(invalid(format!("{field} is a point of small order")));
    }
    Ok(key)
}

/// An Ed25519 public key: a valid point, not of small order.
fn ed25519_key(field: &str, b64: &str) -> Result<ed25519_dalek::VerifyingKey, Error> {
    let key = ed25519_dalek::VerifyingKey::from_bytes(&decode::<32>(field, b64)?)
        .map_err(|_| invalid(format!("{field} is not an Ed25519 public key")))?;
    if key.is_weak() {
        return Err(invalid(format!("{field} is a point of small order")));
    }
    Ok(key)
}

/// `signature` (base64) verifies, strictly, under `key` over `context` then `parts`.
fn verify(
    key: &ed25519_dalek::VerifyingKey,
    field: &str,
    signature: &str,
    context: &[u8],
    parts: &[&[u8]],
) -> Result<(), Error> {
    let sig = ed25519_dalek::Signature::from_bytes(&decode::<64>(field, signature)?);
    let mut message = context.to_vec();
    for p in parts {
        message.extend_from_slice(p);
    }
    key.verify_strict(&message, &sig)
        .map_err(|_| invalid(format!("{field} does not verify under the signing key")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_order_x25519_keys_are_refused() {
        let zero = STANDARD.encode([0u8; 32]);
        let mut one = [0u8; 32];
        one[0] = 1;
        let one = STANDARD.encode(one);
        for key in [zero, one] {
            assert_eq!(x25519_key("k", &key).unwrap_err().code, Code::KeysInvalid);
        }
        // The base point's u (9) is an ordinary public key.
        let mut nine = [0u8; 32];
        nine[0] = 9;
        assert!(x25519_key("k", &STANDARD.encode(nine)).is_ok());
        assert!(x25519_key("k", "not base64!").is_err());
        assert!(x25519_key("k", &STANDARD.encode([7u8; 31])).is_err());
    }
}
