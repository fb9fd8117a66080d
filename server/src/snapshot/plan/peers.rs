//! Where this reader stands with each other node's segments: what it reads next, when a gap
//! in a node's numbers is waited out and when it is read across, a node that started
//! numbering again, and the segments set aside because they proved no writer.
//!
//! Only a trusted writer's segments move a cursor, make a gap or make a name trusted. A gap
//! is known by the segment past it: the I/O checks that segment's owner first (`lstat`, no
//! read), and another user's file there is set aside (`Rejected`) as if it were not listed,
//! so it is no gap at all. A name is trusted once this reader has read a segment of it from
//! a trusted owner, never because its cursor moved.

use std::collections::HashSet;

use crate::snapshot::segments::{Next, NodeSegments, SegmentName};

/// A gap before a trusted writer's segment that lasts this many listings is read across
/// (files removed by hand); a shorter one is a listing that raced a compaction.
pub const GAP_PASSES: u32 = 3;

/// Where this reader stands with one other node's segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCursor {
    /// Every sequence number up to this one is read.
    pub read_through: u64,
    /// Listings in a row that showed the same gap after `read_through`, before a trusted
    /// writer's segment.
    pub gap_passes: u32,
    /// A segment of this node was read from a trusted owner (this run, or at the place the
    /// state directory recorded): another user's file under its name is squatting.
    pub trusted_name: bool,
}

/// What a reader does next with one node's listing.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// Read this segment, then call `read` with it.
    Read(&'a SegmentName),
    /// Nothing more this pass: up to date.
    Done,
    /// Every segment ends before what was read: the node's segments were removed and it
    /// started numbering again. The cursor starts from 0; look again.
    Restarted { read_through: u64 },
    /// Segments lie past `read_through` but none holds the number after it; `past` is the one
    /// a reader would go on with. Check who owns it: another user's file is set aside
    /// (`Rejected`) and the step taken again; a trusted writer's makes this a gap
    /// (`gap_before_trusted`).
    Gap { past: &'a SegmentName },
}

/// What to do about a gap before a trusted writer's segment.
#[derive(Debug, PartialEq, Eq)]
pub enum GapVerdict {
    /// It may still close (a listing that raced a compaction): nothing more this pass.
    Wait,
    /// It lasted `GAP_PASSES` listings: read the segment past it. The cursor moves past the
    /// gap only if that segment proves its writer (`read`).
    ReadAcross { missing_from: u64, missing_to: u64 },
}

impl NodeCursor {
    pub fn step<'a>(&mut self, candidates: &'a NodeSegments) -> Step<'a> {
        match candidates.next_to_read(self.read_through) {
            Next::UpToDate => {
                self.gap_passes = 0;
                Step::Done
            }
            Next::Read(segment) => Step::Read(segment),
            Next::Restarted => {
                let read_through = self.read_through;
                self.read_through = 0;
                Step::Restarted { read_through }
            }
            Next::Gap => match first_after(candidates, self.read_through) {
                Some(past) => Step::Gap { past },
                None => Step::Done,
            },
        }
    }

    /// The segment past the gap (`Step::Gap`) is a trusted writer's: one more listing with
    /// this gap.
    pub fn gap_before_trusted(&mut self, past: &SegmentName) -> GapVerdict {
        self.gap_passes = self.gap_passes.saturating_add(1);
        if self.gap_passes < GAP_PASSES {
            return GapVerdict::Wait;
        }
        GapVerdict::ReadAcross {
            missing_from: self.read_through + 1,
            missing_to: past.first - 1,
        }
    }

    /// `segment` was read from a trusted owner (or found damaged, which is passed over like a
    /// damaged file); returns where the cursor stood before, to go back to if its entries are
    /// not taken.
    pub fn read(&mut self, segment: &SegmentName) -> u64 {
        self.trusted_name = true;
        self.gap_passes = 0;
        std::mem::replace(&mut self.read_through, segment.last)
    }

    /// Goes back to `read_through` (a load whose entries nobody took).
    pub fn undo(&mut self, read_through: u64) {
        self.read_through = self.read_through.min(read_through);
    }
}

/// The segment a reader goes on with past `read_through` when none holds the number after it:
/// the one starting first, the longest of those.
fn first_after(candidates: &NodeSegments, read_through: u64) -> Option<&SegmentName> {
    let sorted = candidates.as_slice();
    let start = sorted.partition_point(|s| s.first <= read_through);
    let first = sorted.get(start)?.first;
    let end = start + sorted[start..].partition_point(|s| s.first == first);
    sorted.get(end - 1)
}

