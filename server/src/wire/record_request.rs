//! The Record request, decoded within the entry limit.
//!
//! The generated route decoded a Record with prost and only then counted its entries: prost
//! builds an `Entry` (two `Option`s of four and two `String`s) for every element, about 85
//! times the two bytes of an empty one, so 64 MiB of `0a 00` became 5.7 GB and 15 s of CPU
//! before the count refused it. The Record route's codec (`wire::BytesCodec`) keeps the
//! request's bytes; [`checked`] counts the entries first (`validate::check_count`, which stops
//! at entry `MAX_BATCH + 1` without allocating), then prost decodes at most `MAX_BATCH`
//! entries, then `validate::entries` checks them, so errors are those of the generated route
//! except that too many entries are refused before anything is decoded.

use prost::bytes::Bytes;
use prost::Message;
use tonic::Status;
use tunecache_proto::v1;

use crate::model::entry::{CacheKey, TunedResult};
use crate::model::validate;
use crate::wire::lookup_request::decode_status;

/// Field number of the repeated `Entry` in `RecordRequest`.
const ENTRIES_FIELD: u32 = 1;

/// A Record request as the client sent it: an encoded `tunecache.v1.RecordRequest`.
#[derive(Debug, Clone)]
pub struct RecordRequestBytes(pub Bytes);

impl From<Bytes> for RecordRequestBytes {
    fn from(bytes: Bytes) -> Self {
        RecordRequestBytes(bytes)
    }
}

/// A Record's entries, validated, and its lease id.
#[derive(Debug)]
pub struct CheckedRecord {
    pub entries: Vec<(CacheKey, TunedResult)>,
    pub lease_id: String,
}

/// Decodes and validates a Record request, counting its entries before decoding any.
pub fn checked(request: &Bytes) -> Result<CheckedRecord, Status> {
    validate::check_count(request, ENTRIES_FIELD, "entries")?;
    let request = v1::RecordRequest::decode(request.clone()).map_err(decode_status)?;
    Ok(CheckedRecord {
        entries: validate::entries(request.entries)?,
        lease_id: request.lease_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::encoding::{encode_key, encode_varint, WireType};

    /// What the generated route answered: prost, then the checks.
    fn generated_route(request: &[u8]) -> Result<CheckedRecord, Status> {
        let request = v1::RecordRequest::decode(request).map_err(decode_status)?;
        Ok(CheckedRecord {
            entries: validate::entries(request.entries)?,
            lease_id: request.lease_id,
        })
    }

    fn wire_entry(i: usize) -> v1::Entry {
        v1::Entry {
            key: Some(v1::Key {
                namespace: "ns".into(),
                op: "gemm".into(),
                device: "dev".into(),
                problem: format!("m={i}"),
                rank: (i & 1 == 0).then_some(i as u32),
            }),
            result: Some(v1::Result {
                config: format!("{{\"tile\":{i}}}"),
                time_us: i as f64,
                tuned_by: "t".into(),
                tuned_at_unix_ms: 1,
                forget_epoch: 0,
                artifacts: Default::default(),
            }),
        }
    }

    fn request_of(entries: Vec<v1::Entry>, lease_id: &str) -> Vec<u8> {
        v1::RecordRequest {
            entries,
            lease_id: lease_id.into(),
        }
        .encode_to_vec()
    }

    fn assert_same_answer(request: &[u8]) {
        let ours = checked(&Bytes::copy_from_slice(request));
        match (ours, generated_route(request)) {
            (Ok(ours), Ok(theirs)) => {
                assert_eq!(ours.entries, theirs.entries);
                assert_eq!(ours.lease_id, theirs.lease_id);
            }
            (Err(ours), Err(theirs)) => {
                assert_eq!(ours.code(), theirs.code());
                assert_eq!(ours.message(), theirs.message());
            }
            (ours, theirs) => panic!("{ours:?} vs the generated route's {theirs:?}"),
        }
    }

    #[test]
    fn decodes_as_the_generated_route() {
        let request = request_of((0..1_000).map(wire_entry).collect(), "lease-7");
        assert_same_answer(&request);
        assert_eq!(checked(&Bytes::from(request)).unwrap().entries.len(), 1_000);
        assert_same_answer(&request_of(Vec::new(), "lease-7"));
        assert_same_answer(&[]);
        // An unknown field is skipped.
        let mut unknown = request_of(vec![wire_entry(1)], "");
        encode_key(9, WireType::Varint, &mut unknown);
        encode_varint(5, &mut unknown);
        assert_same_answer(&unknown);
        // Invalid entries and malformed bytes give the same errors.
        let mut bad = wire_entry(3);
        bad.result.as_mut().unwrap().config = "{not json".into();
        assert_same_answer(&request_of(vec![wire_entry(1), bad], ""));
        let request = request_of((0..4).map(wire_entry).collect(), "l");
        for len in 0..request.len() {
            assert_same_answer(&request[..len]);
        }
    }

    #[test]
    fn too_many_entries_are_refused_before_any_is_decoded() {
        let expected = "entries: more than 10000 items, at most 10000 per request";
        let full = request_of((0..validate::MAX_BATCH).map(wire_entry).collect(), "");
        assert_eq!(
            checked(&Bytes::from(full.clone())).unwrap().entries.len(),
            validate::MAX_BATCH
        );
        let mut over = full;
        over.extend_from_slice(&request_of(vec![wire_entry(0)], ""));
        let error = checked(&Bytes::from(over)).unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        assert_eq!(error.message(), expected);

        // 64 MiB of empty entries: refused at the 10,001st, in well under a second.
        let empty = Bytes::from([0x0a, 0x00].repeat(32 << 20));
        let started = std::time::Instant::now();
        assert_eq!(checked(&empty).unwrap_err().message(), expected);
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
