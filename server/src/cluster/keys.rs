//! How cache entries are laid out in Redis: key names, and field encodings whose plain byte
//! order is the merge rule's order, so the server-side scripts compare bytes and nothing else.
//!
//! Every key belongs to one of `SHARDS` shards (a hash of its key text). A shard's tag
//! `{sNN}` starts each of its names, so on Redis Cluster the entry, its lease, the shard's
//! stream and the shard's meta hash share one slot, and one script can store a result and
//! announce it atomically:
//! - entry `<prefix>e:{sNN}<json K>`: fields `t` (the forget epoch, inverted, then the time:
//!   32 sortable hex digits, so a higher epoch sorts first; 16 digits, the time alone, were
//!   written before Forget existed and read as epoch 0), `c` (config), `b`
//!   (tuned_by), `a` (tuned_at, sortable hex), `s` (the shard sequence number it was last
//!   written or touched at), `u` (the day its key was last used anywhere, `encode_day`;
//!   absent when no node said, as daemons from before lifecycle wrote it);
//! - cluster lease `<prefix>l:{sNN}<json K>`;
//! - stream `<prefix>log:{sNN}`: one message per stored winner or raised `u` (`k`, the four
//!   result fields, `u`, `n` the publishing node, `s`);
//! - meta `<prefix>m:{sNN}`: `s` (last sequence number), `n` (entries), `x` (digest: the
//!   XOR of every entry's `entry_digest`), which the audit compares with what a node holds;
//! - tombstones `<prefix>forgets:{f}` (scope text → stamp) and their stream
//!   `<prefix>flog:{f}`: the Forgets of every node (`cluster::forget`);
//! - view pins `<prefix>view:{vNN}<view name>`: key text → pin, the first pin of each key in
//!   a job's view (`cluster::views`), expiring after the view's idle time.

use crate::error::{TierError, TierResult};
use crate::model::artifacts::ArtifactsView;
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::lifecycle::Day;

/// Shards of the key space: streams a node follows, digests the audit compares.
pub const SHARDS: usize = 16;

/// Why a prefix cannot be used.
pub fn check_prefix(prefix: &str) -> TierResult<()> {
    if prefix.contains(['{', '}']) {
        return Err(TierError::Config(format!(
            "--cluster-prefix {prefix:?} must not contain braces (they select Redis Cluster slots)"
        )));
    }
    Ok(())
}

/// The key names of one deployment (one prefix).
#[derive(Clone, Debug)]
pub struct Layout {
    prefix: String,
}

impl Layout {
    pub fn new(prefix: &str) -> Self {
        Layout {
            prefix: prefix.to_owned(),
        }
    }

    /// The key text used inside names and stream messages: a JSON array of the key's fields.
    pub fn key_text(key: &CacheKey) -> String {
        // A tuple serializes as the same compact array `json!` would build, without building
        // it (a view's first read makes one text per pin). It cannot fail.
        serde_json::to_string(&(&key.namespace, &key.op, &key.device, &key.problem, key.rank))
            .unwrap_or_default()
    }

    /// The shard of a key text: FNV-1a, stable across versions and platforms.
    pub fn shard_of_text(text: &str) -> usize {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        (hash % SHARDS as u64) as usize
    }

    #[cfg(test)]
    pub fn shard_of(key: &CacheKey) -> usize {
        Self::shard_of_text(&Self::key_text(key))
    }

    fn named(&self, kind: &str, text: &str) -> String {
        format!(
            "{}{kind}:{{s{:02}}}{text}",
            self.prefix,
            Self::shard_of_text(text)
        )
    }

    #[cfg(test)]
    pub fn entry(&self, key: &CacheKey) -> String {
        self.entry_of_text(&Self::key_text(key))
    }

    pub fn lease(&self, key: &CacheKey) -> String {
        self.lease_of_text(&Self::key_text(key))
    }

    /// `entry` from a key text already made (one JSON encoding per key, not one per name).
    pub fn entry_of_text(&self, text: &str) -> String {
        self.named("e", text)
    }

    /// The Redis string holding an artifact blob, tagged with its digest's own shard (one
    /// copy however many entries name it).
    pub fn blob(&self, digest: &str) -> String {
        self.named("b", digest)
    }

