//! Authenticating shared-directory files with the cluster's key (`--shared-dir-key-file`):
//! every file then ends with a MAC member, `,"mac":"hmac-sha256:<64 hex>"}`, HMAC-SHA256
//! under the key over every byte before it. The member has a fixed length, so the writer
//! holds back only the closing brace (`MacWriter`) and the reader verifies while it streams
//! (`MacCheck` holds back the last bytes it has seen until it knows they are not the
//! trailer); the document stays plain JSON that readers without a key parse as before.

use std::collections::VecDeque;
use std::io::{Read, Write};

use hmac::Mac;

use crate::model::shared_key::HmacSha256;
pub use crate::model::shared_key::SharedKey;

/// The MAC member that ends an authenticated file, up to the hex digest.
const MAC_PREFIX: &[u8] = b",\"mac\":\"hmac-sha256:";
/// `MAC_PREFIX`, 64 hex digits, `"}`.
const MAC_TRAILER_LEN: usize = MAC_PREFIX.len() + 64 + 2;

/// Writes through to `inner`, MACing every byte, and holds back the last one (the
/// document's closing brace) so the MAC member can go before it.
pub(super) struct MacWriter<W: Write> {
    inner: W,
    mac: HmacSha256,
    held: Option<u8>,
}

impl<W: Write> Write for MacWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some((&last, body)) = buf.split_last() else {
            return Ok(0);
        };
        if let Some(held) = self.held.take() {
            self.inner.write_all(&[held])?;
            self.mac.update(&[held]);
        }
        self.inner.write_all(body)?;
        self.mac.update(body);
        self.held = Some(last);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> MacWriter<W> {
    /// A writer into `inner` that MACs under `key`.
    pub(super) fn new(inner: W, key: &SharedKey) -> MacWriter<W> {
        MacWriter {
            inner,
            mac: key.mac(),
            held: None,
        }
    }

    /// Writes the MAC member and the closing brace.
    pub(super) fn finish(mut self) -> std::io::Result<()> {
        if self.held != Some(b'}') {
            return Err(std::io::Error::other("the document does not end with '}'"));
        }
        let digest = self.mac.finalize().into_bytes();
        let mut trailer = MAC_PREFIX.to_vec();
        for byte in digest {
            trailer.extend_from_slice(format!("{byte:02x}").as_bytes());
        }
        trailer.extend_from_slice(b"\"}");
        self.inner.write_all(&trailer)?;
        self.inner.flush()
    }
}

/// Reads through, MACing every byte except the last `MAC_TRAILER_LEN`, which it keeps to
/// check at the end.
pub(super) struct MacCheck<R> {
    inner: R,
    mac: HmacSha256,
    tail: VecDeque<u8>,
}

impl<R: Read> Read for MacCheck<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.tail.extend(&buf[..read]);
        let excess = self.tail.len().saturating_sub(MAC_TRAILER_LEN);
        if excess > 0 {
            let (front, back) = self.tail.as_slices();
            let from_front = excess.min(front.len());
            self.mac.update(&front[..from_front]);
            self.mac.update(&back[..excess - from_front]);
            self.tail.drain(..excess);
        }
        Ok(read)
    }
}

impl<R> MacCheck<R> {
    /// A reader of `inner` that checks its MAC under `key`.
    pub(super) fn new(inner: R, key: &SharedKey) -> MacCheck<R> {
        MacCheck {
            inner,
            mac: key.mac(),
            tail: VecDeque::with_capacity(MAC_TRAILER_LEN * 2),
        }
    }

    /// Whether the file ended with a MAC member that verifies.
    pub(super) fn verdict(self) -> std::result::Result<(), &'static str> {
        let tail: Vec<u8> = self.tail.into();
        let Some(hex) = tail
            .strip_prefix(MAC_PREFIX)
            .and_then(|rest| rest.strip_suffix(b"\"}"))
        else {
            return Err("carries no MAC");
        };
        let mut digest = [0u8; 32];
        for (i, pair) in hex.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).map_err(|_| "carries a damaged MAC")?;
            digest[i] = u8::from_str_radix(text, 16).map_err(|_| "carries a damaged MAC")?;
        }
        self.mac
            .verify_slice(&digest)
            .map_err(|_| "carries a MAC that does not verify under --shared-dir-key-file")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(document: &[u8], key: &SharedKey) -> Vec<u8> {
        let mut out = Vec::new();
        let mut writer = MacWriter::new(&mut out, key);
        // In pieces, as a serializer writes: the held-back byte crosses every boundary.
        for piece in document.chunks(3) {
            writer.write_all(piece).unwrap();
        }
        writer.finish().unwrap();
        out
    }

    fn check(bytes: &[u8], key: &SharedKey) -> std::result::Result<(), &'static str> {
        let mut checked = MacCheck::new(bytes, key);
        // Small reads, so the held-back tail is split across the deque's two halves.
        let mut buf = [0u8; 7];
        while checked.read(&mut buf).unwrap() > 0 {}
        checked.verdict()
    }

    #[test]
    fn the_mac_member_goes_before_the_closing_brace_and_covers_every_byte_before_it() {
        let key = SharedKey::new(b"0123456789abcdef-cluster-key").unwrap();
        let document = br#"{"format":"tunecache-snapshot","entries":[1,2,3]}"#;
        let bytes = signed(document, &key);
        let (body, trailer) = bytes.split_at(document.len() - 1);
        assert_eq!(body, &document[..document.len() - 1]);
        assert!(trailer.starts_with(MAC_PREFIX), "{trailer:?}");
        assert_eq!(trailer.len(), MAC_TRAILER_LEN);
        assert_eq!(check(&bytes, &key), Ok(()));
        for at in 0..bytes.len() {
            let mut tampered = bytes.clone();
            tampered[at] ^= 0x01;
            assert!(
                check(&tampered, &key).is_err(),
                "byte {at} changed, still verified"
            );
        }
        let other = SharedKey::new(b"another-key-of-16+bytes").unwrap();
        assert!(check(&bytes, &other)
            .unwrap_err()
            .contains("does not verify"));
        assert_eq!(check(document, &key), Err("carries no MAC"));
        // Only a document that ends with its closing brace can carry the member.
        let mut out = Vec::new();
        let mut writer = MacWriter::new(&mut out, &key);
        writer.write_all(b"[1]").unwrap();
        assert!(writer.finish().is_err());
        assert!(SharedKey::new(b"15 bytes, short").is_err());
    }
}
