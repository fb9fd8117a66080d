//! What this node knows of its own segments. A node believes only what it wrote about
//! itself: the names of its own segments are recorded in its state directory
//! (`shared-segments.json`, `OwnRecord`) before each rename, and only recorded segments are
//! read as its own, compacted or removed. A segment that merely carries its name (an earlier
//! state directory, an impostor, a second daemon given the same name) is read like another
//! node's, warned about once and counted (`NotOurs`), and never deleted, adopted or
//! renumbered from.
//!
//! Another user's file under this node's name (in the `v2/` every user shares) is never read
//! and never numbered from: the node's numbering goes past every segment a trusted writer
//! put under its name, and past another user's only by name (`take_name`: a segment that
//! would take a name someone holds ends one number further), so nobody can push its numbers
//! out of range or make it leave a hole. What it published is every recorded segment's,
//! whatever lies between them: a restart publishes nothing again.
//!
//! Here: the record, the first load's view of what this node published, and each later
//! listing reconciled with it (recorded segments that vanished, leftovers of an interrupted
//! compaction), and the name of each segment it writes. The segments under this name it did
//! not write are `not_ours`; publishing and compaction are `publish`.

use std::collections::HashSet;
use std::sync::Arc;

use crate::model::forget::Tombstone;
use crate::model::merge::{merge_views, MergeOutcome};
use crate::model::tombstones::Tombstones;
use crate::snapshot::segments::{NodeSegments, SegmentName, MAX_SEQ};

use super::not_ours::NotOurs;
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
    /// `next_seq` before the last name was taken, for `unreserve`.
    pub before_reserve: u64,
}

/// The number this node publishes next: after everything its record says it used and after
/// every segment it wrote. Never 0. Segments of other writers under its name are gone past
/// once they are judged (`OwnSegments::go_past`).
pub fn next_seq(record_next_seq: u64, mine: &NodeSegments) -> u64 {
    [
        record_next_seq,
        mine.max_last().map_or(0, |last| last + 1),
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
        read: OwnRead,
    ) -> (OwnSegments, Vec<StoredEntry>, Vec<Tombstone>) {
        let next_seq = next_seq(record.next_seq, mine);
        let own = OwnSegments {
            loaded: true,
            next_seq,
            before_reserve: next_seq,
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

    /// Numbering goes on after `last`, the end of a trusted writer's segment under this
    /// node's name (an earlier state directory, a second daemon given the same name), so
    /// readers that read that far read what this node writes next. Returns whether it moved.
    pub fn go_past(&mut self, last: Option<u64>) -> bool {
        match last {
            Some(last) if last >= self.next_seq => {
                self.next_seq = last + 1;
                true
            }
            _ => false,
        }
    }

    /// Takes the name of a segment starting at `first` and ending at `min_last` or, where a
    /// file already holds that name (another user's in the `v2/` every user shares: readers
    /// set it aside), at the first number from `next_seq` on whose name is free; `next_seq`
    /// moves past it. A reader takes the longest segment starting where it stands, so this
    /// node's numbering keeps no hole. `None` past `MAX_SEQ` (a name no reader takes).
    pub fn take_name(
        &mut self,
        node: &str,
        first: u64,
        min_last: u64,
        not_ours: &NotOurs,
    ) -> Option<SegmentName> {
        self.before_reserve = self.next_seq;
        let mut last = min_last;
        loop {
            if last > MAX_SEQ {
                return None;
            }
            let name = SegmentName {
                node: node.to_owned(),
                first,
                last,
            };
            if !not_ours.holds(&name) && !self.segments.contains(&name) {
                self.next_seq = self.next_seq.max(last + 1);
                return Some(name);
            }
            last = if last < self.next_seq {
                self.next_seq
            } else {
                last + 1
            };
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::model::forget::{ForgetScope, RankScope};

    pub use super::super::not_ours::tests::{listing, seg};

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
        assert_eq!(next_seq(record.next_seq, &mine), 4);
        assert_eq!(next_seq(0, &mine), 3);
        assert_eq!(next_seq(0, &listing(&[])), 1, "never 0");

        let mut read = OwnRead::default();
        // p1 three times: the second is faster than the first, the third slower.
        read.absorb(vec![entry("p1", 5.0), entry("p2", 1.0)], vec![]);
        read.absorb(vec![entry("p1", 2.0)], vec![forget_all(9)]);
        read.absorb(vec![entry("p1", 3.0)], vec![]);
        let (mut own, entries, tombstones) = OwnSegments::first_load(&record, &mine, read);
        assert!(own.loaded);
        assert_eq!((own.next_seq, own.segments.len()), (4, 2));
        // 7 proved a trusted writer: numbering goes past it.
        assert!(own.go_past(Some(7)));
        assert!(!own.go_past(Some(7)) && !own.go_past(None));
        assert_eq!(own.next_seq, 8);
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
    fn another_users_names_are_only_not_taken_again_and_leave_no_hole() {
        let mut own = OwnSegments {
            loaded: true,
            segments: vec![seg(1, 1), seg(2, 2)],
            next_seq: 3,
            ..OwnSegments::default()
        };
        let mut not_ours = NotOurs::default();
        // Another user holds 3-3, and a name reaching the last number there is.
        let listed = listing(&[(1, 1), (2, 2), (3, 3), (4, MAX_SEQ)]);
        for segment in not_ours.take_unread(&own.segments, &listed) {
            let name = segment.file_name();
            not_ours.judged(&name, false);
        }
        assert!(not_ours.take_unread(&own.segments, &listed).is_empty());
        assert_eq!(
            not_ours.trusted_last(),
            None,
            "never numbered from, listed again or not"
        );
        assert!(!not_ours.within((1, MAX_SEQ)), "no compaction is held back");
        assert!(!own.go_past(not_ours.trusted_last()));
        // 3-3 is held: the segment starting at 3 ends at 4, which a reader at 2 takes first.
        assert_eq!(own.take_name("me", 3, 3, &not_ours), Some(seg(3, 4)));
        assert_eq!((own.next_seq, own.before_reserve), (5, 3));
        assert_eq!(own.take_name("me", 5, 5, &not_ours), Some(seg(5, 5)));
        // A compaction whose name is held ends at the next free number.
        own.segments = vec![seg(3, 4), seg(5, 5), seg(1, 1), seg(2, 2)];
        let mut held = NotOurs::default();
        let listed = listing(&[(1, 1), (2, 2), (3, 4), (5, 5), (1, 5)]);
        for segment in held.take_unread(&own.segments, &listed) {
            held.judged(&segment.file_name(), false);
        }
        assert_eq!(own.take_name("me", 1, 5, &held), Some(seg(1, 6)));
        assert_eq!(own.next_seq, 7);
        // Nothing past MAX_SEQ.
        let mut full = OwnSegments {
            next_seq: MAX_SEQ,
            ..OwnSegments::default()
        };
        let mut last = NotOurs::default();
        for segment in last.take_unread(&full.segments, &listing(&[(MAX_SEQ, MAX_SEQ)])) {
            last.judged(&segment.file_name(), false);
        }
        assert_eq!(full.take_name("me", MAX_SEQ, MAX_SEQ, &last), None);
    }
}
