//! The on-disk format of shared-directory files, documented in `docs/snapshot-format.md`:
//! version-2 segments (`v2/<node>.<first>-<last>.seg.json`, written) and version-1 whole-cache
//! snapshots (`<node>.tunecache.json`, only read, for migration). Both are one JSON object
//! with the same entry layout; version 2 adds the segment's sequence range.
//!
//! Writing (`write`) streams the cache map straight into the writer (no intermediate
//! tree), in the map's sorted order, so the same content always gives the same entry bytes.
//! Each entry carries the day its key was last used (`last_used_day`, left out when none is
//! known), and a segment may list the uses its writer made of keys since its last segment
//! (`used`: full entries, so a reader learns entry and day together).
//! Reading (`read`) streams from a reader, validates each entry as it is parsed and keeps
//! only valid ones, and checks the format name and version; readers ignore fields they do
//! not know, so later minor additions stay readable. An entry a Record would refuse (a time
//! of `1e999` or `"fast"`) is dropped alone and counted; the rest of the file still loads.
//! Here: the names and versions, and the tombstone layout both sides share.
//!
//! With a shared key (`--shared-dir-key-file`) every file ends with a MAC member (`mac`: the
//! key, and how the member is written and checked while the file streams). Nothing here
//! touches the filesystem: `snapshot` owns the I/O and calls these on its own thread.

mod mac;
mod read;
mod write;

use serde::{Deserialize, Serialize};

use crate::model::forget::{ForgetScope, RankScope, Tombstone};

pub use mac::SharedKey;
pub use read::{parse_snapshot, read_authenticated, read_snapshot, ParsedSnapshot};
pub use write::{
    write_segment, write_segment_with, write_v1_snapshot, SegmentEntries, SegmentExtras,
};

/// The `format` field of every snapshot file.
pub const FORMAT_NAME: &str = "tunecache-snapshot";
/// The format version this build writes (segments).
pub const FORMAT_VERSION: u64 = 2;
/// Version-1 whole-cache snapshots of older daemons: still read and merged, never written.
pub const FORMAT_VERSION_V1: u64 = 1;
/// Suffix of snapshot files; everything else in the shared directory is ignored.
pub const SNAPSHOT_SUFFIX: &str = ".tunecache.json";

/// The file a node publishes: `<node>.tunecache.json`.
pub fn snapshot_file_name(node: &str) -> String {
    format!("{node}{SNAPSHOT_SUFFIX}")
}

/// A tombstone as segments carry it (`model::forget`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TombstoneJson {
    namespace: String,
    #[serde(default)]
    op: String,
    #[serde(default)]
    device: String,
    #[serde(default)]
    problem: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rank: Option<u32>,
    #[serde(default)]
    every_rank: bool,
    stamp: u64,
}

impl From<&Tombstone> for TombstoneJson {
    fn from(tombstone: &Tombstone) -> Self {
        let scope = &tombstone.scope;
        let (rank, every_rank) = scope.rank.to_fields();
        TombstoneJson {
            namespace: scope.namespace.clone(),
            op: scope.op.clone(),
            device: scope.device.clone(),
            problem: scope.problem.clone(),
            rank,
            every_rank,
            stamp: tombstone.stamp,
        }
    }
}

