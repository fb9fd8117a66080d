//! Fuzz targets for the daemon's two readers of untrusted bytes: the journal frame reader
//! (`Journal::open`, which replays `<state-dir>/journal`) and the snapshot parser
//! (`snapshot_format::parse_snapshot`, which reads files any node put in the shared
//! directory).
//!
//! Why proptest and not cargo-fuzz: cargo-fuzz (libFuzzer) needs a nightly toolchain and
//! sanitizer flags, so it cannot run inside `cargo test` on the stable toolchain CI uses.
//! bolero runs on stable too, but outside its own cargo subcommand it is a random-input
//! engine like proptest, without proptest's shrinking and saved regressions. Both readers
//! sit behind a checksum or a JSON parser, so raw random bytes stop at the first check;
//! the generators below therefore build valid journals and documents and then damage them
//! (truncate, flip, insert, splice junk), which is what reaches the interesting paths.
//! Every case is bounded, so a CI run takes seconds; `PROPTEST_CASES=N` runs longer
//! (docs/ci.md).
//!
//! Each target asserts properties, not just "no panic": replay returns exactly the entries
//! of the intact frames, in order, and replays the same after recovery; a snapshot that
//! parses holds only valid entries and writes back to a document that parses to the same
//! entries, bit for bit; a written snapshot parses back to exactly what was written.

use std::path::Path;

use proptest::prelude::*;
use prost::Message;
use tunecache_proto::journal::v1::JournalBatch;
use tunecache_server::journal::{FsyncPolicy, Journal, ReplayReport};
use tunecache_server::model::entry::{to_wire_entry, CacheKey, Origin, TunedResult};
use tunecache_server::model::merge::{merge, MergeOutcome};
use tunecache_server::snapshot::format::{parse_snapshot, read_snapshot, write_segment};
use tunecache_server::store::CacheMap;
use tunecache_server::Error;

const MAGIC: &[u8; 4] = b"TCJ1";

/// A key and result as bits: equal tuples mean equal bytes on disk.
type Bits = (CacheKey, String, u64, String, i64);

fn bits((key, result): &(CacheKey, TunedResult)) -> Bits {
    (
        key.clone(),
        result.config.clone(),
        result.time_us.to_bits(),
        result.tuned_by.clone(),
        result.tuned_at_unix_ms,
    )
}

fn all_bits(entries: &[(CacheKey, TunedResult)]) -> Vec<Bits> {
    entries.iter().map(bits).collect()
}

/// Times a Record could carry: finite and non-negative, with the awkward ones often.
fn valid_time_us() -> impl Strategy<Value = f64> {
    prop_oneof![
        prop::sample::select(vec![
            0.0,
            f64::from_bits(1), // smallest subnormal
            f64::MIN_POSITIVE / 3.0,
            f64::MIN_POSITIVE,
            0.1 + 0.2,
            1.0 / 3.0,
            2.225_073_858_507_201e-308, // the largest subnormal
            9_007_199_254_740_993.0,
            f64::MAX,
        ]),
        (0u64..0x7ff0_0000_0000_0000).prop_map(f64::from_bits), // every finite positive
        0.0f64..1e6,
    ]
}

/// Strings with what JSON and protobuf encoders must escape or count carefully.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "trtllm",
            "\"",
            "\\",
            "\u{0}",
            "\n\t",
            "\u{7f}",
            "\u{2028}",
            "\u{fffd}",
            "é",
            "\u{1f600}",
            "</script>",
            "TCJ1",
        ])
        .prop_map(str::to_owned),
        prop::string::string_regex(&format!("[a-z0-9:|_=,]{{1,{max}}}")).expect("regex"),
        prop::string::string_regex(&format!(".{{1,{max}}}")).expect("regex"),
    ]
}

fn valid_config() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "{}",
            "[]",
            "null",
            "0",
            r#"{"tile":[128,128,64],"stages":3}"#,
            r#"{"s":"\u0000\"\\"}"#,
            " { } ",
        ])
        .prop_map(str::to_owned),
        text(12).prop_map(|s| serde_json::to_string(&s).expect("a string is JSON")),
    ]
}

