//! The wire bytes of a stored entry: encoding a key and result as a `tunecache.v1.Entry`
//! field-1 record exactly as prost does, and reading our own records back as views.

use prost::bytes::BufMut;
use prost::encoding::{
    self, decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint, WireType,
};

use crate::model::artifacts::{ArtifactsView, ARTIFACTS_FIELD};
use crate::model::entry::{KeyView, ResultView};

/// Field number of the repeated `Entry` in `LookupResponse.hits`, `ScanResponse.entries` and
/// `JournalBatch.entries`: the field a stored record is encoded as.
pub const ENTRY_FIELD: u32 = 1;

pub(super) fn string_len(tag: u32, value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        encoding::key_len(tag) + encoded_len_varint(value.len() as u64) + value.len()
    }
}

pub(super) fn put_string(tag: u32, value: &str, buf: &mut impl BufMut) {
    if !value.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(value.len() as u64, buf);
        buf.put_slice(value.as_bytes());
    }
}

pub(super) fn key_body_len(key: &KeyView<'_>) -> usize {
    string_len(1, key.namespace)
        + string_len(2, key.op)
        + string_len(3, key.device)
        + string_len(4, key.problem)
        + key
            .rank
            .map_or(0, |rank| encoding::uint32::encoded_len(5, &rank))
}

pub(super) fn result_body_len(result: &ResultView<'_>) -> usize {
    string_len(1, result.config)
        + if result.time_us != 0.0 {
            encoding::double::encoded_len(2, &result.time_us)
        } else {
            0
        }
        + string_len(3, result.tuned_by)
        + if result.tuned_at_unix_ms != 0 {
            encoding::int64::encoded_len(4, &result.tuned_at_unix_ms)
        } else {
            0
        }
        + if result.forget_epoch != 0 {
            encoding::uint64::encoded_len(5, &result.forget_epoch)
        } else {
            0
        }
        + result.artifacts.encoded().len()
}

/// A length-delimited field of a field number below 16 (one tag byte).
pub(super) fn nested_len(body: usize) -> usize {
    1 + encoded_len_varint(body as u64) + body
}

/// Appends `Entry { key, result }` as a field-`ENTRY_FIELD` record, exactly as prost writes it
/// (same field order, defaults skipped). Returns where in `buf` the problem's bytes start.
pub(super) fn put_record(key: &KeyView<'_>, result: &ResultView<'_>, buf: &mut Vec<u8>) -> usize {
    let key_body = key_body_len(key);
    let result_body = result_body_len(result);
    let entry_body = nested_len(key_body) + nested_len(result_body);
    buf.reserve(nested_len(entry_body));
    encode_key(ENTRY_FIELD, WireType::LengthDelimited, buf);
    encode_varint(entry_body as u64, buf);

    encode_key(1, WireType::LengthDelimited, buf);
    encode_varint(key_body as u64, buf);
    put_string(1, key.namespace, buf);
    put_string(2, key.op, buf);
    put_string(3, key.device, buf);
    let problem_at = buf.len() + string_len(4, key.problem) - key.problem.len();
    put_string(4, key.problem, buf);
    if let Some(rank) = key.rank {
        encoding::uint32::encode(5, &rank, buf);
    }

    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(result_body as u64, buf);
    put_string(1, result.config, buf);
    if result.time_us != 0.0 {
        encoding::double::encode(2, &result.time_us, buf);
    }
    put_string(3, result.tuned_by, buf);
    if result.tuned_at_unix_ms != 0 {
        encoding::int64::encode(4, &result.tuned_at_unix_ms, buf);
    }
    if result.forget_epoch != 0 {
        encoding::uint64::encode(5, &result.forget_epoch, buf);
    }
    // Already field-6 records, in their canonical order: the last fields, as prost writes them.
    buf.put_slice(result.artifacts.encoded());
    problem_at
}

pub(super) fn take<'a>(buf: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
    let (head, tail) = buf.split_at_checked(len)?;
    *buf = tail;
    Some(head)
}

/// Takes a length-delimited field's bytes (after its tag) from the front of `buf`.
pub(crate) fn take_delimited<'a>(buf: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(decode_varint(buf).ok()?).ok()?;
    take(buf, len)
}

/// Takes a string field's bytes, checked as UTF-8 unless `TRUSTED`.
pub(super) fn take_str<'a, const TRUSTED: bool>(buf: &mut &'a [u8]) -> Option<&'a str> {
    let bytes = take_delimited(buf)?;
    if TRUSTED {
        debug_assert!(
            std::str::from_utf8(bytes).is_ok(),
            "a stored string is UTF-8"
        );
        // SAFETY: only a stored entry's own record is read TRUSTED (`parse_record`), and every
        // such record is written once by `put_record` from `&str` values (`StoredEntry` has no
        // other constructor and never changes its bytes), so its string fields are UTF-8.
        // Checking them again was a tenth of a large journal's replay.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// Reads a `tunecache.v1.Key` message body as prost decodes it (a repeated field: the last
/// value wins; `rank` truncated to 32 bits), as long as it holds only the declared fields in
/// their declared wire types; `None` for anything else (an unknown field, a bad length,
/// invalid UTF-8). The Lookup route reads request keys with it too (`lookup_request`).
pub(crate) fn parse_key(body: &[u8]) -> Option<KeyView<'_>> {
    parse_key_as::<false>(body)
}

