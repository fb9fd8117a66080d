//! The version-2 layout of the shared directory: each node's own contributions as immutable,
//! append-only segments in `DIR/v2/`, named `<node>.<first>-<last>.seg.json` by the range of
//! publication sequence numbers they cover (16 hex digits each).
//!
//! This module owns the names and the rule for what a reader takes next; it does no I/O
//! beyond parsing a listing. A node writes segment `n` only after `n-1` is in place, and a
//! compacted segment `[first..last]` is renamed in before the segments it covers are removed,
//! so for every node the segments a reader can still list always cover every sequence number
//! it has not read yet. A reader that remembers "read through `n`" per node therefore picks,
//! each time, a segment that starts at `n+1` (the usual small one) or else one that covers
//! `n+1` (a compaction), and never misses an entry.

use std::collections::BTreeMap;

/// Subdirectory of the shared directory that holds version-2 segments. Version-1 daemons
/// only read `*.tunecache.json` in the top directory, so they never trip over segments.
pub const SEGMENT_DIR: &str = "v2";
/// Suffix of segment files.
pub const SEGMENT_SUFFIX: &str = ".seg.json";
/// Marks temp files of segments being written; they start with '.' so no reader takes them.
pub const SEGMENT_TEMP_MARKER: &str = ".seg.tmp.";
/// Sequence numbers a writer can reach: it takes one per publish, so a node publishing every
/// second would need 136 years to get here. A name past it was not written by a daemon (a
/// forged `…-ffffffffffffffff` would otherwise cover, and so replace, a node's every segment,
/// or make readers skip ahead), and is not taken for a segment.
pub const MAX_SEQ: u64 = u32::MAX as u64;

/// One segment: whose, and which publication sequence numbers it covers (inclusive).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentName {
    pub node: String,
    pub first: u64,
    pub last: u64,
}

impl SegmentName {
    pub fn file_name(&self) -> String {
        format!(
            "{}.{:016x}-{:016x}{SEGMENT_SUFFIX}",
            self.node, self.first, self.last
        )
    }

    /// Parses a file name written by `file_name`; anything else is `None`.
    pub fn parse(name: &str) -> Option<SegmentName> {
        let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
        let (node, range) = stem.rsplit_once('.')?;
        let (first, last) = range.split_once('-')?;
        if node.is_empty() || node.starts_with('.') || first.len() != 16 || last.len() != 16 {
            return None;
        }
        let first = u64::from_str_radix(first, 16).ok()?;
        let last = u64::from_str_radix(last, 16).ok()?;
        (first >= 1 && first <= last && last <= MAX_SEQ).then(|| SegmentName {
            node: node.to_owned(),
            first,
            last,
        })
    }

    /// Whether this segment holds every sequence number `other` holds.
    #[cfg(test)]
    pub fn covers(&self, other: &SegmentName) -> bool {
        self.node == other.node && self.first <= other.first && other.last <= self.last
    }
}

/// One node's segments as listed, sorted by (first, last), with what answers "which one
/// next" in logarithmic time: a pass over tens of thousands of segments stays linear.
#[derive(Debug, Default)]
pub struct NodeSegments {
    sorted: Vec<SegmentName>,
    /// For each position, the index of the segment reaching furthest among those up to it.
    furthest_so_far: Vec<usize>,
}

impl NodeSegments {
    pub fn new(mut segments: Vec<SegmentName>) -> NodeSegments {
        segments.sort();
        segments.dedup();
        let mut furthest_so_far = Vec::with_capacity(segments.len());
        let mut best = 0;
        for (i, segment) in segments.iter().enumerate() {
            if segment.last > segments[best].last {
                best = i;
            }
            furthest_so_far.push(best);
        }
        NodeSegments {
            sorted: segments,
            furthest_so_far,
        }
    }

    pub fn as_slice(&self) -> &[SegmentName] {
        &self.sorted
    }

    pub fn max_last(&self) -> Option<u64> {
        self.furthest_so_far.last().map(|&i| self.sorted[i].last)
    }

