//! What a failed call's status says: whether it ran past its deadline, and which entry of a
//! Record it refused.

/// Whether a call ran past its deadline: the daemon's DEADLINE_EXCEEDED, or this client's own
/// timeout, which tonic reports as CANCELLED "Timeout expired" (`tonic::TimeoutExpired`).
pub fn past_deadline(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::DeadlineExceeded
        || (status.code() == tonic::Code::Cancelled
            && status.message() == tonic::TimeoutExpired(()).to_string())
}

/// The index of the entry a Record's INVALID_ARGUMENT refused, read from the status's
/// `google.rpc.BadRequest` detail (its field path is `entries[<index>]...`); `None` when the
/// status names no entry. A caller drops that entry and sends the rest again.
pub fn refused_entry_index(status: &tonic::Status) -> Option<usize> {
    use tonic_types::StatusExt;
    if status.code() != tonic::Code::InvalidArgument {
        return None;
    }
    status
        .get_details_bad_request()?
        .field_violations
        .iter()
        .find_map(|violation| {
            let rest = violation.field.strip_prefix("entries[")?;
            rest[..rest.find(']')?].parse().ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_deadline_is_the_daemons_deadline_or_this_clients_own_timer() {
        assert!(past_deadline(&tonic::Status::deadline_exceeded("late")));
        // What tonic reports when the client's own request timeout fires.
        assert!(past_deadline(&tonic::Status::cancelled(
            tonic::TimeoutExpired(()).to_string()
        )));
        assert!(!past_deadline(&tonic::Status::cancelled(
            "the caller went away"
        )));
        assert!(!past_deadline(&tonic::Status::unavailable(
            "Timeout expired"
        )));
    }
}
