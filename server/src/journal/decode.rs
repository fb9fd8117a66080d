//! One frame's payload (a `JournalBatch`) read into what replay hands on: its entries straight
//! into their stored form, read from the payload's bytes with no owned copy between; its
//! tombstones and last uses decoded by prost.
//!
//! The direct reader takes only payloads the writer makes: every entry's bytes exactly the
//! record its stored form holds (so nothing is taken that prost would read otherwise). Any
//! other payload (an unknown field, an entry without a key, a non-canonical encoding) is
//! decoded by prost whole, so replay accepts exactly what prost accepts, as it always did.

use prost::encoding::{decode_key, decode_varint, WireType};
use prost::Message;
use tunecache_proto::journal::v1::{JournalBatch, LastUse, Tombstone as JournalTombstone};

use crate::model::artifacts::ArtifactList;
use crate::model::entry::{CacheKey, KeyView, Origin, ResultView, TunedResult};
use crate::model::forget::Tombstone;
use crate::model::lifecycle::Day;
use crate::wire::stored::{parse_entry_body, take_delimited, RecentVocabs, StoredEntry};

use super::frame::{last_use_from_record, tombstone_from_record};

/// What one frame held.
#[derive(Debug, Default)]
pub(crate) struct DecodedFrame {
    /// Its entries in the order written (own first, then learned), each with its last use.
    pub entries: Vec<(StoredEntry, Origin, Day)>,
    pub tombstones: Vec<(Tombstone, Origin)>,
    pub last_uses: Vec<(CacheKey, Day, Origin)>,
    /// The highest `forget_epoch` among its entries.
    pub highest_epoch: u64,
}

/// Reads a frame's payload; `None` when prost does not decode it either (damage).
pub(super) fn decode_frame(payload: &[u8], recent: &mut RecentVocabs) -> Option<DecodedFrame> {
    decode_direct(payload, recent).or_else(|| decode_with_prost(payload))
}

/// The direct reader; `None` for anything the writer does not make.
fn decode_direct(mut payload: &[u8], recent: &mut RecentVocabs) -> Option<DecodedFrame> {
    let mut own: Vec<&[u8]> = Vec::new();
    let mut learned: Vec<&[u8]> = Vec::new();
    let mut days: Vec<Day> = Vec::new();
    let mut frame = DecodedFrame::default();
    while !payload.is_empty() {
        match decode_key(&mut payload).ok()? {
            (1, WireType::LengthDelimited) => own.push(take_delimited(&mut payload)?),
            (2, WireType::LengthDelimited) => learned.push(take_delimited(&mut payload)?),
            (3, WireType::LengthDelimited) => {
                let record = JournalTombstone::decode(take_delimited(&mut payload)?).ok()?;
                frame.tombstones.push(tombstone_from_record(record));
            }
            (4, WireType::LengthDelimited) => {
                let record = LastUse::decode(take_delimited(&mut payload)?).ok()?;
                frame.last_uses.extend(last_use_from_record(record));
            }
            // Packed, as the writer and prost write it; one value at a time, as prost reads
            // it too (prost truncates each value to 32 bits).
            (5, WireType::LengthDelimited) => {
                let mut packed = take_delimited(&mut payload)?;
                while !packed.is_empty() {
                    days.push(decode_varint(&mut packed).ok()? as Day);
                }
            }
            (5, WireType::Varint) => days.push(decode_varint(&mut payload).ok()? as Day),
            _ => return None,
        }
    }
    let bodies = (own.iter().map(|body| (*body, Origin::Own)))
        .chain(learned.iter().map(|body| (*body, Origin::Learned)));
    let days = days.into_iter().chain(std::iter::repeat(0));
    frame.entries.reserve(own.len() + learned.len());
    for ((body, origin), day) in bodies.zip(days) {
        let (key, result) = parse_entry_body(body)?;
        frame.highest_epoch = frame.highest_epoch.max(result.forget_epoch);
        let entry = stored_exactly(&key, &result, body, recent)?;
        frame.entries.push((entry, origin, day));
    }
    Some(frame)
}

/// The stored form of an entry read from `body`, if its record holds exactly `body` (and its
/// artifacts are in their canonical order): what prost and the conversions would make of it.
fn stored_exactly(
    key: &KeyView<'_>,
    result: &ResultView<'_>,
    body: &[u8],
    recent: &mut RecentVocabs,
) -> Option<StoredEntry> {
    if !result.artifacts.is_empty() {
        let canonical = ArtifactList::from_wire(result.artifacts.to_wire());
        if canonical.view().encoded() != result.artifacts.encoded() {
            return None;
        }
    }
    let entry = StoredEntry::from_views_in(key, result, recent);
    let record = entry.record();
    (record.len() >= body.len() && &record[record.len() - body.len()..] == body).then_some(entry)
}