    /// What a reader that has read this node's sequence numbers through `read_through`
    /// does next: the segment that starts right after it (the longest such), else the one
    /// reaching furthest among those that hold `read_through + 1` (a compaction that
    /// replaced the next small one).
    pub fn next_to_read(&self, read_through: u64) -> Next<'_> {
        let Some(max_last) = self.max_last() else {
            return if read_through == 0 {
                Next::UpToDate
            } else {
                Next::Restarted
            };
        };
        if max_last < read_through {
            return Next::Restarted;
        }
        if max_last == read_through {
            return Next::UpToDate;
        }
        let wanted = read_through + 1;
        // Segments starting at or before `wanted` are sorted[..up_to]; those starting at
        // `wanted` exactly are the tail of that range, the longest one last.
        let up_to = self.sorted.partition_point(|s| s.first <= wanted);
        if let Some(exact) = up_to
            .checked_sub(1)
            .map(|i| &self.sorted[i])
            .filter(|s| s.first == wanted)
        {
            return Next::Read(exact);
        }
        match up_to
            .checked_sub(1)
            .map(|i| &self.sorted[self.furthest_so_far[i]])
        {
            Some(covering) if covering.last >= wanted => Next::Read(covering),
            _ => Next::Gap,
        }
    }

    /// Segments another segment covers: left over from a compaction that was interrupted
    /// before it removed them. Sorted by first and then by last, a segment is covered
    /// exactly when one before it, or one starting with it and reaching further, ends at or
    /// after its end.
    pub fn covered(&self) -> Vec<&SegmentName> {
        let mut covered = Vec::new();
        let mut furthest_before: Option<u64> = None;
        let mut i = 0;
        while i < self.sorted.len() {
            // The run of segments starting at the same number: all but its longest are
            // covered by that longest one.
            let first = self.sorted[i].first;
            let end = i + self.sorted[i..].partition_point(|s| s.first == first);
            let longest = self.sorted[end - 1].last;
            for segment in &self.sorted[i..end] {
                let by_earlier = furthest_before.is_some_and(|f| f >= segment.last);
                if by_earlier || segment.last < longest {
                    covered.push(segment);
                }
            }
            furthest_before = Some(furthest_before.map_or(longest, |f| f.max(longest)));
            i = end;
        }
        covered
    }
}

/// Segments grouped by node.
pub fn group_by_node(
    names: impl IntoIterator<Item = SegmentName>,
) -> BTreeMap<String, NodeSegments> {
    let mut by_node: BTreeMap<String, Vec<SegmentName>> = BTreeMap::new();
    for name in names {
        by_node.entry(name.node.clone()).or_default().push(name);
    }
    by_node
        .into_iter()
        .map(|(node, segments)| (node, NodeSegments::new(segments)))
        .collect()
}

