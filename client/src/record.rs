//! Owns storing many entries so that every valid one is kept: [`Client::record_keeping_valid`],
//! which the CLI's import and the TensorRT-LLM drop-in use. The daemon refuses a Record whole
//! (nothing of it is applied) and says why in the status's structured details, never only in
//! its text:
//!
//! * `INVALID_ARGUMENT` with a `google.rpc.BadRequest` naming `entries[<i>]`: that entry is set
//!   aside with the daemon's reason and the rest is sent again;
//! * `RESOURCE_EXHAUSTED` with a `google.rpc.ErrorInfo` of reason `MESSAGE_TOO_LARGE` (over the
//!   daemon's `--max-message-bytes`): the batch is halved and each half sent; an entry too large
//!   alone is set aside;
//! * an `INVALID_ARGUMENT` that names no entry is halved too, until it names one or the batch is
//!   one entry, which is then set aside;
//! * anything else (the daemon away, its journal failing) ends the call with that error.
//!
//! Which of these applies is the pure [`next_step`], unit-tested without a daemon.

use prost::Message as _;
use tunecache_proto::limits::{ERROR_DOMAIN, MAX_MESSAGE_BYTES, MESSAGE_TOO_LARGE_REASON};
use tunecache_proto::v1;

use crate::{refused_entry_index, Client, ClientError, Result};

/// Entries per Record call: well under the daemon's 10,000 per request, and small enough that a
/// refusal resends little.
pub const RECORD_BATCH: usize = 1000;

/// What the daemon's refusal of a whole Record says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `INVALID_ARGUMENT` naming the entry at this index of the batch sent.
    Entry(usize),
    /// `INVALID_ARGUMENT` that names no entry.
    Invalid,
    /// Over the daemon's `--max-message-bytes` (or this client's own limit).
    TooLarge,
    /// Anything else: not the batch's fault.
    Other,
}

/// Whether `status` is a refusal for size: RESOURCE_EXHAUSTED carrying the daemon's
/// `ErrorInfo` reason `MESSAGE_TOO_LARGE` (its message says the same for people).
pub fn is_message_too_large(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt;
    status.code() == tonic::Code::ResourceExhausted
        && status.get_details_error_info().is_some_and(|info| {
            info.reason == MESSAGE_TOO_LARGE_REASON && info.domain == ERROR_DOMAIN
        })
}

/// The refusal a failed Record's status stands for.
pub fn refusal_of(status: &tonic::Status) -> Refusal {
    if is_message_too_large(status) {
        return Refusal::TooLarge;
    }
    if status.code() != tonic::Code::InvalidArgument {
        return Refusal::Other;
    }
    match refused_entry_index(status) {
        Some(index) => Refusal::Entry(index),
        None => Refusal::Invalid,
    }
}

/// What to do with a batch of `batch_len` entries the daemon refused as `refusal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Set the entry at this index aside (refused) and send the rest again.
    SetAside(usize),
    /// Send the first `at` entries, then the rest, each as a batch of its own.
    Split { at: usize },
    /// Give up: the error is not the batch's.
    Fail,
}

/// The rule of [`Client::record_keeping_valid`] (see the module doc).
pub fn next_step(batch_len: usize, refusal: Refusal) -> Step {
    match refusal {
        Refusal::Entry(index) if index < batch_len => Step::SetAside(index),
        // An index outside the batch names nothing in it: as if it named no entry.
        Refusal::Entry(_) | Refusal::Invalid | Refusal::TooLarge => {
            if batch_len > 1 {
                Step::Split { at: batch_len / 2 }
            } else {
                Step::SetAside(0)
            }
        }
        Refusal::Other => Step::Fail,
    }
}

/// An entry the daemon refused, with where it was in the input and why.
#[derive(Debug)]
pub struct RefusedEntry {
    /// Its index in the entries given to [`Client::record_keeping_valid`].
    pub index: usize,
    pub entry: v1::Entry,
    /// The daemon's refusal (its message names the field and says why).
    pub status: tonic::Status,
}

/// What [`Client::record_keeping_valid`] stored.
#[derive(Debug, Default)]
pub struct KeptRecord {
    /// Entries that were new or improved what the cache held.
    pub stored: u64,
    /// Entries that did not beat what the cache held.
    pub unchanged: u64,
    /// Entries the daemon refused, in the order they were set aside.
    pub refused: Vec<RefusedEntry>,
}

/// A batch as sent: each entry with its index in the caller's input.
type Batch = Vec<(usize, v1::Entry)>;

