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

/// One segment: whose, and which publication sequence numbers it covers (inclusive).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
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
        (first >= 1 && first <= last).then(|| SegmentName {
            node: node.to_owned(),
            first,
            last,
        })
    }

    /// Whether this segment holds every sequence number `other` holds.
    pub fn covers(&self, other: &SegmentName) -> bool {
        self.node == other.node && self.first <= other.first && other.last <= self.last
    }
}

/// Segments grouped by node, each list sorted by (first, last).
pub fn group_by_node(
    names: impl IntoIterator<Item = SegmentName>,
) -> BTreeMap<String, Vec<SegmentName>> {
    let mut by_node: BTreeMap<String, Vec<SegmentName>> = BTreeMap::new();
    for name in names {
        by_node.entry(name.node.clone()).or_default().push(name);
    }
    for segments in by_node.values_mut() {
        segments.sort();
    }
    by_node
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

/// Picks the next segment to read from one node's sorted segments: the one that starts right
/// after `read_through` (the longest such), else the one reaching furthest among those that
/// hold `read_through + 1` (a compaction that replaced the next small one).
pub fn next_to_read(segments: &[SegmentName], read_through: u64) -> Next<'_> {
    let Some(max_last) = segments.iter().map(|s| s.last).max() else {
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
    let exact = segments
        .iter()
        .filter(|s| s.first == wanted)
        .max_by_key(|s| s.last);
    let covering = || {
        segments
            .iter()
            .filter(|s| s.first <= wanted && wanted <= s.last)
            .max_by_key(|s| s.last)
    };
    match exact.or_else(covering) {
        Some(segment) => Next::Read(segment),
        None => Next::Gap,
    }
}

/// Segments of one node that another of its segments covers: left over from a compaction
/// that was interrupted before it removed them. Safe to remove, the cover stays.
pub fn covered(segments: &[SegmentName]) -> Vec<&SegmentName> {
    segments
        .iter()
        .filter(|s| segments.iter().any(|other| other != *s && other.covers(s)))
        .collect()
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
        ] {
            assert_eq!(SegmentName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_reader_follows_small_segments_and_falls_back_to_a_compaction() {
        let small: Vec<_> = (1..=4).map(|n| seg(n, n)).collect();
        assert_eq!(next_to_read(&small, 0), Next::Read(&small[0]));
        assert_eq!(next_to_read(&small, 2), Next::Read(&small[2]));
        assert_eq!(next_to_read(&small, 4), Next::UpToDate);
        assert_eq!(next_to_read(&[], 0), Next::UpToDate);

        // A compaction [1..4] is in place, the small ones partly removed.
        let mut mid = vec![seg(1, 4), seg(3, 3), seg(4, 4)];
        mid.sort();
        // Read through 2: the exact continuation 3 is cheaper than the compaction.
        assert_eq!(next_to_read(&mid, 2), Next::Read(&seg(3, 3)));
        // Read through 1, and 2 is gone: the compaction covers it.
        assert_eq!(next_to_read(&mid, 1), Next::Read(&seg(1, 4)));
        // A fresh reader takes the compaction rather than the small ones.
        assert_eq!(next_to_read(&mid, 0), Next::Read(&seg(1, 4)));

        // A listing that missed both the compaction and segment 2.
        let torn = vec![seg(1, 1), seg(3, 3)];
        assert_eq!(next_to_read(&torn, 1), Next::Gap);
        assert_eq!(next_to_read(&torn, 9), Next::Restarted);
        assert_eq!(next_to_read(&[], 9), Next::Restarted);
    }

    #[test]
    fn leftovers_of_an_interrupted_compaction_are_found() {
        let segments = vec![seg(1, 3), seg(1, 1), seg(2, 2), seg(4, 4)];
        let by_node = group_by_node(segments);
        let sorted = &by_node["node.a"];
        let leftovers: Vec<_> = covered(sorted).into_iter().cloned().collect();
        assert_eq!(leftovers, vec![seg(1, 1), seg(2, 2)]);
    }
}
