//! Where this reader stands with each other node's segments: what it reads next, when a gap
//! in a node's numbers is waited out and when it is skipped, a node that started numbering
//! again, and the segments set aside because they proved no writer.

use std::collections::HashSet;

use crate::snapshot::segments::{Next, NodeSegments, SegmentName};

/// A gap in a node's segments that lasts this many listings is skipped (files removed by
/// hand); a shorter one is a listing that raced a compaction.
pub const GAP_PASSES: u32 = 3;

/// Where this reader stands with one other node's segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCursor {
    /// Every sequence number up to this one is read.
    pub read_through: u64,
    /// Listings in a row that showed the same gap after `read_through`.
    pub gap_passes: u32,
}

/// What a reader does next with one node's listing.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// Read this segment, then call `read` with it.
    Read(&'a SegmentName),
    /// Nothing more this pass: up to date, or a gap that may still close.
    Done,
    /// Every segment ends before what was read: the node's segments were removed and it
    /// started numbering again. The cursor starts from 0; look again.
    Restarted { read_through: u64 },
    /// The same gap over `GAP_PASSES` listings: files removed by hand. The cursor moved past
    /// it; look again.
    GapSkipped { missing_from: u64, missing_to: u64 },
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
            Next::Gap => {
                self.gap_passes += 1;
                if self.gap_passes < GAP_PASSES {
                    return Step::Done;
                }
                let resume = candidates
                    .as_slice()
                    .iter()
                    .map(|s| s.first)
                    .filter(|first| *first > self.read_through)
                    .min()
                    .unwrap_or(self.read_through + 1);
                let missing_from = self.read_through + 1;
                self.read_through = resume - 1;
                self.gap_passes = 0;
                Step::GapSkipped {
                    missing_from,
                    missing_to: resume - 1,
                }
            }
        }
    }

    /// Under a name this reader has read trusted segments of, another user's file is no
    /// other user's cache but a squatter's.
    pub fn trusts_name(&self) -> bool {
        self.read_through > 0
    }

    /// `segment` was read (or found damaged, which is passed over like a damaged file);
    /// returns where the cursor stood before, to go back to if its entries are not taken.
    pub fn read(&mut self, segment: &SegmentName) -> u64 {
        std::mem::replace(&mut self.read_through, segment.last)
    }

    /// Goes back to `read_through` (a load whose entries nobody took).
    pub fn undo(&mut self, read_through: u64) {
        self.read_through = self.read_through.min(read_through);
    }
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

    /// Steps until done, reading every segment offered; the segments read, in order.
    fn read_all(cursor: &mut NodeCursor, listed: &NodeSegments) -> Vec<(u64, u64)> {
        let mut read = Vec::new();
        for _ in 0..100 {
            match cursor.step(listed) {
                Step::Read(segment) => {
                    read.push((segment.first, segment.last));
                    cursor.read(segment);
                }
                Step::Done => return read,
                Step::Restarted { .. } | Step::GapSkipped { .. } => {}
            }
        }
        panic!("the cursor never came to rest: {cursor:?}, read {read:?}");
    }

    #[test]
    fn a_reader_reads_each_new_segment_once_in_order() {
        let mut cursor = NodeCursor::default();
        assert!(!cursor.trusts_name());
        let listed = listing(&[(1, 1), (2, 2), (3, 3)]);
        assert_eq!(read_all(&mut cursor, &listed), vec![(1, 1), (2, 2), (3, 3)]);
        assert!(cursor.trusts_name());
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
    fn a_gap_is_waited_out_for_a_few_listings_then_skipped() {
        let mut cursor = NodeCursor::default();
        let torn = listing(&[(1, 1), (4, 4)]);
        assert_eq!(read_all(&mut cursor, &torn), vec![(1, 1)]);
        // Listings that may have raced a compaction: nothing is skipped yet.
        for pass in 2..GAP_PASSES {
            assert_eq!(cursor.step(&torn), Step::Done, "pass {pass}");
            assert_eq!(cursor.read_through, 1);
        }
        assert_eq!(
            cursor.step(&torn),
            Step::GapSkipped {
                missing_from: 2,
                missing_to: 3
            }
        );
        assert_eq!(cursor.gap_passes, 0);
        assert_eq!(cursor.step(&torn), Step::Read(&seg(4, 4)));

        // A gap that closes (the compaction shows up) resets the count.
        let mut cursor = NodeCursor::default();
        assert_eq!(read_all(&mut cursor, &torn), vec![(1, 1)]);
        assert_eq!(cursor.gap_passes, 1);
        let healed = listing(&[(1, 1), (1, 4)]);
        assert_eq!(read_all(&mut cursor, &healed), vec![(1, 4)]);
        assert_eq!(cursor.gap_passes, 0);
    }

    #[test]
    fn a_node_that_numbers_again_is_read_from_the_start() {
        let mut cursor = NodeCursor {
            read_through: 9,
            gap_passes: 0,
        };
        let again = listing(&[(1, 1), (2, 2)]);
        assert_eq!(cursor.step(&again), Step::Restarted { read_through: 9 });
        assert_eq!(read_all(&mut cursor, &again), vec![(1, 1), (2, 2)]);
        // All its segments gone: nothing to read, and a later first segment is read.
        let mut cursor = NodeCursor {
            read_through: 2,
            gap_passes: 0,
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
