//! The Lookup request read in place (the Lookup route's codec keeps its bytes: `wire`).
//!
//! prost decodes each `Key` into four `String`s (an allocation and a UTF-8 check each, then a
//! free): a third of the daemon's CPU in a 1,000-key Lookup. The Lookup route's codec
//! (`wire::BytesCodec`) instead hands the service the request's bytes, and [`checked_keys`] reads
//! the keys as views into them. It reads only requests made of the declared fields in their
//! declared wire types (what every client writes); any other request (an unknown field,
//! malformed bytes) is decoded by prost and checked by `validate::keys` exactly as before, so
//! the keys, the treatment of unknown fields and the error of a malformed request are prost's.
//! Either way no more than `MAX_BATCH` keys are ever built: reading stops at the next.

use prost::bytes::Bytes;
use prost::encoding::{decode_key, WireType};
use prost::Message;
use tonic::Status;
use tunecache_proto::v1;

use crate::model::entry::{CacheKey, KeyView};
use crate::model::validate::{self, CheckedKey};
use crate::wire::stored::{parse_key, take_delimited};

/// Field number of the repeated `Key` in `LookupRequest`.
const KEYS_FIELD: u32 = 1;
/// Field number of the `view` string.
const VIEW_FIELD: u32 = 2;

/// A Lookup request as the client sent it: an encoded `tunecache.v1.LookupRequest`.
#[derive(Debug, Clone)]
pub struct LookupRequestBytes(pub Bytes);

impl From<Bytes> for LookupRequestBytes {
    fn from(bytes: Bytes) -> Self {
        LookupRequestBytes(bytes)
    }
}

/// A Lookup's keys, validated, and its view (empty: none).
#[derive(Debug)]
pub struct CheckedLookup<'a> {
    pub keys: LookupKeys<'a>,
    pub view: String,
}

/// A Lookup's keys, validated.
#[derive(Debug)]
pub enum LookupKeys<'a> {
    /// Read in place: views into the request's bytes.
    InPlace(Vec<CheckedKey<'a>>),
    /// A request of another shape, decoded by prost.
    Decoded(Vec<CacheKey>),
}

/// Reads and validates a Lookup's keys. A request of more than `MAX_BATCH` keys is refused
/// at the first key over, whichever way it is read (`validate::too_many`). Other errors are
/// those the route gave when prost decoded every request: a malformed request is tonic's
/// decode error (`decode_status`), an invalid key INVALID_ARGUMENT naming it.
pub fn checked_keys(request: &Bytes) -> Result<CheckedLookup<'_>, Status> {
    match read_keys(request)? {
        Some((keys, view)) => Ok(CheckedLookup {
            keys: LookupKeys::InPlace(validate::key_views(keys.into_iter())?),
            view: view.to_owned(),
        }),
        None => {
            // Counted before prost builds a single key, so it builds at most `MAX_BATCH`.
            validate::check_count(request, KEYS_FIELD, "keys")?;
            let request = v1::LookupRequest::decode(request.clone()).map_err(decode_status)?;
            Ok(CheckedLookup {
                keys: LookupKeys::Decoded(validate::keys(request.keys)?),
                view: request.view,
            })
        }
    }
}

/// The refusal of a request message that does not decode (invalid UTF-8 in a string, a
/// truncated field): INVALID_ARGUMENT, the caller's fault, with a BadRequest naming the field
/// prost stopped at (`entries.key.problem`), not tonic's INTERNAL.
pub(crate) fn decode_status(error: prost::DecodeError) -> Status {
    validate::InvalidField::new(undecodable_field(&error), error.to_string()).into()
}

/// The field path in prost's message (`failed to decode Protobuf message: Key.problem:
/// Entry.key: RecordRequest.entries: invalid string value: ...`, innermost first): each
/// `Message.field` segment's field, outermost first, joined by dots; `request` when prost
/// names none.
fn undecodable_field(error: &prost::DecodeError) -> String {
    let text = error.to_string();
    let mut fields: Vec<&str> = text
        .split(": ")
        .filter_map(|segment| {
            let (message, field) = segment.split_once('.')?;
            let is_name =
                |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (is_name(message)
                && is_name(field)
                && message.starts_with(|c: char| c.is_ascii_uppercase()))
            .then_some(field)
        })
        .collect();
    fields.reverse();
    if fields.is_empty() {
        "request".to_owned()
    } else {
        fields.join(".")
    }
}