/// Pairs that pass the daemon's validation (so a snapshot keeps all of them).
fn valid_entry() -> impl Strategy<Value = (CacheKey, TunedResult)> {
    (
        text(8),
        text(12),
        prop_oneof![Just(String::new()), text(16)],
        prop_oneof![Just(String::new()), text(24)],
        prop::option::of(prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()]),
        valid_config(),
        valid_time_us(),
        prop_oneof![Just(String::new()), text(12)],
        prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>()],
    )
        .prop_map(
            |(namespace, op, device, problem, rank, config, time_us, tuned_by, at)| {
                // The node tuner's namespace canonicalises problems; keep out of it here.
                let namespace = if namespace == "tunecache" {
                    "tunecache-x".to_owned()
                } else {
                    namespace
                };
                let key = CacheKey {
                    namespace,
                    op,
                    device,
                    problem,
                    rank,
                };
                let result = TunedResult {
                    config,
                    time_us,
                    tuned_by,
                    tuned_at_unix_ms: at,
                    forget_epoch: 0,
                    artifacts: Default::default(),
                };
                (key, result)
            },
        )
}

fn map_of(entries: &[(CacheKey, TunedResult)]) -> CacheMap {
    let mut map = CacheMap::new();
    for (key, result) in entries {
        if merge(map.get(key), result) == MergeOutcome::Replace {
            map.insert(key.clone(), result.clone());
        }
    }
    map
}

// ---------------------------------------------------------------------------------------
// Journal frame reader
// ---------------------------------------------------------------------------------------

/// One piece of a journal file under test.
#[derive(Debug, Clone)]
enum Piece {
    /// A frame as the daemon writes it.
    Frame(Vec<(CacheKey, TunedResult)>),
    /// A frame with a correct header and checksum around arbitrary payload bytes: replay
    /// must accept it exactly when the payload decodes.
    ChecksummedJunk(Vec<u8>),
    /// Bytes that are not a frame: random, a lone magic, a header that lies about its
    /// length or checksum.
    Junk(Vec<u8>),
}

fn frame_bytes(payload: &[u8]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn encode_batch(entries: &[(CacheKey, TunedResult)]) -> Vec<u8> {
    JournalBatch {
        entries: entries.iter().map(|(k, r)| to_wire_entry(k, r)).collect(),
        learned: Vec::new(),
        forgets: Vec::new(),
        last_uses: Vec::new(),
        entry_days: Vec::new(),
    }
    .encode_to_vec()
}

fn junk() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 1..64),
        Just(MAGIC.to_vec()),
        Just(b"TC".to_vec()),
        // A header claiming more payload than follows, or more than any frame may hold.
        (
            any::<u32>(),
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 0..16)
        )
            .prop_map(|(len, crc, tail)| {
                let mut bytes = MAGIC.to_vec();
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(&crc.to_le_bytes());
                bytes.extend_from_slice(&tail);
                bytes
            }),
        // A valid-looking header whose checksum is off by one bit.
        (prop::collection::vec(any::<u8>(), 1..32), 0u32..32).prop_map(|(payload, bit)| {
            let mut bytes = frame_bytes(&payload);
            bytes[8..12].copy_from_slice(&(crc32fast::hash(&payload) ^ (1 << bit)).to_le_bytes());
            bytes
        }),
    ]
    // Junk that happens to be an intact frame would be data, not junk: keep it out.
    .prop_filter("junk must not hold an intact frame", |bytes| {
        !holds_intact_frame(bytes)
    })
}

fn holds_intact_frame(bytes: &[u8]) -> bool {
    (0..bytes.len()).any(|at| {
        let rest = &bytes[at..];
        rest.len() >= 12 && rest[..4] == *MAGIC && {
            let len = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
            let crc = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
            rest.len() >= 12 + len && crc32fast::hash(&rest[12..12 + len]) == crc
        }
    })
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        4 => prop::collection::vec(valid_entry(), 0..4).prop_map(Piece::Frame),
        1 => prop::collection::vec(any::<u8>(), 0..48).prop_map(Piece::ChecksummedJunk),
        2 => junk().prop_map(Piece::Junk),
    ]
}

