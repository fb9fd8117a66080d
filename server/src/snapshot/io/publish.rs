//! Writing this node's segments: the plan (`plan::publish`) carried out. A segment is
//! recorded in the state directory before it exists, written to a hidden temp file and
//! linked in (a link fails where a rename would silently replace another writer's segment
//! of the same name); a compaction is linked in before the segments it replaces are removed.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::error::{Error, Result};
use crate::fsx::atomic::{self, Durability, TempFile, TempOptions};
use crate::model::entry::unix_now_ms;
use crate::model::tombstones::Tombstones;
use crate::snapshot::format;
use crate::snapshot::plan::publish::SegmentPlan;
use crate::snapshot::plan::trust::{self, MissingDir, WrittenModes};
use crate::snapshot::segments::{SegmentName, SEGMENT_TEMP_MARKER};
use crate::wire::stored::EntryMap;

use super::{IoWorker, Operation, WriteReport};

impl IoWorker {
    pub(super) fn publish(
        &mut self,
        own: &EntryMap,
        used: &EntryMap,
        own_tombstones: &Tombstones,
        all_tombstones: Arc<Tombstones>,
    ) -> Result<WriteReport> {
        if !self.own.loaded {
            return Err(Error::SharedDirUnavailable(
                "this node's published segments have not been read yet".into(),
            ));
        }
        let started = Instant::now();
        self.own.prune(all_tombstones);
        self.prune_pending_blobs(own);
        let node = self.node().to_owned();
        let Some(plan) = self
            .own
            .plan_publish(&node, own, used, own_tombstones, &self.not_ours)
        else {
            // No segment is due, but blobs may be: pending ones, or (first in a run) any
            // this node's contributions name that the shared directory lacks.
            if self.blobs_due() {
                self.check_segment_dir(Operation::Write)?;
                self.publish_blobs(own, false);
            }
            return Ok(WriteReport {
                path: self.segment_dir(),
                wrote: false,
                bytes: 0,
                published: self.own.published.len(),
            });
        };
        let path = self.segment_dir().join(plan.segment.file_name());
        // The blobs its entries name go in first: a reader that finds the segment can fetch
        // them. One that cannot be published is reported and retried; the segment goes out.
        let names_blobs = plan
            .entries
            .iter()
            .any(|e| !e.result().artifacts.is_empty());
        if names_blobs || self.blobs_due() {
            if let Err(error) = self.check_segment_dir(Operation::Write) {
                self.own.unreserve();
                return Err(error);
            }
            let entries = if self.blobs_seeded {
                &plan.entries
            } else {
                own
            };
            self.publish_blobs(entries, false);
        }
        // Recorded before it exists, so a crash between the two never leaves a segment of
        // this node that its record does not know.
        if let Err(error) = self.write_own_record() {
            self.own.unreserve();
            return Err(error);
        }
        let bytes = match self.write_segment(&plan) {
            Ok(bytes) => bytes,
            Err(error) => {
                // Another user's file of that name is no other writer of this node: the next
                // listing has it, and the next publish takes another name.
                let name_taken = matches!(&error, Error::SegmentNameTaken(_))
                    && !self.held_by_another_user(&plan.segment);
                if name_taken {
                    self.shared
                        .counters
                        .name_conflicts
                        .fetch_add(1, Ordering::Relaxed);
                }
                if self.own.not_written(name_taken) {
                    tracing::warn!(
                        file = ?plan.segment.file_name(),
                        node = self.node(),
                        "another writer uses this node's name (a second daemon with the same \
                         --node-name, or an impostor); numbering goes past its segments and \
                         compaction stops"
                    );
                }
                return Err(error);
            }
        };
        // A sweep may have renamed a blob away between the check above and the link: the
        // segment now names it, so it goes in again.
        if names_blobs {
            if let Some(relinked @ 1..) = self.publish_blobs(&plan.entries, true) {
                tracing::info!(
                    relinked,
                    "blobs a sweep had just collected are linked in again"
                );
            }
        }
        let entries = plan.entries.len();
        let uses = plan.used.len();
        self.own.written(plan);
        self.shared
            .counters
            .last_uses_published
            .fetch_add(uses as u64, Ordering::Relaxed);
        self.shared.wrote(&path);
        tracing::debug!(
            path = %path.display(),
            entries,
            uses,
            bytes,
            elapsed = ?started.elapsed(),
            "segment written"
        );
        if self
            .own
            .compaction_due(self.shared.settings.compact_segments, &self.not_ours)
        {
            self.compact(own);
        }
        Ok(WriteReport {
            path,
            wrote: true,
            bytes,
            published: self.own.published.len(),
        })
    }

