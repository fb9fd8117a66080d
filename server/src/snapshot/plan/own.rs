//! What this node knows of its own segments. A node believes only what it wrote about
//! itself: the names of its own segments are recorded in its state directory
//! (`shared-segments.json`, `OwnRecord`) before each rename, and only recorded segments are
//! read as its own, compacted or removed. A segment that merely carries its name (an earlier
//! state directory, an impostor, a second daemon given the same name) is read like another
//! node's, warned about once and counted (`NotOurs`), and never deleted, adopted or
//! renumbered from.
//!
//! Here: the record, the first load's view of what this node published, and each later
//! listing reconciled with it (recorded segments that vanished, leftovers of an interrupted
//! compaction, segments under this name it did not write). Publishing and compaction are
//! `publish`.

use std::collections::HashSet;
use std::sync::Arc;

use crate::model::forget::{Tombstone, Tombstones};
use crate::model::merge::{merge_views, MergeOutcome};
use crate::snapshot::segments::{NodeSegments, SegmentName};
use crate::wire::stored::{EntryMap, StoredEntry};

/// What this node wrote to the shared directory, kept in its own state directory: the only
/// source of truth about its own segments.
#[derive(serde::Serialize, serde::Deserialize, Default, Debug, PartialEq, Eq)]
pub struct OwnRecord {
    pub node: String,
    pub shared_dir: String,
    pub next_seq: u64,
    pub segments: Vec<String>,
}

impl OwnRecord {
    /// The record as read, or an empty one when it was written for another node name or
    /// another shared directory: what it lists is not this node's there.
    pub fn for_node(self, node: &str, shared_dir: &str) -> OwnRecord {
        if self.node == node && self.shared_dir == shared_dir {
            self
        } else {
            OwnRecord::default()
        }
    }

    /// The segments this record lists among those listed: the only ones read as this node's
    /// own.
    pub fn recorded_among(&self, listed: &NodeSegments) -> NodeSegments {
        let recorded: HashSet<&str> = self.segments.iter().map(String::as_str).collect();
        NodeSegments::new(
            listed
                .as_slice()
                .iter()
                .filter(|s| recorded.contains(s.file_name().as_str()))
                .cloned()
                .collect(),
        )
    }
}

/// What the first load read from this node's recorded segments.
#[derive(Default)]
pub struct OwnRead {
    /// Best entry per key that the segments hold (by the one merge rule): what is published.
    pub published: EntryMap,
    /// Tombstones of this node's Forgets that its segments hold.
    pub published_tombstones: Tombstones,
    /// Entries the segments hold, superseded ones included.
    pub entries_in_segments: usize,
    /// Every entry and tombstone read, for the store (as this node's own again).
    pub entries: Vec<StoredEntry>,
    pub tombstones: Vec<Tombstone>,
}

impl OwnRead {
    /// Takes in one own segment's entries and tombstones.
    pub fn absorb(&mut self, entries: Vec<StoredEntry>, tombstones: Vec<Tombstone>) {
        self.entries_in_segments += entries.len();
        for tombstone in tombstones {
            self.published_tombstones.insert(tombstone.clone());
            self.tombstones.push(tombstone);
        }
        for entry in entries {
            let best = self
                .published
                .get_view(&entry.key())
                .map(StoredEntry::result);
            if merge_views(best, entry.result()) == MergeOutcome::Replace {
                self.published.insert(entry.clone());
            }
            self.entries.push(entry);
        }
    }
}

/// This node's own segments, as far as its writer knows them.
#[derive(Default)]
pub struct OwnSegments {
    /// Listed and read once since start.
    pub loaded: bool,
    pub segments: Vec<SegmentName>,
    pub next_seq: u64,
    /// Best entry per key that the segments hold: what is published.
    pub published: EntryMap,
    /// Tombstones of this node's Forgets that its segments hold.
    pub published_tombstones: Tombstones,
    /// The tombstones `published` was last pruned with.
    pub pruned_with: Option<Arc<Tombstones>>,
    /// Entries the segments hold, superseded ones included.
    pub entries_in_segments: usize,
    /// Another writer uses this node's name: compaction would hide its segments.
    pub name_conflict: bool,
    /// Segments this node wrote vanished: the next publish holds everything and covers the
    /// numbers from this one on (`plan_publish`).
    pub republish_from: Option<u64>,
}

