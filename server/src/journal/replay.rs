//! Replay at start: every intact frame's entries handed to the caller in the order written,
//! its tombstones collected; a torn tail (a last frame cut short) truncated; any other damage,
//! in the middle or at the end, skipped, reported and kept as a copy for a post-mortem.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::entry::{CacheKey, Origin, TunedResult};
use crate::model::forget::Tombstone;
use crate::model::lifecycle::Day;

use crate::wire::stored::{RecentVocabs, StoredEntry};

use super::decode::decode_frame;
use super::frame::{check_frame, next_intact_frame, FrameCheck, FrameLimits, HEADER_LEN};
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
    /// The highest `forget_epoch` of any entry replayed: a key's winner has its key's highest
    /// (the merge rule ranks epochs first), and what a tombstone drops is below its stamp, so
    /// it is the highest the store holds, or below a tombstone's.
    pub highest_epoch: u64,
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
        mut apply: impl FnMut(CacheKey, TunedResult, Origin, Day),
    ) -> Result<(Journal, ReplayReport)> {
        Journal::open_reporting(
            dir,
            fsync,
            &ReplayProgress::default(),
            |entry, origin, day| {
                let (key, result) = entry.to_pair();
                apply(key, result, origin, day)
            },
        )
    }

    /// `open`, handing each entry in its stored form, and counting the frames into
    /// `progress` as it replays them.
    pub fn open_reporting(
        dir: &Path,
        fsync: FsyncPolicy,
        progress: &ReplayProgress,
        apply: impl FnMut(StoredEntry, Origin, Day),
    ) -> Result<(Journal, ReplayReport)> {
        Journal::open_with_limits(dir, fsync, FrameLimits::DEFAULT, progress, apply)
    }

    /// `open_reporting`, with frames of `limits` (tests write many frames with little data).
    pub(super) fn open_with_limits(
        dir: &Path,
        fsync: FsyncPolicy,
        limits: FrameLimits,
        progress: &ReplayProgress,
        apply: impl FnMut(StoredEntry, Origin, Day),
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
        let mut report = replay_frames(&buf, limits, progress, apply);

        let mut len = buf.len() as u64;
        drop(buf);
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

/// Frames decoded ahead of the one being applied: enough to keep both threads busy, few
/// enough that the decoded copies never hold much of a large journal (a frame is at most
/// 16 MiB).
const FRAMES_IN_FLIGHT: usize = 4;

/// Replays the frames of `buf`: one thread reads and decodes them (the checksums, the
/// entries' stored forms) while this one hands their entries to `apply`, so a large journal's
/// start costs the slower of the two, not their sum. Without a second thread, both run here.
fn replay_frames(
    buf: &[u8],
    limits: FrameLimits,
    progress: &ReplayProgress,
    mut apply: impl FnMut(StoredEntry, Origin, Day),
) -> ReplayReport {
    std::thread::scope(|scope| {
        let (frames, decoded) = std::sync::mpsc::sync_channel::<DecodedEntries>(FRAMES_IN_FLIGHT);
        let reader = std::thread::Builder::new()
            .name("tunecache-replay".into())
            .spawn_scoped(scope, move || {
                read_frames(buf, limits, progress, |entries| {
                    // The receiver stays until every frame is read.
                    let _ = frames.send(entries);
                })
            });
        let Ok(reader) = reader else {
            return read_frames(buf, limits, progress, |entries| {
                entries.into_iter().for_each(|(e, o, d)| apply(e, o, d))
            });
        };
        for entries in decoded {
            entries.into_iter().for_each(|(e, o, d)| apply(e, o, d));
        }
        reader
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

type DecodedEntries = Vec<(StoredEntry, Origin, Day)>;

/// Reads every frame of `buf`, handing each one's entries to `entries` in the order written,
/// and reports the rest (tombstones, last uses, damage).
fn read_frames(
    buf: &[u8],
    limits: FrameLimits,
    progress: &ReplayProgress,
    mut entries: impl FnMut(DecodedEntries),
) -> ReplayReport {
    let mut report = ReplayReport::default();
    let mut recent = RecentVocabs::default();
    let mut pos = 0;
    while pos < buf.len() {
        let reason = match check_frame(buf, pos, limits.max) {
            FrameCheck::Intact { payload_end } => {
                match decode_frame(&buf[pos + HEADER_LEN..payload_end], &mut recent) {
                    Some(frame) => {
                        report.frames += 1;
                        progress.frame_done();
                        report.entries += frame.entries.len() as u64;
                        report.highest_epoch = report.highest_epoch.max(frame.highest_epoch);
                        entries(frame.entries);
                        report.last_uses.extend(frame.last_uses);
                        report.tombstones.extend(frame.tombstones);
                        pos = payload_end;
                        continue;
                    }
                    None => "frame payload does not decode",
                }
            }
            FrameCheck::Incomplete => "incomplete frame",
            FrameCheck::Damaged(reason) => reason,
        };
        match next_intact_frame(buf, pos + 1, limits.max) {
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
            None if matches!(check_frame(buf, pos, limits.max), FrameCheck::Incomplete) => {
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
    report
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
