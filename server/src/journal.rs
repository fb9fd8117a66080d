//! The node-local journal: an append-only file of checksummed frames in `<state-dir>/journal`.
//!
//! Owns the file format, replay at start, appends with the chosen fsync policy, and
//! compaction (rewrite the live entries to a new file, then rename it over the old one).
//! Only the store's writer thread touches a `Journal`, so nothing here locks.
//!
//! Frame: magic `TCJ1` | payload length (u32 LE) | CRC-32 of payload (u32 LE) | payload, where
//! the payload is a prost-encoded `tunecache.journal.v1.JournalBatch`. The magic lets replay
//! find the next intact frame after damage in the middle of the file.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;
use tunecache_proto::journal::v1::JournalBatch;

use crate::entry::{to_wire_entry, CacheKey, TunedResult};
use crate::error::{Error, Result};

const MAGIC: [u8; 4] = *b"TCJ1";
const HEADER_LEN: usize = 12;
/// Appends split batches into frames of about this many payload bytes.
const TARGET_FRAME_PAYLOAD: usize = 4 * 1024 * 1024;
/// No valid frame is larger: a bigger length field is damage, not data.
const MAX_FRAME_PAYLOAD: usize = 16 * 1024 * 1024;
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
    /// Offset and length of an incomplete last write that was truncated away.
    pub torn_tail: Option<(u64, u64)>,
    /// Damaged stretches in the middle, skipped; the file is rewritten clean afterwards.
    pub skipped: Vec<SkippedRange>,
}

pub struct Journal {
    dir: PathBuf,
    file: File,
    len: u64,
    fsync: FsyncPolicy,
    unsynced: bool,
    last_sync: Instant,
}