impl TombstoneJson {
    /// The tombstone, unless its namespace is empty (a Forget needs one).
    pub(super) fn into_tombstone(self) -> Option<Tombstone> {
        let rank = RankScope::from_fields(self.rank, self.every_rank);
        let plausible =
            crate::model::forget::plausible(self.stamp, crate::model::entry::unix_now_ms());
        (!self.namespace.is_empty() && plausible).then_some(Tombstone {
            scope: ForgetScope {
                namespace: self.namespace,
                op: self.op,
                device: self.device,
                problem: self.problem,
                rank,
            },
            stamp: self.stamp,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Instant;

    use super::*;
    use crate::error::Error;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::store::CacheMap;

    fn sample_map(n: usize) -> CacheMap {
        (0..n)
            .map(|i| {
                let key = CacheKey {
                    namespace: "trtllm".into(),
                    op: format!("trtllm::gemm_{}", i % 7),
                    device: "NVIDIA H200|sm_90|cuda 12.8".into(),
                    problem: format!("m={i},n=4096,k=4096,dtype=f16"),
                    rank: (i % 5 == 0).then_some((i % 8) as u32),
                };
                let result = TunedResult {
                    config: format!(r#"{{"tactic":{i},"tile":[128,128,64]}}"#),
                    time_us: i as f64 * 0.25 + 1.0,
                    tuned_by: "node-a/rank0".into(),
                    tuned_at_unix_ms: 1_700_000_000_000 + i as i64,
                    forget_epoch: 0,
                    artifacts: Default::default(),
                };
                (key, result)
            })
            .collect()
    }

    fn written(map: &CacheMap, at: i64) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_segment(&mut bytes, "node-a", (1, 1), at, map, None).unwrap();
        bytes
    }

    #[test]
    fn round_trip_keeps_every_entry_in_order() {
        let map = sample_map(500);
        let parsed = parse_snapshot(&written(&map, 42)).unwrap();
        assert_eq!(parsed.node, "node-a");
        assert_eq!(parsed.written_at_unix_ms, 42);
        assert_eq!(parsed.invalid_entries, 0);
        let expected: Vec<_> = map.into_iter().collect();
        assert_eq!(parsed.pairs(), expected);
    }

    #[test]
    fn version_1_snapshots_are_still_read() {
        let map = sample_map(50);
        let mut bytes = Vec::new();
        write_v1_snapshot(&mut bytes, "old-node", 3, &map).unwrap();
        let parsed = parse_snapshot(&bytes).unwrap();
        assert_eq!((parsed.version, parsed.node.as_str()), (1, "old-node"));
        assert_eq!(parsed.entries.len(), 50);
        let segment = parse_snapshot(&written(&map, 3)).unwrap();
        assert_eq!(segment.version, 2);
    }

    #[test]
    fn same_content_gives_same_bytes_in_key_order() {
        // Two nodes holding the same entries write the same file: the writer puts entries in
        // key order and adds nothing that varies between writes.
        let map = sample_map(100);
        let bytes = written(&map, 7);
        assert_eq!(bytes, written(&map, 7));
        let text = String::from_utf8(bytes).unwrap();
        let offsets: Vec<usize> = map
            .keys()
            .map(|key| {
                let quoted = format!("\"{}\"", key.problem);
                text.find(&quoted)
                    .unwrap_or_else(|| panic!("{quoted} not written"))
            })
            .collect();
        assert!(
            offsets.windows(2).all(|pair| pair[0] < pair[1]),
            "entries are not written in key order"
        );
        let mut sorted: Vec<&CacheKey> = map.keys().collect();
        sorted.sort();
        assert!(
            map.keys().eq(sorted),
            "the map does not iterate in key order"
        );
    }

    #[test]
    fn damaged_and_foreign_files_are_explained() {
        let bytes = written(&sample_map(10), 1);
        let reason = |bytes: &[u8]| match parse_snapshot(bytes) {
            Err(Error::SnapshotFormat(reason)) => reason,
            other => panic!("expected a format error, got {other:?}"),
        };
        assert_eq!(reason(b""), "empty file");
        assert!(reason(&bytes[..bytes.len() / 2]).starts_with("truncated"));
        assert!(reason(b"\x89PNG garbage").starts_with("unparsable"));
        let future = br#"{"format":"tunecache-snapshot","version":3,"entries":{"new":"shape"}}"#;
        assert!(reason(future).contains("unknown format version"));
        let foreign = br#"{"format":"something-else","version":1,"entries":[]}"#;
        assert!(reason(foreign).contains("not a tunecache-snapshot"));
    }

    #[test]
    fn unknown_fields_are_ignored_and_invalid_entries_dropped() {
        let text = r#"{"format":"tunecache-snapshot","version":1,"future":true,"entries":[
            {"namespace":"n","op":"o","config":"{}","time_us":1.0,"extra":[1,2]},
            {"namespace":"n","op":"p","config":"{not json","time_us":1.0},
            {"namespace":"n","op":"q","config":"{}","time_us":-3.0}]}"#;
        let parsed = parse_snapshot(text.as_bytes()).unwrap();
        assert_eq!(parsed.entries.len(), 1);
        assert_eq!(parsed.invalid_entries, 2);
    }

    /// Timing of a large snapshot; run in release:
    /// `cargo test --release -p tunecache-server snapshot_format -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn timing_of_large_snapshots() {
        for n in [100_000, 1_000_000] {
            let map = sample_map(n);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("node-a.tunecache.json");
            let started = Instant::now();
            let file = std::fs::File::create(&path).unwrap();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            write_segment(&mut out, "node-a", (1, 1), 1, &map, None).unwrap();
            out.flush().unwrap();
            let write_time = started.elapsed();
            let started = Instant::now();
            let bytes = std::fs::read(&path).unwrap();
            let parsed = parse_snapshot(&bytes).unwrap();
            let read_time = started.elapsed();
            assert_eq!(parsed.entries.len(), n);
            println!(
                "{n} entries, {} MB: write {write_time:?}, read+parse+validate {read_time:?}",
                bytes.len() / 1_000_000
            );
        }
    }