/// What a reader that has read a node's sequence numbers through `read_through` does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// Nothing new.
    UpToDate,
    /// Read this segment; afterwards the node is read through its `last`.
    Read(&'a SegmentName),
    /// Segments after `read_through` exist but none holds `read_through + 1`: a listing that
    /// raced a compaction, or files removed by hand. Look again next pass.
    Gap,
    /// Every segment ends before `read_through`: the node's segments were removed and it
    /// started numbering again.
    Restarted,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(first: u64, last: u64) -> SegmentName {
        SegmentName {
            node: "node.a".into(),
            first,
            last,
        }
    }

    #[test]
    fn names_round_trip_and_foreign_names_are_ignored() {
        let name = seg(3, 0x1f);
        let file = name.file_name();
        assert_eq!(file, "node.a.0000000000000003-000000000000001f.seg.json");
        assert_eq!(SegmentName::parse(&file), Some(name));
        for bad in [
            "node-a.tunecache.json",
            ".node.0000000000000001-0000000000000001.seg.json",
            "node.0000000000000002-0000000000000001.seg.json",
            "node.0000000000000000-0000000000000001.seg.json",
            "node.1-2.seg.json",
            "0000000000000001-0000000000000001.seg.json",
            // Ranges no writer reaches: a forged cover of everything, a jump past 2^32.
            "node.0000000000000001-ffffffffffffffff.seg.json",
            "node.0000000100000000-0000000100000000.seg.json",
        ] {
            assert_eq!(SegmentName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_reader_follows_small_segments_and_falls_back_to_a_compaction() {
        let small = NodeSegments::new((1..=4).map(|n| seg(n, n)).collect());
        assert_eq!(small.next_to_read(0), Next::Read(&seg(1, 1)));
        assert_eq!(small.next_to_read(2), Next::Read(&seg(3, 3)));
        assert_eq!(small.next_to_read(4), Next::UpToDate);
        let none = NodeSegments::new(Vec::new());
        assert_eq!(none.next_to_read(0), Next::UpToDate);

        // A compaction [1..4] is in place, the small ones partly removed.
        let mid = NodeSegments::new(vec![seg(3, 3), seg(1, 4), seg(4, 4)]);
        // Read through 2: the exact continuation 3 is cheaper than the compaction.
        assert_eq!(mid.next_to_read(2), Next::Read(&seg(3, 3)));
        // Read through 1, and 2 is gone: the compaction covers it.
        assert_eq!(mid.next_to_read(1), Next::Read(&seg(1, 4)));
        // A fresh reader takes the compaction rather than the small ones.
        assert_eq!(mid.next_to_read(0), Next::Read(&seg(1, 4)));
        // Of two segments starting at the wanted number, the longer.
        let two = NodeSegments::new(vec![seg(1, 1), seg(1, 3), seg(2, 2)]);
        assert_eq!(two.next_to_read(0), Next::Read(&seg(1, 3)));

        // A listing that missed both the compaction and segment 2.
        let torn = NodeSegments::new(vec![seg(1, 1), seg(3, 3)]);
        assert_eq!(torn.next_to_read(1), Next::Gap);
        assert_eq!(torn.next_to_read(9), Next::Restarted);
        assert_eq!(none.next_to_read(9), Next::Restarted);
    }

    #[test]
    fn leftovers_of_an_interrupted_compaction_are_found() {
        let segments = vec![seg(1, 3), seg(1, 1), seg(2, 2), seg(4, 4)];
        let by_node = group_by_node(segments);
        let leftovers: Vec<_> = by_node["node.a"].covered().into_iter().cloned().collect();
        assert_eq!(leftovers, vec![seg(1, 1), seg(2, 2)]);
    }

    /// The logarithmic rules give what the plain definitions give, on random listings.
    #[test]
    fn fast_rules_agree_with_their_definitions() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..2000 {
            let count = next(8) as usize;
            let mut listed: Vec<SegmentName> = (0..count)
                .map(|_| {
                    let first = 1 + next(10);
                    seg(first, first + next(4))
                })
                .collect();
            listed.sort();
            listed.dedup();
            let fast = NodeSegments::new(listed.clone());
            let covered_by_definition: Vec<&SegmentName> = listed
                .iter()
                .filter(|s| listed.iter().any(|o| o != *s && o.covers(s)))
                .collect();
            assert_eq!(fast.covered(), covered_by_definition, "{listed:?}");
            for read_through in 0..16 {
                let max_last = listed.iter().map(|s| s.last).max();
                let wanted = read_through + 1;
                let by_definition = match max_last {
                    None if read_through == 0 => Next::UpToDate,
                    None => Next::Restarted,
                    Some(max) if max < read_through => Next::Restarted,
                    Some(max) if max == read_through => Next::UpToDate,
                    Some(_) => listed
                        .iter()
                        .filter(|s| s.first == wanted)
                        .max_by_key(|s| s.last)
                        .or_else(|| {
                            listed
                                .iter()
                                .filter(|s| s.first <= wanted && wanted <= s.last)
                                .max_by_key(|s| s.last)
                        })
                        .map_or(Next::Gap, Next::Read),
                };
                let fast_next = fast.next_to_read(read_through);
                // Ties in reach may pick a different segment of the same reach.
                match (&fast_next, &by_definition) {
                    (Next::Read(a), Next::Read(b)) => {
                        assert_eq!(
                            (a.first <= wanted, a.last),
                            (b.first <= wanted, b.last),
                            "{listed:?} {read_through}"
                        )
                    }
                    _ => assert_eq!(fast_next, by_definition, "{listed:?} {read_through}"),
                }
            }
        }
    }
}