impl Client {
    /// Records `entries` in batches of [`RECORD_BATCH`], keeping every valid one: a refused
    /// batch is split as the module doc says, so one bad entry never costs the others. Fails
    /// only for an error that is not the entries' (what was stored before it stays stored).
    pub async fn record_keeping_valid(&self, entries: Vec<v1::Entry>) -> Result<KeptRecord> {
        let mut kept = KeptRecord::default();
        let mut indexed: Batch = entries.into_iter().enumerate().collect();
        // Batches still to send, the next one last.
        let mut pending: Vec<Batch> = Vec::new();
        while !indexed.is_empty() {
            let rest = indexed.split_off(indexed.len().min(RECORD_BATCH));
            pending.push(indexed);
            indexed = rest;
        }
        pending.reverse();
        while let Some(mut batch) = pending.pop() {
            if batch.is_empty() {
                continue;
            }
            let entries: Vec<v1::Entry> = batch.iter().map(|(_, entry)| entry.clone()).collect();
            let status = if over_client_limit(&entries) {
                // tonic would refuse to send it; the daemon's limit is lower unless raised.
                too_large_here(&entries)
            } else {
                match self.record(entries).await {
                    Ok(response) => {
                        kept.stored += u64::from(response.stored);
                        kept.unchanged += u64::from(response.unchanged);
                        continue;
                    }
                    Err(ClientError::Rpc(status)) => status,
                    Err(other) => return Err(other),
                }
            };
            match next_step(batch.len(), refusal_of(&status)) {
                Step::SetAside(position) => {
                    let (index, entry) = batch.remove(position);
                    kept.refused.push(RefusedEntry {
                        index,
                        entry,
                        status,
                    });
                    pending.push(batch);
                }
                Step::Split { at } => {
                    let second = batch.split_off(at);
                    pending.push(second);
                    pending.push(batch);
                }
                Step::Fail => return Err(ClientError::Rpc(status)),
            }
        }
        Ok(kept)
    }
}

/// Whether a Record of `entries` is over the largest message this client sends.
fn over_client_limit(entries: &[v1::Entry]) -> bool {
    let request = v1::RecordRequest {
        entries: entries.to_vec(),
        lease_id: String::new(),
    };
    request.encoded_len() > MAX_MESSAGE_BYTES
}

/// The refusal this client makes itself for a Record over its own limit, in the daemon's form.
fn too_large_here(entries: &[v1::Entry]) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt};
    let request = v1::RecordRequest {
        entries: entries.to_vec(),
        lease_id: String::new(),
    };
    let len = request.encoded_len();
    tonic::Status::with_error_details(
        tonic::Code::ResourceExhausted,
        format!("a Record of {len} bytes is over this client's limit of {MAX_MESSAGE_BYTES} bytes"),
        ErrorDetails::with_error_info(
            MESSAGE_TOO_LARGE_REASON,
            ERROR_DOMAIN,
            std::collections::HashMap::new(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    fn bad_entry(index: usize) -> tonic::Status {
        tonic::Status::with_error_details(
            tonic::Code::InvalidArgument,
            format!("entries[{index}].key.problem: 5000 bytes, at most 4096"),
            ErrorDetails::with_bad_request_violation(
                format!("entries[{index}].key.problem"),
                "5000 bytes, at most 4096",
            ),
        )
    }

    fn too_large(reason: &str, domain: &str) -> tonic::Status {
        tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            "request message of 70000 bytes is over the daemon's limit (--max-message-bytes 65536)",
            ErrorDetails::with_error_info(reason, domain, std::collections::HashMap::new()),
        )
    }

    #[test]
    fn a_refusal_is_read_from_the_structured_details_only() {
        assert_eq!(refusal_of(&bad_entry(7)), Refusal::Entry(7));
        assert_eq!(
            refusal_of(&too_large(MESSAGE_TOO_LARGE_REASON, ERROR_DOMAIN)),
            Refusal::TooLarge
        );
        // The same text without the ErrorInfo is no size refusal: the text is for people.
        let text_only = tonic::Status::resource_exhausted(
            "request message of 70000 bytes is over the daemon's limit (--max-message-bytes 65536)",
        );
        assert_eq!(refusal_of(&text_only), Refusal::Other);
        assert_eq!(
            refusal_of(&too_large("OTHER", ERROR_DOMAIN)),
            Refusal::Other
        );
        assert_eq!(
            refusal_of(&too_large(MESSAGE_TOO_LARGE_REASON, "elsewhere")),
            Refusal::Other
        );
        // A queue full or a uid's bytes in flight: a smaller batch would not help.
        assert_eq!(
            refusal_of(&tonic::Status::resource_exhausted(
                "the journal writer's queue is full"
            )),
            Refusal::Other
        );
        assert_eq!(
            refusal_of(&tonic::Status::invalid_argument(
                "entries: more than 10000 items"
            )),
            Refusal::Invalid
        );
        assert_eq!(
            refusal_of(&tonic::Status::unavailable("down")),
            Refusal::Other
        );
        let here = too_large_here(&[]);
        assert_eq!(refusal_of(&here), Refusal::TooLarge);
        assert!(here.get_details_error_info().is_some());
    }

    #[test]
    fn a_refused_entry_is_set_aside_and_a_size_refusal_halves() {
        assert_eq!(next_step(10, Refusal::Entry(3)), Step::SetAside(3));
        assert_eq!(next_step(1, Refusal::Entry(0)), Step::SetAside(0));
        // An index the batch does not have names nothing: split until one is named.
        assert_eq!(next_step(10, Refusal::Entry(10)), Step::Split { at: 5 });
        assert_eq!(next_step(10, Refusal::Invalid), Step::Split { at: 5 });
        assert_eq!(next_step(1, Refusal::Invalid), Step::SetAside(0));
        assert_eq!(next_step(1000, Refusal::TooLarge), Step::Split { at: 500 });
        assert_eq!(next_step(3, Refusal::TooLarge), Step::Split { at: 1 });
        // One entry too large alone is refused, the rest are kept.
        assert_eq!(next_step(1, Refusal::TooLarge), Step::SetAside(0));
        assert_eq!(next_step(10, Refusal::Other), Step::Fail);
        assert_eq!(next_step(1, Refusal::Other), Step::Fail);
    }
}
