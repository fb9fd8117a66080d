//! What this node has merged of other nodes' segments, remembered across a restart, so a
//! node restarted on its state directory reads only what is new (`shared-merged.json`).
//!
//! Per other node, the reader's place (`NodeCursor::read_through`) and the segment whose
//! reading brought it there, as it was when read: its range, length and modification time.
//! The record is written only after the store's journal is synced (the async side does
//! that), so it never claims more than the journal holds. At start it is read like any
//! other untrusted input (`MergedRecord::parse`): a damaged file, or one written for another
//! node name or shared directory, counts for nothing and every segment is read again. A
//! place is taken up only when the segment it names is still listed under the same length
//! and modification time (`resume`); a segment rewritten, compacted away or numbered again
//! since then starts that node from the beginning, as a fresh reader would.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::names::check_node_name;
use crate::snapshot::segments::{NodeSegments, SegmentName, MAX_SEQ};

use super::peers::NodeCursor;

const FORMAT: &str = "tunecache-merged-segments";
const VERSION: u32 = 1;
/// More nodes than any cluster has: a file claiming more was not written by a daemon.
pub const MAX_PEERS: usize = 1 << 20;

/// A segment as it was when read: which one, and the length and modification time that say
/// it is still the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadSegment {
    pub first: u64,
    pub last: u64,
    pub bytes: u64,
    pub mtime_ns: i64,
}

/// How a listed segment looks now (what `resume` compares with what was read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentStamp {
    pub bytes: u64,
    pub mtime_ns: i64,
}

/// Where this reader stands with one other node, and the segment that proves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedPeer {
    pub read_through: u64,
    pub segment: ReadSegment,
}

/// What the state directory keeps: the places of every other node this reader can prove.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergedRecord {
    format: String,
    version: u32,
    pub node: String,
    pub shared_dir: String,
    pub peers: BTreeMap<String, MergedPeer>,
}

/// Why a record read at start counts for nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum Ignored {
    /// Not a record this daemon wrote: unreadable, another format, a value no writer makes.
    Damaged(String),
    /// A sound record of another node name or shared directory.
    Foreign(String),
}

impl MergedRecord {
    pub fn new(node: &str, shared_dir: &str, peers: BTreeMap<String, MergedPeer>) -> Self {
        MergedRecord {
            format: FORMAT.to_owned(),
            version: VERSION,
            node: node.to_owned(),
            shared_dir: shared_dir.to_owned(),
            peers,
        }
    }

    /// The record in `bytes` if it is one this node wrote for this shared directory, each
    /// place checked as a reader would have left it.
    pub fn parse(bytes: &[u8], node: &str, shared_dir: &str) -> Result<MergedRecord, Ignored> {
        let record: MergedRecord = serde_json::from_slice(bytes)
            .map_err(|e| Ignored::Damaged(format!("unreadable: {e}")))?;
        if record.format != FORMAT || record.version != VERSION {
            return Err(Ignored::Damaged(format!(
                "format {:?} version {}, not {FORMAT:?} {VERSION}",
                record.format, record.version
            )));
        }
        if record.node != node || record.shared_dir != shared_dir {
            return Err(Ignored::Foreign(format!(
                "written by node {:?} for {:?}, not {node:?} for {shared_dir:?}",
                record.node, record.shared_dir
            )));
        }
        if record.peers.len() > MAX_PEERS {
            return Err(Ignored::Damaged(format!(
                "{} nodes, more than {MAX_PEERS}",
                record.peers.len()
            )));
        }
        for (peer, place) in &record.peers {
            if let Err(why) = check_node_name(peer) {
                return Err(Ignored::Damaged(format!("a node name: {why}")));
            }
            if peer == node {
                return Err(Ignored::Damaged(
                    "a place among this node's own segments".to_owned(),
                ));
            }
            let segment = &place.segment;
            let sound = segment.first >= 1
                && segment.first <= segment.last
                && segment.last <= place.read_through
                && place.read_through <= MAX_SEQ;
            if !sound {
                return Err(Ignored::Damaged(format!(
                    "node {peer:?}: read through {} on segment {}-{}, which no reader leaves",
                    place.read_through, segment.first, segment.last
                )));
            }
        }
        Ok(record)
    }
}

