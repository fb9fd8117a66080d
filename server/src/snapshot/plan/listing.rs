//! What a listing of the shared directory holds, by name alone: in the top directory the
//! version-1 whole-cache files of older daemons to read, in `v2/` the segments of each node;
//! in both, the temp files of writers that may have crashed. And which version-1 files
//! changed since they were read: one is read again only when its version changes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use crate::snapshot::format::{self, SNAPSHOT_SUFFIX};
use crate::snapshot::segments::{self, NodeSegments, SegmentName, SEGMENT_TEMP_MARKER};
use crate::snapshot::shared_file::FileVersion;

/// Temp files older than this belong to writers that crashed; they are removed.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);
/// Marks version-1 temp files (written by older daemons); removed when stale.
pub const V1_TEMP_MARKER: &str = ".tunecache.json.tmp.";

/// The top directory, as listed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TopListing {
    /// Version-1 files to read unless their version was taken in before, in listing order.
    /// This node's own is among them only when asked for.
    pub v1_files: Vec<String>,
    /// Hidden version-1 temp files: removed once stale.
    pub temps: Vec<String>,
}

/// `names`: the UTF-8 names listed in the top directory (others are never this daemon's).
/// `include_own_v1`: read this node's own version-1 file too (a wiped node starts from what
/// it published before).
pub fn top_listing(
    names: impl IntoIterator<Item = String>,
    node: &str,
    include_own_v1: bool,
) -> TopListing {
    let own_v1 = format::snapshot_file_name(node);
    let mut listing = TopListing::default();
    for name in names {
        if name.starts_with('.') {
            if name.contains(V1_TEMP_MARKER) {
                listing.temps.push(name);
            }
            continue;
        }
        // (The suffix alone is a hidden name, passed over above.)
        if !name.ends_with(SNAPSHOT_SUFFIX) {
            continue;
        }
        if name == own_v1 && !include_own_v1 {
            continue;
        }
        listing.v1_files.push(name);
    }
    listing
}

/// `v2/`, as listed.
#[derive(Debug, Default)]
pub struct SegmentListing {
    pub by_node: BTreeMap<String, NodeSegments>,
    /// Hidden segment temp files: removed once stale.
    pub temps: Vec<String>,
}

/// `names`: the UTF-8 names listed in `v2/`. Names that are not segments are ignored.
pub fn segment_listing(names: impl IntoIterator<Item = String>) -> SegmentListing {
    let mut temps = Vec::new();
    let mut segments = Vec::new();
    for name in names {
        if name.starts_with('.') {
            if name.contains(SEGMENT_TEMP_MARKER) {
                temps.push(name);
            }
            continue;
        }
        segments.extend(SegmentName::parse(&name));
    }
    SegmentListing {
        by_node: segments::group_by_node(segments),
        temps,
    }
}

/// Whether a temp file of this age was left by a writer that crashed. `None`: its age is
/// unknown (gone, or a clock that went back), and it is left alone.
pub fn is_stale(age: Option<Duration>) -> bool {
    age.is_some_and(|age| age > STALE_TEMP_AGE)
}

/// Version-1 files: the version of each already taken in (or skipped).
#[derive(Debug, Default)]
pub struct SeenV1 {
    versions: HashMap<String, FileVersion>,
}

impl SeenV1 {
    /// The version of `name` taken in before, if any: the same version is not read again.
    pub fn version(&self, name: &str) -> Option<FileVersion> {
        self.versions.get(name).copied()
    }

    /// This version of `name` is done with: loaded, or warned about once.
    pub fn mark(&mut self, name: String, version: FileVersion) {
        self.versions.insert(name, version);
    }

    /// Read `name` again next time (its entries were not taken).
    pub fn forget(&mut self, name: &str) {
        self.versions.remove(name);
    }

    /// Forgets the files no longer listed (or our own, once no longer read), so a later
    /// file of the same name is read afresh.
    pub fn keep_only(&mut self, listed: &[String]) {
        let listed: HashSet<&str> = listed.iter().map(String::as_str).collect();
        self.versions
            .retain(|name, _| listed.contains(name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn the_top_directory_yields_version_1_files_and_their_temp_files() {
        let listed = names(&[
            "b.tunecache.json",
            "me.tunecache.json",
            ".tunecache.json",
            ".b.tunecache.json.tmp.12.34",
            ".hidden.tunecache.json",
            ".other",
            "notes.txt",
            "v2",
            "a.tunecache.json",
        ]);
        let listing = top_listing(listed.clone(), "me", false);
        assert_eq!(
            listing,
            TopListing {
                v1_files: names(&["b.tunecache.json", "a.tunecache.json"]),
                temps: names(&[".b.tunecache.json.tmp.12.34"]),
            }
        );
        // A wiped node reads back its own version-1 file too.
        let listing = top_listing(listed, "me", true);
        assert_eq!(
            listing.v1_files,
            names(&["b.tunecache.json", "me.tunecache.json", "a.tunecache.json"])
        );
        // A file named only by the suffix is nobody's (and hidden).
        assert!(top_listing(names(&[SNAPSHOT_SUFFIX]), "me", true)
            .v1_files
            .is_empty());
    }

    #[test]
    fn v2_yields_each_nodes_segments_and_the_temp_files() {
        let listing = segment_listing(names(&[
            "a.0000000000000001-0000000000000001.seg.json",
            "b.0000000000000002-0000000000000003.seg.json",
            "a.0000000000000002-0000000000000002.seg.json",
            ".a.seg.tmp.1.2",
            ".a.0000000000000003-0000000000000003.seg.json",
            "a.0000000000000001-ffffffffffffffff.seg.json",
            "junk",
        ]));
        let of = |node: &str| -> Vec<(u64, u64)> {
            listing.by_node[node]
                .as_slice()
                .iter()
                .map(|s| (s.first, s.last))
                .collect()
        };
        assert_eq!(of("a"), vec![(1, 1), (2, 2)]);
        assert_eq!(of("b"), vec![(2, 3)]);
        assert_eq!(listing.by_node.len(), 2);
        assert_eq!(listing.temps, names(&[".a.seg.tmp.1.2"]));
    }

    #[test]
    fn only_temp_files_older_than_an_hour_are_stale() {
        assert!(!is_stale(None));
        assert!(!is_stale(Some(Duration::from_secs(60))));
        assert!(!is_stale(Some(STALE_TEMP_AGE)));
        assert!(is_stale(Some(STALE_TEMP_AGE + Duration::from_secs(1))));
    }

    #[test]
    fn a_version_1_file_is_read_again_only_when_its_version_changes_or_it_came_back() {
        let version = |size| FileVersion {
            dev: 1,
            ino: 2,
            size,
            mtime_ns: 3,
        };
        let mut seen = SeenV1::default();
        assert_eq!(seen.version("a.tunecache.json"), None);
        seen.mark("a.tunecache.json".into(), version(10));
        seen.mark("b.tunecache.json".into(), version(10));
        assert_eq!(seen.version("a.tunecache.json"), Some(version(10)));
        seen.forget("b.tunecache.json");
        assert_eq!(seen.version("b.tunecache.json"), None);
        seen.mark("b.tunecache.json".into(), version(11));
        // a is gone from the listing: a later a is read afresh.
        seen.keep_only(&names(&["b.tunecache.json"]));
        assert_eq!(seen.version("a.tunecache.json"), None);
        assert_eq!(seen.version("b.tunecache.json"), Some(version(11)));
    }
}
