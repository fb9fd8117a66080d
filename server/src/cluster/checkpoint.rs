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
//! A reader trusts nothing of it (`verify`): the format, the prefix, the shard, the Redis
//! data lifetime, each part's length and CRC-32, every entry checked like a client's
//! (`values`), every key in its shard, and the count and digest over the decoded entries,
//! with names made under the reader's own prefix, equal to the header's (the shard's digest
//! at that sequence number). Anything else rejects the checkpoint: the node reads that shard
//! from its entries instead.

use serde::{Deserialize, Serialize};

use super::keys::{entry_digest, format_digest, Layout};
use super::values;
use crate::model::entry::{CacheKey, TunedResult};

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
    /// The id of the stream message that carried `seq` (`0-0` at 0): where a reader's tail
    /// starts.
    pub id: String,
    pub count: u64,
    pub digest: String,
    pub parts: Vec<PartInfo>,
    pub built_by: String,
    pub built_at_unix_ms: i64,
}

/// A built checkpoint: its header and its compressed parts.
pub struct Built {
    pub header: Header,
    pub parts: Vec<Vec<u8>>,
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Builds a shard's checkpoint from its entries (key text, the four fields), any order.
#[allow(clippy::too_many_arguments)]
pub fn build(
    layout: &Layout,
    prefix: &str,
    shard: usize,
    epoch: &str,
    seq: u64,
    id: &str,
    built_by: &str,
    entries: &[(String, [String; 4])],
) -> Result<Built, String> {
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
        return Err(format!("{} parts, at most {MAX_PARTS}", raws.len()));
    }
    let mut parts = Vec::with_capacity(raws.len());
    let mut infos = Vec::with_capacity(raws.len());
    for raw in raws {
        let compressed = zstd::bulk::compress(&raw, LEVEL).map_err(|e| e.to_string())?;
        infos.push(PartInfo {
            bytes: compressed.len() as u64,
            raw: raw.len() as u64,
            crc32: crc32fast::hash(&compressed),
        });
        parts.push(compressed);
    }
    Ok(Built {
        header: Header {
            format: FORMAT.to_owned(),
            version: VERSION,
            prefix: prefix.to_owned(),
            shard,
            epoch: epoch.to_owned(),
            seq,
            id: id.to_owned(),
            count: entries.len() as u64,
            digest: format_digest(digest),
            parts: infos,
            built_by: built_by.to_owned(),
            built_at_unix_ms: crate::model::entry::unix_now_ms(),
        },
        parts,
    })
}

/// Parses a header's JSON; checks what can be checked before reading any part.
pub fn parse_header(
    text: &[u8],
    prefix: &str,
    shard: usize,
    epoch: Option<&str>,
) -> Result<Header, String> {
    let header: Header = serde_json::from_slice(text).map_err(|e| format!("header: {e}"))?;
    if header.format != FORMAT || header.version != VERSION {
        return Err(format!(
            "format {:?} version {}, not {FORMAT:?} {VERSION}",
            header.format, header.version
        ));
    }
    if header.prefix != prefix {
        return Err(format!(
            "built under prefix {:?}",
            values::shown(&header.prefix)
        ));
    }
    if header.shard != shard {
        return Err(format!("the header of shard {}", header.shard));
    }
    if epoch.is_some_and(|epoch| epoch != header.epoch) {
        return Err("built in another redis data lifetime (epoch)".to_owned());
    }
    if header.parts.len() > MAX_PARTS
        || header
            .parts
            .iter()
            .any(|p| p.raw > PART_RAW_BYTES as u64 || p.bytes > PART_RAW_BYTES as u64 * 2)
    {
        return Err("parts larger than any checkpoint has".to_owned());
    }
    if header.id.len() > 64 {
        return Err("a message id longer than any Redis makes".to_owned());
    }
    Ok(header)
}

fn take<'a>(raw: &mut &'a [u8]) -> Result<&'a str, String> {
    let (len, rest) = raw
        .split_first_chunk::<4>()
        .ok_or_else(|| "a part cut short".to_owned())?;
    let len = u32::from_le_bytes(*len) as usize;
    if rest.len() < len {
        return Err("a part cut short".to_owned());
    }
    let (bytes, rest) = rest.split_at(len);
    *raw = rest;
    std::str::from_utf8(bytes).map_err(|_| "a field that is not UTF-8".to_owned())
}

