//! Segments under this node's name that it did not write (its record does not list them):
//! which were read already, and who wrote each. A trusted writer's (a second daemon given
//! the same name, an earlier state directory) is read by readers, so this node's numbering
//! goes past it and no compaction may hide it; another user's (in the `v2/` every user
//! shares) is set aside by readers, so only its name is not taken again.

use std::collections::{HashMap, HashSet};

use crate::snapshot::segments::{NodeSegments, SegmentName};

/// Who wrote a segment under this node's name that it did not write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// Not read yet (or its read failed): counted as trusted, which only ever protects.
    Unknown,
    /// It proved a trusted writer (a second daemon with this name, an earlier state
    /// directory): readers read it, so numbering goes past it and no compaction hides it.
    Trusted,
    /// Another user's, or a forgery: readers set it aside; only its name is not taken again.
    Untrusted,
}

/// Segments under this node's name that its record does not list, already read (or being
/// read) like another node's, and who wrote each.
#[derive(Debug, Default)]
pub struct NotOurs {
    names: HashMap<String, Writer>,
}

impl NotOurs {
    /// Of `listed`, the segments under this node's name that are not `recorded` (the node's
    /// own record, `OwnSegments::segments`) and that
    /// were not read yet: read once each (and remembered from now on). Names no longer
    /// listed are forgotten, so the set stays as small as the listing.
    pub fn take_unread<'a>(
        &mut self,
        recorded: &[SegmentName],
        listed: &'a NodeSegments,
    ) -> Vec<&'a SegmentName> {
        let recorded: HashSet<String> = recorded.iter().map(SegmentName::file_name).collect();
        let listed_names: HashSet<String> = listed
            .as_slice()
            .iter()
            .map(SegmentName::file_name)
            .collect();
        self.names.retain(|name, _| listed_names.contains(name));
        listed
            .as_slice()
            .iter()
            .filter(|segment| {
                let name = segment.file_name();
                if recorded.contains(&name) || self.names.contains_key(&name) {
                    return false;
                }
                self.names.insert(name, Writer::Unknown);
                true
            })
            .collect()
    }

    /// What its read proved of `name`'s writer.
    pub fn judged(&mut self, name: &str, trusted: bool) {
        if let Some(writer) = self.names.get_mut(name) {
            *writer = if trusted {
                Writer::Trusted
            } else {
                Writer::Untrusted
            };
        }
    }

    /// Read it again next time (its read failed, or nobody took its entries).
    pub fn forget(&mut self, name: &str) {
        self.names.remove(name);
    }

    /// Whether a file of that name is listed under this node's name.
    pub fn holds(&self, segment: &SegmentName) -> bool {
        self.names.contains_key(&segment.file_name())
    }

    fn readers_read(&self) -> impl Iterator<Item = SegmentName> + '_ {
        self.names
            .iter()
            .filter(|(_, writer)| **writer != Writer::Untrusted)
            .filter_map(|(name, _)| SegmentName::parse(name))
    }

    /// The furthest number a segment readers read (not another user's) reaches.
    pub fn trusted_last(&self) -> Option<u64> {
        self.readers_read().map(|other| other.last).max()
    }

    /// Whether a segment readers read (not another user's) lies inside `first..=last`, which
    /// a compaction (or a republish) of this node's own segments covering that range would
    /// hide from readers. Those of an earlier state directory lie before it: numbering went
    /// on after them.
    pub fn within(&self, (first, last): (u64, u64)) -> bool {
        self.readers_read()
            .any(|other| other.first <= last && first <= other.last)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

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

    #[test]
    fn segments_under_this_name_it_did_not_write_are_read_once_each() {
        let own = [seg(1, 1)];
        let mut not_ours = NotOurs::default();
        let listed = listing(&[(1, 1), (2, 2), (3, 3)]);
        assert_eq!(
            not_ours.take_unread(&own, &listed),
            vec![&seg(2, 2), &seg(3, 3)]
        );
        assert!(not_ours.take_unread(&own, &listed).is_empty(), "read once");
        not_ours.forget(&seg(3, 3).file_name());
        assert_eq!(not_ours.take_unread(&own, &listed), vec![&seg(3, 3)]);
        // Not judged yet, or a trusted writer's: readers read it.
        not_ours.judged(&seg(2, 2).file_name(), true);
        assert!(not_ours.within((3, 9)) && not_ours.within((1, 2)));
        assert!(!not_ours.within((4, 9)));
        assert_eq!(not_ours.trusted_last(), Some(3));
        // Another user's: readers set it aside.
        not_ours.judged(&seg(3, 3).file_name(), false);
        assert!(!not_ours.within((3, 9)));
        assert_eq!(not_ours.trusted_last(), Some(2));
        // Gone from the listing: forgotten, and read again should it come back.
        assert!(not_ours.take_unread(&own, &listing(&[(1, 1)])).is_empty());
        assert!(!not_ours.within((1, 9)));
        assert_eq!(not_ours.take_unread(&own, &listed).len(), 2);
    }
}