fn parse_key_as<const TRUSTED: bool>(mut body: &[u8]) -> Option<KeyView<'_>> {
    let mut key = KeyView {
        namespace: "",
        op: "",
        device: "",
        problem: "",
        rank: None,
    };
    while !body.is_empty() {
        match decode_key(&mut body).ok()? {
            (1, WireType::LengthDelimited) => key.namespace = take_str::<TRUSTED>(&mut body)?,
            (2, WireType::LengthDelimited) => key.op = take_str::<TRUSTED>(&mut body)?,
            (3, WireType::LengthDelimited) => key.device = take_str::<TRUSTED>(&mut body)?,
            (4, WireType::LengthDelimited) => key.problem = take_str::<TRUSTED>(&mut body)?,
            (5, WireType::Varint) => key.rank = Some(decode_varint(&mut body).ok()? as u32),
            _ => return None,
        }
    }
    Some(key)
}

fn parse_result<const TRUSTED: bool>(mut body: &[u8]) -> Option<ResultView<'_>> {
    let mut result = ResultView {
        config: "",
        time_us: 0.0,
        tuned_by: "",
        tuned_at_unix_ms: 0,
        forget_epoch: 0,
        artifacts: ArtifactsView::default(),
    };
    while !body.is_empty() {
        // `put_record` writes the artifacts last, as one run of field-6 records.
        if body[0] == ((ARTIFACTS_FIELD << 3) | WireType::LengthDelimited as u32) as u8 {
            result.artifacts = ArtifactsView::parse(body)?;
            break;
        }
        match decode_key(&mut body).ok()? {
            (1, WireType::LengthDelimited) => result.config = take_str::<TRUSTED>(&mut body)?,
            (2, WireType::SixtyFourBit) => {
                result.time_us = f64::from_le_bytes(take(&mut body, 8)?.try_into().ok()?);
            }
            (3, WireType::LengthDelimited) => result.tuned_by = take_str::<TRUSTED>(&mut body)?,
            (4, WireType::Varint) => {
                result.tuned_at_unix_ms = decode_varint(&mut body).ok()? as i64
            }
            (5, WireType::Varint) => result.forget_epoch = decode_varint(&mut body).ok()?,
            _ => return None,
        }
    }
    Some(result)
}

/// Reads a stored entry's own record, which `put_record` wrote (its strings are not checked
/// as UTF-8 again: see `take_str`). Nothing else may be read with it.
pub(super) fn parse_record(mut record: &[u8]) -> Option<(KeyView<'_>, ResultView<'_>)> {
    if decode_key(&mut record).ok()? != (ENTRY_FIELD, WireType::LengthDelimited) {
        return None;
    }
    parse_entry_body_as::<true>(take_delimited(&mut record)?)
}

/// Reads a `tunecache.v1.Entry` message body holding a key and a result, each as
/// `parse_key` reads a key; `None` for anything else (a missing key or result, an unknown
/// field, invalid UTF-8): the caller then decodes it with prost.
pub(crate) fn parse_entry_body(body: &[u8]) -> Option<(KeyView<'_>, ResultView<'_>)> {
    parse_entry_body_as::<false>(body)
}

fn parse_entry_body_as<const TRUSTED: bool>(
    mut body: &[u8],
) -> Option<(KeyView<'_>, ResultView<'_>)> {
    let mut key = None;
    let mut result = None;
    while !body.is_empty() {
        match decode_key(&mut body).ok()? {
            (1, WireType::LengthDelimited) => {
                key = Some(parse_key_as::<TRUSTED>(take_delimited(&mut body)?)?)
            }
            (2, WireType::LengthDelimited) => {
                result = Some(parse_result::<TRUSTED>(take_delimited(&mut body)?)?);
            }
            _ => return None,
        }
    }
    Some((key?, result?))
}

pub(super) const EMPTY_KEY: KeyView<'static> = KeyView {
    namespace: "",
    op: "",
    device: "",
    problem: "",
    rank: None,
};
pub(super) const EMPTY_RESULT: ResultView<'static> = ResultView {
    config: "",
    time_us: 0.0,
    tuned_by: "",
    tuned_at_unix_ms: 0,
    forget_epoch: 0,
    artifacts: ArtifactsView::new_empty(),
};