/// The number this node publishes next: after everything its record says it used, after
/// every segment it wrote, and after everything listed under its name, so no segment of
/// another writer of the name is overwritten (names past `MAX_SEQ` never parse). Never 0.
pub fn next_seq(record_next_seq: u64, mine: &NodeSegments, listed: &NodeSegments) -> u64 {
    [
        record_next_seq,
        mine.max_last().map_or(0, |last| last + 1),
        listed.max_last().map_or(0, |last| last + 1),
        1,
    ]
    .into_iter()
    .max()
    .unwrap_or(1)
}

impl OwnSegments {
    /// After the first load: the recorded segments that are listed (`mine`) and what they
    /// held. Also hands back every entry and tombstone read, for the store.
    pub fn first_load(
        record: &OwnRecord,
        mine: &NodeSegments,
        listed: &NodeSegments,
        read: OwnRead,
    ) -> (OwnSegments, Vec<StoredEntry>, Vec<Tombstone>) {
        let own = OwnSegments {
            loaded: true,
            next_seq: next_seq(record.next_seq, mine, listed),
            segments: mine.as_slice().to_vec(),
            published: read.published,
            published_tombstones: read.published_tombstones,
            pruned_with: None,
            entries_in_segments: read.entries_in_segments,
            name_conflict: false,
            republish_from: None,
        };
        (own, read.entries, read.tombstones)
    }

    /// The record of these segments, as the state directory keeps it.
    pub fn record(&self, node: &str, shared_dir: &str) -> OwnRecord {
        OwnRecord {
            node: node.to_owned(),
            shared_dir: shared_dir.to_owned(),
            next_seq: self.next_seq,
            segments: self.segments.iter().map(SegmentName::file_name).collect(),
        }
    }

    /// Only this node removes its own segments, and it updates its record first: a recorded
    /// segment missing from `listed` was removed by someone else (`v2/` wiped, files deleted
    /// by hand). Forgets those, and that anything is published, entries and tombstones alike,
    /// so the next publish holds it all again: a node that joins later still gets every
    /// contribution of this one, and every Forget made here. That publish covers the numbers
    /// from the lowest one recorded on (`republish_from`), so the joining node reads it at
    /// once rather than waiting out a gap while it serves what the Forgets removed.
    /// Returns how many vanished (the record must then be written again).
    pub fn forget_vanished(&mut self, listed: &NodeSegments) -> usize {
        let lowest = self.segments.iter().map(|s| s.first).min();
        let before = self.segments.len();
        // The listing is sorted: a binary search per recorded segment.
        self.segments
            .retain(|s| listed.as_slice().binary_search(s).is_ok());
        let vanished = before - self.segments.len();
        if let (true, Some(lowest)) = (vanished > 0, lowest) {
            self.published = EntryMap::new();
            self.published_tombstones = Tombstones::default();
            self.entries_in_segments = 0;
            self.republish_from = Some(self.republish_from.map_or(lowest, |from| from.min(lowest)));
        }
        vanished
    }

    /// Recorded segments that another recorded one covers: left by a compaction that was
    /// interrupted after its rename. The I/O removes them, then calls `removed`.
    pub fn leftovers(&self, listed: &NodeSegments) -> Vec<SegmentName> {
        let recorded: HashSet<&SegmentName> = self.segments.iter().collect();
        let mine = NodeSegments::new(
            listed
                .as_slice()
                .iter()
                .filter(|s| recorded.contains(s))
                .cloned()
                .collect(),
        );
        mine.covered().into_iter().cloned().collect()
    }

    /// Leftovers that are gone now (removed, or found missing); `true` when the record must
    /// be written again.
    pub fn removed(&mut self, removed: &[SegmentName]) -> bool {
        if removed.is_empty() {
            return false;
        }
        self.segments.retain(|s| !removed.contains(s));
        true
    }

    /// The range a compaction of the own segments would cover.
    pub fn range(&self) -> Option<(u64, u64)> {
        Some((
            self.segments.iter().map(|s| s.first).min()?,
            self.segments.iter().map(|s| s.last).max()?,
        ))
    }
}

/// Segments under this node's name that its record does not list, already read (or being
/// read) like another node's.
#[derive(Debug, Default)]
pub struct NotOurs {
    names: HashSet<String>,
}

