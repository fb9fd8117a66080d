//! The key every node of a cluster shares to prove that a node wrote what others read
//! (`--shared-dir-key-file` for shared-directory files, `--cluster-key-file` for the
//! checkpoints in Redis), and the one MAC made with it: HMAC-SHA256. How each reader frames
//! what it authenticates is its own business (`snapshot::format`, `cluster::checkpoint`);
//! the key file's rules (private, as ssh's) are `config`'s.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub type HmacSha256 = Hmac<Sha256>;

/// A shared key (at least `MIN_BYTES`).
#[derive(Clone)]
pub struct SharedKey(std::sync::Arc<[u8]>);

impl SharedKey {
    /// Keys shorter than this are refused: HMAC's strength is the key's.
    pub const MIN_BYTES: usize = 16;

    pub fn new(bytes: &[u8]) -> std::result::Result<SharedKey, String> {
        if bytes.len() < Self::MIN_BYTES {
            return Err(format!(
                "is {} bytes; a shared key needs at least {}",
                bytes.len(),
                Self::MIN_BYTES
            ));
        }
        Ok(SharedKey(bytes.into()))
    }

    /// A MAC under this key, to feed bytes into.
    pub fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length, so this cannot fail.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        }
    }

    /// The MAC of `pieces`, each preceded by its length (so no two framings of the same
    /// bytes agree), in lowercase hex.
    pub fn sign(&self, pieces: &[&[u8]]) -> String {
        let digest = self.framed(pieces).finalize().into_bytes();
        digest.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// Whether `tag` (hex, as `sign` makes it) is the MAC of `pieces`; compared in constant
    /// time.
    pub fn verifies(&self, pieces: &[&[u8]], tag: &str) -> bool {
        if tag.len() != 64 || !tag.is_ascii() {
            return false;
        }
        let mut digest = [0u8; 32];
        for (i, byte) in digest.iter_mut().enumerate() {
            match u8::from_str_radix(&tag[2 * i..2 * i + 2], 16) {
                Ok(value) => *byte = value,
                Err(_) => return false,
            }
        }
        self.framed(pieces).verify_slice(&digest).is_ok()
    }

    fn framed(&self, pieces: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.mac();
        for piece in pieces {
            mac.update(&(piece.len() as u64).to_le_bytes());
            mac.update(piece);
        }
        mac
    }
}

impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_under_its_key_and_its_framing() {
        let key = SharedKey::new(b"0123456789abcdef-cluster-key").unwrap();
        let tag = key.sign(&[b"ab", b"c"]);
        assert_eq!(tag.len(), 64);
        assert!(key.verifies(&[b"ab", b"c"], &tag));
        // The same bytes framed otherwise, other bytes, another key, a damaged tag.
        assert!(!key.verifies(&[b"a", b"bc"], &tag));
        assert!(!key.verifies(&[b"ab", b"d"], &tag));
        let other = SharedKey::new(b"another-key-of-16+bytes").unwrap();
        assert!(!other.verifies(&[b"ab", b"c"], &tag));
        assert!(!key.verifies(&[b"ab", b"c"], &tag[..63]));
        assert!(!key.verifies(&[b"ab", b"c"], &"zz".repeat(32)));
        assert!(!key.verifies(&[b"ab", b"c"], &"é".repeat(32)));
        assert!(SharedKey::new(b"15 bytes, short").is_err());
    }
}