impl Piece {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Piece::Frame(entries) => frame_bytes(&encode_batch(entries)),
            Piece::ChecksummedJunk(payload) => frame_bytes(payload),
            Piece::Junk(bytes) => bytes.clone(),
        }
    }

    /// What replay must hand over for this piece when it is intact.
    fn expected_entries(&self) -> Vec<(CacheKey, TunedResult)> {
        let payload = match self {
            Piece::Frame(entries) => return entries.clone(),
            Piece::ChecksummedJunk(payload) => payload,
            Piece::Junk(_) => return Vec::new(),
        };
        // Replay applies exactly the entries of a checksummed payload that decodes.
        JournalBatch::decode(payload.as_slice())
            .map(|batch| {
                batch
                    .entries
                    .into_iter()
                    .filter_map(|entry| Some((entry.key?.into(), entry.result?.into())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn replay(dir: &Path) -> (Journal, Vec<(CacheKey, TunedResult)>, ReplayReport) {
    let mut seen = Vec::new();
    let (journal, report) = Journal::open(dir, FsyncPolicy::Never, |key, result, _origin, _day| {
        seen.push((key, result))
    })
    .expect("replay of any content succeeds on a working disk");
    (journal, seen, report)
}

/// Checks the report's ranges against a file of `len` bytes: in order, inside the file,
/// not overlapping, the torn tail last.
fn check_ranges(report: &ReplayReport, len: u64) -> Result<(), TestCaseError> {
    let mut end = 0;
    for skipped in &report.skipped {
        prop_assert!(skipped.offset >= end && skipped.len > 0, "{report:?}");
        end = skipped.offset + skipped.len;
        prop_assert!(end <= len, "{report:?}");
    }
    if let Some((offset, tail_len)) = report.torn_tail {
        prop_assert!(
            offset >= end && tail_len > 0 && offset + tail_len == len,
            "{report:?}"
        );
    }
    Ok(())
}

/// Replays `bytes` as a journal and checks it against what the pieces say it holds.
fn check_journal(bytes: &[u8], expected: &[(CacheKey, TunedResult)]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal");
    std::fs::write(&path, bytes).expect("writing the journal under test");

    let (mut journal, seen, report) = replay(dir.path());
    prop_assert_eq!(all_bits(&seen), all_bits(expected));
    prop_assert_eq!(report.entries, expected.len() as u64);
    check_ranges(&report, bytes.len() as u64)?;
    let kept = report
        .torn_tail
        .map_or(bytes.len() as u64, |(offset, _)| offset);
    prop_assert_eq!(journal.len(), kept);
    prop_assert_eq!(std::fs::metadata(&path).expect("journal").len(), kept);

    // After recovery the journal takes appends, and replays the same plus what was added.
    let added = (
        CacheKey {
            namespace: "ns".into(),
            op: "added-after-recovery".into(),
            device: String::new(),
            problem: String::new(),
            rank: None,
        },
        TunedResult {
            config: "{}".into(),
            time_us: 1.0,
            tuned_by: String::new(),
            tuned_at_unix_ms: 0,
            forget_epoch: 0,
            artifacts: Default::default(),
        },
    );
    let (key, result) = added.clone();
    journal
        .append(&[(key, result, Origin::Own)])
        .expect("append");
    drop(journal);
    let (_, again, second) = replay(dir.path());
    let mut with_added = expected.to_vec();
    with_added.push(added);
    prop_assert_eq!(all_bits(&again), all_bits(&with_added));
    prop_assert!(second.torn_tail.is_none(), "{second:?}");
    prop_assert_eq!(second.skipped.len(), report.skipped.len());
    Ok(())
}

proptest! {
    #[test]
    fn journal_replays_exactly_the_intact_frames(pieces in prop::collection::vec(piece(), 0..8)) {
        let bytes: Vec<u8> = pieces.iter().flat_map(Piece::bytes).collect();
        let expected: Vec<_> = pieces.iter().flat_map(Piece::expected_entries).collect();
        check_journal(&bytes, &expected)?;
    }

    #[test]
    fn journal_cut_anywhere_replays_the_whole_frames_before_the_cut(
        frames in prop::collection::vec(prop::collection::vec(valid_entry(), 1..3), 1..5),
        cut in any::<prop::sample::Index>(),
    ) {
        let pieces: Vec<Piece> = frames.into_iter().map(Piece::Frame).collect();
        let bytes: Vec<u8> = pieces.iter().flat_map(Piece::bytes).collect();
        let cut = cut.index(bytes.len() + 1);
        let mut end = 0;
        let mut expected = Vec::new();
        for piece in &pieces {
            end += piece.bytes().len();
            if end <= cut {
                expected.extend(piece.expected_entries());
            }
        }
        check_journal(&bytes[..cut], &expected)?;
    }

    #[test]
    fn journal_reader_survives_any_bytes(
        chunks in prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..64),
                Just(MAGIC.to_vec()),
                Just(vec![0; 12]),
            ],
            0..8,
        )
    ) {
        let bytes: Vec<u8> = chunks.concat();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("journal"), &bytes).expect("write");
        let (journal, seen, report) = replay(dir.path());
        check_ranges(&report, bytes.len() as u64)?;
        prop_assert_eq!(report.entries, seen.len() as u64);
        drop(journal);
        // Replay after recovery is stable.
        let (_, again, second) = replay(dir.path());
        prop_assert_eq!(all_bits(&again), all_bits(&seen));
        prop_assert!(second.torn_tail.is_none());
    }
}

// ---------------------------------------------------------------------------------------
// Snapshot parser
// ---------------------------------------------------------------------------------------

fn snapshot_bytes(node: &str, at: i64, map: &CacheMap) -> Vec<u8> {
    let mut bytes = Vec::new();
    write_segment(&mut bytes, node, (1, 1), at, map, None).expect("writing to memory");
    bytes
}

/// Hands out its bytes a few at a time, as a slow shared filesystem may.
struct Trickle<'a> {
    bytes: &'a [u8],
    step: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(out.len()).min(self.bytes.len());
        out[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

/// What a node that loads a parsed snapshot would write back out; the parse must survive it.
/// Reading in small pieces must give the same outcome as reading the whole file.
fn check_parsed(bytes: &[u8]) -> Result<(), TestCaseError> {
    let whole = parse_snapshot(bytes);
    let trickled = read_snapshot(Trickle {
        bytes,
        step: 1 + bytes.len() % 7,
    });
    match (&whole, &trickled) {
        (Ok(a), Ok(b)) => prop_assert_eq!(all_bits(&a.pairs()), all_bits(&b.pairs())),
        (Err(_), Err(_)) => {}
        _ => prop_assert!(false, "whole: {whole:?}, in pieces: {trickled:?}"),
    }
    let Ok(parsed) = whole else {
        return Ok(());
    };
    for (key, result) in &parsed.pairs() {
        prop_assert!(!key.namespace.is_empty() && !key.op.is_empty());
        prop_assert!(result.time_us.is_finite() && result.time_us.is_sign_positive());
        prop_assert!(serde_json::from_str::<serde::de::IgnoredAny>(&result.config).is_ok());
    }
    let map = map_of(&parsed.pairs());
    let rewritten = snapshot_bytes(&parsed.node, parsed.written_at_unix_ms, &map);
    let reparsed = parse_snapshot(&rewritten).expect("a written snapshot parses");
    prop_assert_eq!(reparsed.invalid_entries, 0);
    prop_assert_eq!(&reparsed.node, &parsed.node);
    prop_assert_eq!(reparsed.written_at_unix_ms, parsed.written_at_unix_ms);
    let expected: Vec<_> = map.into_iter().collect();
    prop_assert_eq!(all_bits(&reparsed.pairs()), all_bits(&expected));
    Ok(())
}

/// Edits that a torn write, a bad disk or a hostile peer could make to a document.
#[derive(Debug, Clone)]
enum Damage {
    Truncate(prop::sample::Index),
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, Vec<u8>),
    Remove(prop::sample::Index, prop::sample::Index),
}

fn damage() -> impl Strategy<Value = Damage> {
    let splice = prop_oneof![
        prop::collection::vec(any::<u8>(), 1..8),
        prop::sample::select(vec![
            b",".to_vec(),
            b"\"".to_vec(),
            b"\\u0000".to_vec(),
            b"\\ud800".to_vec(),
            b"1e999".to_vec(),
            b"-0.0".to_vec(),
            b"null".to_vec(),
            b"{}".to_vec(),
            b"[".to_vec(),
            b"\xff\xfe".to_vec(),
            br#","time_us":5e-324"#.to_vec(),
            br#","rank":4294967296"#.to_vec(),
            br#","version":2"#.to_vec(),
        ]),
    ];
    prop_oneof![
        any::<prop::sample::Index>().prop_map(Damage::Truncate),
        (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(at, x)| Damage::Flip(at, x)),
        (any::<prop::sample::Index>(), splice).prop_map(|(at, b)| Damage::Insert(at, b)),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>())
            .prop_map(|(at, len)| Damage::Remove(at, len)),
    ]
}

