//! Every frame the journal writes, its replay accepts: entries, tombstones, learned batches
//! and compaction output, at any batch size, come back exactly as written.

use proptest::prelude::*;

use super::test_support::*;
use super::*;
use crate::error::Error;
use crate::model::forget::{ForgetScope, RankScope, Tombstone};

/// A tombstone of one key whose problem is `problem_bytes` long.
fn big_tombstone(i: usize, problem_bytes: usize) -> Tombstone {
    let mut problem = format!("{i:08}");
    problem.extend(std::iter::repeat_n(
        'p',
        problem_bytes.saturating_sub(problem.len()),
    ));
    Tombstone {
        scope: ForgetScope {
            namespace: "ns".into(),
            op: "op".into(),
            device: "dev".into(),
            problem,
            rank: RankScope::Shared,
        },
        stamp: 1 << 16,
    }
}

/// Issue 39, finding 5: 4,500 tombstones of 4 KiB keys (about 18 MiB), learned in one batch
/// or written by a compaction, made one frame over the 16 MiB replay accepts; after a
/// restart every one was gone and the journal was set aside as damaged.
#[test]
fn a_tombstone_batch_bigger_than_a_frame_is_replayed_whole() {
    let tombstones: Vec<(Tombstone, Origin)> = (0..4_500)
        .map(|i| (big_tombstone(i, 4096), Origin::Learned))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _, _| {}).unwrap();
        journal.append_tombstones(&tombstones).unwrap();
    }
    let (_, report) = replay(dir.path());
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.tombstones.len(), tombstones.len());
    assert!(report.tombstones == tombstones);
    {
        let (mut journal, _) =
            Journal::open(dir.path(), FsyncPolicy::Never, |_, _, _, _| {}).unwrap();
        journal
            .rewrite(
                stored(&[entry(1)]).iter().map(|(e, o)| (e, *o)),
                &tombstones,
            )
            .unwrap();
    }
    let (seen, report) = replay(dir.path());
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(seen, vec![entry(1)]);
    assert!(report.tombstones == tombstones);
}

/// Small frames, so that a proptest writes batches of many frames with little data.
const LIMITS: FrameLimits = FrameLimits {
    target: 1024,
    max: 4096,
};

/// One write of the proptest: records given by their sizes (config or problem bytes) and
/// whether they are learned.
#[derive(Debug, Clone)]
enum Written {
    Entries(Vec<(usize, bool)>),
    Tombstones(Vec<(usize, bool)>),
    Rewrite(Vec<(usize, bool)>, Vec<(usize, bool)>),
}

/// A batch: a few records up to most of a frame, or many small ones; either way up to
/// about 10 times the largest frame.
fn batch() -> impl Strategy<Value = Vec<(usize, bool)>> {
    prop_oneof![
        proptest::collection::vec((0..=3_900usize, any::<bool>()), 0..=10),
        proptest::collection::vec((0..=64usize, any::<bool>()), 0..=500),
    ]
}

fn written() -> impl Strategy<Value = Written> {
    prop_oneof![
        batch().prop_map(Written::Entries),
        batch().prop_map(Written::Tombstones),
        (batch(), batch()).prop_map(|(e, t)| Written::Rewrite(e, t)),
    ]
}

fn origin(learned: bool) -> Origin {
    if learned {
        Origin::Learned
    } else {
        Origin::Own
    }
}

/// What replay hands back: entries in the order written, per provenance (a frame holds its
/// own entries before its learned ones), and tombstones in the order written.
#[derive(Debug, Default, PartialEq)]
struct Held {
    own: Vec<(CacheKey, TunedResult)>,
    learned: Vec<(CacheKey, TunedResult)>,
    tombstones: Vec<(Tombstone, Origin)>,
}

impl Held {
    fn add_entry(&mut self, (key, result, origin): JournalEntry) {
        match origin {
            Origin::Own => self.own.push((key, result)),
            Origin::Learned => self.learned.push((key, result)),
        }
    }
}