impl MergedPeer {
    /// The segment this place stands on.
    pub fn segment_name(&self, node: &str) -> SegmentName {
        SegmentName {
            node: node.to_owned(),
            first: self.segment.first,
            last: self.segment.last,
        }
    }
}

/// Where to start reading `node`'s segments after a restart: at the remembered place if the
/// segment it stands on is still listed and looks as it did when read (`stamp` says how it
/// looks now; asked only for a listed segment), else from the beginning.
pub fn resume(
    node: &str,
    remembered: &MergedPeer,
    listed: &NodeSegments,
    stamp: impl FnOnce(&SegmentName) -> Option<SegmentStamp>,
) -> Option<NodeCursor> {
    let segment = remembered.segment_name(node);
    listed.as_slice().binary_search(&segment).ok()?;
    let now = stamp(&segment)?;
    let then = SegmentStamp {
        bytes: remembered.segment.bytes,
        mtime_ns: remembered.segment.mtime_ns,
    };
    // The record holds only places reached by reading a trusted writer's segment.
    (now == then).then_some(NodeCursor {
        read_through: remembered.read_through,
        gap_passes: 0,
        trusted_name: true,
    })
}

/// The places this run knows: those proved by a read this run, and those of the record read
/// at start not taken up yet (their node not listed since). Both are what the next record
/// holds; which ones changed since the last record was handed out is tracked, so an
/// unchanged place costs no write.
#[derive(Debug, Default)]
pub struct MergedPlaces {
    remembered: BTreeMap<String, MergedPeer>,
    proved: BTreeMap<String, MergedPeer>,
    changed: bool,
}

impl MergedPlaces {
    pub fn from_record(record: MergedRecord) -> MergedPlaces {
        MergedPlaces {
            remembered: record.peers,
            ..MergedPlaces::default()
        }
    }

    /// No place is known.
    pub fn is_empty(&self) -> bool {
        self.remembered.is_empty() && self.proved.is_empty()
    }

    /// The remembered place of `node`, at the first listing of it this run; the caller
    /// checks it (`resume`) and reports what came of it (`resumed`).
    pub fn take_remembered(&mut self, node: &str) -> Option<MergedPeer> {
        self.remembered.remove(node)
    }

    /// What came of a remembered place: kept when taken up, dropped when it no longer holds.
    pub fn resumed(&mut self, node: &str, place: MergedPeer, taken_up: bool) {
        if taken_up {
            self.proved.insert(node.to_owned(), place);
        } else {
            self.changed = true;
        }
    }

    /// `segment` of `node` was read through (merged, or passed over as damaged); returns
    /// the place before, for `restore`. A node whose name breaks the rule for node names
    /// (a listing takes any segment name) is not recorded: a record holding it would be
    /// refused as damaged at the next start.
    pub fn read(
        &mut self,
        node: &str,
        read_through: u64,
        segment: ReadSegment,
    ) -> Option<MergedPeer> {
        if check_node_name(node).is_err() {
            return None;
        }
        self.changed = true;
        let place = MergedPeer {
            read_through,
            segment,
        };
        self.proved.insert(node.to_owned(), place)
    }

    /// `node` was read on past a segment whose look no record can hold (a modification time
    /// past 2262): no place is proved for it any more. Returns the place before.
    pub fn read_unproved(&mut self, node: &str) -> Option<MergedPeer> {
        let before = self.proved.remove(node);
        self.changed |= before.is_some();
        before
    }

    /// Back to the place before a read whose entries nobody took.
    pub fn restore(&mut self, node: &str, before: Option<MergedPeer>) {
        self.changed = true;
        match before {
            Some(place) => self.proved.insert(node.to_owned(), place),
            None => self.proved.remove(node),
        };
    }