/// Checks the parts against the header and decodes them: every entry checked like a
/// client's, in its shard, and the count and digest (names under `layout`'s prefix) those
/// of the header.
pub fn verify(
    layout: &Layout,
    header: &Header,
    parts: &[Vec<u8>],
) -> Result<Vec<(CacheKey, TunedResult)>, String> {
    if parts.len() != header.parts.len() {
        return Err(format!(
            "{} parts in redis, {} in the header",
            parts.len(),
            header.parts.len()
        ));
    }
    let mut entries = Vec::new();
    let mut digest = 0u64;
    for (part, info) in parts.iter().zip(&header.parts) {
        if part.len() as u64 != info.bytes || crc32fast::hash(part) != info.crc32 {
            return Err("a part's length or CRC-32 is not the header's".to_owned());
        }
        let raw = zstd::bulk::decompress(part, info.raw as usize)
            .map_err(|e| format!("a part does not decompress: {e}"))?;
        if raw.len() as u64 != info.raw {
            return Err("a part's length is not the header's".to_owned());
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
                return Err("an entry of another shard".to_owned());
            }
            let key = values::key_text(text)?;
            let [t, c, b, a] = fields;
            let result = values::result(t, c, b, a)?;
            let owned = fields.map(str::to_owned);
            digest ^= entry_digest(&layout.entry_of_text(text), &owned);
            entries.push((key, result));
        }
    }
    if entries.len() as u64 != header.count || format_digest(digest) != header.digest {
        return Err(format!(
            "{} entries of digest {}, the header says {} of {}",
            entries.len(),
            format_digest(digest),
            header.count,
            header.digest
        ));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::keys::encode_result;

    fn entries_of(shard: usize, n: usize) -> Vec<(String, [String; 4])> {
        (0..)
            .map(|i| CacheKey {
                namespace: "trtllm".into(),
                op: format!("gemm_{}", i % 7),
                device: "H200".into(),
                problem: format!("m={i},n=4096"),
                rank: None,
            })
            .map(|key| Layout::key_text(&key))
            .filter(|text| Layout::shard_of_text(text) == shard)
            .take(n)
            .map(|text| {
                let result = TunedResult {
                    config: format!(r#"{{"tile":{}}}"#, text.len()),
                    time_us: 1.5,
                    tuned_by: "a".into(),
                    tuned_at_unix_ms: 1_700_000_000_000,
                    forget_epoch: 0,
                    artifacts: Default::default(),
                };
                (text, encode_result(&result))
            })
            .collect()
    }

    #[test]
    fn a_checkpoint_reads_back_and_rejects_any_damage_or_another_prefix() {
        let layout = Layout::new("tc:");
        let entries = entries_of(3, 500);
        let built = build(&layout, "tc:", 3, "e1", 42, "5-0", "a", &entries).unwrap();
        let json = serde_json::to_vec(&built.header).unwrap();
        let header = parse_header(&json, "tc:", 3, Some("e1")).unwrap();
        let read = verify(&layout, &header, &built.parts).unwrap();
        assert_eq!(read.len(), 500);
        assert!(parse_header(&json, "other:", 3, Some("e1")).is_err());
        assert!(parse_header(&json, "tc:", 4, Some("e1")).is_err());
        assert!(parse_header(&json, "tc:", 3, Some("e2")).is_err());
        // A byte flipped anywhere in a part.
        let mut damaged = built.parts.clone();
        let middle = damaged[0].len() / 2;
        damaged[0][middle] ^= 1;
        assert!(verify(&layout, &header, &damaged).is_err());
        // The same bytes under another prefix: their digest is another prefix's.
        let mut foreign = header.clone();
        foreign.prefix = "other:".into();
        assert!(verify(&Layout::new("other:"), &foreign, &built.parts).is_err());
        // A header that claims another count.
        let mut lying = header;
        lying.count += 1;
        assert!(verify(&layout, &lying, &built.parts).is_err());
    }

    #[test]
    fn a_large_shard_splits_into_parts_of_a_few_mib() {
        let layout = Layout::new("tc:");
        let mut entries = entries_of(0, 3000);
        for (_, fields) in &mut entries {
            fields[1] = format!("\"{}\"", "x".repeat(3000));
        }
        let built = build(&layout, "tc:", 0, "e", 1, "1-0", "a", &entries).unwrap();
        assert!(built.header.parts.len() >= 2, "{:?}", built.header.parts);
        assert!(built
            .header
            .parts
            .iter()
            .all(|p| p.raw <= PART_RAW_BYTES as u64));
        let read = verify(&layout, &built.header, &built.parts).unwrap();
        assert_eq!(read.len(), 3000);
    }
}