    /// Folds this node's segments into one covering all their sequence numbers. The
    /// compacted segment is linked in before any old one is removed, so a reader always
    /// finds every sequence number it has not read in some segment.
    /// It holds each entry with its last use as `own` (the own contributions) knows it now.
    fn compact(&mut self, own: &EntryMap) {
        let node = self.node().to_owned();
        let Some(plan) = self.own.plan_compaction(&node, own, &self.not_ours) else {
            return;
        };
        if let Err(error) = self.write_own_record() {
            tracing::debug!(%error, "compaction not recorded; the segments stay as they are");
            self.own.compaction_unrecorded(&plan);
            return;
        }
        if let Err(error) = self.write_segment(&plan) {
            tracing::debug!(%error, "compaction failed; the segments stay as they are");
            return;
        }
        for old in self.own.compacted(&plan) {
            let path = self.segment_dir().join(old.file_name());
            if let Err(error) = fs::remove_file(&path) {
                // The next load removes what the compacted segment covers.
                tracing::debug!(path = ?path, %error, "old segment not removed");
            }
        }
        tracing::info!(
            segment = %plan.segment.file_name(),
            entries = plan.entries.len(),
            "compacted this node's segments"
        );
        if let Err(error) = self.write_own_record() {
            // The record still lists the old names: harmless, they are gone.
            tracing::debug!(%error, "compaction's record not updated");
        }
        self.shared
            .counters
            .compactions
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Writes one segment by temp file and link; returns its bytes.
    fn write_segment(&self, plan: &SegmentPlan) -> Result<u64> {
        let segment = &plan.segment;
        let dir = self.segment_dir();
        self.check_segment_dir(Operation::Write)?;
        let key = self.shared.settings.key.clone();
        let temp_path = dir.join(temp_file_name(self.node()));
        let path = dir.join(segment.file_name());
        let write = |out: &mut dyn Write| {
            let extras = format::SegmentExtras {
                used: Some(&plan.used),
                tombstones: &plan.tombstones,
            };
            format::write_segment_with(
                out,
                self.node(),
                (segment.first, segment.last),
                unix_now_ms(),
                &plan.entries,
                extras,
                key.as_ref(),
            )
        };
        match self.write_temp_then_link(&dir, &temp_path, &path, write) {
            Ok(bytes) => Ok(bytes),
            Err((what, error)) => {
                if what != "creating" {
                    // Best effort: a temp file left behind is removed after an hour anyway.
                    let _ = fs::remove_file(&temp_path);
                }
                if what == "linking" && error.kind() == io::ErrorKind::AlreadyExists {
                    return Err(Error::SegmentNameTaken(segment.file_name()));
                }
                let at = if what == "linking" { &path } else { &temp_path };
                Err(self.failed(Operation::Write, what, at, &error))
            }
        }
    }

    /// The steps of one write; an error names the step that failed.
    fn write_temp_then_link(
        &self,
        dir: &Path,
        temp_path: &Path,
        path: &Path,
        write: impl FnOnce(&mut dyn Write) -> serde_json::Result<()>,
    ) -> Result<u64, (&'static str, io::Error)> {
        let fsync = self.shared.settings.fsync;
        let mode = self.segment_mode();
        // Exactly the written mode, whatever the umask; else 0644 under the umask.
        let options = TempOptions {
            mode: Some(mode.unwrap_or(0o644)),
            exact_mode: mode.is_some(),
            nofollow: true,
            append: false,
            replace_stale: false,
        };
        let create = || TempFile::create(temp_path, options);
        let mut temp = match create() {
            // The segment directory is made by the first load; it may not have been
            // possible then (read-only, full) or it was removed since.
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                if self.missing_segment_dir() == MissingDir::LeaveToAdmin {
                    return Err(("creating", error));
                }
                fs::create_dir_all(dir).map_err(|e| ("creating", e))?;
                create()
            }
            opened => opened,
        }
        .map_err(|e| ("creating", e))?;
        let mut out = BufWriter::with_capacity(
            1 << 20,
            CountingWriter {
                inner: temp.file(),
                bytes: 0,
                total: &self.shared.counters.bytes_written,
            },
        );
        write(&mut out).map_err(|e| ("writing", io::Error::from(e)))?;
        let counted = out.into_inner().map_err(|e| ("writing", e.into_error()))?;
        let bytes = counted.bytes;
        let durability = if fsync {
            Durability::All
        } else {
            Durability::None
        };
        temp.sync(durability).map_err(|e| ("syncing", e))?;
        // Linked in, not renamed: a rename would silently replace a segment another writer
        // of this name put there; a link fails instead (atomic on NFS too).
        match temp.link_as(path) {
            Ok(()) => {}
            Err(error) if link_unsupported(&error) => {
                // A filesystem without hard links (some FUSE and object-store mounts): look,
                // then rename. A second writer of this name racing inside that window could
                // still be replaced; every other case is caught.
                if fs::symlink_metadata(path).is_ok() {
                    return Err(("linking", io::Error::from(io::ErrorKind::AlreadyExists)));
                }
                temp.rename_over(path).map_err(|e| ("renaming", e))?;
            }
            Err(error) => return Err(("linking", error)),
        }
        if fsync {
            atomic::sync_dir(dir).map_err(|e| ("syncing the directory of", e))?;
        }
        Ok(bytes)
    }
}

