//! The journal's frame format: magic `TCJ1` | payload length (u32 LE) | CRC-32 of payload
//! (u32 LE) | payload, where the payload is a prost-encoded `tunecache.journal.v1.JournalBatch`.
//! The magic lets replay find the next intact frame after damage in the middle of the file.
//! Each entry keeps its provenance (`Origin`): own contributions and learned entries sit in
//! separate fields; tombstones sit in `forgets`, with theirs.
//!
//! Every frame an append or a rewrite writes is one replay accepts: batches of any kind and
//! size (entries, tombstones, learned batches, compaction output) are split into frames at
//! write time, a new frame starting before the record that would take one past the target
//! size, so a frame holds at least one record and at most `FrameLimits::max` bytes; a single
//! record over that is refused, never written (the store keeps none that big).

use prost::Message;
use tunecache_proto::journal::v1::{
    JournalBatch, LastUse as JournalLastUse, Tombstone as JournalTombstone,
};

use crate::error::{Error, Result};
use crate::model::entry::{CacheKey, Origin};
use crate::model::forget::{ForgetScope, RankScope, Tombstone};
use crate::model::lifecycle::Day;
use crate::wire::stored::StoredEntry;

pub(super) const MAGIC: [u8; 4] = *b"TCJ1";
pub(super) const HEADER_LEN: usize = 12;

/// How big frames are: what writes aim for, and the most replay accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameLimits {
    /// A frame ends before the record that would take its payload past this.
    pub target: usize,
    /// No valid frame's payload is larger: a bigger length field is damage, not data. A
    /// record bigger than this is refused.
    pub max: usize,
}

impl FrameLimits {
    pub(crate) const DEFAULT: FrameLimits = FrameLimits {
        target: 4 * 1024 * 1024,
        max: 16 * 1024 * 1024,
    };
}

/// The largest entry or tombstone the store keeps, by its estimated size (`encoded_len_
/// estimate`): half the largest frame, so whatever an estimate leaves out, its record fits
/// a frame of its own. Every field a client may send is far below it.
pub const MAX_RECORD_BYTES: usize = FrameLimits::DEFAULT.max / 2;

/// A record the journal refuses to write: alone it would make a frame replay refuses.
fn record_too_large(len: usize, limits: FrameLimits) -> Error {
    Error::JournalRecordTooLarge {
        len,
        limit: limits.max,
    }
}