    /// `lease` from a key text already made.
    pub fn lease_of_text(&self, text: &str) -> String {
        self.named("l", text)
    }

    /// The key text and shard of an entry name found by SCAN (`values::key_of_entry` checks
    /// the text as a client's key is); why not for anything else (a name whose shard tag
    /// disagrees with its key is not ours either).
    pub fn entry_key_text<'n>(&self, name: &'n str) -> TierResult<(&'n str, usize)> {
        let not_ours = || TierError::refused("not an entry name of this prefix");
        let rest = name
            .strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_prefix("e:{s"))
            .ok_or_else(not_ours)?;
        let (digits, text) = rest.split_at_checked(2).ok_or_else(not_ours)?;
        let text = text.strip_prefix('}').ok_or_else(not_ours)?;
        let shard: usize = digits.parse().map_err(|_| not_ours())?;
        if shard != Self::shard_of_text(text) {
            return Err(TierError::refused("its shard tag is not its key's shard"));
        }
        Ok((text, shard))
    }

    /// SCAN pattern matching every entry name of `shard`, or of every shard (glob characters
    /// in the prefix escaped).
    pub fn entry_pattern(&self, shard: Option<usize>) -> String {
        let mut pattern = String::new();
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        match shard {
            Some(shard) => pattern.push_str(&format!("e:{{s{shard:02}}}*")),
            None => pattern.push_str("e:{s*"),
        }
        pattern
    }

    /// The stream a shard's stored winners are appended to.
    pub fn log(&self, shard: usize) -> String {
        format!("{}log:{{s{shard:02}}}", self.prefix)
    }

    /// The shard's sequence number, entry count and digest.
    pub fn meta(&self, shard: usize) -> String {
        format!("{}m:{{s{shard:02}}}", self.prefix)
    }

    /// The tombstones of every node's Forgets: scope text → stamp (16 hex digits).
    pub fn forgets(&self) -> String {
        format!("{}forgets:{{f}}", self.prefix)
    }

    /// The stream announcing each new tombstone.
    pub fn forget_log(&self) -> String {
        format!("{}flog:{{f}}", self.prefix)
    }

    /// The pins of one job view: key text → pin (`views`). Tagged by a hash of the name, so
    /// a name with braces cannot pick its slot, and one script touches one slot.
    pub fn view(&self, name: &str) -> String {
        format!(
            "{}view:{{v{:02}}}{name}",
            self.prefix,
            Self::shard_of_text(name)
        )
    }

    /// A shard's checkpoint header (`checkpoint`).
    pub fn checkpoint(&self, shard: usize) -> String {
        format!("{}cp:{{s{shard:02}}}", self.prefix)
    }

    /// The stem of a shard's checkpoint part names: `<stem><seq>:<i>`.
    pub fn checkpoint_part_stem(&self, shard: usize) -> String {
        format!("{}cp:{{s{shard:02}}}:", self.prefix)
    }

    /// Who builds a shard's next checkpoint.
    pub fn checkpoint_lease(&self, shard: usize) -> String {
        format!("{}cpl:{{s{shard:02}}}", self.prefix)
    }

    /// A random marker written once per server lifetime: when it changes, the server was
    /// flushed or replaced, and this node republishes its winners.
    pub fn epoch(&self) -> String {
        format!("{}epoch", self.prefix)
    }
}

/// One entry's part of its shard's digest, as the merge script computes it: the first 8
/// bytes of SHA-1 over the entry's name, `t`, `a`, the length of `c`, `:`, `c` and `b`
/// (lengths and fixed widths make the concatenation unambiguous).
pub fn entry_digest(entry_name: &str, fields: &[String; 4]) -> u64 {
    let [t, c, b, a] = fields;
    let mut sha = sha1_smol::Sha1::new();
    sha.update(entry_name.as_bytes());
    sha.update(b"\0");
    sha.update(t.as_bytes());
    sha.update(a.as_bytes());
    sha.update(c.len().to_string().as_bytes());
    sha.update(b":");
    sha.update(c.as_bytes());
    sha.update(b.as_bytes());
    let bytes = sha.digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(first)
}

/// The `u` field: a day (`model::lifecycle::Day`, days since the Unix epoch) in decimal,
/// no leading zero. The scripts compare it as a number (`tonumber`: a day is far below 2^53,
/// so exactly), never as bytes. Left out of `entry_digest`: a use changes no result, so it
/// must not make the audit think a node and Redis hold different entries.
pub fn encode_day(day: Day) -> String {
    day.to_string()
}