/// The whole payload decoded by prost: what replay always accepted.
fn decode_with_prost(payload: &[u8]) -> Option<DecodedFrame> {
    let batch = JournalBatch::decode(payload).ok()?;
    let own = batch.entries.into_iter().map(|e| (e, Origin::Own));
    let learned = batch.learned.into_iter().map(|e| (e, Origin::Learned));
    let days = batch.entry_days.into_iter().chain(std::iter::repeat(0));
    let mut frame = DecodedFrame::default();
    for ((entry, origin), day) in own.chain(learned).zip(days) {
        if let (Some(key), Some(result)) = (entry.key, entry.result) {
            let (key, result): (CacheKey, TunedResult) = (key.into(), result.into());
            frame.highest_epoch = frame.highest_epoch.max(result.forget_epoch);
            frame
                .entries
                .push((StoredEntry::new(&key, &result), origin, day));
        }
    }
    frame.last_uses = batch
        .last_uses
        .into_iter()
        .filter_map(last_use_from_record)
        .collect();
    frame.tombstones = batch
        .forgets
        .into_iter()
        .map(tombstone_from_record)
        .collect();
    Some(frame)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message;
    use tunecache_proto::journal::v1::JournalBatch;
    use tunecache_proto::v1;

    use super::*;
    use crate::journal::frame::{encode_frame, HEADER_LEN};

    fn pairs(frame: &DecodedFrame) -> Vec<(CacheKey, TunedResult, Origin, Day)> {
        frame
            .entries
            .iter()
            .map(|(entry, origin, day)| {
                let (key, result) = entry.to_pair();
                (key, result, *origin, *day)
            })
            .collect()
    }

    fn same(a: &DecodedFrame, b: &DecodedFrame) {
        assert_eq!(pairs(a), pairs(b));
        assert_eq!(a.tombstones, b.tombstones);
        assert_eq!(a.last_uses, b.last_uses);
        assert_eq!(a.highest_epoch, b.highest_epoch);
    }

    fn wire_entry(i: u32, artifacts: Vec<v1::Artifact>) -> v1::Entry {
        v1::Entry {
            key: Some(v1::Key {
                namespace: "ns".into(),
                op: format!("op{}", i % 3),
                device: "dev".into(),
                problem: format!("m={i}"),
                rank: i.is_multiple_of(2).then_some(i),
            }),
            result: Some(v1::Result {
                config: format!("{{\"tile\":{i}}}"),
                time_us: f64::from(i) + 0.5,
                tuned_by: "node".into(),
                tuned_at_unix_ms: i64::from(i),
                forget_epoch: u64::from(i % 4),
                artifacts,
            }),
        }
    }

    #[test]
    fn the_writers_frames_are_read_directly_as_prost_reads_them() {
        let entries: Vec<(StoredEntry, Origin)> = (0..20)
            .map(|i| {
                let entry = wire_entry(i, Vec::new());
                let key: CacheKey = entry.key.unwrap().into();
                let result: TunedResult = entry.result.unwrap().into();
                let origin = [Origin::Own, Origin::Learned][i as usize % 2];
                let stored = StoredEntry::new(&key, &result).with_last_use(20_000 + i);
                (stored, origin)
            })
            .collect();
        let mut frame = Vec::new();
        encode_frame(
            &entries.iter().map(|(e, o)| (e, *o)).collect::<Vec<_>>(),
            &mut frame,
        );
        let payload = &frame[HEADER_LEN..];
        let mut recent = RecentVocabs::default();
        let direct = decode_direct(payload, &mut recent).expect("the writer's frame is direct");
        same(&direct, &decode_with_prost(payload).unwrap());
        assert_eq!(direct.entries.len(), 20);
        assert!(direct.entries.iter().all(|(_, _, day)| *day >= 20_000));
    }

    #[test]
    fn what_the_writer_never_makes_goes_to_prost() {
        let unsorted = vec![
            v1::Artifact {
                name: "b.so".into(),
                sha256: "ab".repeat(32),
                size: 2,
            },
            v1::Artifact {
                name: "a.cu".into(),
                sha256: "cd".repeat(32),
                size: 1,
            },
        ];
        let mut no_key = wire_entry(2, Vec::new());
        no_key.key = None;
        let cases = [
            JournalBatch {
                entries: vec![wire_entry(1, unsorted)],
                ..Default::default()
            },
            JournalBatch {
                entries: vec![wire_entry(1, Vec::new()), no_key],
                entry_days: vec![7, 8],
                ..Default::default()
            },
        ];
        let mut recent = RecentVocabs::default();
        for batch in cases {
            let payload = batch.encode_to_vec();
            assert!(decode_direct(&payload, &mut recent).is_none());
            let read = decode_frame(&payload, &mut recent).unwrap();
            same(&read, &decode_with_prost(&payload).unwrap());
        }
        // An unknown field: prost skips it, and so does replay.
        let mut payload = JournalBatch {
            entries: vec![wire_entry(3, Vec::new())],
            ..Default::default()
        }
        .encode_to_vec();
        payload.extend_from_slice(&[9 << 3, 1]);
        assert!(decode_direct(&payload, &mut recent).is_none());
        assert_eq!(
            decode_frame(&payload, &mut recent).unwrap().entries.len(),
            1
        );
    }

    proptest! {
        /// Whatever bytes a frame holds, the direct reader reads them as prost does, or
        /// leaves them to prost.
        #[test]
        fn direct_reads_agree_with_prost(
            days in proptest::collection::vec(0u32..40_000, 1..6),
            damage in 0u8..3,
            at in any::<prop::sample::Index>(),
            bits in 1u8..=255,
        ) {
            let batch = JournalBatch {
                entries: (0..days.len() as u32).map(|i| wire_entry(i, Vec::new())).collect(),
                entry_days: days,
                ..Default::default()
            };
            let mut payload = batch.encode_to_vec();
            let at = at.index(payload.len());
            match damage {
                0 => {}
                1 => payload[at] ^= bits,
                _ => payload.truncate(at.max(1)),
            }
            let mut recent = RecentVocabs::default();
            if let Some(direct) = decode_direct(&payload, &mut recent) {
                let prost = decode_with_prost(&payload);
                prop_assert!(prost.is_some(), "direct took what prost refuses");
                let prost = prost.unwrap();
                prop_assert_eq!(pairs(&direct), pairs(&prost));
            }
        }
    }
}
