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
//! Frame: magic `TCJ1` | payload length (u32 LE) | CRC-32 of payload (u32 LE) | payload, where
//! the payload is a prost-encoded `tunecache.journal.v1.JournalBatch`. The magic lets replay
//! find the next intact frame after damage in the middle of the file. Each entry keeps its
//! provenance (`Origin`): own contributions and learned entries sit in separate fields.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use tunecache_proto::journal::v1::{JournalBatch, Tombstone as JournalTombstone};

use crate::model::forget::{ForgetScope, RankScope, Tombstone};

use crate::error::{Error, Result};
use crate::model::entry::{CacheKey, Origin, TunedResult};
use crate::wire::stored::StoredEntry;

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
}

/// How a replacement failed.
enum ReplaceError {
    /// Before the rename took effect: `journal` still names the old file.
    NotRenamed(Error),
    /// `journal` names neither the old nor the new file, or cannot be checked.
    Unknown(Error),
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

/// One journalled change: the entry and where it came from.
pub type JournalEntry = (CacheKey, TunedResult, Origin);

/// Tag byte of `JournalBatch.learned` (field 2, length-delimited); own entries are field 1,
/// the field a stored record is already encoded as.
const LEARNED_TAG: u8 = 2 << 3 | 2;

/// A tombstone as the journal writes it.
fn tombstone_record(tombstone: &Tombstone, origin: Origin) -> JournalTombstone {
    let scope = &tombstone.scope;
    let (rank, every_rank) = scope.rank.to_fields();
    JournalTombstone {
        namespace: scope.namespace.clone(),
        op: scope.op.clone(),
        device: scope.device.clone(),
        problem: scope.problem.clone(),
        rank,
        every_rank,
        stamp: tombstone.stamp,
        learned: origin == Origin::Learned,
    }
}

fn tombstone_from_record(record: JournalTombstone) -> (Tombstone, Origin) {
    let rank = RankScope::from_fields(record.rank, record.every_rank);
    let tombstone = Tombstone {
        scope: ForgetScope {
            namespace: record.namespace,
            op: record.op,
            device: record.device,
            problem: record.problem,
            rank,
        },
        stamp: record.stamp,
    };
    let origin = if record.learned {
        Origin::Learned
    } else {
        Origin::Own
    };
    (tombstone, origin)
}

/// Encodes tombstones as one frame (they are few: subsumed ones are not kept).
fn encode_tombstone_frame(tombstones: &[(Tombstone, Origin)], out: &mut Vec<u8>) {
    if tombstones.is_empty() {
        return;
    }
    let batch = JournalBatch {
        forgets: tombstones
            .iter()
            .map(|(tombstone, origin)| tombstone_record(tombstone, *origin))
            .collect(),
        ..Default::default()
    };
    frame_payload(&batch.encode_to_vec(), out);
}

/// Appends the frame header and `payload`.
fn frame_payload(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    // Frames are split well below u32::MAX (TARGET_FRAME_PAYLOAD), so the cast is exact.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Encodes one frame. The payload is the `JournalBatch` prost would write: every own entry
/// (field 1), then every learned one (field 2), each copied from its stored record.
fn encode_frame(entries: &[(&StoredEntry, Origin)], out: &mut Vec<u8>) {
    let mut payload =
        Vec::with_capacity(entries.iter().map(|(entry, _)| entry.record().len()).sum());
    for (entry, _) in entries.iter().filter(|(_, o)| *o == Origin::Own) {
        payload.extend_from_slice(entry.record());
    }
    for (entry, _) in entries.iter().filter(|(_, o)| *o == Origin::Learned) {
        payload.push(LEARNED_TAG);
        payload.extend_from_slice(&entry.record()[1..]);
    }
    frame_payload(&payload, out);
}

/// Encodes entries as frames of about `TARGET_FRAME_PAYLOAD` bytes each.
fn encode_frames<'a>(entries: impl Iterator<Item = (&'a StoredEntry, Origin)>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk: Vec<(&StoredEntry, Origin)> = Vec::new();
    let mut chunk_bytes = 0;
    for (entry, origin) in entries {
        chunk_bytes += entry.encoded_len_estimate();
        chunk.push((entry, origin));
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

fn sync_dir(dir_handle: &File, dir: &Path) -> Result<()> {
    dir_handle
        .sync_all()
        .map_err(|e| Error::io("syncing the state directory", dir, e))
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

/// Writes `bytes` to a fresh `journal.compacting`, synced per `fsync`. The handle returned
/// is the append handle of the journal-to-be: nothing needs opening after the rename.
fn write_new_file(
    path: &Path,
    bytes: &[u8],
    fsync: FsyncPolicy,
) -> std::io::Result<(File, FileId)> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let mut file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(path)?;
    file.write_all(bytes)?;
    if fsync != FsyncPolicy::Never {
        file.sync_all()?;
    }
    let id = file_id(&file.metadata()?);
    Ok((file, id))
}

/// Steps one to three of a replacement: the new file written and synced, renamed over
/// `journal`, and `journal` checked by path (stat, no descriptor) to name the new file.
/// `old` is the file appends go to now, if any.
fn place_new_journal(
    dir: &Path,
    bytes: &[u8],
    fsync: FsyncPolicy,
    old: Option<FileId>,
) -> std::result::Result<(File, FileId), ReplaceError> {
    let path = journal_path(dir);
    let tmp_path = dir.join("journal.compacting");
    let (file, new_id) = write_new_file(&tmp_path, bytes, fsync).map_err(|e| {
        let _ = std::fs::remove_file(&tmp_path);
        ReplaceError::NotRenamed(Error::io("writing the new journal", &tmp_path, e))
    })?;
    let renamed = std::fs::rename(&tmp_path, &path);
    // Whatever rename said, what counts is which file the path names now.
    let at_path = std::fs::symlink_metadata(&path).map(|m| file_id(&m));
    match (at_path, renamed) {
        (Ok(id), _) if id == new_id => Ok((file, new_id)),
        (Ok(id), Err(error)) if Some(id) == old => {
            let _ = std::fs::remove_file(&tmp_path);
            Err(ReplaceError::NotRenamed(Error::io(
                "renaming the new journal into place",
                &path,
                error,
            )))
        }
        (Err(error), Err(_)) if old.is_none() && error.kind() == ErrorKind::NotFound => {
            let _ = std::fs::remove_file(&tmp_path);
            Err(ReplaceError::NotRenamed(Error::io(
                "renaming the new journal into place",
                &path,
                error,
            )))
        }
        (Ok(_), _) => Err(ReplaceError::Unknown(Error::io(
            "checking the journal after renaming it into place",
            &path,
            std::io::Error::other("the path names neither the old nor the new journal file"),
        ))),
        (Err(error), _) => Err(ReplaceError::Unknown(Error::io(
            "checking the journal after renaming it into place",
            &path,
            error,
        ))),
    }
}

impl ReplaceError {
    fn into_error(self) -> Error {
        match self {
            ReplaceError::NotRenamed(error) | ReplaceError::Unknown(error) => error,
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
        mut apply: impl FnMut(CacheKey, TunedResult, Origin),
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
                let journal = Journal::in_place(dir, dir_handle, file, id, 0, fsync);
                return Ok((journal, ReplayReport::default()));
            }
            Err(error) => return Err(Error::io("opening journal", &path, error)),
        };
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
                            let own = batch.entries.into_iter().map(|e| (e, Origin::Own));
                            let learned = batch.learned.into_iter().map(|e| (e, Origin::Learned));
                            for (entry, origin) in own.chain(learned) {
                                if let (Some(key), Some(result)) = (entry.key, entry.result) {
                                    report.entries += 1;
                                    apply(key.into(), result.into(), origin);
                                }
                            }
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
            match next_intact_frame(&buf, pos + 1) {
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
                None if matches!(check_frame(&buf, pos), FrameCheck::Incomplete) => {
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
        journal.damaged = !report.skipped.is_empty();
        Ok((journal, report))
    }

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

    /// Checks by path (a stat, no descriptor) that `journal` still names the file appends go
    /// to. If it was deleted or replaced behind the daemon's back, appends are refused until
    /// a rewrite puts the journal back, rather than acknowledged into a file with no name.
    pub fn check_path(&mut self) {
        if self.unwritable.is_some() {
            return;
        }
        let path = journal_path(&self.dir);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if file_id(&meta) == self.file_id => {}
            Ok(_) => self.mark_unwritable(format!(
                "{} no longer names the file the daemon appends to",
                path.display()
            )),
            Err(error) => {
                self.mark_unwritable(format!("{} cannot be checked: {error}", path.display()))
            }
        }
    }

    fn mark_unwritable(&mut self, reason: String) {
        self.unwritable.get_or_insert(reason);
    }

    /// Refuses when the journal cannot take an append; retries a pending directory sync.
    fn ensure_writable(&mut self) -> Result<()> {
        if let Some(reason) = &self.unwritable {
            return Err(Error::JournalWrite(Arc::new(Error::JournalUnwritable {
                reason: reason.clone(),
                source: None,
            })));
        }
        if self.dir_sync_pending {
            sync_dir(&self.dir_handle, &self.dir).map_err(|error| {
                Error::JournalWrite(Arc::new(Error::JournalUnwritable {
                    reason: format!("the rename of the new journal is not durable yet: {error}"),
                    source: Some(Box::new(error)),
                }))
            })?;
            self.dir_sync_pending = false;
        }
        Ok(())
    }

    /// `append_stored` for decoded entries, as the tests write them.
    #[cfg(any(test, feature = "test-support"))]
    pub fn append(&mut self, entries: &[JournalEntry]) -> Result<u64> {
        let stored: Vec<(StoredEntry, Origin)> = entries
            .iter()
            .map(|(key, result, origin)| (StoredEntry::new(key, result), *origin))
            .collect();
        self.append_stored(&stored)
    }

    /// Appends entries (in wire form, the store's: their records are copied) as one or more
    /// frames and syncs according to the policy. On failure the file is cut back to where it
    /// was, so a failed write leaves no partial frame; if that or a sync fails, the journal
    /// refuses appends until it is rewritten.
    pub fn append_stored(&mut self, entries: &[(StoredEntry, Origin)]) -> Result<u64> {
        self.ensure_writable()?;
        let bytes = encode_frames(entries.iter().map(|(entry, origin)| (entry, *origin)));
        self.append_bytes(bytes)
    }

    /// Appends tombstones as one frame, like `append_stored`.
    pub fn append_tombstones(&mut self, tombstones: &[(Tombstone, Origin)]) -> Result<u64> {
        self.ensure_writable()?;
        let mut bytes = Vec::new();
        encode_tombstone_frame(tombstones, &mut bytes);
        self.append_bytes(bytes)
    }

    fn append_bytes(&mut self, bytes: Vec<u8>) -> Result<u64> {
        let path = journal_path(&self.dir);
        if let Err(error) = self.file.write_all(&bytes) {
            if let Err(cut) = self.file.set_len(self.len) {
                self.mark_unwritable(format!(
                    "a failed append ({error}) could not be cut back: {cut}"
                ));
            }
            return Err(Error::io("appending to journal", path, error));
        }
        self.len += bytes.len() as u64;
        self.unsynced = true;
        let sync_now = match self.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Batch => self.last_sync.elapsed() >= BATCH_SYNC_INTERVAL,
            FsyncPolicy::Never => false,
        };
        if sync_now {
            if let Err(error) = self.sync() {
                // Not acknowledged: take the frames back out (best effort; the journal is
                // rewritten from memory before the next append anyway).
                self.len -= bytes.len() as u64;
                let _ = self.file.set_len(self.len);
                return Err(error);
            }
        }
        Ok(bytes.len() as u64)
    }

    /// Whether data is waiting for a `--fsync batch` sync.
    pub fn sync_pending(&self) -> bool {
        self.unsynced && self.fsync == FsyncPolicy::Batch
    }

    /// Forces written data to stable storage (unless the policy is `never`). A failed sync
    /// makes the journal refuse appends until it is rewritten: after a failed fsync the
    /// kernel may have dropped the unsynced pages, and a later fsync would not say so.
    pub fn sync(&mut self) -> Result<()> {
        if self.unsynced && self.fsync != FsyncPolicy::Never {
            if let Err(error) = self.file.sync_data() {
                let error = Error::io("syncing journal", journal_path(&self.dir), error);
                self.mark_unwritable(error.to_string());
                return Err(error);
            }
        }
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Replaces the journal with one holding exactly `live` (the replacement protocol in
    /// the module doc). A crash at any point leaves the old or the new journal. On error:
    /// before the rename, appends go on to the old file, still in place; after it, appends
    /// go to the new file, or, where the path cannot be shown to name it, are refused until
    /// a later rewrite succeeds. A success makes a journal that refused appends writable.
    pub fn rewrite<'a>(
        &mut self,
        live: impl Iterator<Item = (&'a StoredEntry, Origin)>,
        tombstones: &[(Tombstone, Origin)],
    ) -> Result<()> {
        let mut bytes = encode_frames(live);
        encode_tombstone_frame(tombstones, &mut bytes);
        let (file, id) = match place_new_journal(&self.dir, &bytes, self.fsync, Some(self.file_id))
        {
            Ok(placed) => placed,
            Err(ReplaceError::NotRenamed(error)) => return Err(error),
            Err(ReplaceError::Unknown(error)) => {
                self.mark_unwritable(error.to_string());
                return Err(error);
            }
        };
        // The path names the new file: from here on appends go to it, whatever fails next.
        self.file = file;
        self.file_id = id;
        self.len = bytes.len() as u64;
        self.unsynced = false;
        self.last_sync = Instant::now();
        self.unwritable = None;
        self.damaged = false;
        self.dir_sync_pending = false;
        if self.fsync != FsyncPolicy::Never {
            if let Err(error) = sync_dir(&self.dir_handle, &self.dir) {
                self.dir_sync_pending = true;
                return Err(error);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(entries: &[JournalEntry]) -> Vec<(StoredEntry, Origin)> {
        entries
            .iter()
            .map(|(k, r, o)| (StoredEntry::new(k, r), *o))
            .collect()
    }

    fn entry(i: u32) -> JournalEntry {
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
            },
            if i.is_multiple_of(2) {
                Origin::Own
            } else {
                Origin::Learned
            },
        )
    }

    fn replay(dir: &Path) -> (Vec<JournalEntry>, ReplayReport) {
        let mut seen = Vec::new();
        let (_, report) =
            Journal::open(dir, FsyncPolicy::Never, |k, r, o| seen.push((k, r, o))).unwrap();
        (seen, report)
    }

    #[test]
    fn tombstones_survive_appends_and_rewrites_with_their_provenance() {
        let dir = tempfile::tempdir().unwrap();
        let scope = |problem: &str, rank| ForgetScope {
            namespace: "ns".into(),
            op: "op".into(),
            device: String::new(),
            problem: problem.into(),
            rank,
        };
        let own = Tombstone {
            scope: scope("", RankScope::Every),
            stamp: 7 << 16,
        };
        let learned = Tombstone {
            scope: scope("p1", RankScope::Rank(3)),
            stamp: 9 << 16,
        };
        {
            let (mut journal, _) =
                Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _| {}).unwrap();
            journal.append(&[entry(1)]).unwrap();
            journal
                .append_tombstones(&[
                    (own.clone(), Origin::Own),
                    (learned.clone(), Origin::Learned),
                ])
                .unwrap();
        }
        let (seen, report) = replay(dir.path());
        assert_eq!(seen.len(), 1);
        let expected = vec![
            (own.clone(), Origin::Own),
            (learned.clone(), Origin::Learned),
        ];
        assert_eq!(report.tombstones, expected);
        {
            let (mut journal, _) =
                Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _| {}).unwrap();
            journal
                .rewrite(stored(&[entry(2)]).iter().map(|(e, o)| (e, *o)), &expected)
                .unwrap();
        }
        let (seen, report) = replay(dir.path());
        assert_eq!(seen.len(), 1, "the rewrite holds what it was given");
        assert_eq!(report.tombstones, expected);
    }

    #[test]
    fn replays_frames_and_skips_damage_in_the_middle() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _| {}).unwrap();
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
        let (mut journal, _) = Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _| {}).unwrap();
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
    fn frames_hold_the_batch_prost_writes() {
        // Own and learned entries interleaved: prost writes all of field 1, then field 2.
        let entries: Vec<JournalEntry> = (0..6)
            .map(|i| {
                let (key, result, _) = entry(i);
                let origin = if i % 2 == 0 {
                    Origin::Learned
                } else {
                    Origin::Own
                };
                (key, result, origin)
            })
            .collect();
        let stored: Vec<(StoredEntry, Origin)> = entries
            .iter()
            .map(|(k, r, o)| (StoredEntry::new(k, r), *o))
            .collect();
        let mut frame = Vec::new();
        encode_frame(
            &stored.iter().map(|(e, o)| (e, *o)).collect::<Vec<_>>(),
            &mut frame,
        );
        let mut batch = JournalBatch::default();
        for (key, result, origin) in &entries {
            let field = match origin {
                Origin::Own => &mut batch.entries,
                Origin::Learned => &mut batch.learned,
            };
            field.push(crate::model::entry::to_wire_entry(key, result));
        }
        assert_eq!(&frame[HEADER_LEN..], batch.encode_to_vec().as_slice());
    }