/// The payload length of every frame in the journal file.
fn frame_lengths(dir: &Path) -> Vec<usize> {
    let bytes = std::fs::read(dir.join("journal")).unwrap();
    let mut lengths = Vec::new();
    let mut at = 0;
    while at + 12 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        lengths.push(len);
        at += 12 + len;
    }
    assert_eq!(at, bytes.len(), "the file is whole frames");
    lengths
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_kind_of_batch_is_replayed_exactly_as_written(writes in proptest::collection::vec(written(), 1..6)) {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Held::default();
        let mut n = 0usize;
        let mut next_entry = |config_len: usize, learned: bool| {
            n += 1;
            let (key, mut result, _) = entry(n as u32);
            result.config = "c".repeat(config_len);
            (key, result, origin(learned))
        };
        let mut m = 0usize;
        let mut next_tombstone = |problem_len: usize, learned: bool| {
            m += 1;
            (big_tombstone(m, problem_len), origin(learned))
        };
        {
            let (mut journal, _) =
                Journal::open_with_limits(dir.path(), FsyncPolicy::Never, LIMITS, &Default::default(), |_, _, _| {})
                    .unwrap();
            for write in writes {
                match write {
                    Written::Entries(sizes) => {
                        let entries: Vec<JournalEntry> =
                            sizes.iter().map(|&(len, l)| next_entry(len, l)).collect();
                        journal.append(&entries).unwrap();
                        entries.into_iter().for_each(|e| expected.add_entry(e));
                    }
                    Written::Tombstones(sizes) => {
                        let tombstones: Vec<(Tombstone, Origin)> =
                            sizes.iter().map(|&(len, l)| next_tombstone(len, l)).collect();
                        journal.append_tombstones(&tombstones).unwrap();
                        expected.tombstones.extend(tombstones);
                    }
                    Written::Rewrite(entry_sizes, tombstone_sizes) => {
                        let entries: Vec<JournalEntry> =
                            entry_sizes.iter().map(|&(len, l)| next_entry(len, l)).collect();
                        let tombstones: Vec<(Tombstone, Origin)> = tombstone_sizes
                            .iter()
                            .map(|&(len, l)| next_tombstone(len, l))
                            .collect();
                        let live = stored(&entries);
                        journal
                            .rewrite(live.iter().map(|(e, o)| (e, *o)), &tombstones)
                            .unwrap();
                        expected = Held::default();
                        entries.into_iter().for_each(|e| expected.add_entry(e));
                        expected.tombstones.extend(tombstones);
                    }
                }
            }
        }
        let lengths = frame_lengths(dir.path());
        prop_assert!(lengths.iter().all(|&len| len <= LIMITS.max), "{lengths:?}");
        let mut seen = Held::default();
        let (_, report) =
            Journal::open_with_limits(dir.path(), FsyncPolicy::Never, LIMITS, &Default::default(), |entry, o, _| {
                let (k, r) = entry.to_pair();
                seen.add_entry((k, r, o))
            })
            .unwrap();
        prop_assert!(report.skipped.is_empty(), "{:?}", report.skipped);
        prop_assert!(report.torn_tail.is_none());
        seen.tombstones = report.tombstones;
        prop_assert!(seen == expected);
    }
}

#[test]
fn a_record_bigger_than_a_frame_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = Journal::open_with_limits(
        dir.path(),
        FsyncPolicy::Never,
        LIMITS,
        &Default::default(),
        |_, _, _| {},
    )
    .unwrap();
    journal.append(&[entry(1)]).unwrap();
    let len = journal.len();
    let (key, mut result, origin) = entry(2);
    result.config = "c".repeat(LIMITS.max);
    let refused = journal
        .append(&[entry(3), (key, result, origin)])
        .unwrap_err();
    assert!(
        matches!(refused, Error::JournalRecordTooLarge { limit: 4096, .. }),
        "{refused}"
    );
    let refused = journal
        .append_tombstones(&[(big_tombstone(1, LIMITS.max), Origin::Own)])
        .unwrap_err();
    assert!(
        matches!(refused, Error::JournalRecordTooLarge { .. }),
        "{refused}"
    );
    assert_eq!(journal.len(), len, "nothing of either batch was written");
    drop(journal);
    assert_eq!(replay(dir.path()).0, vec![entry(1)]);
}
