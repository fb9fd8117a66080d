//! Replay at start: every intact frame's entries handed to the caller in the order written,
//! its tombstones collected; a torn tail (a last frame cut short) truncated; any other damage,
//! in the middle or at the end, skipped, reported and kept as a copy for a post-mortem.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use prost::Message;
use tunecache_proto::journal::v1::JournalBatch;

use crate::error::{Error, Result};
use crate::model::entry::{CacheKey, Origin, TunedResult};
use crate::model::forget::Tombstone;
use crate::model::lifecycle::Day;

use super::frame::{
    check_frame, last_use_from_record, next_intact_frame, tombstone_from_record, FrameCheck,
    FrameLimits, HEADER_LEN,
};
use super::replace::{place_new_journal, sync_dir, ReplaceError};
use super::{file_id, journal_path, FsyncPolicy, Journal, ReplayProgress};

/// A stretch of the journal that replay could not read and skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRange {
    pub offset: u64,
    pub len: u64,
    pub reason: &'static str,
}

/// What replay found.
#[derive(Debug, Default)]
pub struct ReplayReport {
    pub frames: u64,
    pub entries: u64,
    /// Offset and length of an incomplete last write (a frame cut short) truncated away.
    pub torn_tail: Option<(u64, u64)>,
    /// Damaged stretches, in the middle or at the end, skipped; the caller rewrites the
    /// journal clean afterwards.
    pub skipped: Vec<SkippedRange>,
    /// Where the damaged file was kept, or why it could not be (best effort: a full disk
    /// must not stop the start).
    pub kept_copy: Option<std::result::Result<PathBuf, String>>,
    /// The tombstones of Forgets, with their provenance: the store applies them after every
    /// entry (the merge rule does not depend on the order).
    pub tombstones: Vec<(Tombstone, Origin)>,
    /// Last uses journalled on their own (`JournalBatch.last_uses`), in the order written:
    /// the store raises its entries' to them (a maximum, so the order does not matter).
    pub last_uses: Vec<(CacheKey, Day, Origin)>,
}

