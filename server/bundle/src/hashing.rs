//! Readers and writers that hash and count what passes through them, so that every part is
//! checked as it streams and never has to be held whole.

use std::io::{Read, Write};

use sha2::{Digest, Sha256};

/// Lowercase hex, the spelling of every digest in a bundle.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// Hashes and counts the bytes read through it.
pub(crate) struct HashingReader<R> {
    pub(crate) inner: R,
    hasher: Sha256,
    pub(crate) count: u64,
}

impl<R> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// The hex digest of everything read so far.
    pub(crate) fn digest(&self) -> String {
        hex(&self.hasher.clone().finalize())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Hashes and counts the bytes written through it.
pub(crate) struct HashingWriter<W> {
    pub(crate) inner: W,
    hasher: Sha256,
    pub(crate) count: u64,
}

impl<W> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// The hex digest of everything written since the last call, and its length; starts
    /// afresh, so that one writer over the whole file hashes each part in turn.
    pub(crate) fn take_digest(&mut self) -> (String, u64) {
        let hasher = std::mem::take(&mut self.hasher);
        let count = std::mem::take(&mut self.count);
        (hex(&hasher.finalize()), count)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