    /// The cursor of `node` moved without a read: past a gap (the place moves with it, still
    /// proved by the segment read last), or back to the start (nothing left to prove).
    pub fn moved(&mut self, node: &str, read_through: u64) {
        if read_through == 0 {
            self.changed |= self.proved.remove(node).is_some();
        } else if let Some(place) = self.proved.get_mut(node) {
            if place.read_through != read_through && place.segment.last <= read_through {
                place.read_through = read_through;
                self.changed = true;
            }
        }
    }

    /// A record of every place known, when any changed since the last one handed out.
    pub fn changed_record(&mut self, node: &str, shared_dir: &str) -> Option<MergedRecord> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        let mut peers = self.remembered.clone();
        peers.extend(self.proved.iter().map(|(n, p)| (n.clone(), *p)));
        Some(MergedRecord::new(node, shared_dir, peers))
    }

    /// The record handed out was not taken: hand one out again next time.
    pub fn not_taken(&mut self) {
        self.changed = true;
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

    fn place(read_through: u64, first: u64, last: u64) -> MergedPeer {
        MergedPeer {
            read_through,
            segment: ReadSegment {
                first,
                last,
                bytes: 100,
                mtime_ns: 7,
            },
        }
    }

    const SAME: SegmentStamp = SegmentStamp {
        bytes: 100,
        mtime_ns: 7,
    };

    #[test]
    fn a_place_is_taken_up_only_on_the_segment_it_was_read_from() {
        let remembered = place(3, 3, 3);
        let listed = listing(&[(1, 1), (2, 2), (3, 3)]);
        let cursor = resume("b", &remembered, &listed, |s| {
            assert_eq!(s, &seg(3, 3));
            Some(SAME)
        });
        assert_eq!(cursor.map(|c| c.read_through), Some(3));
        // Rewritten: another length, or the same length written at another time.
        let longer = SegmentStamp { bytes: 101, ..SAME };
        assert_eq!(resume("b", &remembered, &listed, |_| Some(longer)), None);
        let later = SegmentStamp {
            mtime_ns: 8,
            ..SAME
        };
        assert_eq!(resume("b", &remembered, &listed, |_| Some(later)), None);
        // Removed between the listing and the look at it.
        assert_eq!(resume("b", &remembered, &listed, |_| None), None);
        // Compacted away (a [1..3] in its place) or numbered again: not looked at at all.
        for listed in [listing(&[(1, 3)]), listing(&[(1, 1)]), listing(&[])] {
            let cursor = resume("b", &remembered, &listed, |_| panic!("not listed"));
            assert_eq!(cursor, None, "{listed:?}");
        }
        // A place past its segment (a gap skipped since) is taken up as it was left.
        let skipped = place(9, 3, 3);
        let cursor = resume("b", &skipped, &listed, |_| Some(SAME));
        assert_eq!(cursor.map(|c| c.read_through), Some(9));
    }

    fn bytes(record: &MergedRecord) -> Vec<u8> {
        serde_json::to_vec(record).unwrap()
    }

    #[test]
    fn a_record_reads_back_for_its_node_and_directory_only() {
        let peers = BTreeMap::from([("b".to_owned(), place(3, 1, 3))]);
        let record = MergedRecord::new("a", "/shared", peers);
        assert_eq!(
            MergedRecord::parse(&bytes(&record), "a", "/shared"),
            Ok(record.clone())
        );
        for (node, dir) in [("c", "/shared"), ("a", "/other")] {
            assert!(matches!(
                MergedRecord::parse(&bytes(&record), node, dir),
                Err(Ignored::Foreign(_))
            ));
        }
    }

    #[test]
    fn a_damaged_record_counts_for_nothing() {
        let good = MergedRecord::new("a", "/s", BTreeMap::from([("b".into(), place(3, 1, 3))]));
        let damaged = |edit: &dyn Fn(&mut MergedRecord)| {
            let mut record = good.clone();
            edit(&mut record);
            MergedRecord::parse(&bytes(&record), "a", "/s")
        };
        type Edit<'a> = &'a dyn Fn(&mut MergedRecord);
        let cases: [(&str, Edit); 8] = [
            ("version", &|r| r.version = 2),
            ("format", &|r| r.format = "tunecache-cluster-places".into()),
            ("own node", &|r| {
                r.peers.insert("a".into(), place(1, 1, 1));
            }),
            ("bad name", &|r| {
                r.peers.insert("../x".into(), place(1, 1, 1));
            }),
            ("segment past the place", &|r| {
                r.peers.insert("c".into(), place(2, 1, 3));
            }),
            ("segment numbered 0", &|r| {
                r.peers.insert("c".into(), place(2, 0, 2));
            }),
            ("inverted range", &|r| {
                r.peers.insert("c".into(), place(5, 4, 3));
            }),
            ("past MAX_SEQ", &|r| {
                r.peers.insert("c".into(), place(MAX_SEQ + 1, 1, 1));
            }),
        ];
        for (what, edit) in cases {
            assert!(
                matches!(damaged(edit), Err(Ignored::Damaged(_))),
                "{what}: {:?}",
                damaged(edit)
            );
        }
        for garbage in [&b""[..], b"{", b"[]", b"{\"format\":1}", &[0xff, 0xfe]] {
            assert!(matches!(
                MergedRecord::parse(garbage, "a", "/s"),
                Err(Ignored::Damaged(_))
            ));
        }
    }

    #[test]
    fn the_places_follow_the_cursor_and_change_only_when_it_does() {
        let stamp = |first, last| ReadSegment {
            first,
            last,
            bytes: 10,
            mtime_ns: 1,
        };
        let record = MergedRecord::new(
            "a",
            "/s",
            BTreeMap::from([("b".into(), place(3, 3, 3)), ("c".into(), place(5, 1, 5))]),
        );
        let mut places = MergedPlaces::from_record(record.clone());
        assert!(!places.is_empty() && MergedPlaces::default().is_empty());
        // Nothing changed yet: nothing to write.
        assert_eq!(places.changed_record("a", "/s"), None);
        // b taken up: still nothing new; c not listed yet: kept as it was.
        let b = places.take_remembered("b").unwrap();
        assert_eq!(places.take_remembered("b"), None, "taken once");
        places.resumed("b", b, true);
        assert_eq!(places.changed_record("a", "/s"), None);
        // b read on; a gap skipped past it; an undo puts it back.
        let before = places.read("b", 4, stamp(4, 4));
        assert_eq!(before, Some(place(3, 3, 3)));
        places.moved("b", 6);
        let written = places.changed_record("a", "/s").unwrap();
        assert_eq!(written.peers["b"].read_through, 6);
        assert_eq!(written.peers["b"].segment, stamp(4, 4));
        assert_eq!(written.peers["c"], place(5, 1, 5));
        places.restore("b", before);
        assert_eq!(places.changed_record("a", "/s"), Some(record.clone()));
        // Not taken: handed out again.
        places.not_taken();
        assert_eq!(places.changed_record("a", "/s"), Some(record));
        // b numbered again: nothing proves a place; c no longer holds.
        places.moved("b", 0);
        let c = places.take_remembered("c").unwrap();
        places.resumed("c", c, false);
        let written = places.changed_record("a", "/s").unwrap();
        assert!(written.peers.is_empty(), "{written:?}");
        // A node first read this run.
        places.read("d", 2, stamp(1, 2));
        assert_eq!(places.changed_record("a", "/s").unwrap().peers.len(), 1);
        places.moved("d", 2);
        assert_eq!(places.changed_record("a", "/s"), None);
        // A name no record may hold is not remembered; what is written reads back.
        assert_eq!(places.read(&"x".repeat(65), 1, stamp(1, 1)), None);
        assert_eq!(places.changed_record("a", "/s"), None);
        places.read("e", 1, stamp(1, 1));
        let written = places.changed_record("a", "/s").unwrap();
        assert_eq!(
            MergedRecord::parse(&bytes(&written), "a", "/s"),
            Ok(written.clone())
        );
    }
}