impl Damage {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            Damage::Truncate(at) => bytes.truncate(at.index(bytes.len() + 1)),
            Damage::Flip(at, x) if !bytes.is_empty() => {
                let at = at.index(bytes.len());
                bytes[at] ^= x;
            }
            Damage::Flip(..) => {}
            Damage::Insert(at, splice) => {
                let at = at.index(bytes.len() + 1);
                bytes.splice(at..at, splice.iter().copied());
            }
            Damage::Remove(at, len) => {
                let at = at.index(bytes.len() + 1);
                let len = len.index(bytes.len() - at + 1).min(16);
                bytes.drain(at..at + len);
            }
        }
    }
}

proptest! {
    #[test]
    fn snapshot_round_trips_bit_for_bit(
        entries in prop::collection::vec(valid_entry(), 0..12),
        node in text(16),
        at in any::<i64>(),
    ) {
        let map = map_of(&entries);
        let bytes = snapshot_bytes(&node, at, &map);
        let parsed = parse_snapshot(&bytes).expect("a written snapshot parses");
        prop_assert_eq!(&parsed.node, &node);
        prop_assert_eq!(parsed.written_at_unix_ms, at);
        prop_assert_eq!(parsed.invalid_entries, 0);
        let expected: Vec<_> = map.into_iter().collect();
        prop_assert_eq!(all_bits(&parsed.pairs()), all_bits(&expected));
        check_parsed(&bytes)?;
    }

    #[test]
    fn damaged_snapshot_is_refused_or_parses_to_valid_entries(
        entries in prop::collection::vec(valid_entry(), 1..6),
        edits in prop::collection::vec(damage(), 1..4),
    ) {
        let mut bytes = snapshot_bytes("node-a", 1, &map_of(&entries));
        for edit in &edits {
            edit.apply(&mut bytes);
        }
        check_parsed(&bytes)?;
    }

    #[test]
    fn truncated_snapshot_is_reported_as_truncated(
        entries in prop::collection::vec(valid_entry(), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = snapshot_bytes("node-a", 1, &map_of(&entries));
        let cut = cut.index(bytes.len());
        match parse_snapshot(&bytes[..cut]) {
            Err(Error::SnapshotFormat(reason)) => prop_assert!(
                reason == "empty file" || reason.starts_with("truncated"),
                "{cut}: {reason}"
            ),
            other => prop_assert!(false, "a strict prefix parsed: {other:?}"),
        }
    }

    #[test]
    fn snapshot_parser_survives_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_parsed(&bytes)?;
    }

    #[test]
    fn snapshot_parser_survives_any_json_text(
        text in r#"\{("(format|version|entries|node|namespace|op|config|time_us|rank)"|[\[\]{}:,0-9.eE+-]|"[a-z-]{0,8}"|null|true|-0\.0|1e400|"tunecache-snapshot"){0,40}"#
    ) {
        check_parsed(text.as_bytes())?;
    }
}

/// Found by `snapshot_round_trips_bit_for_bit`: with serde_json's default float parser (the
/// daemon built on its own, without the benchmarks in the same cargo run) this time came back
/// one ulp lower, so a node's snapshot did not read back as what it held. Fixed by the
/// workspace-wide `float_roundtrip` feature.
#[test]
fn snapshot_time_reads_back_to_the_same_bits() {
    for time_us in [
        2.583_601_072_299_589_3e-263,
        2.225_073_858_507_201e-308,
        0.1 + 0.2,
    ] {
        let key = CacheKey {
            namespace: "trtllm".into(),
            op: "trtllm".into(),
            device: String::new(),
            problem: String::new(),
            rank: None,
        };
        let result = TunedResult {
            config: "{}".into(),
            time_us,
            tuned_by: String::new(),
            tuned_at_unix_ms: i64::MIN,
            forget_epoch: 0,
            artifacts: Default::default(),
        };
        let map: CacheMap = [(key, result)].into_iter().collect();
        let parsed = parse_snapshot(&snapshot_bytes("node-a", 0, &map)).expect("parses");
        assert_eq!(parsed.pairs()[0].1.time_us.to_bits(), time_us.to_bits());
    }
}
