//! Per-shard checkpoints in Redis: every entry of a shard at one sequence number, encoded
//! compactly and compressed (zstd), so that a node that joins reads 16 checkpoints and the
//! streams' tails instead of one command per entry.
//!
//! Layout (each under its shard's hash tag, so one script touches one slot on Redis Cluster):
//! - header `<prefix>cp:{sNN}`: a hash of `seq` (the sequence number it holds the shard at),
//!   `n` (parts) and `h` (the header below, JSON);
//! - parts `<prefix>cp:{sNN}:<seq>:<i>`: strings of at most `PART_RAW_BYTES` of entries before
//!   compression, each entry its key text and its four fields (`keys::encode_result`), every
//!   one length-prefixed (u32 LE);
//! - lease `<prefix>cpl:{sNN}`: who builds the shard's next one.
//!
//! A node builds a shard's checkpoint from its own memory, at the audit's quiet moment, when
//! its entries of the shard have the count and digest Redis's meta hash has at that sequence
//! number: then they are exactly the shard's entries at it (`follow`). It writes the parts
//! (expiring, in case it never finishes), then swaps the header with compare-and-set on the
//! sequence number (`scripts::CHECKPOINT`), so no older checkpoint ever replaces a newer.
//!
//! The header swap also writes the shard's own record of its checkpoint into the shard's
//! meta hash (`cs`, `cn`, `cx`: its sequence number, entry count and digest), refused by the
//! script unless the meta's live count and digest are the header's when the shard is still
//! at that number. With `--cluster-key-file`, the header and every part carry an HMAC-SHA256
//! under the cluster's key.
//!
//! A reader trusts nothing of it: the format, the prefix, the shard, the Redis data lifetime
//! and, with a key, the header's MAC (`parse_header`); the header against the shard's record
//! and its live meta (`check_record`); the stream message at the header's `id` carrying the
//! header's sequence number (`check_place`); each part's length, CRC-32 and MAC, every entry
//! checked like a client's (`values`), every key in its shard, and the count and digest over
//! the decoded entries, with names made under the reader's own prefix, equal to the header's
//! (`verify`). Anything else rejects the checkpoint: the node reads that shard from its
//! entries instead.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::keys::{entry_digest, format_digest, Layout};
use super::refusals;
use super::values::{self, Message};
use crate::error::{TierError, TierResult};
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::shared_key::SharedKey;

const FORMAT: &str = "tunecache-checkpoint";
const VERSION: u32 = 1;
/// Most entry bytes of one part before compression: parts stay a few MiB at most.
pub const PART_RAW_BYTES: usize = 4 << 20;
/// Most parts of one shard's checkpoint (256 MiB of entries).
pub const MAX_PARTS: usize = 64;
/// zstd's level: fast to build, small enough to read.
const LEVEL: i32 = 3;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartInfo {
    /// Compressed length.
    pub bytes: u64,
    /// Length before compression.
    pub raw: u64,
    pub crc32: u32,
    /// With a cluster key: HMAC-SHA256 of the part and its place (`part_signed`), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// What the header says of the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    format: String,
    version: u32,
    pub prefix: String,
    pub shard: usize,
    /// The epoch marker of the Redis data lifetime it was built in.
    pub epoch: String,
    pub seq: u64,
    /// The id of the stream message that carried `seq`: where a reader's tail starts (and
    /// the message a reader checks carries `seq`, `check_place`).
    pub id: String,
    pub count: u64,
    pub digest: String,
    pub parts: Vec<PartInfo>,
    pub built_by: String,
    pub built_at_unix_ms: i64,
    /// With a cluster key: HMAC-SHA256 of every other field (`signed_bytes`), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

impl Header {
    /// The bytes the header's MAC covers: the header's JSON without its MAC.
    fn signed_bytes(&self) -> Vec<u8> {
        let unsigned = Header {
            mac: None,
            ..self.clone()
        };
        serde_json::to_vec(&unsigned).unwrap_or_default()
    }
}

/// A part's place in its checkpoint: shard, sequence number, index (what its MAC binds it to,
/// with the prefix and the data lifetime).
fn part_place(header: &Header, i: usize) -> [u8; 24] {
    let mut place = [0u8; 24];
    place[..8].copy_from_slice(&(header.shard as u64).to_le_bytes());
    place[8..16].copy_from_slice(&header.seq.to_le_bytes());
    place[16..].copy_from_slice(&(i as u64).to_le_bytes());
    place
}

/// What a part's MAC covers: its bytes and where they belong.
fn part_signed<'a>(header: &'a Header, place: &'a [u8; 24], bytes: &'a [u8]) -> [&'a [u8]; 5] {
    [
        b"tunecache-checkpoint-part",
        header.prefix.as_bytes(),
        header.epoch.as_bytes(),
        place,
        bytes,
    ]
}