/// Keeps the damaged journal as `journal.corrupt.<unix ms>`: a hard link first (exact, and
/// it needs no space on a full disk; the clean rewrite then replaces `journal` and leaves
/// the link holding the damaged file), a copy where links do not work. Best effort.
fn keep_damaged_copy(dir: &Path, path: &Path) -> std::result::Result<PathBuf, String> {
    let kept = dir.join(format!(
        "journal.corrupt.{}",
        crate::model::entry::unix_now_ms()
    ));
    let linked = match std::fs::hard_link(path, &kept) {
        Ok(()) => return Ok(kept),
        Err(error) => error,
    };
    match std::fs::copy(path, &kept) {
        Ok(_) => Ok(kept),
        Err(copied) => {
            let _ = std::fs::remove_file(&kept);
            Err(format!(
                "could not keep a copy of the damaged journal as {}: link: {linked}; copy: {copied}",
                kept.display()
            ))
        }
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir` and replays it, handing every entry
    /// to `apply` in the order written. A torn tail (a last frame cut short) is truncated;
    /// other damage, in the middle or at the end, is skipped and reported, the damaged file
    /// kept as a copy where that can be done, never a panic.
    pub fn open(
        dir: &Path,
        fsync: FsyncPolicy,
        apply: impl FnMut(CacheKey, TunedResult, Origin, Day),
    ) -> Result<(Journal, ReplayReport)> {
        Journal::open_reporting(dir, fsync, &ReplayProgress::default(), apply)
    }

    /// `open`, counting its frames into `progress` as it replays them.
    pub fn open_reporting(
        dir: &Path,
        fsync: FsyncPolicy,
        progress: &ReplayProgress,
        apply: impl FnMut(CacheKey, TunedResult, Origin, Day),
    ) -> Result<(Journal, ReplayReport)> {
        Journal::open_with_limits(dir, fsync, FrameLimits::DEFAULT, progress, apply)
    }

    /// `open`, with frames of `limits` (tests write many frames with little data).
    pub(super) fn open_with_limits(
        dir: &Path,
        fsync: FsyncPolicy,
        limits: FrameLimits,
        progress: &ReplayProgress,
        mut apply: impl FnMut(CacheKey, TunedResult, Origin, Day),
    ) -> Result<(Journal, ReplayReport)> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating state directory", dir, e))?;
        let dir_handle =
            File::open(dir).map_err(|e| Error::io("opening state directory", dir, e))?;
        let path = journal_path(dir);
        let opened = OpenOptions::new().read(true).append(true).open(&path);
        let mut file = match opened {
            Ok(file) => file,
            Err(error) if error.kind() == ErrorKind::NotFound => {
                // First start: an empty journal put in place like any replacement, so its
                // name is durable before the first Record is acknowledged.
                let (file, id) =
                    place_new_journal(dir, &[], fsync, None).map_err(ReplaceError::into_error)?;
                sync_dir(&dir_handle, dir)?;
                let mut journal = Journal::in_place(dir, dir_handle, file, id, 0, fsync);
                journal.limits = limits;
                return Ok((journal, ReplayReport::default()));
            }
            Err(error) => return Err(Error::io("opening journal", &path, error)),
        };
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)
            .map_err(|e| Error::io("reading journal", &path, e))?;
        progress.count_frames(&buf, limits);

        let mut report = ReplayReport::default();
        let mut pos = 0;
        while pos < buf.len() {
            let reason = match check_frame(&buf, pos, limits.max) {
                FrameCheck::Intact { payload_end } => {
                    match JournalBatch::decode(&buf[pos + HEADER_LEN..payload_end]) {
                        Ok(batch) => {
                            report.frames += 1;
                            progress.frame_done();
                            let own = batch.entries.into_iter().map(|e| (e, Origin::Own));
                            let learned = batch.learned.into_iter().map(|e| (e, Origin::Learned));
                            let days = batch.entry_days.into_iter().chain(std::iter::repeat(0));
                            for ((entry, origin), day) in own.chain(learned).zip(days) {
                                if let (Some(key), Some(result)) = (entry.key, entry.result) {
                                    report.entries += 1;
                                    apply(key.into(), result.into(), origin, day);
                                }
                            }
                            report.last_uses.extend(
                                batch.last_uses.into_iter().filter_map(last_use_from_record),
                            );
                            report
                                .tombstones
                                .extend(batch.forgets.into_iter().map(tombstone_from_record));
                            pos = payload_end;
                            continue;
                        }
                        Err(_) => "frame payload does not decode",
                    }
                }
                FrameCheck::Incomplete => "incomplete frame",
                FrameCheck::Damaged(reason) => reason,
            };
            match next_intact_frame(&buf, pos + 1, limits.max) {
                Some(next) => {
                    report.skipped.push(SkippedRange {
                        offset: pos as u64,
                        len: (next - pos) as u64,
                        reason,
                    });
                    pos = next;
                }
                // Only a frame cut short by the end of the file is a torn write; anything
                // else reaching the end (zeros, garbage) is damage and is kept.
                None if matches!(check_frame(&buf, pos, limits.max), FrameCheck::Incomplete) => {
                    report.torn_tail = Some((pos as u64, (buf.len() - pos) as u64));
                    break;
                }
                None => {
                    report.skipped.push(SkippedRange {
                        offset: pos as u64,
                        len: (buf.len() - pos) as u64,
                        reason,
                    });
                    break;
                }
            }
        }

        let mut len = buf.len() as u64;
        if let Some((offset, _)) = report.torn_tail {
            file.set_len(offset)
                .map_err(|e| Error::io("truncating torn journal tail", &path, e))?;
            len = offset;
        }
        if !report.skipped.is_empty() {
            // Keep the damaged file for a post-mortem; the caller rewrites the journal clean.
            report.kept_copy = Some(keep_damaged_copy(dir, &path));
        }
        let id = file
            .metadata()
            .map_err(|e| Error::io("reading journal metadata", &path, e))?;
        let mut journal = Journal::in_place(dir, dir_handle, file, file_id(&id), len, fsync);
        journal.limits = limits;
        journal.damaged = !report.skipped.is_empty();
        Ok((journal, report))
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;

    use super::*;
    use crate::journal::test_support::*;

    #[test]
    fn replays_frames_and_skips_damage_in_the_middle() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _, _| {}).unwrap();
        let mut frame_starts = Vec::new();
        for i in 0..3 {
            frame_starts.push(journal.len() as usize);
            journal.append(&[entry(i)]).unwrap();
        }
        drop(journal);
        let path = journal_path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let second = frame_starts[1];
        bytes[second + 14] ^= 0xff; // damage the second frame's payload
        std::fs::write(&path, &bytes).unwrap();

        let (seen, report) = replay(dir.path());
        assert_eq!(seen, vec![entry(0), entry(2)]);
        assert_eq!(report.skipped.len(), 1);
        assert_eq!(report.skipped[0].offset, second as u64);
        assert_eq!(report.skipped[0].len, (frame_starts[2] - second) as u64);
        assert_eq!(report.skipped[0].reason, "checksum mismatch");
        assert!(report.torn_tail.is_none());
    }

    #[test]
    fn truncates_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        let good_len = journal.len();
        journal.append(&[entry(2)]).unwrap();
        drop(journal);
        let path = journal_path(dir.path());
        let full = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(full - 3)
            .unwrap();

        let (seen, report) = replay(dir.path());
        assert_eq!(seen, vec![entry(1)]);
        assert_eq!(report.torn_tail, Some((good_len, full - 3 - good_len)));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good_len);
    }

    fn kept_copies(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("journal.corrupt."))
            .collect()
    }

    #[test]
    fn an_all_zero_journal_is_damage_kept_as_a_copy_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let zeros = vec![0u8; 33 * 1024];
        std::fs::write(journal_path(dir.path()), &zeros).unwrap();
        let (seen, report) = replay(dir.path());
        assert!(seen.is_empty());
        assert!(report.torn_tail.is_none());
        assert_eq!(
            report.skipped,
            vec![SkippedRange {
                offset: 0,
                len: zeros.len() as u64,
                reason: "bad frame magic"
            }]
        );
        let copies = kept_copies(dir.path());
        assert_eq!(copies.len(), 1);
        assert_eq!(report.kept_copy, Some(Ok(copies[0].clone())));
        assert_eq!(std::fs::read(&copies[0]).unwrap(), zeros);
    }

    #[test]
    fn garbage_after_the_last_frame_is_damage_and_the_rewrite_keeps_the_copy() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        let good_len = journal.len();
        drop(journal);
        let path = journal_path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0xee; 500]);
        std::fs::write(&path, &bytes).unwrap();

        let mut seen = Vec::new();
        let (mut journal, report) = Journal::open(dir.path(), FsyncPolicy::Always, |k, r, o, _| {
            seen.push((k, r, o))
        })
        .unwrap();
        assert_eq!(seen, vec![entry(1)]);
        assert!(report.torn_tail.is_none());
        assert_eq!(report.skipped.len(), 1);
        assert_eq!(report.skipped[0].offset, good_len);
        assert!(journal.holds_damage());
        // The clean rewrite replaces `journal`; the kept copy still holds the damage.
        journal
            .rewrite(stored(&seen).iter().map(|(e, o)| (e, *o)), &[])
            .unwrap();
        assert!(!journal.holds_damage());
        let copies = kept_copies(dir.path());
        assert_eq!(copies.len(), 1);
        assert_eq!(std::fs::read(&copies[0]).unwrap(), bytes);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good_len);
    }
}
