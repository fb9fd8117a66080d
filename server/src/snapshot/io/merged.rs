//! The record of what this node has merged of other nodes' segments (`plan::merged`), in its
//! state directory as `shared-merged.json`: read by the I/O thread at its first load, each
//! remembered place checked against the listing before it is taken up; written by `write`,
//! which the async side runs off the runtime (`spawn_blocking`) once the journal is synced.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::fsx::atomic;
use crate::snapshot::plan::merged::{
    self, Ignored, MergedPlaces, MergedRecord, ReadSegment, SegmentStamp,
};
use crate::snapshot::plan::peers::NodeCursor;
use crate::snapshot::segments::{NodeSegments, SegmentName};
use crate::snapshot::shared_file::{self, FileVersion};
use crate::snapshot::Shared;
use crate::sync::lock;

use super::IoWorker;

const FILE: &str = "shared-merged.json";
/// A record past this size was not written by a daemon: a place takes at most about 200
/// bytes, so this holds `plan::merged::MAX_PEERS` of them.
const MAX_RECORD_BYTES: u64 = 256 << 20;

fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// How a segment read looks, for the record; `None` for a time no record can hold.
pub(super) fn read_segment(segment: &SegmentName, version: FileVersion) -> Option<ReadSegment> {
    Some(ReadSegment {
        first: segment.first,
        last: segment.last,
        bytes: version.size,
        mtime_ns: i64::try_from(version.mtime_ns).ok()?,
    })
}

impl IoWorker {
    /// The places the state directory remembers; none when there is no record, or it is
    /// damaged or another node's or directory's (said once: this runs once per start).
    pub(super) fn read_merged_record(&self) -> MergedPlaces {
        let path = path(&self.shared.settings.state_dir);
        let bytes = match read_bounded(&path, MAX_RECORD_BYTES) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return MergedPlaces::default(),
            Err(error) => {
                tracing::warn!(path = ?path, %error, "the record of merged segments is unreadable; every segment is read again");
                return MergedPlaces::default();
            }
        };
        let dir = self.dir().display().to_string();
        match MergedRecord::parse(&bytes, self.node(), &dir) {
            Ok(record) => {
                tracing::info!(
                    path = ?path,
                    nodes = record.peers.len(),
                    "reading other nodes' segments from where this node had merged them"
                );
                MergedPlaces::from_record(record)
            }
            Err(Ignored::Damaged(why)) => {
                tracing::warn!(path = ?path, "the record of merged segments is damaged ({why}); ignored, every segment is read again");
                MergedPlaces::default()
            }
            Err(Ignored::Foreign(why)) => {
                tracing::info!(path = ?path, "the record of merged segments is not this node's ({why}); ignored, every segment is read again");
                MergedPlaces::default()
            }
        }
    }

    /// At the first listing of `node` this run: its cursor from the remembered place, if
    /// that place still holds (`plan::merged::resume`).
    pub(super) fn resume_from_record(
        &mut self,
        node: &str,
        listed: &NodeSegments,
    ) -> Option<NodeCursor> {
        let place = self.merged.take_remembered(node)?;
        let segment_dir = self.segment_dir();
        let cursor = merged::resume(node, &place, listed, |segment| {
            let version = shared_file::version_of(&segment_dir.join(segment.file_name())).ok()?;
            Some(SegmentStamp {
                bytes: version.size,
                mtime_ns: i64::try_from(version.mtime_ns).ok()?,
            })
        });
        self.merged.resumed(node, place, cursor.is_some());
        match cursor {
            Some(cursor) => {
                self.shared
                    .counters
                    .peers_resumed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    node,
                    read_through = cursor.read_through,
                    "reading on from the recorded place"
                );
            }
            None => tracing::debug!(
                node,
                read_through = place.read_through,
                "the segment the recorded place stands on changed or is gone; reading from the start"
            ),
        }
        cursor
    }
}

/// The file's bytes, `None` when there is none; refused past `max` bytes.
fn read_bounded(path: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("over {max} bytes"),
        ));
    }
    Ok(Some(bytes))
}

/// Writes the record (blocking): a temporary file, synced when `sync`, renamed over the old
/// one, the directory synced. One write at a time (`Shared::merged_write`), so a write whose
/// pass was given up on and a later one never share the temporary file.
pub(in crate::snapshot) fn write(
    shared: &Shared,
    record: &MergedRecord,
    sync: bool,
) -> io::Result<()> {
    let _one_at_a_time = lock(&shared.merged_write);
    let state_dir = &shared.settings.state_dir;
    let target = path(state_dir);
    let temporary = state_dir.join(format!("{FILE}.tmp"));
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    atomic::write_whole(&target, &bytes, atomic::resume_point(&temporary, sync))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_record_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = path(dir.path());
        assert!(read_bounded(&path, 2).unwrap().is_none());
        std::fs::write(&path, b"{}").unwrap();
        assert_eq!(read_bounded(&path, 2).unwrap().unwrap(), b"{}");
        assert_eq!(
            read_bounded(&path, 1).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