impl IoWorker {
    /// The modes of what this daemon writes into the shared directory (`trust::written_modes`).
    pub(super) fn written_modes(&self) -> Option<WrittenModes> {
        trust::written_modes(self.shared_by_users.get(), self.shared.settings.public)
    }

    /// The mode of a new segment: see `written_modes`; `None`, 0644 under the umask.
    fn segment_mode(&self) -> Option<u32> {
        self.written_modes().map(|modes| modes.file)
    }

    /// Whether the file that took `segment`'s name is another user's (by its owner, `lstat`).
    fn held_by_another_user(&self, segment: &SegmentName) -> bool {
        matches!(
            self.judge_segment_owner(segment),
            Ok(Some(Err(
                Error::OtherUsersFile(_) | Error::Unauthenticated(_)
            )))
        )
    }
}

/// `link(2)` refused because the filesystem has no hard links, not because of the name.
fn link_unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EPERM | libc::EOPNOTSUPP | libc::EXDEV | libc::EMLINK | libc::ENOSYS)
    )
}

/// `.<node>.seg.tmp.<pid>.<unique>`: hidden, so readers never take it for a segment, and
/// unique per writer.
fn temp_file_name(node: &str) -> String {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!(
        ".{node}{SEGMENT_TEMP_MARKER}{}.{nanos:08x}{sequence:x}",
        std::process::id()
    )
}

/// Counts the bytes that reach the file, so the size is known without another stat.
struct CountingWriter<'a> {
    inner: &'a mut File,
    bytes: u64,
    total: &'a AtomicU64,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.bytes += written as u64;
        self.total.fetch_add(written as u64, Ordering::Relaxed);
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
