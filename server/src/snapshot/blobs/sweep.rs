//! Collecting blobs no live entry names from the shared directory: the two steps of
//! `plan::blob_sweep` carried out in each directory this node's uid writes blobs into, and
//! among the flat names older daemons used.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::snapshot::plan::blob_sweep::{self, BlobName, SweepStep};
use crate::snapshot::plan::trust::{self, DirVerdict, Writers};

use super::{dirs, BLOB_DIR};

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SweepReport {
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

/// One sweep (see `plan::blob_sweep`) of the directories this node's uid writes blobs into
/// (`<uid>/` and its fallbacks) and of the flat names of `v2/artifacts/` older daemons used:
/// `named` holds every digest an entry of this node's cache names, read after a load that read
/// every trusted segment. Nothing is swept in a blob directory this daemon refuses. A file
/// another user owns in the flat directory (root's and sticky) cannot be renamed or removed:
/// it is left, logged at debug.
pub(crate) fn sweep(
    segment_dir: &Path,
    named: &HashSet<String>,
    grace: Duration,
    node: &str,
    writers: Writers<'_>,
) -> io::Result<SweepReport> {
    let blob_dir = segment_dir.join(BLOB_DIR);
    let facts = match fs::symlink_metadata(&blob_dir) {
        Ok(metadata) => dirs::dir_facts(&metadata),
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(SweepReport::default()),
        Err(error) => return Err(error),
    };
    if !matches!(
        trust::judge_segment_dir(facts, writers),
        DirVerdict::Usable { .. }
    ) {
        return Ok(SweepReport::default());
    }
    let now = SystemTime::now();
    let mut report = SweepReport::default();
    let mut swept = dirs::dirs_of(&blob_dir, nix::unistd::geteuid().as_raw())?;
    swept.push(blob_dir);
    for dir in swept {
        sweep_dir(&dir, named, grace, node, now, &mut report)?;
    }
    Ok(report)
}

/// Sweeps the blob names of one directory into `report`.
fn sweep_dir(
    dir: &Path,
    named: &HashSet<String>,
    grace: Duration,
    node: &str,
    now: SystemTime,
    report: &mut SweepReport,
) -> io::Result<()> {
    let listing = match fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
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
    Ok(())
}