    #[test]
    fn rewrite_keeps_exactly_the_live_entries() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _| {}).unwrap();
        for i in 0..10 {
            journal.append(&[entry(i)]).unwrap();
        }
        let live = [entry(3), entry(7)];
        journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .unwrap();
        journal.append(&[entry(8)]).unwrap();
        drop(journal);
        let (seen, report) = replay(dir.path());
        assert_eq!(seen, vec![entry(3), entry(7), entry(8)]);
        assert!(report.skipped.is_empty() && report.torn_tail.is_none());
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
        let (mut journal, _) = Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        let good_len = journal.len();
        drop(journal);
        let path = journal_path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0xee; 500]);
        std::fs::write(&path, &bytes).unwrap();

        let mut seen = Vec::new();
        let (mut journal, report) = Journal::open(dir.path(), FsyncPolicy::Always, |k, r, o| {
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

    #[test]
    fn after_a_rewrite_appends_go_to_the_file_the_path_names() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = Journal::open(dir.path(), FsyncPolicy::Batch, |_, _, _| {}).unwrap();
        for round in 0..3 {
            journal.append(&[entry(round)]).unwrap();
            let live = [entry(round)];
            journal
                .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
                .unwrap();
            let at_path = std::fs::metadata(journal_path(dir.path())).unwrap();
            assert_eq!(
                file_id(&at_path),
                file_id(&journal.file.metadata().unwrap())
            );
            assert!(journal.unwritable().is_none());
        }
        journal.append(&[entry(9)]).unwrap();
        drop(journal);
        let (seen, _) = replay(dir.path());
        assert_eq!(seen, vec![entry(2), entry(9)]);
        assert!(!dir.path().join("journal.compacting").exists());
    }

    #[test]
    fn a_rewrite_that_cannot_write_its_new_file_leaves_appends_on_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        // A directory where the new file must go: creating it fails before any rename.
        std::fs::create_dir(dir.path().join("journal.compacting")).unwrap();
        std::fs::write(dir.path().join("journal.compacting/x"), b"x").unwrap();
        let live = [entry(1)];
        assert!(journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .is_err());
        assert!(journal.unwritable().is_none());
        journal.append(&[entry(2)]).unwrap();
        drop(journal);
        let (seen, _) = replay(dir.path());
        assert_eq!(seen, vec![entry(1), entry(2)]);
    }

    #[test]
    fn a_journal_deleted_behind_its_back_refuses_appends_until_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        std::fs::remove_file(journal_path(dir.path())).unwrap();
        journal.check_path();
        assert!(journal.needs_rewrite());
        let refused = journal.append(&[entry(2)]).unwrap_err().to_string();
        assert!(refused.contains("not writable"), "{refused}");
        let live = [entry(1)];
        journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .unwrap();
        assert!(journal.unwritable().is_none());
        journal.append(&[entry(3)]).unwrap();
        drop(journal);
        assert_eq!(replay(dir.path()).0, vec![entry(1), entry(3)]);
    }

    #[test]
    fn a_rename_that_leaves_the_path_naming_neither_file_refuses_appends() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Always, |_, _, _| {}).unwrap();
        journal.append(&[entry(1)]).unwrap();
        // `journal` becomes a non-empty directory: the rename fails, and the path names
        // neither the old file nor the new one.
        let path = journal_path(dir.path());
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), b"x").unwrap();
        let live = [entry(1)];
        assert!(journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .is_err());
        assert!(journal.needs_rewrite());
        assert!(journal.append(&[entry(2)]).is_err());
        std::fs::remove_dir_all(&path).unwrap();
        journal
            .rewrite(stored(&live).iter().map(|(e, o)| (e, *o)), &[])
            .unwrap();
        journal.append(&[entry(3)]).unwrap();
        drop(journal);
        assert_eq!(replay(dir.path()).0, vec![entry(1), entry(3)]);
    }
}