/// What the header's MAC covers first: no part's MAC can pass for a header's.
const HEADER_DOMAIN: &[u8] = b"tunecache-checkpoint-header";

/// A built checkpoint: its header and its compressed parts.
pub struct Built {
    pub header: Header,
    pub parts: Vec<Vec<u8>>,
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Where a checkpoint belongs and who builds it: what `build` writes into its header.
pub struct Origin<'a> {
    pub prefix: &'a str,
    pub shard: usize,
    /// The epoch marker of the Redis data lifetime.
    pub epoch: &'a str,
    pub seq: u64,
    /// The id of the stream message that carried `seq`.
    pub id: &'a str,
    pub built_by: &'a str,
}

/// Builds a shard's checkpoint from its entries (key text, the four fields), any order;
/// with a key, its header and parts carry MACs.
pub fn build(
    layout: &Layout,
    origin: &Origin<'_>,
    key: Option<&SharedKey>,
    entries: &[(String, [String; 4])],
) -> TierResult<Built> {
    let mut raws: Vec<Vec<u8>> = vec![Vec::new()];
    let mut digest = 0u64;
    for (text, fields) in entries {
        digest ^= entry_digest(&layout.entry_of_text(text), fields);
        let size = 4 * 5 + text.len() + fields.iter().map(String::len).sum::<usize>();
        if raws
            .last()
            .is_some_and(|raw| !raw.is_empty() && raw.len() + size > PART_RAW_BYTES)
        {
            raws.push(Vec::new());
        }
        let raw = raws.last_mut().expect("one part at least");
        put(raw, text.as_bytes());
        for field in fields {
            put(raw, field.as_bytes());
        }
    }
    if raws.len() > MAX_PARTS {
        return Err(TierError::refused(format!(
            "{} parts, at most {MAX_PARTS}",
            raws.len()
        )));
    }
    let mut parts = Vec::with_capacity(raws.len());
    let mut infos = Vec::with_capacity(raws.len());
    for raw in raws {
        let compressed =
            zstd::bulk::compress(&raw, LEVEL).map_err(|e| TierError::unavailable(e.to_string()))?;
        infos.push(PartInfo {
            bytes: compressed.len() as u64,
            raw: raw.len() as u64,
            crc32: crc32fast::hash(&compressed),
            mac: None,
        });
        parts.push(compressed);
    }
    let mut header = Header {
        format: FORMAT.to_owned(),
        version: VERSION,
        prefix: origin.prefix.to_owned(),
        shard: origin.shard,
        epoch: origin.epoch.to_owned(),
        seq: origin.seq,
        id: origin.id.to_owned(),
        count: entries.len() as u64,
        digest: format_digest(digest),
        parts: infos,
        built_by: origin.built_by.to_owned(),
        built_at_unix_ms: crate::model::entry::unix_now_ms(),
        mac: None,
    };
    if let Some(key) = key {
        for (i, part) in parts.iter().enumerate() {
            let place = part_place(&header, i);
            let tag = key.sign(&part_signed(&header, &place, part));
            header.parts[i].mac = Some(tag);
        }
        let tag = key.sign(&[HEADER_DOMAIN, &header.signed_bytes()]);
        header.mac = Some(tag);
    }
    Ok(Built { header, parts })
}