/// The keys and view of a `LookupRequest` holding only field-1 keys of only declared fields
/// and field-2 views, as prost would decode them (the last view wins); `None` for any other
/// request (which prost may still accept). Stops at key `MAX_BATCH + 1` with
/// `validate::too_many`.
#[allow(clippy::type_complexity)]
fn read_keys(request: &[u8]) -> Result<Option<(Vec<KeyView<'_>>, &str)>, validate::InvalidField> {
    let mut buf = request;
    let mut keys = Vec::new();
    let mut view = "";
    while !buf.is_empty() {
        let Ok(tag) = decode_key(&mut buf) else {
            return Ok(None);
        };
        if tag == (VIEW_FIELD, WireType::LengthDelimited) {
            let Some(text) = take_delimited(&mut buf).and_then(|b| std::str::from_utf8(b).ok())
            else {
                return Ok(None);
            };
            view = text;
            continue;
        }
        if keys.len() == validate::MAX_BATCH {
            return Err(validate::too_many("keys"));
        }
        let key = Some(tag)
            .filter(|&key| key == (KEYS_FIELD, WireType::LengthDelimited))
            .and_then(|_| parse_key(take_delimited(&mut buf)?));
        let Some(key) = key else {
            return Ok(None);
        };
        keys.push(key);
    }
    Ok(Some((keys, view)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::validate::MAX_KEY_FIELD_BYTES;

    #[test]
    fn an_undecodable_request_is_invalid_argument_naming_the_field() {
        use tonic_types::StatusExt;
        // A LookupRequest whose view (field 2) is not UTF-8.
        let lookup = [0x12, 0x02, 0xff, 0xfe];
        let status = v1::LookupRequest::decode(&lookup[..])
            .map_err(decode_status)
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let violations = status.get_details_bad_request().unwrap().field_violations;
        assert_eq!(violations[0].field, "view");
        // A key's problem (entries[0].key.problem) in a RecordRequest.
        let record = v1::RecordRequest {
            entries: vec![v1::Entry {
                key: Some(v1::Key {
                    problem: "p".into(),
                    ..Default::default()
                }),
                result: None,
            }],
            lease_id: String::new(),
        };
        let mut bytes = record.encode_to_vec();
        let at = bytes.iter().rposition(|&b| b == b'p').unwrap();
        bytes[at] = 0xff;
        let status = v1::RecordRequest::decode(&bytes[..])
            .map_err(decode_status)
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let violations = status.get_details_bad_request().unwrap().field_violations;
        assert_eq!(violations[0].field, "entries.key.problem");
        // A message cut short names no field.
        let status = v1::LookupRequest::decode(&[0x0a, 0x05][..])
            .map_err(decode_status)
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }
    use proptest::prelude::*;
    use prost::encoding::{encode_key, encode_varint};

    /// What the route answered when prost decoded every Lookup: the keys and the view, or
    /// the status.
    fn prost_path(request: &[u8]) -> Result<(Vec<CacheKey>, String), Status> {
        validate::check_count(request, KEYS_FIELD, "keys")?;
        let request = v1::LookupRequest::decode(request).map_err(decode_status)?;
        Ok((validate::keys(request.keys)?, request.view))
    }

    /// `checked_keys`, as owned keys and the view (or the status), to compare with
    /// `prost_path`.
    fn in_place_path(request: &[u8]) -> Result<(Vec<CacheKey>, String), Status> {
        let bytes = Bytes::copy_from_slice(request);
        let checked = checked_keys(&bytes)?;
        let keys = match checked.keys {
            LookupKeys::InPlace(keys) => keys.iter().map(|k| k.view().to_key()).collect(),
            LookupKeys::Decoded(keys) => keys,
        };
        Ok((keys, checked.view))
    }

    fn assert_same_answer(request: &[u8]) {
        match (in_place_path(request), prost_path(request)) {
            (Ok(ours), Ok(theirs)) => assert_eq!(ours, theirs),
            (Err(ours), Err(theirs)) => {
                assert_eq!(ours.code(), theirs.code());
                assert_eq!(ours.message(), theirs.message());
            }
            (ours, theirs) => panic!("{ours:?} vs prost {theirs:?} for {request:?}"),
        }
    }

    fn wire_key(namespace: &str, op: &str, problem: &str, rank: Option<u32>) -> v1::Key {
        v1::Key {
            namespace: namespace.into(),
            op: op.into(),
            device: "NVIDIA H200 80GB HBM3|sm_90|drv-550.54".into(),
            problem: problem.into(),
            rank,
        }
    }

    fn request_of(keys: Vec<v1::Key>) -> Vec<u8> {
        v1::LookupRequest {
            keys,
            view: String::new(),
        }
        .encode_to_vec()
    }

    fn good_keys(n: usize) -> Vec<v1::Key> {
        (0..n)
            .map(|i| {
                let rank = [None, Some(0), Some(7), Some(u32::MAX)][i % 4];
                wire_key("trtllm", "gemm", &format!("m={i},\u{e9}\0"), rank)
            })
            .collect()
    }

    #[test]
    fn reads_the_keys_prost_decodes_in_place() {
        let mut keys = good_keys(1_000);
        keys.push(wire_key("ns", "op", "", None));
        keys.push(v1::Key {
            device: String::new(),
            ..wire_key("ns", "op", "p", Some(1))
        });
        keys.push(wire_key(
            "tunecache",
            "gemm",
            r#"{"m":1,"n":2,"k":3,"dtype":"f16","layout":"nn"}"#,
            None,
        ));
        let request = request_of(keys);
        let bytes = Bytes::from(request.clone());
        assert!(matches!(
            checked_keys(&bytes).map(|c| c.keys),
            Ok(LookupKeys::InPlace(_))
        ));
        assert_same_answer(&request);
        assert_same_answer(&[]);
    }

    #[test]
    fn the_view_is_read_in_place_as_prost_reads_it_the_last_one_winning() {
        let request = v1::LookupRequest {
            keys: good_keys(3),
            view: "job-1".to_owned(),
        }
        .encode_to_vec();
        let bytes = Bytes::from(request.clone());
        let checked = checked_keys(&bytes).unwrap();
        assert!(matches!(checked.keys, LookupKeys::InPlace(_)));
        assert_eq!(checked.view, "job-1");
        assert_same_answer(&request);
        // Two view fields, keys between them: prost keeps the last; so does the reader.
        let mut twice = request.clone();
        encode_key(VIEW_FIELD, WireType::LengthDelimited, &mut twice);
        encode_varint(5, &mut twice);
        twice.extend_from_slice(b"job-2");
        twice.extend_from_slice(&request);
        let bytes = Bytes::from(twice.clone());
        let checked = checked_keys(&bytes).unwrap();
        assert!(matches!(checked.keys, LookupKeys::InPlace(_)));
        assert_eq!(
            checked.view,
            v1::LookupRequest::decode(twice.as_slice()).unwrap().view
        );
        assert_eq!(checked.view, "job-1");
        // A view that is not UTF-8: prost's error, not a view of bytes.
        let mut bad = Vec::new();
        encode_key(VIEW_FIELD, WireType::LengthDelimited, &mut bad);
        encode_varint(1, &mut bad);
        bad.push(0xff);
        assert!(checked_keys(&Bytes::from(bad)).is_err());
    }

    #[test]
    fn tuner_problems_are_canonicalised_in_place() {
        let key = wire_key(
            "tunecache",
            "gemm",
            r#"{ "k": 3, "n": 2, "m": 1, "dtype": "f16", "layout": "nn" }"#,
            None,
        );
        let bytes = Bytes::from(request_of(vec![key.clone()]));
        let Ok(LookupKeys::InPlace(checked)) = checked_keys(&bytes).map(|c| c.keys) else {
            panic!("not read in place")
        };
        let expected = validate::key("k", Some(key)).unwrap();
        assert_ne!(
            expected.problem,
            r#"{ "k": 3, "n": 2, "m": 1, "dtype": "f16", "layout": "nn" }"#
        );
        assert_eq!(checked[0].view(), expected.view());
    }

    #[test]
    fn invalid_keys_give_the_same_error_at_any_index() {
        let long = "x".repeat(MAX_KEY_FIELD_BYTES + 1);
        let bad_keys = [
            wire_key("", "gemm", "p", None),
            wire_key("ns", "", "p", None),
            v1::Key {
                device: long.clone(),
                ..wire_key("ns", "op", "p", None)
            },
            wire_key("ns", "op", &long, None),
            wire_key("tunecache", "gemm", "not json", None),
            wire_key("tunecache", "no-such-op", "{}", None),
        ];
        for bad in bad_keys {
            for index in [0, 3, 999] {
                let mut keys = good_keys(1_000);
                keys[index] = bad.clone();
                // A later invalid key does not change which error is reported.
                keys[999.min(index + 1)].op.clear();
                let request = request_of(keys);
                let error = in_place_path(&request).unwrap_err();
                assert_eq!(error.code(), tonic::Code::InvalidArgument);
                assert!(
                    error.message().starts_with(&format!("keys[{index}].")),
                    "{}",
                    error.message()
                );
                assert_same_answer(&request);
            }
        }
        let too_many = request_of(good_keys(validate::MAX_BATCH + 1));
        let error = in_place_path(&too_many).unwrap_err();
        assert_eq!(
            error.message(),
            "keys: more than 10000 items, at most 10000 per request"
        );
        assert_same_answer(&too_many);
        // Keys of other shapes (an unknown field) are counted the same way, before prost.
        let mut unknown = too_many.clone();
        encode_key(9, WireType::Varint, &mut unknown);
        encode_varint(5, &mut unknown);
        assert_eq!(
            in_place_path(&unknown).unwrap_err().message(),
            error.message()
        );
        assert_same_answer(&unknown);
        // A malformed tail past key 10,001 is never read.
        let mut damaged = too_many;
        damaged.push(0xff);
        assert_eq!(
            in_place_path(&damaged).unwrap_err().message(),
            error.message()
        );
        // Empty keys, two bytes each: refused at the 10,001st, not after 16 million.
        let empty = [0x0a, 0x00].repeat(16 << 20);
        let started = std::time::Instant::now();
        assert_eq!(
            in_place_path(&empty).unwrap_err().message(),
            error.message()
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn unknown_fields_are_left_to_prost() {
        let mut request = request_of(good_keys(3));
        // An unknown top-level field: prost skips it.
        encode_key(9, WireType::Varint, &mut request);
        encode_varint(5, &mut request);
        assert!(read_keys(&request).unwrap().is_none());
        assert_same_answer(&request);
        assert_eq!(in_place_path(&request).unwrap().0.len(), 3);

        // An unknown field inside a key (a later field of Key, say).
        let mut key = wire_key("ns", "op", "p", Some(2)).encode_to_vec();
        encode_key(6, WireType::LengthDelimited, &mut key);
        encode_varint(1, &mut key);
        key.push(b'z');
        let mut request = Vec::new();
        encode_key(KEYS_FIELD, WireType::LengthDelimited, &mut request);
        encode_varint(key.len() as u64, &mut request);
        request.extend_from_slice(&key);
        assert!(read_keys(&request).unwrap().is_none());
        assert_same_answer(&request);
        assert_eq!(in_place_path(&request).unwrap().0[0].problem, "p");
    }

    #[test]
    fn malformed_requests_are_refused_as_prost_refuses_them() {
        let request = request_of(good_keys(4));
        for len in 0..request.len() {
            assert_same_answer(&request[..len]);
        }
        // Invalid UTF-8 in a key field; a key field of the wrong wire type; a bad varint.
        let mut bad_utf8 = request_of(vec![wire_key("ns", "op", "p\u{e9}", None)]);
        let last = bad_utf8.len() - 1;
        bad_utf8[last] = 0xff;
        let wrong_type = [0x0a, 0x02, 0x08, 0x01];
        let bad_varint = [
            0x0a, 0x0b, 0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        for request in [&bad_utf8[..], &wrong_type, &bad_varint, &[0x00], &[0xff; 7]] {
            let error = in_place_path(request).unwrap_err();
            assert_eq!(error.code(), tonic::Code::InvalidArgument, "{request:?}");
            assert_same_answer(request);
        }
    }

    fn arb_field() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("tunecache".to_owned()),
            Just("gemm".to_owned()),
            "[a-c\u{e9}\0]{0,6}",
        ]
    }

    fn arb_key() -> impl Strategy<Value = v1::Key> {
        (
            arb_field(),
            arb_field(),
            arb_field(),
            arb_field(),
            proptest::option::of(any::<u32>()),
        )
            .prop_map(|(namespace, op, device, problem, rank)| v1::Key {
                namespace,
                op,
                device,
                problem,
                rank,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn answers_as_prost_for_any_keys(keys in proptest::collection::vec(arb_key(), 0..8)) {
            let request = request_of(keys);
            prop_assert!(read_keys(&request).unwrap().is_some());
            assert_same_answer(&request);
        }

        #[test]
        fn answers_as_prost_for_damaged_requests(
            keys in proptest::collection::vec(arb_key(), 1..4),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut request = request_of(keys);
            for (at, byte) in flips {
                let at = at.index(request.len());
                request[at] = byte;
            }
            let cut = cut.index(request.len() + 1);
            assert_same_answer(&request[..cut]);
        }

        #[test]
        fn answers_as_prost_for_any_bytes(request in proptest::collection::vec(any::<u8>(), 0..64)) {
            assert_same_answer(&request);
        }
    }
}
