//! The keys of signed bundles: the signing key (PKCS#8 PEM, as `openssl genpkey -algorithm
//! ed25519` writes it, read only from a private file) and the trusted public keys (SPKI PEM, as
//! `openssl pkey -pubout` writes them), and how a key is named to people.

use std::path::Path;

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::hashing::hex;
use crate::BundleError;

/// The largest key file read: a PEM key is a few hundred bytes.
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// How a key is named: `SHA256:` and the hex SHA-256 of its 32 raw bytes.
pub fn fingerprint(key: &VerifyingKey) -> String {
    format!("SHA256:{}", hex(&Sha256::digest(key.as_bytes())))
}

fn key_error(path: &Path, reason: impl Into<String>) -> BundleError {
    BundleError::Key {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// The PEM text of a key file.
fn pem_text(path: &Path, bytes: Vec<u8>) -> Result<String, BundleError> {
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(key_error(path, "too large for a PEM key"));
    }
    String::from_utf8(bytes).map_err(|_| key_error(path, "not PEM text"))
}

/// The signing key in `path`, a PKCS#8 PEM Ed25519 private key, read only when the file is
/// private ([`crate::private_file`]): anyone who can read it can sign bundles as its owner.
pub fn read_signing_key(path: &Path) -> Result<SigningKey, BundleError> {
    let bytes = crate::private_file::read_private_file(path).map_err(|why| key_error(path, why))?;
    let text = pem_text(path, bytes)?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| {
        key_error(
            path,
            format!("not an Ed25519 private key in PKCS#8 PEM ({e})"),
        )
    })
}

/// The public key in `path`, an SPKI PEM Ed25519 key (`-----BEGIN PUBLIC KEY-----`).
pub fn read_verifying_key(path: &Path) -> Result<VerifyingKey, BundleError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| key_error(path, e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| key_error(path, e.to_string()))?;
    let text = pem_text(path, bytes)?;
    VerifyingKey::from_public_key_pem(&text)
        .map_err(|e| key_error(path, format!("not an Ed25519 public key in SPKI PEM ({e})")))
}
