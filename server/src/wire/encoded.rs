//! A Lookup or Scan response held as its encoded body. The store keeps every entry as its
//! encoded `tunecache.v1.Entry` record (`stored`), so a response is those records copied into
//! one buffer of their exact size; `wire` hands it to tonic as the message body.

use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{self, WireType};

use crate::wire::stored::StoredEntry;

/// A `LookupResponse` or `ScanResponse` held as its encoded body: a run of field-1 `Entry`
/// records. Encoding it copies the bytes; it is never decoded (it is a response only).
#[derive(Debug, Default, Clone)]
pub struct EncodedEntries {
    body: BytesMut,
    count: usize,
}

impl EncodedEntries {
    /// The response holding exactly `entries`, in one allocation of their total size (the
    /// body never grows by reallocation, which cost a third of a Scan's CPU).
    pub fn from_entries(entries: &[&StoredEntry]) -> Self {
        let size = entries.iter().map(|entry| entry.record().len()).sum();
        let mut encoded = EncodedEntries {
            body: BytesMut::with_capacity(size),
            count: 0,
        };
        for entry in entries {
            encoded.push(entry);
        }
        encoded
    }

    /// Appends a stored entry: a copy of its record, which is already a field-1 `Entry`.
    pub fn push(&mut self, entry: &StoredEntry) {
        self.body.extend_from_slice(entry.record());
        self.count += 1;
    }

    /// Entries written so far.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The encoded message body.
    pub fn into_bytes(self) -> Bytes {
        self.body.freeze()
    }
}

impl prost::Message for EncodedEntries {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.body);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.body.len()
    }

    fn clear(&mut self) {
        self.body.clear();
        self.count = 0;
    }
}