/// Parses a header's JSON; checks what can be checked before reading any part: with a key,
/// its MAC.
pub fn parse_header(
    text: &[u8],
    prefix: &str,
    shard: usize,
    epoch: Option<&str>,
    key: Option<&SharedKey>,
) -> TierResult<Header> {
    let header: Header =
        serde_json::from_slice(text).map_err(|e| TierError::refused(format!("header: {e}")))?;
    if header.format != FORMAT || header.version != VERSION {
        return Err(TierError::refused(format!(
            "format {:?} version {}, not {FORMAT:?} {VERSION}",
            header.format, header.version
        )));
    }
    if header.prefix != prefix {
        return Err(TierError::refused(format!(
            "built under prefix {:?}",
            refusals::shown(&header.prefix)
        )));
    }
    if header.shard != shard {
        return Err(TierError::refused(format!(
            "the header of shard {}",
            header.shard
        )));
    }
    if epoch.is_some_and(|epoch| epoch != header.epoch) {
        return Err(TierError::refused(
            "built in another redis data lifetime (epoch)",
        ));
    }
    if header.parts.len() > MAX_PARTS
        || header
            .parts
            .iter()
            .any(|p| p.raw > PART_RAW_BYTES as u64 || p.bytes > PART_RAW_BYTES as u64 * 2)
    {
        return Err(TierError::refused("parts larger than any checkpoint has"));
    }
    if !is_message_id(&header.id) {
        return Err(TierError::refused("its message id is not one Redis makes"));
    }
    if let Some(key) = key {
        let signed = header.signed_bytes();
        match &header.mac {
            None => {
                return Err(TierError::refused(
                    "carries no MAC under --cluster-key-file",
                ))
            }
            Some(tag) if !key.verifies(&[HEADER_DOMAIN, &signed], tag) => {
                return Err(TierError::refused(
                    "its MAC does not verify under --cluster-key-file",
                ));
            }
            Some(_) => {}
        }
    }
    Ok(header)
}