    #[test]
    fn a_key_authenticates_every_byte_and_nothing_else_passes() {
        let map = sample_map(40);
        let key = SharedKey::new(b"0123456789abcdef-cluster-key").unwrap();
        let mut bytes = Vec::new();
        write_segment(&mut bytes, "node-a", (3, 4), 7, &map, Some(&key)).unwrap();
        // Still plain JSON, with the MAC as its last member.
        let document: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(document["mac"]
            .as_str()
            .unwrap()
            .starts_with("hmac-sha256:"));
        let parsed = read_authenticated(&bytes[..], Some(&key)).unwrap();
        assert_eq!((parsed.first_seq, parsed.last_seq), (Some(3), Some(4)));
        assert_eq!(parsed.entries.len(), 40);
        // Readers without a key read it as before.
        assert_eq!(
            read_authenticated(&bytes[..], None).unwrap().entries.len(),
            40
        );

        let refused = |bytes: &[u8], key: &SharedKey| match read_authenticated(bytes, Some(key)) {
            Err(Error::Unauthenticated(why)) => why,
            other => panic!("accepted: {other:?}"),
        };
        // Any byte changed, the MAC included.
        for at in [10, bytes.len() / 2, bytes.len() - 5] {
            let mut tampered = bytes.clone();
            tampered[at] ^= 0x01;
            assert!(
                read_authenticated(&tampered[..], Some(&key)).is_err(),
                "byte {at}"
            );
        }
        let other = SharedKey::new(b"another-key-of-16+bytes").unwrap();
        assert!(refused(&bytes, &other).contains("does not verify"));
        assert_eq!(refused(&written(&map, 7), &key), "carries no MAC");
        assert!(SharedKey::new(b"short").is_err());
    }

    #[test]
    fn an_invalid_entry_is_dropped_alone() {
        let good = r#"{"namespace":"n","op":"o","device":"d","problem":"p1","config":"{}","time_us":1.5,"tuned_by":"x","tuned_at_unix_ms":1}"#;
        let good2 = good.replace("p1", "p2");
        let huge = good.replace("1.5", "1e999").replace("p1", "p3");
        let text = good.replace("1.5", "\"fast\"").replace("p1", "p4");
        let document = format!(
            r#"{{"format":"tunecache-snapshot","version":2,"node":"a","first_seq":1,"last_seq":1,"entries":[{good},{huge},{text},{good2}]}}"#
        );
        let parsed = parse_snapshot(document.as_bytes()).unwrap();
        assert_eq!(parsed.entries.len(), 2);
        assert_eq!(parsed.invalid_entries, 2);
    }

