//! Artifact blobs in the shared directory: `DIR/v2/artifacts/<sha256>`, one file per digest,
//! written once by whichever node publishes it first (a temporary file, then a link, which
//! never replaces what another node linked in).
//!
//! A node publishes the blobs its own contributions name before the segment that names them
//! (`publish_named`, on the snapshot I/O thread), and fetches a blob only when a GetArtifact
//! asks for one it lacks ([`SharedDirBlobs`], a tier of the artifact store), so the shared
//! filesystem never carries nodes × store bytes. A blob needs no MAC: a reader takes it only
//! because an entry from a trusted segment (or Redis) names its digest, and the store keeps
//! the bytes only if they hash to it. No blob is ever deleted here, so compaction can never
//! remove one a live segment names.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::artifacts::{Artifacts, BlobSource, Partial, Tier};
use crate::wire::stored::EntryMap;

/// The blobs' directory under `v2/`.
pub const BLOB_DIR: &str = "artifacts";

/// The shared directory as a tier of the artifact store.
pub struct SharedDirBlobs {
    /// `DIR/v2/artifacts`.
    dir: PathBuf,
}

impl SharedDirBlobs {
    pub fn new(segment_dir: &Path) -> SharedDirBlobs {
        SharedDirBlobs {
            dir: segment_dir.join(BLOB_DIR),
        }
    }
}

impl BlobSource for SharedDirBlobs {
    fn tier(&self) -> Tier {
        Tier::SharedDir
    }

    fn fetch(
        &self,
        digest: String,
        size: u64,
        into: Partial,
    ) -> crate::artifacts::tiers::FetchFuture {
        let path = self.dir.join(&digest);
        Box::pin(async move {
            // The caller bounds the wait; a hung mount holds only this blocking thread.
            tokio::task::spawn_blocking(move || read_blob(&path, size, into))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        })
    }
}

/// Copies the file at `path` into `into`: `None` when there is none. Reads at most one byte
/// past `size`, so a file that is too long is refused (by its digest) without being read.
fn read_blob(path: &Path, size: u64, mut into: Partial) -> io::Result<Option<Partial>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    if !file.metadata()?.is_file() {
        // Not a blob (a FIFO, a device): nothing of it is read; the empty copy fails its
        // digest and is counted.
        return Ok(Some(into));
    }
    into.copy_from(&mut file.take(size.saturating_add(1)))?;
    Ok(Some(into))
}

/// Links every blob that `entries` name and the shared directory lacks into
/// `segment_dir/artifacts/`, from this node's store. `published` remembers the digests known
/// to be there, so each is looked at once per daemon. A blob this node cannot supply is
/// logged and left out: its entry is still published (the other nodes answer NOT_FOUND for
/// that blob until a node that holds it publishes it).
pub(super) fn publish_named(
    segment_dir: &Path,
    entries: &EntryMap,
    artifacts: &Arc<Artifacts>,
    published: &mut HashSet<String>,
    fsync: bool,
    node: &str,
) -> io::Result<usize> {
    let mut linked = 0;
    let dir = segment_dir.join(BLOB_DIR);
    let mut dir_checked = false;
    for entry in entries.iter() {
        for artifact in entry.result().artifacts.iter() {
            if published.contains(artifact.sha256) {
                continue;
            }
            if !dir_checked {
                make_blob_dir(segment_dir, &dir)?;
                dir_checked = true;
            }
            let target = dir.join(artifact.sha256);
            if fs::symlink_metadata(&target).is_ok() {
                published.insert(artifact.sha256.to_owned());
                continue;
            }
            let Some(source) = artifacts.held_path(artifact.sha256) else {
                tracing::warn!(
                    digest = artifact.sha256,
                    "a published entry names a blob this node no longer holds; its entry is \
                     published without it"
                );
                continue;
            };
            link_copy(&source, &dir, &target, artifact.sha256, fsync, node)?;
            published.insert(artifact.sha256.to_owned());
            linked += 1;
        }
    }
    Ok(linked)
}

/// `v2/artifacts/`, made with the mode `v2/` has (shared by every user, sticky, or the
/// writers' own), so the same users may add blobs as may add segments.
fn make_blob_dir(segment_dir: &Path, dir: &Path) -> io::Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(metadata) if metadata.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                dir.display()
            )))
        }
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        Err(_) => {}
    }
    let mode = fs::metadata(segment_dir)?.permissions().mode() & 0o7777;
    match fs::create_dir(dir) {
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode)),
    }
}

/// Copies `source` to a temporary file in `dir` and links it in as `target`; a target that
/// appeared meanwhile (another node's copy) is left as it is.
fn link_copy(
    source: &Path,
    dir: &Path,
    target: &Path,
    digest: &str,
    fsync: bool,
    node: &str,
) -> io::Result<()> {
    let temp = dir.join(format!(".{digest}.{node}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&temp);
    let result = (|| {
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)?;
        io::copy(&mut File::open(source)?, &mut out)?;
        out.flush()?;
        if fsync {
            out.sync_all()?;
        }
        match fs::hard_link(&temp, target) {
            Err(error) if error.kind() != io::ErrorKind::AlreadyExists => Err(error),
            _ => Ok(()),
        }
    })();
    let _ = fs::remove_file(&temp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_read_at_most_one_byte_past_its_size_and_never_through_a_link() {
        let state = tempfile::tempdir().unwrap();
        let (store, _) = crate::artifacts::BlobDir::open(state.path()).unwrap();
        let shared = tempfile::tempdir().unwrap();
        let blob = shared.path().join("blob");
        fs::write(&blob, vec![7u8; 10 << 20]).unwrap();
        let copied = read_blob(&blob, 3, store.partial().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(copied.written, 4);
        assert!(
            read_blob(&shared.path().join("absent"), 3, store.partial().unwrap())
                .unwrap()
                .is_none()
        );
        std::os::unix::fs::symlink(&blob, shared.path().join("link")).unwrap();
        assert!(read_blob(&shared.path().join("link"), 3, store.partial().unwrap()).is_err());
    }
}