/// `<ms>-<seq>`, as Redis makes a stream message's id.
fn is_message_id(id: &str) -> bool {
    id.len() <= 41
        && id.split_once('-').is_some_and(|(ms, seq)| {
            [ms, seq]
                .iter()
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The shard's own record in Redis, read in one step with the checkpoint's header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardRecord {
    /// The header hash's `seq` field.
    pub header_seq: Option<u64>,
    /// The shard's meta now: sequence number, entry count, digest.
    pub live: (u64, u64, String),
    /// The meta's record of the checkpoint last swapped in: `cs`, `cn`, `cx`.
    pub checkpoint: Option<(u64, u64, String)>,
}

/// The header against the shard's record: the checkpoint the record names (its sequence
/// number, count and digest), no newer than the shard, and, when the shard is still at its
/// sequence number, its count and digest the shard's live ones.
pub fn check_record(header: &Header, record: &ShardRecord) -> TierResult<()> {
    if record.header_seq != Some(header.seq) {
        return Err(TierError::refused(
            "the header hash's seq is not the header's",
        ));
    }
    let (live_seq, live_count, live_digest) = &record.live;
    if header.seq > *live_seq {
        return Err(TierError::refused(
            "newer than its shard (redis lost writes?)",
        ));
    }
    let claimed = (header.seq, header.count, header.digest.clone());
    if record.checkpoint.as_ref() != Some(&claimed) {
        return Err(TierError::Refused(match &record.checkpoint {
            None => "the shard keeps no record of a checkpoint (built by an older daemon?)"
                .to_owned(),
            Some((seq, count, digest)) => format!(
                "claims {} entries of digest {} at {}; the shard's record is {count} of {digest} at {seq}",
                header.count, header.digest, header.seq
            ),
        }));
    }
    if header.seq == *live_seq && (header.count, &header.digest) != (*live_count, live_digest) {
        return Err(TierError::refused(format!(
            "claims {} entries of digest {}; the shard holds {live_count} of {live_digest} at that sequence number",
            header.count, header.digest
        )));
    }
    Ok(())
}

/// The header's place in its shard's stream: the message at its `id` (as read by an
/// `XRANGE id id`) must carry its sequence number; a reader follows the stream from there.
pub fn check_place(header: &Header, messages: &[Message]) -> TierResult<()> {
    let Some(message) = messages.iter().find(|m| m.id == header.id) else {
        return Err(TierError::refused(
            "no message at its id in the shard's stream (trimmed, or moved)",
        ));
    };
    match message.text("s").and_then(|s| s.parse::<u64>().ok()) {
        Some(seq) if seq == header.seq => Ok(()),
        Some(seq) => Err(TierError::refused(format!(
            "the message at its id carries sequence number {seq}, not its {}",
            header.seq
        ))),
        None => Err(TierError::refused(
            "the message at its id carries no sequence number",
        )),
    }
}

fn take<'a>(raw: &mut &'a [u8]) -> TierResult<&'a str> {
    let (len, rest) = raw
        .split_first_chunk::<4>()
        .ok_or_else(|| TierError::refused("a part cut short"))?;
    let len = u32::from_le_bytes(*len) as usize;
    if rest.len() < len {
        return Err(TierError::refused("a part cut short"));
    }
    let (bytes, rest) = rest.split_at(len);
    *raw = rest;
    std::str::from_utf8(bytes).map_err(|_| TierError::refused("a field that is not UTF-8"))
}

/// A checkpoint's entries, and each one's part of the shard digest.
#[derive(Debug)]
pub struct Decoded {
    pub entries: Vec<(CacheKey, TunedResult)>,
    pub digests: HashSet<u64>,
}

/// Checks the parts against the header (with a key, each part's MAC) and decodes them:
/// every entry checked like a client's, in its shard, and the count and digest (names under
/// `layout`'s prefix) those of the header.
pub fn verify(
    layout: &Layout,
    header: &Header,
    parts: &[Vec<u8>],
    key: Option<&SharedKey>,
) -> TierResult<Decoded> {
    if parts.len() != header.parts.len() {
        return Err(TierError::refused(format!(
            "{} parts in redis, {} in the header",
            parts.len(),
            header.parts.len()
        )));
    }
    let mut entries = Vec::new();
    let mut digests = HashSet::new();
    let mut digest = 0u64;
    for (i, (part, info)) in parts.iter().zip(&header.parts).enumerate() {
        if part.len() as u64 != info.bytes || crc32fast::hash(part) != info.crc32 {
            return Err(TierError::refused(
                "a part's length or CRC-32 is not the header's",
            ));
        }
        if let Some(key) = key {
            let place = part_place(header, i);
            let signed = part_signed(header, &place, part);
            if !info
                .mac
                .as_ref()
                .is_some_and(|tag| key.verifies(&signed, tag))
            {
                return Err(TierError::refused(
                    "a part's MAC does not verify under --cluster-key-file",
                ));
            }
        }
        let raw = zstd::bulk::decompress(part, info.raw as usize)
            .map_err(|e| TierError::refused(format!("a part does not decompress: {e}")))?;
        if raw.len() as u64 != info.raw {
            return Err(TierError::refused("a part's length is not the header's"));
        }
        let mut rest = raw.as_slice();
        while !rest.is_empty() {
            let text = take(&mut rest)?;
            let fields = [
                take(&mut rest)?,
                take(&mut rest)?,
                take(&mut rest)?,
                take(&mut rest)?,
            ];
            if Layout::shard_of_text(text) != header.shard {
                return Err(TierError::refused("an entry of another shard"));
            }
            let key = values::key_text(text)?;
            let [t, c, b, a] = fields;
            let result = values::result(t, c, b, a)?;
            let owned = fields.map(str::to_owned);
            let one = entry_digest(&layout.entry_of_text(text), &owned);
            digest ^= one;
            digests.insert(one);
            entries.push((key, result));
        }
    }
    if entries.len() as u64 != header.count || format_digest(digest) != header.digest {
        return Err(TierError::refused(format!(
            "{} entries of digest {}, the header says {} of {}",
            entries.len(),
            format_digest(digest),
            header.count,
            header.digest
        )));
    }
    Ok(Decoded { entries, digests })
}

#[cfg(test)]
mod tests;