impl NotOurs {
    /// Of `listed`, the segments under this node's name that `own` does not record and that
    /// were not read yet: read once each (and remembered from now on). Names no longer
    /// listed are forgotten, so the set stays as small as the listing.
    pub fn take_unread<'a>(
        &mut self,
        own: &OwnSegments,
        listed: &'a NodeSegments,
    ) -> Vec<&'a SegmentName> {
        let recorded: HashSet<String> = own.segments.iter().map(SegmentName::file_name).collect();
        let listed_names: HashSet<String> = listed
            .as_slice()
            .iter()
            .map(SegmentName::file_name)
            .collect();
        self.names.retain(|name| listed_names.contains(name));
        listed
            .as_slice()
            .iter()
            .filter(|segment| {
                let name = segment.file_name();
                !recorded.contains(&name) && self.names.insert(name)
            })
            .collect()
    }

    /// Read it again next time (its read failed, or nobody took its entries).
    pub fn forget(&mut self, name: &str) {
        self.names.remove(name);
    }

    /// Whether one of them lies inside `first..=last`, which a compaction (or a republish)
    /// of this node's own segments covering that range would hide from readers. Those of an
    /// earlier state directory lie before it: numbering went on after them.
    pub fn within(&self, (first, last): (u64, u64)) -> bool {
        self.names
            .iter()
            .filter_map(|name| SegmentName::parse(name))
            .any(|other| other.first <= last && first <= other.last)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::model::forget::{ForgetScope, RankScope};

    pub fn seg(first: u64, last: u64) -> SegmentName {
        SegmentName {
            node: "me".into(),
            first,
            last,
        }
    }

    pub fn listing(ranges: &[(u64, u64)]) -> NodeSegments {
        NodeSegments::new(ranges.iter().map(|&(f, l)| seg(f, l)).collect())
    }

    pub fn entry(problem: &str, time_us: f64) -> StoredEntry {
        let key = CacheKey {
            namespace: "n".into(),
            op: "gemm".into(),
            device: "d".into(),
            problem: problem.into(),
            rank: None,
        };
        let result = TunedResult {
            config: format!("{{\"t\":{time_us}}}"),
            time_us,
            tuned_by: "me/rank0".into(),
            tuned_at_unix_ms: 1,
            forget_epoch: 0,
            artifacts: Default::default(),
        };
        StoredEntry::new(&key, &result)
    }

    pub fn forget_all(stamp: u64) -> Tombstone {
        Tombstone {
            scope: ForgetScope {
                namespace: "n".into(),
                op: "gemm".into(),
                device: String::new(),
                problem: String::new(),
                rank: RankScope::Every,
            },
            stamp,
        }
    }

    fn record(node: &str, dir: &str, segments: &[SegmentName], next_seq: u64) -> OwnRecord {
        OwnRecord {
            node: node.into(),
            shared_dir: dir.into(),
            next_seq,
            segments: segments.iter().map(SegmentName::file_name).collect(),
        }
    }

    #[test]
    fn a_record_counts_only_for_its_own_node_and_shared_directory() {
        let written = record("me", "/shared", &[seg(1, 1)], 2);
        assert_eq!(
            record("me", "/shared", &[seg(1, 1)], 2).for_node("me", "/shared"),
            written
        );
        for (node, dir) in [("other", "/shared"), ("me", "/elsewhere")] {
            assert_eq!(
                record("me", "/shared", &[seg(1, 1)], 2).for_node(node, dir),
                OwnRecord::default(),
                "{node} {dir}"
            );
        }
    }

    #[test]
    fn only_recorded_segments_are_this_nodes_and_numbering_goes_past_every_listed_one() {
        let record = record("me", "/s", &[seg(1, 1), seg(2, 2), seg(3, 3)], 4);
        // 3 vanished; 7 is under this name but not recorded (an impostor, a second daemon).
        let listed = listing(&[(1, 1), (2, 2), (7, 7)]);
        let mine = record.recorded_among(&listed);
        assert_eq!(mine.as_slice(), &[seg(1, 1), seg(2, 2)]);
        assert_eq!(next_seq(record.next_seq, &mine, &listed), 8);
        assert_eq!(next_seq(4, &mine, &listing(&[(1, 1), (2, 2)])), 4);
        assert_eq!(next_seq(0, &mine, &mine), 3);
        assert_eq!(next_seq(0, &listing(&[]), &listing(&[])), 1, "never 0");

        let mut read = OwnRead::default();
        // p1 three times: the second is faster than the first, the third slower.
        read.absorb(vec![entry("p1", 5.0), entry("p2", 1.0)], vec![]);
        read.absorb(vec![entry("p1", 2.0)], vec![forget_all(9)]);
        read.absorb(vec![entry("p1", 3.0)], vec![]);
        let (own, entries, tombstones) = OwnSegments::first_load(&record, &mine, &listed, read);
        assert!(own.loaded);
        assert_eq!((own.next_seq, own.segments.len()), (8, 2));
        assert_eq!(own.entries_in_segments, 4);
        assert_eq!(own.published.len(), 2, "the best entry per key");
        let p1 = own
            .published
            .iter()
            .find(|e| e.key().problem == "p1")
            .unwrap();
        assert_eq!(
            p1.result().time_us,
            2.0,
            "the faster one, by the merge rule"
        );
        assert_eq!(own.published_tombstones.len(), 1);
        assert_eq!((entries.len(), tombstones.len()), (4, 1));
        assert_eq!(
            own.record("me", "/s"),
            self::record("me", "/s", &[seg(1, 1), seg(2, 2)], 8)
        );
    }

    #[test]
    fn a_recorded_segment_that_vanished_makes_everything_unpublished() {
        let mut tombstones = Tombstones::default();
        tombstones.insert(forget_all(7));
        let mut own = OwnSegments {
            loaded: true,
            segments: vec![seg(2, 2), seg(3, 3)],
            next_seq: 4,
            published: [entry("p1", 1.0)].into_iter().collect(),
            published_tombstones: tombstones,
            entries_in_segments: 1,
            ..OwnSegments::default()
        };
        assert_eq!(own.forget_vanished(&listing(&[(2, 2), (3, 3), (5, 5)])), 0);
        assert_eq!(own.published.len(), 1, "nothing vanished, nothing to redo");
        assert_eq!(own.published_tombstones.len(), 1);
        assert_eq!(own.republish_from, None);
        assert_eq!(own.forget_vanished(&listing(&[(3, 3)])), 1);
        assert_eq!(own.segments, vec![seg(3, 3)]);
        assert!(own.published.is_empty());
        assert!(
            own.published_tombstones.is_empty(),
            "the Forgets are published again too"
        );
        assert_eq!(own.entries_in_segments, 0);
        assert_eq!(own.next_seq, 4, "numbers are never taken again");
        assert_eq!(
            own.republish_from,
            Some(2),
            "from the lowest recorded number"
        );
        // Before that republish, the rest vanishes too: still from 2, not from 3.
        assert_eq!(own.forget_vanished(&listing(&[])), 1);
        assert_eq!(own.republish_from, Some(2));
    }

    #[test]
    fn leftovers_are_recorded_segments_a_recorded_compaction_covers() {
        let own = OwnSegments {
            segments: vec![seg(1, 1), seg(2, 2), seg(1, 3), seg(4, 4)],
            ..OwnSegments::default()
        };
        // 5..5 is not recorded: it covers nothing of ours. 1..9 is not ours: never a reason
        // to remove ours.
        let listed = listing(&[(1, 1), (2, 2), (1, 3), (4, 4), (1, 9)]);
        assert_eq!(own.leftovers(&listed), vec![seg(1, 1), seg(2, 2)]);
        let mut own = own;
        assert!(!own.removed(&[]));
        assert!(own.removed(&[seg(1, 1)]));
        assert_eq!(own.segments, vec![seg(2, 2), seg(1, 3), seg(4, 4)]);
        assert_eq!(own.range(), Some((1, 4)));
        assert_eq!(OwnSegments::default().range(), None);
    }

    #[test]
    fn segments_under_this_name_it_did_not_write_are_read_once_each() {
        let own = OwnSegments {
            segments: vec![seg(1, 1)],
            ..OwnSegments::default()
        };
        let mut not_ours = NotOurs::default();
        let listed = listing(&[(1, 1), (2, 2), (3, 3)]);
        assert_eq!(
            not_ours.take_unread(&own, &listed),
            vec![&seg(2, 2), &seg(3, 3)]
        );
        assert!(not_ours.take_unread(&own, &listed).is_empty(), "read once");
        not_ours.forget(&seg(3, 3).file_name());
        assert_eq!(not_ours.take_unread(&own, &listed), vec![&seg(3, 3)]);
        assert!(not_ours.within((3, 9)) && not_ours.within((1, 2)));
        assert!(!not_ours.within((4, 9)));
        // Gone from the listing: forgotten, and read again should it come back.
        assert!(not_ours.take_unread(&own, &listing(&[(1, 1)])).is_empty());
        assert!(!not_ours.within((1, 9)));
        assert_eq!(not_ours.take_unread(&own, &listed).len(), 2);
    }
}
