//! This node's own segments on disk: the record of them in the state directory
//! (`shared-segments.json`), the first load that reads them back, each later listing
//! reconciled with them (vanished ones, an interrupted compaction's leftovers removed), and
//! the segments under this node's name it did not write, read like another node's. What
//! counts as its own is `plan::own`'s to say.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::fsx::atomic::{self, Durability, TempOptions, WholeFile};
use crate::model::entry::Origin;
use crate::snapshot::plan::own::{OwnRead, OwnRecord, OwnSegments};
use crate::snapshot::plan::trust;
use crate::snapshot::segments::{NodeSegments, SegmentName, SEGMENT_DIR};

use super::{IoWorker, LoadReport, LoadedFile, Operation, Undo};

/// The state-directory file that records which segments this node wrote.
const OWN_RECORD_FILE: &str = "shared-segments.json";

impl IoWorker {
    /// At the first load: what this node has published (every segment its state directory
    /// records that is listed, whatever lies between them), and its own contributions back.
    pub(super) fn load_own_segments(
        &mut self,
        listed: NodeSegments,
        report: &mut LoadReport,
    ) -> Result<()> {
        let record = self.read_own_record();
        let mine = record.recorded_among(&listed);
        // Leftovers of an interrupted compaction hold nothing the compaction does not.
        let covered: HashSet<&SegmentName> = mine.covered().into_iter().collect();
        let mut read = OwnRead::default();
        let mut used = Vec::new();
        for segment in mine.as_slice().iter().filter(|s| !covered.contains(s)) {
            let path = self.segment_dir().join(segment.file_name());
            let (version, parsed) = match self.read_segment(segment) {
                Ok(Some(read)) => read,
                // Removed since the listing: look again next pass.
                Ok(None) => return Ok(()),
                // Without every own segment the writer cannot know what it published, and
                // a compaction could drop what it did not read: fail, retry with backoff.
                Err(error) => return Err(self.failed(Operation::Load, "reading", &path, &error)),
            };
            if let Some(parsed) = self.accept(&path, version, parsed, true) {
                read.absorb(parsed.entries, parsed.tombstones);
                // Uses are no contributions: merged as learned, never counted as published.
                used.extend(parsed.used);
            }
        }
        let (own, entries, tombstones) = OwnSegments::first_load(&record, &mine, read);
        self.own = own;
        // Before the record is written: its numbering goes past trusted writers' segments
        // under this name, and past nobody else's.
        self.read_not_ours(&listed, report);
        self.write_own_record()?;
        if !entries.is_empty() || !tombstones.is_empty() || !used.is_empty() {
            tracing::info!(
                segments = self.own.segments.len(),
                entries = self.own.published.len(),
                "read this node's own published segments"
            );
            report.files.push(LoadedFile {
                name: format!("{SEGMENT_DIR}/{}.*", self.node()),
                node: self.node().to_owned(),
                origin: Origin::Own,
                entries,
                tombstones,
                used,
                undo: Undo::OwnSegments,
            });
        }
        Ok(())
    }

