//! The node-local journal: an append-only file of checksummed frames in `<state-dir>/journal`.
//!
//! Owns the file format, replay at start, appends with the chosen fsync policy, and the one
//! protocol that replaces the journal file (compaction, the clean rewrite after damage, the
//! first start): write the new file and sync it, keep its handle as the append handle, rename
//! it over `journal`, check by path that `journal` now names that handle's inode, sync the
//! directory. No step after the rename needs a new file descriptor, and if the path cannot
//! be shown to name the file appends go to, the journal refuses appends (so Records are
//! refused, not acknowledged into an unlinked file) until a rewrite succeeds.
//! Only the store's writer thread touches a `Journal`, so nothing here locks.
//!
//! The parts: `frame` (the format and its codec), `replay` (reading it back at start),
//! `progress` (how far a replay has got, for callers meanwhile), `append` (writing at the
//! end, syncing, refusing appends), `replace` (the replacement
//! protocol: compaction and repair rewrites).
//!
//! Frame: magic `TCJ1` | payload length (u32 LE) | CRC-32 of payload (u32 LE) | payload, where
//! the payload is a prost-encoded `tunecache.journal.v1.JournalBatch`. The magic lets replay
//! find the next intact frame after damage in the middle of the file. Each entry keeps its
//! provenance (`Origin`): own contributions and learned entries sit in separate fields.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::model::entry::{CacheKey, Origin, TunedResult};

mod append;
mod decode;
mod frame;
mod progress;
mod replace;
mod replay;

use frame::FrameLimits;
pub use frame::MAX_RECORD_BYTES;
pub use progress::ReplayProgress;
pub use replay::{ReplayReport, SkippedRange};

/// Under `--fsync batch`, data reaches the disk at most this long after it was acknowledged.
pub const BATCH_SYNC_INTERVAL: Duration = Duration::from_millis(100);

/// When the journal forces data to stable storage. Every policy writes before acknowledging,
/// so an acknowledged Record survives a crash of the daemon; they differ on power loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FsyncPolicy {
    /// fdatasync before every acknowledgement (one per group commit).
    Always,
    /// fdatasync at most every 100 ms: power loss can lose the last 100 ms of results.
    Batch,
    /// Leave it to the kernel's writeback.
    Never,
}

impl FsyncPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FsyncPolicy::Always => "always",
            FsyncPolicy::Batch => "batch",
            FsyncPolicy::Never => "never",
        }
    }
}

/// Device and inode of a file: what "the same file" means across a rename.
type FileId = (u64, u64);

fn file_id(meta: &std::fs::Metadata) -> FileId {
    (meta.dev(), meta.ino())
}

pub struct Journal {
    dir: PathBuf,
    /// The state directory, held open so syncing it after a rename needs no new descriptor
    /// (a process out of descriptors could not get one).
    dir_handle: File,
    file: File,
    /// Device and inode of `file`, compared with what the path names after a replacement.
    file_id: FileId,
    len: u64,
    fsync: FsyncPolicy,
    unsynced: bool,
    last_sync: Instant,
    /// A replacement was renamed into place but the directory sync failed: the rename may
    /// not survive power loss, so appends wait until a directory sync succeeds.
    dir_sync_pending: bool,
    /// Why appends are refused until a rewrite succeeds: the path may not name the file we
    /// append to, a sync failed (the kernel may have dropped the unsynced pages), or a failed
    /// append could not be cut back.
    unwritable: Option<String>,
    /// Replay skipped damage that is still in the file: rewrite it clean when possible.
    damaged: bool,
    /// How big frames are (`FrameLimits::DEFAULT` outside tests).
    limits: FrameLimits,
}

/// One journalled change: the entry and where it came from.
pub type JournalEntry = (CacheKey, TunedResult, Origin);

fn journal_path(dir: &Path) -> PathBuf {
    dir.join("journal")
}

impl Journal {
    /// A healthy journal appending to `file`, which the path names.
    fn in_place(
        dir: &Path,
        dir_handle: File,
        file: File,
        file_id: FileId,
        len: u64,
        fsync: FsyncPolicy,
    ) -> Journal {
        Journal {
            dir: dir.to_path_buf(),
            dir_handle,
            file,
            file_id,
            len,
            fsync,
            unsynced: false,
            last_sync: Instant::now(),
            dir_sync_pending: false,
            unwritable: None,
            damaged: false,
            limits: FrameLimits::DEFAULT,
        }
    }

    /// Bytes in the journal file.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Why appends are refused right now, if they are: the journal needs a rewrite, or the
    /// directory sync after the last replacement has not succeeded yet.
    pub fn unwritable(&self) -> Option<String> {
        if let Some(reason) = &self.unwritable {
            return Some(reason.clone());
        }
        self.dir_sync_pending.then(|| {
            "the state directory has not been synced since the journal was replaced".into()
        })
    }

    /// Whether appends are refused until a rewrite succeeds.
    pub fn needs_rewrite(&self) -> bool {
        self.unwritable.is_some()
    }

    /// Whether the file still holds damage that replay skipped (the clean rewrite at start
    /// failed, e.g. on a full disk): appends after it are safe, replay skips it again.
    pub fn holds_damage(&self) -> bool {
        self.damaged
    }
}

/// What the journal's tests share: entries, and a replay of a directory.
#[cfg(test)]
mod test_support {
    use super::*;
    use crate::wire::stored::StoredEntry;

    pub(crate) fn stored(entries: &[JournalEntry]) -> Vec<(StoredEntry, Origin)> {
        entries
            .iter()
            .map(|(k, r, o)| (StoredEntry::new(k, r), *o))
            .collect()
    }

    pub(crate) fn entry(i: u32) -> JournalEntry {
        (
            CacheKey {
                namespace: "ns".into(),
                op: "op".into(),
                device: "dev".into(),
                problem: format!("p{i}"),
                rank: None,
            },
            TunedResult {
                config: "{}".into(),
                time_us: f64::from(i),
                tuned_by: "t".into(),
                tuned_at_unix_ms: 0,
                forget_epoch: 0,
                artifacts: Default::default(),
            },
            if i.is_multiple_of(2) {
                Origin::Own
            } else {
                Origin::Learned
            },
        )
    }

    pub(crate) fn replay(dir: &Path) -> (Vec<JournalEntry>, ReplayReport) {
        let mut seen = Vec::new();
        let (_, report) =
            Journal::open(dir, FsyncPolicy::Never, |k, r, o, _| seen.push((k, r, o))).unwrap();
        (seen, report)
    }
}

#[cfg(test)]
mod tests;