pub(super) enum FrameCheck {
    Intact { payload_end: usize },
    Incomplete,
    Damaged(&'static str),
}

pub(super) fn check_frame(buf: &[u8], at: usize, max_payload: usize) -> FrameCheck {
    let rest = &buf[at..];
    if rest.len() < HEADER_LEN {
        return if MAGIC.starts_with(&rest[..rest.len().min(4)]) {
            FrameCheck::Incomplete
        } else {
            FrameCheck::Damaged("bad frame magic")
        };
    }
    if rest[..4] != MAGIC {
        return FrameCheck::Damaged("bad frame magic");
    }
    let payload_len = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
    let crc = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
    if payload_len > max_payload {
        return FrameCheck::Damaged("frame length out of range");
    }
    if rest.len() < HEADER_LEN + payload_len {
        return FrameCheck::Incomplete;
    }
    let payload = &rest[HEADER_LEN..HEADER_LEN + payload_len];
    if crc32fast::hash(payload) != crc {
        return FrameCheck::Damaged("checksum mismatch");
    }
    FrameCheck::Intact {
        payload_end: at + HEADER_LEN + payload_len,
    }
}

/// The offset of the next intact frame at or after `from`, if any.
pub(super) fn next_intact_frame(buf: &[u8], from: usize, max_payload: usize) -> Option<usize> {
    let finder = memchr::memmem::Finder::new(&MAGIC);
    let mut search_from = from;
    while search_from < buf.len() {
        let at = search_from + finder.find(&buf[search_from..])?;
        if matches!(check_frame(buf, at, max_payload), FrameCheck::Intact { .. }) {
            return Some(at);
        }
        search_from = at + 1;
    }
    None
}

/// Tag byte of `JournalBatch.learned` (field 2, length-delimited); own entries are field 1,
/// the field a stored record is already encoded as.
const LEARNED_TAG: u8 = 2 << 3 | 2;

/// A tombstone as the journal writes it.
pub(super) fn tombstone_record(tombstone: &Tombstone, origin: Origin) -> JournalTombstone {
    let scope = &tombstone.scope;
    let (rank, every_rank) = scope.rank.to_fields();
    JournalTombstone {
        namespace: scope.namespace.clone(),
        op: scope.op.clone(),
        device: scope.device.clone(),
        problem: scope.problem.clone(),
        rank,
        every_rank,
        stamp: tombstone.stamp,
        learned: origin == Origin::Learned,
    }
}

pub(super) fn tombstone_from_record(record: JournalTombstone) -> (Tombstone, Origin) {
    let rank = RankScope::from_fields(record.rank, record.every_rank);
    let tombstone = Tombstone {
        scope: ForgetScope {
            namespace: record.namespace,
            op: record.op,
            device: record.device,
            problem: record.problem,
            rank,
        },
        stamp: record.stamp,
    };
    let origin = if record.learned {
        Origin::Learned
    } else {
        Origin::Own
    };
    (tombstone, origin)
}

/// Encodes tombstones as frames (`FrameLimits`): field 3 of `JournalBatch`, each record
/// tagged and length-delimited as prost writes it.
pub(super) fn encode_tombstone_frames(
    tombstones: &[(Tombstone, Origin)],
    limits: FrameLimits,
    out: &mut Vec<u8>,
) -> Result<()> {
    let mut frame = JournalBatch::default();
    let mut frame_bytes = 0;
    for (tombstone, origin) in tombstones {
        let record = tombstone_record(tombstone, *origin);
        let len = record.encoded_len();
        let record_bytes = 1 + prost::length_delimiter_len(len) + len;
        if record_bytes > limits.max {
            return Err(record_too_large(record_bytes, limits));
        }
        if !frame.forgets.is_empty() && frame_bytes + record_bytes > limits.target {
            frame_payload(&std::mem::take(&mut frame).encode_to_vec(), out);
            frame_bytes = 0;
        }
        frame.forgets.push(record);
        frame_bytes += record_bytes;
    }
    if !frame.forgets.is_empty() {
        frame_payload(&frame.encode_to_vec(), out);
    }
    Ok(())
}

/// A last use as the journal writes it.
pub(super) fn last_use_record(entry: &StoredEntry, day: Day, origin: Origin) -> JournalLastUse {
    JournalLastUse {
        key: Some(entry.key().to_key().into()),
        day,
        learned: origin == Origin::Learned,
    }
}

/// A last use read back; `None` without a key (never written so: damage that kept its CRC).
pub(super) fn last_use_from_record(record: JournalLastUse) -> Option<(CacheKey, Day, Origin)> {
    let origin = if record.learned {
        Origin::Learned
    } else {
        Origin::Own
    };
    Some((record.key?.into(), record.day, origin))
}

/// Encodes last uses as frames (`FrameLimits`): field 4 of `JournalBatch`. Each is far below
/// a frame: its key passed the same bounds as the entry it names.
pub(super) fn encode_last_use_frames(
    uses: &[(StoredEntry, Day, Origin)],
    limits: FrameLimits,
    out: &mut Vec<u8>,
) {
    let mut frame = JournalBatch::default();
    let mut frame_bytes = 0;
    for (entry, day, origin) in uses {
        let record = last_use_record(entry, *day, *origin);
        let len = record.encoded_len();
        let record_bytes = 1 + prost::length_delimiter_len(len) + len;
        if !frame.last_uses.is_empty() && frame_bytes + record_bytes > limits.target {
            frame_payload(&std::mem::take(&mut frame).encode_to_vec(), out);
            frame_bytes = 0;
        }
        frame.last_uses.push(record);
        frame_bytes += record_bytes;
    }
    if !frame.last_uses.is_empty() {
        frame_payload(&frame.encode_to_vec(), out);
    }
}

/// Appends the frame header and `payload`.
pub(super) fn frame_payload(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    // Frames are split well below u32::MAX (`FrameLimits`), so the cast is exact.
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Tag byte of `JournalBatch.entry_days` (field 5, packed: length-delimited).
const ENTRY_DAYS_TAG: u8 = 5 << 3 | 2;

/// Encodes one frame. The payload is the `JournalBatch` prost would write: every own entry
/// (field 1), then every learned one (field 2), each copied from its stored record, then
/// their last uses in that order (field 5, packed), when any is known.
pub(super) fn encode_frame(entries: &[(&StoredEntry, Origin)], out: &mut Vec<u8>) {
    let mut payload = Vec::with_capacity(
        entries
            .iter()
            .map(|(entry, _)| entry.record().len() + 3)
            .sum(),
    );
    let own = entries.iter().filter(|(_, o)| *o == Origin::Own);
    let learned = entries.iter().filter(|(_, o)| *o == Origin::Learned);
    for (entry, _) in own.clone() {
        payload.extend_from_slice(entry.record());
    }
    for (entry, _) in learned.clone() {
        payload.push(LEARNED_TAG);
        payload.extend_from_slice(&entry.record()[1..]);
    }
    // Read once: a reader may raise a day meanwhile, and the length must match the values.
    let days: Vec<u64> = own
        .chain(learned)
        .map(|(entry, _)| u64::from(entry.last_use()))
        .collect();
    if days.iter().any(|day| *day > 0) {
        let len: usize = days
            .iter()
            .map(|day| prost::encoding::encoded_len_varint(*day))
            .sum();
        payload.push(ENTRY_DAYS_TAG);
        prost::encoding::encode_varint(len as u64, &mut payload);
        for day in days {
            prost::encoding::encode_varint(day, &mut payload);
        }
    }
    frame_payload(&payload, out);
}

/// Encodes entries as frames (`FrameLimits`), each entry's record copied as it is.
pub(super) fn encode_frames<'a>(
    entries: impl Iterator<Item = (&'a StoredEntry, Origin)>,
    limits: FrameLimits,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut chunk: Vec<(&StoredEntry, Origin)> = Vec::new();
    let mut chunk_bytes = 0;
    for (entry, origin) in entries {
        // A learned entry's record differs from its own form in the tag byte only; its day
        // takes at most 5 bytes more.
        let record_bytes = entry.record().len() + 5;
        if record_bytes > limits.max {
            return Err(record_too_large(record_bytes, limits));
        }
        if !chunk.is_empty() && chunk_bytes + record_bytes > limits.target {
            encode_frame(&chunk, &mut out);
            chunk.clear();
            chunk_bytes = 0;
        }
        chunk.push((entry, origin));
        chunk_bytes += record_bytes;
    }
    if !chunk.is_empty() {
        encode_frame(&chunk, &mut out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::test_support::*;
    use crate::journal::JournalEntry;

    #[test]
    fn frames_hold_the_batch_prost_writes() {
        // Own and learned entries interleaved: prost writes all of field 1, then field 2.
        let entries: Vec<JournalEntry> = (0..6)
            .map(|i| {
                let (key, result, _) = entry(i);
                let origin = if i % 2 == 0 {
                    Origin::Learned
                } else {
                    Origin::Own
                };
                (key, result, origin)
            })
            .collect();
        let stored: Vec<(StoredEntry, Origin)> = entries
            .iter()
            .map(|(k, r, o)| (StoredEntry::new(k, r), *o))
            .collect();
        let mut frame = Vec::new();
        encode_frame(
            &stored.iter().map(|(e, o)| (e, *o)).collect::<Vec<_>>(),
            &mut frame,
        );
        let mut batch = JournalBatch::default();
        for (key, result, origin) in &entries {
            let field = match origin {
                Origin::Own => &mut batch.entries,
                Origin::Learned => &mut batch.learned,
            };
            field.push(crate::model::entry::to_wire_entry(key, result));
        }
        assert_eq!(&frame[HEADER_LEN..], batch.encode_to_vec().as_slice());
    }
}
