//! Owns taking a blob handed over as a descriptor ([`crate::handoff`]): asking for it on a
//! handoff connection, then copying the file into the caller's writer or file, checked.
//!
//! The daemon hands only a file it hashed whole to the digest, mode 0444 and its own, so a
//! rank of another uid cannot change it; the copy checks that it has the size the daemon
//! answered. A rank of the daemon's own uid can change the daemon's files, though, even
//! under a copy in progress (docs/artifacts.md), so with `TUNECACHE_VERIFY=1`
//! ([`crate::handoff::VERIFY_ENV`], [`crate::Client::verify_handoffs`]) the copy is hashed
//! as well and other bytes are refused: a copy into a file is emptied and the blob streamed
//! by GetArtifact instead (the daemon hashes a changed file again before it serves it); a
//! copy into a writer, which cannot take back what it wrote, ends in an error.

use std::fs::File;
use std::io::{Read, Seek};
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tunecache_proto::artifact::CHUNK_BYTES;

use crate::artifacts::{blocking, hash_all, hex, io_error};
use crate::handoff::Handoff;
use crate::{ClientError, Result};

/// Asks the handoff socket at `path` for blob `sha256` (of `size` bytes, when the entry names
/// it) on the connection this process keeps there (made now if there is none): the file and
/// its size if the daemon handed it. A kept connection the daemon closed since (it closes one
/// idle for its `--preface-timeout`) is replaced once. Whatever else goes wrong, the caller
/// streams the blob by GetArtifact instead.
pub(crate) async fn hand_over(
    path: &Path,
    timeout: Duration,
    sha256: &str,
    size: Option<u64>,
) -> Option<(File, u64)> {
    for _ in 0..2 {
        let (connection, kept) = match crate::handoff::take_kept(path) {
            Some(connection) => (connection, true),
            None => (
                Handoff::connect(path, &crate::trusted_daemon_uids(), timeout).await?,
                false,
            ),
        };
        let digest = sha256.to_owned();
        let exchanged = tokio::task::spawn_blocking(move || {
            let mut connection = connection;
            let handed = connection.open(&digest, size);
            (connection, handed)
        })
        .await;
        match exchanged {
            Ok((connection, Ok(handed))) => {
                crate::handoff::keep(path, connection);
                return handed;
            }
            // Done with; a kept one may only have been closed while idle: once more.
            Ok((_, Err(_))) if kept => continue,
            _ => return None,
        }
    }
    None
}

/// A handed blob's copy is whole: `copied` bytes of the `size` its daemon answered.
pub(crate) fn copied_whole(sha256: &str, copied: u64, size: u64) -> Result<u64> {
    if copied == size {
        Ok(copied)
    } else {
        Err(ClientError::Artifact(format!(
            "blob {sha256}: {copied} bytes read of {size}"
        )))
    }
}

fn changed(sha256: &str, received: &str) -> ClientError {
    ClientError::Artifact(format!(
        "blob {sha256}: the handed file's bytes hash to {received}: it changed after the \
         daemon checked it; refused (TUNECACHE_VERIFY=1)"
    ))
}

/// Copies a handed blob's file into `writer`, a chunk at a time, hashing it with `verify`,
/// and answers its size.
pub(crate) async fn copy_to_writer<W>(
    file: File,
    size: u64,
    sha256: &str,
    verify: bool,
    writer: &mut W,
) -> Result<u64>
where
    W: AsyncWrite + Unpin,
{
    let what = format!("reading blob {sha256}");
    // One buffer for the whole copy, moved to the blocking pool and back for each read.
    let mut state = (file, vec![0u8; CHUNK_BYTES]);
    let mut hasher = verify.then(Sha256::new);
    let mut copied = 0u64;
    loop {
        let (mut file, mut buf) = state;
        let (file, buf, n) = blocking(&what, move || loop {
            match file.read(&mut buf) {
                Ok(n) => return Ok((file, buf, n)),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        })
        .await?;
        if n == 0 {
            break;
        }
        copied += n as u64;
        if let Some(hasher) = &mut hasher {
            hasher.update(&buf[..n]);
        }
        writer
            .write_all(&buf[..n])
            .await
            .map_err(io_error(format!("writing blob {sha256}")))?;
        state = (file, buf);
    }
    writer
        .flush()
        .await
        .map_err(io_error(format!("writing blob {sha256}")))?;
    if let Some(hasher) = hasher {
        let received = hex(&hasher.finalize());
        if received != sha256 {
            return Err(changed(sha256, &received));
        }
    }
    copied_whole(sha256, copied, size)
}

/// How a copy of a handed blob into a file ended.
pub(crate) enum FileCopy {
    /// Copied and synced: `copied` bytes (the caller checks them against the size).
    Synced { copied: u64 },
    /// `verify` found other bytes: the file is emptied, for the caller to stream into.
    Changed { file: File },
}

/// Copies a handed blob's file into `to` (opened for reading and writing), file to file
/// (`copy_file_range`: the bytes need not enter this process), then, with `verify`, hashes
/// what `to` now holds. Blocking.
pub(crate) fn copy_to_file(
    mut from: File,
    mut to: File,
    sha256: &str,
    verify: bool,
) -> std::io::Result<FileCopy> {
    let copied = std::io::copy(&mut from, &mut to)?;
    if verify {
        to.rewind()?;
        let (received, _) = hash_all(&mut to, None)?;
        if received != sha256 {
            to.set_len(0)?;
            to.rewind()?;
            return Ok(FileCopy::Changed { file: to });
        }
    }
    // Synced as a streamed blob is: after a crash the name holds the whole blob or the
    // previous file, never a torn one.
    to.sync_all()?;
    Ok(FileCopy::Synced { copied })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> File {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, bytes).unwrap();
        file.rewind().unwrap();
        file
    }

    #[test]
    fn a_verified_copy_of_other_bytes_is_emptied_and_an_unverified_one_kept() {
        let hello = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
        let copy = |from: &[u8], verify: bool| {
            copy_to_file(
                file_with(from),
                tempfile::tempfile().unwrap(),
                hello,
                verify,
            )
            .unwrap()
        };
        assert!(matches!(
            copy(b"hello\n", true),
            FileCopy::Synced { copied: 6 }
        ));
        match copy(b"HELLO\n", true) {
            FileCopy::Changed { file } => assert_eq!(file.metadata().unwrap().len(), 0),
            FileCopy::Synced { .. } => panic!("other bytes were taken under verification"),
        }
        // Unverified, only the length is checked (by the caller).
        assert!(matches!(
            copy(b"HELLO\n", false),
            FileCopy::Synced { copied: 6 }
        ));
    }
}
