//! Artifact blobs in the shared directory: `DIR/v2/artifacts/<sha256>`, one file per digest,
//! written once by whichever node publishes it first (a temporary file, then a link, which
//! never replaces what another node linked in).
//!
//! A node publishes the blobs its own contributions name before the segment that names them
//! (`publish_named`, on the snapshot I/O thread), and fetches a blob only when a GetArtifact
//! asks for one it lacks ([`SharedDirBlobs`], a tier of the artifact store), so the shared
//! filesystem never carries nodes × store bytes. A blob needs no MAC: a reader takes it only
//! because an entry from a trusted segment (or Redis) names its digest, and the store keeps
//! the bytes only if they hash to it.
//!
//! Blobs no live entry names are collected by [`sweep`], in the two steps of
//! `plan::blob_sweep` (renamed to this node's trash, then deleted one pass later unless named
//! again), only after a load that read every trusted segment; after each segment it links in,
//! a publisher links in afresh any blob the segment names that is missing
//! ([`relink_missing`]). So a blob a live segment names is never left deleted.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::artifacts::{Artifacts, BlobSource, Partial, Tier};
use crate::snapshot::plan::blob_sweep::{self, BlobName, SweepStep};
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

/// After a segment naming `entries` is linked in: links in, from this node's store, every
/// blob they name that the shared directory lacks (a sweep renamed it while the segment was
/// being written). Answers how many it linked.
pub(super) fn relink_missing(
    segment_dir: &Path,
    entries: &EntryMap,
    artifacts: &Arc<Artifacts>,
    fsync: bool,
    node: &str,
) -> io::Result<usize> {
    publish_named(
        segment_dir,
        entries,
        artifacts,
        &mut HashSet::new(),
        fsync,
        node,
    )
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct SweepReport {
    /// Blobs renamed to this node's trash.
    pub trashed: usize,
    /// Trash files linked back under their digest.
    pub restored: usize,
    /// Trash files deleted: blobs collected.
    pub deleted: usize,
    pub deleted_bytes: u64,
    /// Publishers' temporary files deleted.
    pub temps_deleted: usize,
}

/// How long ago the file was last written or renamed (the later of its mtime and ctime).
fn age_of(metadata: &fs::Metadata, now: SystemTime) -> Option<Duration> {
    let at = |seconds: i64, nanos: i64| {
        let since_epoch = Duration::new(u64::try_from(seconds).ok()?, u32::try_from(nanos).ok()?);
        SystemTime::UNIX_EPOCH.checked_add(since_epoch)
    };
    let modified = at(metadata.mtime(), metadata.mtime_nsec())?;
    let changed = at(metadata.ctime(), metadata.ctime_nsec())?;
    now.duration_since(modified.max(changed)).ok()
}

/// One sweep of `segment_dir/artifacts/` (see `plan::blob_sweep`): `named` holds every digest
/// an entry of this node's cache names, read after a load that read every trusted segment.
/// A file another user owns there (a sticky directory) cannot be renamed or removed: it is left,
/// logged at debug.
pub(super) fn sweep(
    segment_dir: &Path,
    named: &HashSet<String>,
    grace: Duration,
    node: &str,
) -> io::Result<SweepReport> {
    let dir = segment_dir.join(BLOB_DIR);
    let listing = match fs::read_dir(&dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(SweepReport::default()),
        Err(error) => return Err(error),
    };
    let now = SystemTime::now();
    let mut report = SweepReport::default();
    for item in listing {
        let item = item?;
        let file_name = item.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let kind = blob_sweep::classify(name, node);
        if kind == BlobName::Other {
            continue;
        }
        let path = dir.join(name);
        let Ok(metadata) = fs::symlink_metadata(&path) else {
            continue; // gone meanwhile
        };
        if metadata.is_dir() {
            continue;
        }
        let digest = match kind {
            BlobName::Blob(digest) | BlobName::Trash { digest, .. } => Some(digest),
            _ => None,
        };
        let is_named = digest.is_some_and(|digest| named.contains(digest));
        let outcome = match blob_sweep::step(&kind, age_of(&metadata, now), is_named, grace) {
            SweepStep::Keep => Ok(()),
            SweepStep::Trash => {
                let trash = dir.join(blob_sweep::trash_name(name, node));
                fs::rename(&path, &trash).map(|()| report.trashed += 1)
            }
            SweepStep::Restore => {
                let target = dir.join(digest.unwrap_or_default());
                match fs::hard_link(&path, &target) {
                    Err(error) if error.kind() != io::ErrorKind::AlreadyExists => Err(error),
                    _ => fs::remove_file(&path).map(|()| report.restored += 1),
                }
            }
            SweepStep::Delete => fs::remove_file(&path).map(|()| {
                if kind == BlobName::Temp {
                    report.temps_deleted += 1;
                } else {
                    report.deleted += 1;
                    report.deleted_bytes += metadata.len();
                }
            }),
        };
        if let Err(error) = outcome {
            if error.kind() != io::ErrorKind::NotFound {
                tracing::debug!(path = %path.display(), %error, "a shared blob was left as it is");
            }
        }
    }
    Ok(report)
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
