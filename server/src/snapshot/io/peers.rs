//! Reading other nodes' segments: each node's cursor (`plan::peers`) says what to read
//! next; a segment that proves no writer is set aside as if absent, a damaged one is passed
//! over, a gap is known only before a trusted writer's segment (its owner looked at first,
//! without a read), and a load stops starting new reads once its budget is spent.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::model::entry::Origin;
use crate::snapshot::plan::peers::{GapVerdict, Step};
use crate::snapshot::plan::trust;
use crate::snapshot::segments::{NodeSegments, SegmentName};

use super::merged;
use super::{IoWorker, LoadReport, LoadedFile, Operation, Undo, LOAD_BUDGET};

impl IoWorker {
    /// Reads the segments of `node` this reader has not read yet, in order. Answers whether
    /// it read through every one listed (no budget spent, no read failed, no gap waited on).
    pub(super) fn read_new_segments(
        &mut self,
        node: &str,
        listed: &NodeSegments,
        started: Instant,
        report: &mut LoadReport,
    ) -> bool {
        let mut caught_up = false;
        let mut filtered = self.rejected.filter(listed);
        let mut cursor = match self.cursors.get(node) {
            Some(cursor) => *cursor,
            // First listed this run: on from where the state directory says it was merged.
            None => self
                .resume_from_record(node, filtered.as_ref().unwrap_or(listed))
                .unwrap_or_default(),
        };
        loop {
            if started.elapsed() > LOAD_BUDGET {
                break;
            }
            let candidates = filtered.as_ref().unwrap_or(listed);
            let mut across = None;
            let segment: &SegmentName = match cursor.step(candidates) {
                Step::Read(segment) => segment,
                Step::Done => {
                    caught_up = true;
                    break;
                }
                Step::Restarted { read_through } => {
                    self.merged.moved(node, cursor.read_through);
                    tracing::warn!(
                        node,
                        read_through,
                        "a node's segments restarted numbering; reading them from the start"
                    );
                    continue;
                }
                Step::Gap { past } => {
                    match self.judge_segment_owner(past) {
                        // Gone since the listing: look again next pass.
                        Ok(None) => break,
                        Ok(Some(Err(not_trusted))) => {
                            // No gap at all: another user's file, as if it were not listed.
                            let path = self.segment_dir().join(past.file_name());
                            self.skipped(&path, node, cursor.trusted_name, &not_trusted, None);
                            self.rejected.insert(past);
                            filtered = self.rejected.filter(listed);
                            continue;
                        }
                        Ok(Some(Ok(()))) => {}
                        Err(error) => {
                            let path = self.segment_dir().join(past.file_name());
                            let _ = self.failed(Operation::Load, "checking", &path, &error);
                            break;
                        }
                    }
                    match cursor.gap_before_trusted(past) {
                        GapVerdict::Wait => break,
                        GapVerdict::ReadAcross {
                            missing_from,
                            missing_to,
                        } => {
                            across = Some((missing_from, missing_to));
                            past
                        }
                    }
                }
            };
            let path = self.segment_dir().join(segment.file_name());
            let (version, parsed) = match self.read_segment(segment) {
                Ok(Some(read)) => read,
                // Removed by a compaction after the listing: the compacted segment is in
                // place; the next listing finds it.
                Ok(None) => break,
                Err(error) if error.kind() == io::ErrorKind::NotFound => break,
                Err(error) => {
                    let _ = self.failed(Operation::Load, "reading", &path, &error);
                    break;
                }
            };
            if trust::proves_no_writer(&parsed) {
                // Not a segment of this node's at all: as if it were not there.
                let _ = self.accept(&path, version, parsed, cursor.trusted_name);
                self.rejected.insert(segment);
                filtered = self.rejected.filter(listed);
                continue;
            }
            if let Some((missing_from, missing_to)) = across {
                if self.warned_gaps.insert(node.to_owned()) {
                    tracing::warn!(
                        node,
                        missing_from,
                        missing_to,
                        "segments of a node are missing from the shared directory; read on past them"
                    );
                }
            }
            // A damaged segment is warned about once and passed over, like a damaged file.
            let before = cursor.read(segment);
            let place = match merged::read_segment(segment, version) {
                Some(read) => self.merged.read(node, cursor.read_through, read),
                None => self.merged.read_unproved(node),
            };
            if let Some(parsed) = self.accept(&path, version, parsed, true) {
                self.shared
                    .counters
                    .segments_loaded
                    .fetch_add(1, Ordering::Relaxed);
                report.files.push(LoadedFile {
                    name: segment.file_name(),
                    node: node.to_owned(),
                    origin: Origin::Learned,
                    entries: parsed.entries,
                    tombstones: parsed.tombstones,
                    used: parsed.used,
                    undo: Undo::Segment {
                        node: node.to_owned(),
                        read_through: before,
                        place,
                    },
                });
            }
        }
        self.cursors.insert(node.to_owned(), cursor);
        caught_up
    }
}