/// Reads `u` back, as strictly as it is written: 1 to 10 digits, no leading zero, at most
/// `u32::MAX`. Whether the day is plausible (not after today) is the store's to judge.
pub fn decode_day(text: &str) -> Option<Day> {
    let canonical = !text.is_empty()
        && text.len() <= 10
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

/// A shard's digest as the meta hash stores it.
pub fn format_digest(digest: u64) -> String {
    format!("{digest:016x}")
}

/// `time_us` as 16 hex digits whose byte order is `f64::total_cmp`'s order.
pub fn encode_time(time_us: f64) -> String {
    let bits = time_us.to_bits();
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    format!("{ordered:016x}")
}

pub fn decode_time(text: &str) -> Option<f64> {
    let ordered = parse_hex16(text)?;
    let bits = if ordered >> 63 == 1 {
        ordered & !(1 << 63)
    } else {
        !ordered
    };
    Some(f64::from_bits(bits))
}

/// `tuned_at_unix_ms` as 16 hex digits whose byte order is the integer order.
pub fn encode_at(at: i64) -> String {
    format!("{:016x}", (at as u64) ^ (1 << 63))
}

pub fn decode_at(text: &str) -> Option<i64> {
    Some((parse_hex16(text)? ^ (1 << 63)) as i64)
}

fn parse_hex16(text: &str) -> Option<u64> {
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

/// The four stored fields of a result, in the merge rule's order of comparison.
pub fn encode_result(result: &TunedResult) -> [String; 4] {
    [
        encode_epoch_time(result.forget_epoch, result.time_us),
        result.config.clone(),
        result.tuned_by.clone(),
        encode_at_artifacts(result.tuned_at_unix_ms, result.artifacts.view()),
    ]
}

/// The `a` field: `tuned_at_unix_ms` (`encode_at`), then the result's artifacts, their
/// canonical bytes (`model::artifacts`) in lowercase hex. The merge rule compares the
/// artifacts right after the time, and hex keeps byte order, so the field's byte order is
/// still the rule's; a result without artifacts is the 16 digits it always was.
pub fn encode_at_artifacts(at: i64, artifacts: ArtifactsView<'_>) -> String {
    use std::fmt::Write as _;
    let mut text = encode_at(at);
    for byte in artifacts.encoded() {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// Reads an `a` field back: the time, and the artifacts' bytes (not yet validated).
pub fn decode_at_artifacts(text: &str) -> Option<(i64, Vec<u8>)> {
    let at = decode_at(text.get(..16)?)?;
    let hex = text.get(16..)?;
    if hex.len() % 2 != 0 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((at, bytes))
}

/// The `t` field: the epoch inverted (a higher epoch sorts first), then the time.
pub fn encode_epoch_time(epoch: u64, time_us: f64) -> String {
    format!("{}{}", encode_stamp(!epoch), encode_time(time_us))
}

/// A stamp or an inverted epoch as 16 hex digits.
pub fn encode_stamp(stamp: u64) -> String {
    format!("{stamp:016x}")
}

pub fn decode_stamp(text: &str) -> Option<u64> {
    parse_hex16(text)
}

/// Reads `t`: 32 digits (epoch and time), or 16 (time only, written before Forget: epoch 0).
pub fn decode_epoch_time(t: &str) -> Option<(u64, f64)> {
    if t.len() == 16 {
        return Some((0, decode_time(t)?));
    }
    let (epoch, time) = t.split_at_checked(16)?;
    Some((!parse_hex16(epoch)?, decode_time(time)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::merge::rank_results;

    fn result(time_us: f64, config: &str, by: &str, at: i64) -> TunedResult {
        TunedResult {
            config: config.into(),
            time_us,
            tuned_by: by.into(),
            tuned_at_unix_ms: at,
            forget_epoch: 0,
            artifacts: Default::default(),
        }
    }

    /// Lists whose canonical bytes differ early, late, by a prefix, and not at all.
    fn artifact_lists() -> Vec<crate::model::artifacts::ArtifactList> {
        let artifact = |name: &str, digit: char, size: u64| tunecache_proto::v1::Artifact {
            name: name.into(),
            sha256: digit.to_string().repeat(64),
            size,
        };
        [
            vec![],
            vec![artifact("a.so", 'a', 1)],
            vec![artifact("a.so", 'a', 300)],
            vec![artifact("a.so", 'b', 1)],
            vec![artifact("b.so", 'a', 1)],
            vec![artifact("a.so", 'a', 1), artifact("b.cu", 'c', 0)],
        ]
        .into_iter()
        .map(crate::model::artifacts::ArtifactList::from_wire)
        .collect()
    }

    #[test]
    fn encoded_byte_order_is_the_merge_order() {
        let times = [0.0, 1e-300, 0.1, 0.2, 1.0, 1.5, 2.0, 10.0, 1e10, f64::MAX];
        let ats = [i64::MIN, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        let texts = ["", "{}", "{\"a\":1}", "{\"b\":1}", "é", "z", "Z"];
        let mut all = Vec::new();
        for t in times {
            for at in ats {
                for c in texts {
                    for b in ["", "a", "B", "ä"] {
                        all.push(result(t, c, b, at));
                    }
                }
                for artifacts in artifact_lists() {
                    all.push(TunedResult {
                        artifacts,
                        ..result(t, "{}", "a", at)
                    });
                }
            }
        }
        for x in all.iter().step_by(7) {
            for y in all.iter().step_by(5) {
                let bytes = |r: &TunedResult| encode_result(r).map(String::into_bytes);
                let by_bytes = bytes(x).cmp(&bytes(y));
                assert_eq!(by_bytes, rank_results(x, y), "{x:?} vs {y:?}");
            }
        }
    }

    #[test]
    fn days_read_back_only_in_the_form_written() {
        for day in [0, 1, 20_000, u32::MAX] {
            assert_eq!(decode_day(&encode_day(day)), Some(day));
        }
        for bad in [
            "",
            "01",
            "-1",
            "+5",
            "1e3",
            " 5",
            "4294967296",
            "12345678901",
            "١",
        ] {
            assert_eq!(decode_day(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn encodings_round_trip() {
        for t in [0.0, 1e-7, 0.1 + 0.2, 123.456, f64::MAX] {
            assert_eq!(decode_time(&encode_time(t)), Some(t));
        }
        for at in [i64::MIN, -5, 0, 1_700_000_000_123, i64::MAX] {
            assert_eq!(decode_at(&encode_at(at)), Some(at));
            for list in artifact_lists() {
                let text = encode_at_artifacts(at, list.view());
                assert_eq!(
                    decode_at_artifacts(&text),
                    Some((at, list.view().encoded().to_vec()))
                );
            }
        }
        let layout = Layout::new("tc:");
        let key = CacheKey {
            namespace: "ns".into(),
            op: "op}{".into(),
            device: "d\"ev".into(),
            problem: "{\"m\":1}".into(),
            rank: Some(3),
        };
        let shard = Layout::shard_of(&key);
        let entry = layout.entry(&key);
        assert_eq!(
            layout.entry_key_text(&entry),
            Ok((Layout::key_text(&key).as_str(), shard))
        );
        assert!(layout.entry_key_text(&layout.lease(&key)).is_err());
        // A name whose shard tag was altered is not taken for the key.
        let forged = layout.entry(&key).replacen(
            &format!("{{s{shard:02}}}"),
            &format!("{{s{:02}}}", (shard + 1) % SHARDS),
            1,
        );
        assert!(layout.entry_key_text(&forged).is_err());
        assert!(check_prefix("a{b").is_err());
        assert_eq!(Layout::new("a*b:").entry_pattern(None), "a\\*b:e:{s*");
        assert_eq!(Layout::new("p:").entry_pattern(Some(3)), "p:e:{s03}*");
        // The entry, its lease, its stream and its meta share the shard tag (one slot).
        let tag = format!("{{s{shard:02}}}");
        for name in [
            layout.entry(&key),
            layout.lease(&key),
            layout.log(shard),
            layout.meta(shard),
            layout.checkpoint(shard),
            layout.checkpoint_lease(shard),
            format!("{}0:0", layout.checkpoint_part_stem(shard)),
        ] {
            assert!(name.contains(&tag), "{name}");
        }
    }
}