/// Segments that proved no writer or disagree with their name: treated as absent, so a forged
/// name can never make a reader skip the real segments it claims to cover.
#[derive(Debug, Default)]
pub struct Rejected {
    names: HashSet<String>,
}

impl Rejected {
    pub fn insert(&mut self, segment: &SegmentName) {
        self.names.insert(segment.file_name());
    }

    /// Forgets names no longer listed, so the set stays as small as the listing.
    pub fn keep_only<'a>(&mut self, listed: impl IntoIterator<Item = &'a NodeSegments>) {
        if self.names.is_empty() {
            return;
        }
        let listed: HashSet<String> = listed
            .into_iter()
            .flat_map(|segments| segments.as_slice().iter().map(SegmentName::file_name))
            .collect();
        self.names.retain(|name| listed.contains(name));
    }

    /// `listed` without the rejected segments; `None` when none of them is rejected (the
    /// usual case: no copy).
    pub fn filter(&self, listed: &NodeSegments) -> Option<NodeSegments> {
        let any = !self.names.is_empty()
            && listed
                .as_slice()
                .iter()
                .any(|s| self.names.contains(&s.file_name()));
        any.then(|| {
            NodeSegments::new(
                listed
                    .as_slice()
                    .iter()
                    .filter(|s| !self.names.contains(&s.file_name()))
                    .cloned()
                    .collect(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(first: u64, last: u64) -> SegmentName {
        SegmentName {
            node: "b".into(),
            first,
            last,
        }
    }

    fn listing(ranges: &[(u64, u64)]) -> NodeSegments {
        NodeSegments::new(ranges.iter().map(|&(f, l)| seg(f, l)).collect())
    }

    /// Steps until done, reading every segment offered, every writer trusted; the segments
    /// read, in order.
    fn read_all(cursor: &mut NodeCursor, listed: &NodeSegments) -> Vec<(u64, u64)> {
        let mut read = Vec::new();
        for _ in 0..100 {
            let segment = match cursor.step(listed) {
                Step::Read(segment) => segment,
                Step::Gap { past } => match cursor.gap_before_trusted(past) {
                    GapVerdict::Wait => return read,
                    GapVerdict::ReadAcross { .. } => past,
                },
                Step::Done => return read,
                Step::Restarted { .. } => continue,
            };
            read.push((segment.first, segment.last));
            cursor.read(segment);
        }
        panic!("the cursor never came to rest: {cursor:?}, read {read:?}");
    }

    #[test]
    fn a_reader_reads_each_new_segment_once_in_order() {
        let mut cursor = NodeCursor::default();
        assert!(!cursor.trusted_name);
        let listed = listing(&[(1, 1), (2, 2), (3, 3)]);
        assert_eq!(read_all(&mut cursor, &listed), vec![(1, 1), (2, 2), (3, 3)]);
        assert!(cursor.trusted_name);
        assert_eq!(read_all(&mut cursor, &listed), vec![]);
        let more = listing(&[(1, 1), (2, 2), (3, 3), (4, 4)]);
        assert_eq!(read_all(&mut cursor, &more), vec![(4, 4)]);
        // Undone: read again next time; never moved forward by an undo.
        cursor.undo(3);
        assert_eq!(read_all(&mut cursor, &more), vec![(4, 4)]);
        cursor.undo(9);
        assert_eq!(cursor.read_through, 4);
    }

    #[test]
    fn a_gap_before_a_trusted_segment_is_waited_out_then_read_across() {
        let mut cursor = NodeCursor::default();
        let torn = listing(&[(1, 1), (4, 4), (4, 6), (9, 9)]);
        assert_eq!(read_all(&mut cursor, &torn), vec![(1, 1)]);
        assert_eq!(cursor.gap_passes, 1);
        // Listings that may have raced a compaction: nothing is read across yet.
        for pass in 2..GAP_PASSES {
            let Step::Gap { past } = cursor.step(&torn) else {
                panic!("pass {pass}: no gap");
            };
            assert_eq!(past, &seg(4, 6), "the longest of those starting first");
            assert_eq!(cursor.gap_before_trusted(past), GapVerdict::Wait);
            assert_eq!(cursor.read_through, 1);
        }
        let Step::Gap { past } = cursor.step(&torn) else {
            panic!("no gap");
        };
        assert_eq!(
            cursor.gap_before_trusted(past),
            GapVerdict::ReadAcross {
                missing_from: 2,
                missing_to: 3
            }
        );
        // Not moved until the segment past the gap is read (and so proved its writer).
        assert_eq!(cursor.read_through, 1);
        cursor.read(past);
        assert_eq!((cursor.read_through, cursor.gap_passes), (6, 0));
        // The next gap is waited out afresh.
        assert_eq!(read_all(&mut cursor, &torn), vec![]);
        assert_eq!(cursor.gap_passes, 1);

        // A gap that closes (the compaction shows up) resets the count.
        let mut cursor = NodeCursor::default();
        let torn = listing(&[(1, 1), (4, 4)]);
        assert_eq!(read_all(&mut cursor, &torn), vec![(1, 1)]);
        assert_eq!(cursor.gap_passes, 1);
        let healed = listing(&[(1, 1), (1, 4)]);
        assert_eq!(read_all(&mut cursor, &healed), vec![(1, 4)]);
        assert_eq!(cursor.gap_passes, 0);
    }

    #[test]
    fn another_users_files_make_no_gap_move_no_cursor_and_trust_no_name() {
        // Another user's node: every segment is theirs, one after the other set aside.
        let listed = listing(&[(1, 1), (2, 2), (5, 9)]);
        let mut rejected = Rejected::default();
        let mut cursor = NodeCursor::default();
        for pass in 0..2 * GAP_PASSES {
            for _ in 0..10 {
                let candidates = rejected.filter(&listed);
                let candidates = candidates.as_ref().unwrap_or(&listed);
                match cursor.step(candidates) {
                    Step::Read(segment) | Step::Gap { past: segment } => rejected.insert(segment),
                    Step::Done => break,
                    other => panic!("pass {pass}: {other:?}"),
                }
            }
            assert_eq!(cursor, NodeCursor::default(), "pass {pass}");
        }
        // A trusted node with another user's file past its last segment: no gap either.
        let mut cursor = NodeCursor::default();
        let before = listing(&[(1, 1), (2, 2)]);
        assert_eq!(read_all(&mut cursor, &before), vec![(1, 1), (2, 2)]);
        let listed = listing(&[(1, 1), (2, 2), (16, 16)]);
        let mut rejected = Rejected::default();
        let Step::Gap { past } = cursor.step(&listed) else {
            panic!("no gap");
        };
        rejected.insert(past);
        let filtered = rejected.filter(&listed).unwrap();
        assert_eq!(cursor.step(&filtered), Step::Done);
        assert_eq!((cursor.read_through, cursor.gap_passes), (2, 0));
    }

    #[test]
    fn a_node_that_numbers_again_is_read_from_the_start() {
        let mut cursor = NodeCursor {
            read_through: 9,
            ..NodeCursor::default()
        };
        let again = listing(&[(1, 1), (2, 2)]);
        assert_eq!(cursor.step(&again), Step::Restarted { read_through: 9 });
        assert_eq!(read_all(&mut cursor, &again), vec![(1, 1), (2, 2)]);
        // All its segments gone: nothing to read, and a later first segment is read.
        let mut cursor = NodeCursor {
            read_through: 2,
            ..NodeCursor::default()
        };
        assert_eq!(read_all(&mut cursor, &listing(&[])), vec![]);
        assert_eq!(cursor.read_through, 0);
    }

    #[test]
    fn rejected_segments_are_as_if_absent_and_forgotten_once_unlisted() {
        let mut rejected = Rejected::default();
        let listed = listing(&[(1, 1), (1, 9), (2, 2)]);
        assert!(rejected.filter(&listed).is_none());
        // A forged "cover of everything" would make the reader skip 2.
        rejected.insert(&seg(1, 9));
        let filtered = rejected.filter(&listed).unwrap();
        let mut cursor = NodeCursor::default();
        assert_eq!(read_all(&mut cursor, &filtered), vec![(1, 1), (2, 2)]);
        assert!(rejected.filter(&listing(&[(3, 3)])).is_none());
        rejected.keep_only([&listing(&[(1, 1)])]);
        assert!(rejected.filter(&listed).is_none(), "still remembered");
    }
}