    #[test]
    fn forgets_read_back_and_values_no_clock_made_are_refused() {
        let now_stamp = (crate::model::entry::unix_now_ms() as u64) << 16;
        let entry = |problem: &str, epoch: u64| {
            format!(
                r#"{{"namespace":"n","op":"o","device":"d","problem":"{problem}","config":"{{}}","time_us":1.5,"forget_epoch":{epoch}}}"#
            )
        };
        let forget = |stamp: u64| {
            format!(r#"{{"namespace":"n","op":"o","every_rank":true,"stamp":{stamp}}}"#)
        };
        let document = format!(
            r#"{{"format":"tunecache-snapshot","version":2,"node":"a","first_seq":1,"last_seq":1,"entries":[{},{}],"forgets":[{},{}]}}"#,
            entry("p1", now_stamp),
            entry("p2", u64::MAX),
            forget(now_stamp),
            forget(u64::MAX)
        );
        let parsed = parse_snapshot(document.as_bytes()).unwrap();
        assert_eq!(
            parsed.entries.len(),
            1,
            "an epoch from the far future is refused"
        );
        assert_eq!(parsed.entries[0].result().forget_epoch, now_stamp);
        assert_eq!(parsed.invalid_entries, 1);
        let stamps: Vec<u64> = parsed.tombstones.iter().map(|t| t.stamp).collect();
        assert_eq!(stamps, vec![now_stamp], "so is a stamp from the far future");
        assert_eq!(parsed.tombstones[0].scope.rank, RankScope::Every);
    }

    fn dated(map: &CacheMap, day_of: impl Fn(usize) -> u32) -> crate::wire::stored::EntryMap {
        map.iter()
            .enumerate()
            .map(|(i, (key, result))| {
                crate::wire::stored::StoredEntry::new(key, result).with_last_use(day_of(i))
            })
            .collect()
    }

    fn days(entries: &[crate::wire::stored::StoredEntry]) -> Vec<(String, u32)> {
        entries
            .iter()
            .map(|e| (e.key().problem.to_owned(), e.last_use()))
            .collect()
    }

    #[test]
    fn entries_and_uses_carry_their_days_through_a_keyed_round_trip() {
        let map = sample_map(20);
        // Every third entry has no use known: its field is left out.
        let entries = dated(&map, |i| if i % 3 == 0 { 0 } else { 20_000 + i as u32 });
        let used = dated(&sample_map(3), |i| 20_100 + i as u32);
        let key = SharedKey::new(b"0123456789abcdef-cluster-key").unwrap();
        let extras = SegmentExtras {
            used: Some(&used),
            tombstones: &[],
        };
        let mut bytes = Vec::new();
        write_segment_with(
            &mut bytes,
            "node-a",
            (2, 2),
            9,
            &entries,
            extras,
            Some(&key),
        )
        .unwrap();
        let document: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(document["used"].as_array().unwrap().len(), 3);
        assert!(document["entries"][0].get("last_used_day").is_none());
        assert_eq!(document["entries"][1]["last_used_day"], 20_001);

        let parsed = read_authenticated(&bytes[..], Some(&key)).unwrap();
        assert_eq!(parsed.invalid_entries, 0);
        let expected: Vec<_> = entries.iter().cloned().collect();
        assert_eq!(days(&parsed.entries), days(&expected));
        assert_eq!(parsed.pairs(), map.into_iter().collect::<Vec<_>>());
        let expected: Vec<_> = used.iter().cloned().collect();
        assert_eq!(days(&parsed.used), days(&expected));
        assert!(parsed
            .used
            .iter()
            .zip(&expected)
            .all(|(a, b)| a.same_entry(b)));

        // The MAC covers the uses like the entries: a day changed inside `used` is refused.
        let text = String::from_utf8(bytes.clone()).unwrap();
        let at = text.find(r#""last_used_day":20102"#).unwrap();
        assert!(at > text.find(r#""used":"#).unwrap());
        let tampered = text.replacen(r#""last_used_day":20102"#, r#""last_used_day":20109"#, 1);
        assert!(matches!(
            read_authenticated(tampered.as_bytes(), Some(&key)),
            Err(Error::Unauthenticated(_))
        ));

        // Without uses or days, a segment is the bytes it always was.
        let mut plain = Vec::new();
        let no_days = dated(&sample_map(20), |_| 0);
        write_segment(&mut plain, "node-a", (1, 1), 42, &no_days, None).unwrap();
        assert_eq!(plain, written(&sample_map(20), 42));
    }

    #[test]
    fn an_invalid_last_used_day_drops_only_its_entry() {
        let entry = |problem: &str, day: &str| {
            format!(
                r#"{{"namespace":"n","op":"o","device":"d","problem":"{problem}","config":"{{}}","time_us":1.5,"last_used_day":{day}}}"#
            )
        };
        let document = format!(
            r#"{{"format":"tunecache-snapshot","version":2,"node":"a","first_seq":1,"last_seq":1,"entries":[{},{},{},{}],"used":[{},{},{}]}}"#,
            entry("p1", "20000"),
            entry("p2", "1.5"),
            entry("p3", "-1"),
            entry("p4", "\"today\""),
            entry("u1", "20001"),
            entry("u2", "4294967296"),
            entry("u3", "null"),
        );
        let parsed = parse_snapshot(document.as_bytes()).unwrap();
        assert_eq!(days(&parsed.entries), vec![("p1".into(), 20_000)]);
        assert_eq!(days(&parsed.used), vec![("u1".into(), 20_001)]);
        assert_eq!(parsed.invalid_entries, 5, "counted like any invalid entry");
        // A segment of an older daemon lists no uses and no days.
        let old = parse_snapshot(&written(&sample_map(2), 1)).unwrap();
        assert!(old.used.is_empty());
        assert!(old.entries.iter().all(|e| e.last_use() == 0));
    }
}