enum FrameCheck {
    Intact { payload_end: usize },
    Incomplete,
    Damaged(&'static str),
}

fn check_frame(buf: &[u8], at: usize) -> FrameCheck {
    let rest = &buf[at..];
    if rest.len() < HEADER_LEN {
        return if MAGIC.starts_with(&rest[..rest.len().min(4)]) {
            FrameCheck::Incomplete
        } else {
            FrameCheck::Damaged("bad frame magic")
        };
    }
    if rest[..4] != MAGIC {
        return FrameCheck::Damaged("bad frame magic");
    }
    let payload_len = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
    let crc = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
    if payload_len > MAX_FRAME_PAYLOAD {
        return FrameCheck::Damaged("frame length out of range");
    }
    if rest.len() < HEADER_LEN + payload_len {
        return FrameCheck::Incomplete;
    }
    let payload = &rest[HEADER_LEN..HEADER_LEN + payload_len];
    if crc32fast::hash(payload) != crc {
        return FrameCheck::Damaged("checksum mismatch");
    }
    FrameCheck::Intact {
        payload_end: at + HEADER_LEN + payload_len,
    }
}

/// The offset of the next intact frame at or after `from`, if any.
fn next_intact_frame(buf: &[u8], from: usize) -> Option<usize> {
    let finder = memchr::memmem::Finder::new(&MAGIC);
    let mut search_from = from;
    while search_from < buf.len() {
        let at = search_from + finder.find(&buf[search_from..])?;
        if matches!(check_frame(buf, at), FrameCheck::Intact { .. }) {
            return Some(at);
        }
        search_from = at + 1;
    }
    None
}

fn encode_frame(entries: &[(CacheKey, TunedResult)], out: &mut Vec<u8>) {
    let batch = JournalBatch {
        entries: entries
            .iter()
            .map(|(key, result)| to_wire_entry(key, result))
            .collect(),
    };
    let payload = batch.encode_to_vec();
    out.extend_from_slice(&MAGIC);
    // Frames are split well below u32::MAX (TARGET_FRAME_PAYLOAD), so the cast is exact.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// Encodes entries as frames of about `TARGET_FRAME_PAYLOAD` bytes each.
fn encode_frames<'a>(entries: impl Iterator<Item = (&'a CacheKey, &'a TunedResult)>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk: Vec<(CacheKey, TunedResult)> = Vec::new();
    let mut chunk_bytes = 0;
    for (key, result) in entries {
        chunk_bytes += key.encoded_len_estimate() + result.encoded_len_estimate();
        chunk.push((key.clone(), result.clone()));
        if chunk_bytes >= TARGET_FRAME_PAYLOAD {
            encode_frame(&chunk, &mut out);
            chunk.clear();
            chunk_bytes = 0;
        }
    }
    if !chunk.is_empty() {
        encode_frame(&chunk, &mut out);
    }
    out
}

fn journal_path(dir: &Path) -> PathBuf {
    dir.join("journal")
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("syncing directory", dir, e))
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir` and replays it, handing every entry
    /// to `apply` in the order written. A torn tail is truncated; damaged stretches in the
    /// middle are skipped and reported, never a panic.
    pub fn open(
        dir: &Path,
        fsync: FsyncPolicy,
        mut apply: impl FnMut(CacheKey, TunedResult),
    ) -> Result<(Journal, ReplayReport)> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating state directory", dir, e))?;
        let path = journal_path(dir);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| Error::io("opening journal", &path, e))?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)
            .map_err(|e| Error::io("reading journal", &path, e))?;

        let mut report = ReplayReport::default();
        let mut pos = 0;
        while pos < buf.len() {
            let reason = match check_frame(&buf, pos) {
                FrameCheck::Intact { payload_end } => {
                    match JournalBatch::decode(&buf[pos + HEADER_LEN..payload_end]) {
                        Ok(batch) => {
                            report.frames += 1;
                            for entry in batch.entries {
                                if let (Some(key), Some(result)) = (entry.key, entry.result) {
                                    report.entries += 1;
                                    apply(key.into(), result.into());
                                }
                            }
                            pos = payload_end;
                            continue;
                        }
                        Err(_) => "frame payload does not decode",
                    }
                }
                FrameCheck::Incomplete => "incomplete frame",
                FrameCheck::Damaged(reason) => reason,
            };
            match next_intact_frame(&buf, pos + 1) {
                Some(next) => {
                    report.skipped.push(SkippedRange {
                        offset: pos as u64,
                        len: (next - pos) as u64,
                        reason,
                    });
                    pos = next;
                }
                None => {
                    report.torn_tail = Some((pos as u64, (buf.len() - pos) as u64));
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
            let kept = dir.join(format!("journal.corrupt.{}", crate::entry::unix_now_ms()));
            std::fs::copy(&path, &kept)
                .map_err(|e| Error::io("keeping a copy of the damaged journal", &kept, e))?;
        }
        let journal = Journal {
            dir: dir.to_path_buf(),
            file,
            len,
            fsync,
            unsynced: false,
            last_sync: Instant::now(),
        };
        Ok((journal, report))
    }

    /// Bytes in the journal file.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends entries as one or more frames and syncs according to the policy. On failure
    /// the file is cut back to where it was, so a failed write leaves no partial frame.
    pub fn append(&mut self, entries: &[(CacheKey, TunedResult)]) -> Result<u64> {
        let bytes = encode_frames(entries.iter().map(|(k, r)| (k, r)));
        let path = journal_path(&self.dir);
        if let Err(error) = self.file.write_all(&bytes) {
            let _ = self.file.set_len(self.len);
            return Err(Error::io("appending to journal", path, error));
        }
        self.len += bytes.len() as u64;
        self.unsynced = true;
        match self.fsync {
            FsyncPolicy::Always => self.sync()?,
            FsyncPolicy::Batch if self.last_sync.elapsed() >= BATCH_SYNC_INTERVAL => self.sync()?,
            FsyncPolicy::Batch | FsyncPolicy::Never => {}
        }
        Ok(bytes.len() as u64)
    }

    /// Whether data is waiting for a `--fsync batch` sync.
    pub fn sync_pending(&self) -> bool {
        self.unsynced && self.fsync == FsyncPolicy::Batch
    }

    /// Forces written data to stable storage (unless the policy is `never`).
    pub fn sync(&mut self) -> Result<()> {
        if self.unsynced && self.fsync != FsyncPolicy::Never {
            self.file
                .sync_data()
                .map_err(|e| Error::io("syncing journal", journal_path(&self.dir), e))?;
        }
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Replaces the journal with one holding exactly `live`: written to a new file, synced,
    /// renamed over the old one. A crash at any point leaves the old or the new journal.
    pub fn rewrite<'a>(
        &mut self,
        live: impl Iterator<Item = (&'a CacheKey, &'a TunedResult)>,
    ) -> Result<()> {
        let path = journal_path(&self.dir);
        let tmp_path = self.dir.join("journal.compacting");
        let bytes = encode_frames(live);
        let write = || -> std::io::Result<File> {
            let mut tmp = File::create(&tmp_path)?;
            tmp.write_all(&bytes)?;
            if self.fsync != FsyncPolicy::Never {
                tmp.sync_data()?;
            }
            Ok(tmp)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp_path);
            Error::io("writing compacted journal", &tmp_path, e)
        })?;
        std::fs::rename(&tmp_path, &path)
            .map_err(|e| Error::io("renaming compacted journal", &path, e))?;
        if self.fsync != FsyncPolicy::Never {
            sync_dir(&self.dir)?;
        }
        self.file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| Error::io("reopening journal", &path, e))?;
        self.len = bytes.len() as u64;
        self.unsynced = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u32) -> (CacheKey, TunedResult) {
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
            },
        )
    }

    fn replay(dir: &Path) -> (Vec<(CacheKey, TunedResult)>, ReplayReport) {
        let mut seen = Vec::new();
        let (_, report) = Journal::open(dir, FsyncPolicy::Never, |k, r| seen.push((k, r))).unwrap();
        (seen, report)
    }

    #[test]
    fn replays_frames_and_skips_damage_in_the_middle() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = Journal::open(dir.path(), FsyncPolicy::Never, |_, _| {}).unwrap();
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
        let (mut journal, _) = Journal::open(dir.path(), FsyncPolicy::Never, |_, _| {}).unwrap();
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

    #[test]
    fn rewrite_keeps_exactly_the_live_entries() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = Journal::open(dir.path(), FsyncPolicy::Always, |_, _| {}).unwrap();
        for i in 0..10 {
            journal.append(&[entry(i)]).unwrap();
        }
        let live = [entry(3), entry(7)];
        journal.rewrite(live.iter().map(|(k, r)| (k, r))).unwrap();
        journal.append(&[entry(8)]).unwrap();
        drop(journal);
        let (seen, report) = replay(dir.path());
        assert_eq!(seen, vec![entry(3), entry(7), entry(8)]);
        assert!(report.skipped.is_empty() && report.torn_tail.is_none());
    }
}