    /// A later listing of this node's segments: what recorded ones that vanished held is
    /// published again (`OwnSegments::forget_vanished`; the load tells the async side to
    /// publish now), leftovers of an interrupted compaction are removed.
    pub(super) fn reconcile_own(&mut self, listed: &NodeSegments) {
        let vanished = self.own.forget_vanished(listed);
        if vanished > 0 {
            self.own_vanished = true;
            tracing::warn!(
                missing = vanished,
                node = self.node(),
                "segments this node wrote are gone from the shared directory; publishing its \
                 contributions and Forgets again"
            );
            if let Err(error) = self.write_own_record() {
                tracing::debug!(%error, "record not updated; the next pass tries again");
            }
        }
        let mut removed = Vec::new();
        for leftover in self.own.leftovers(listed) {
            let path = self.segment_dir().join(leftover.file_name());
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = ?path, "removed a compacted segment");
                    removed.push(leftover);
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => removed.push(leftover),
                Err(error) => tracing::debug!(path = ?path, %error, "not removed"),
            }
        }
        if self.own.removed(&removed) {
            if let Err(error) = self.write_own_record() {
                tracing::debug!(%error, "record not updated; the next pass tries again");
            }
        }
    }

    /// Segments under this node's name that its record does not list: read once each like
    /// another node's (if they prove their writer), counted; never deleted, adopted or
    /// renumbered from. A trusted writer's (a second daemon with this name, an earlier state
    /// directory) is warned about once and numbering goes past it; another user's is
    /// squatting, reported as such (`skipped`), and only its name is not taken again.
    pub(super) fn read_not_ours(&mut self, listed: &NodeSegments, report: &mut LoadReport) {
        for segment in self.not_ours.take_unread(&self.own.segments, listed) {
            let name = segment.file_name();
            self.shared
                .counters
                .name_conflicts
                .fetch_add(1, Ordering::Relaxed);
            let path = self.segment_dir().join(&name);
            let (version, parsed) = match self.read_segment(segment) {
                Ok(Some(read)) => read,
                Ok(None) => continue,
                Err(error) => {
                    let _ = self.failed(Operation::Load, "reading", &path, &error);
                    self.not_ours.forget(&name);
                    continue;
                }
            };
            let trusted = !trust::proves_no_writer(&parsed);
            self.not_ours.judged(&name, trusted);
            if trusted && !std::mem::replace(&mut self.warned_not_ours, true) {
                tracing::warn!(
                    file = ?name,
                    node = self.node(),
                    "a segment under this node's name that this node did not write (an earlier \
                     state directory, or a second daemon with the same --node-name); read like \
                     another node's, never taken as this node's own (logged once; Stats \
                     snapshot_name_conflicts counts them)"
                );
            } else if trusted {
                tracing::debug!(file = ?name, "another segment under this node's name it did not write");
            }
            if let Some(parsed) = self.accept(&path, version, parsed, true) {
                report.files.push(LoadedFile {
                    name: name.clone(),
                    node: self.node().to_owned(),
                    origin: Origin::Learned,
                    entries: parsed.entries,
                    tombstones: parsed.tombstones,
                    used: parsed.used,
                    undo: Undo::NotOurs(name),
                });
            }
        }
        if self.own.go_past(self.not_ours.trusted_last()) {
            tracing::info!(
                next_seq = self.own.next_seq,
                "this node numbers its segments past another writer's under its name"
            );
        }
    }

    fn own_record_path(&self) -> PathBuf {
        self.shared.settings.state_dir.join(OWN_RECORD_FILE)
    }

    fn shared_dir_text(&self) -> String {
        self.dir().display().to_string()
    }

    /// The record of this node's own segments; empty when there is none yet, when it is
    /// damaged, or when it was written for another node name or shared directory.
    fn read_own_record(&self) -> OwnRecord {
        let path = self.own_record_path();
        let Ok(bytes) = fs::read(&path) else {
            return OwnRecord::default();
        };
        match serde_json::from_slice::<OwnRecord>(&bytes) {
            Ok(record) => record.for_node(self.node(), &self.shared_dir_text()),
            Err(error) => {
                tracing::warn!(path = ?path, %error, "the record of this node's segments is damaged; starting a new one");
                OwnRecord::default()
            }
        }
    }

    /// Writes the record (temp file, fsync, rename) in the state directory.
    pub(super) fn write_own_record(&self) -> Result<()> {
        let record = self.own.record(self.node(), &self.shared_dir_text());
        let path = self.own_record_path();
        let temp = path.with_extension("json.tmp");
        let write = || -> io::Result<()> {
            let bytes = serde_json::to_vec(&record).map_err(io::Error::from)?;
            let how = WholeFile {
                temp: &temp,
                options: TempOptions {
                    replace_stale: true,
                    ..TempOptions::default()
                },
                durability: Durability::All,
                sync_dir: true,
            };
            atomic::write_whole(&path, &bytes, how)
        };
        write().map_err(|error| Error::io("recording this node's segments in", &path, error))
    }
}
