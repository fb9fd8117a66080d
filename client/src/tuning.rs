//! Owns the split lease, the one way every client of this crate (the rank flow, the Python
//! binding's drop-ins and `tunecache.autotune`, the CLI) tunes a key under the daemon's lease:
//!
//! 1. [`Client::begin_tune`] Resolves the key: a hit, a [`TuneLease`] to tune under, or a miss;
//! 2. the caller tunes;
//! 3. [`Client::finish_tune`] Records the result under the lease, or [`Client::abandon`] gives
//!    the lease up (tuning failed), so that the next waiter that can tune gets it at once.
//!
//! What happens to the lease when its Record fails is one rule, [`gives_up_after`]: the lease is
//! given up at once (the daemon keeps a failed Record's lease held, so its waiters would sit out
//! their whole wait), except after a deadline: that Record may still land and complete the
//! lease, and a second call to a daemon that did not answer in time would block as long again.

use tunecache_proto::v1;

use crate::{past_deadline, Client, ClientError, Resolution, ResolveOptions, Result};

/// What [`Client::begin_tune`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum TuneStart {
    /// Cached, or tuned by someone else while the caller waited.
    Hit(v1::Result),
    /// The caller tunes the key now and ends the lease with [`Client::finish_tune`] or
    /// [`Client::abandon`].
    Tune(TuneLease),
    /// Nobody will have a result in time; the reason says why. Use the default.
    Miss(String),
}

/// The lease `Resolve` handed out for one key. Ended by [`Client::finish_tune`] or
/// [`Client::abandon`], which take it by value; one never ended expires on the daemon, or ends
/// when the process that Resolved exits.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneLease {
    key: v1::Key,
    lease: v1::Lease,
}

impl TuneLease {
    /// The lease `lease` for `key`, e.g. one a Resolve handed out to another program (the CLI's
    /// `put --lease-id`).
    pub fn from_parts(key: v1::Key, lease: v1::Lease) -> TuneLease {
        TuneLease { key, lease }
    }

    pub fn key(&self) -> &v1::Key {
        &self.key
    }

    pub fn lease_id(&self) -> &str {
        &self.lease.lease_id
    }

    /// How long the daemon gave the lease, in milliseconds, when it was handed out.
    pub fn expires_in_ms(&self) -> u32 {
        self.lease.expires_in_ms
    }
}

/// What became of a lease whose Record failed (see [`gives_up_after`]).
#[derive(Debug)]
pub enum LeaseAfterFailure {
    /// Given up: the next waiter tunes at once.
    GivenUp,
    /// The give-up failed too; the lease ends when it expires or the process exits.
    GiveUpFailed(ClientError),
    /// Kept: the Record ran past its deadline and may still land.
    Kept,
}

/// A [`Client::finish_tune`] whose Record failed: why, and what became of the lease.
#[derive(Debug)]
pub struct FinishFailed {
    pub error: ClientError,
    pub lease: LeaseAfterFailure,
}

impl FinishFailed {
    /// Whether the daemon refused the result itself (`INVALID_ARGUMENT`: a config over 64 KiB,
    /// not JSON, a time that is not finite): no rank will ever get it, so one that used it would
    /// disagree with its peers. Any other failure is the daemon's, and the result stays good.
    pub fn refused(&self) -> bool {
        matches!(&self.error, ClientError::Rpc(status) if status.code() == tonic::Code::InvalidArgument)
    }
}

/// Whether a lease is given up after its Record failed with `error`: always, except after a
/// deadline (this client's own timer or the daemon's DEADLINE_EXCEEDED; see the module doc).
pub fn gives_up_after(error: &ClientError) -> bool {
    !matches!(error, ClientError::Rpc(status) if past_deadline(status))
}

impl Client {
    /// Resolves `key` in this client's view: a hit, a lease to tune it under, or a miss after
    /// waiting up to `options.wait`.
    pub async fn begin_tune(&self, key: v1::Key, options: ResolveOptions) -> Result<TuneStart> {
        Ok(match self.resolve(key.clone(), options).await? {
            Resolution::Hit(result) => TuneStart::Hit(result),
            Resolution::TuneHere(lease) => TuneStart::Tune(TuneLease { key, lease }),
            Resolution::Miss(reason) => TuneStart::Miss(reason),
        })
    }

    /// Records `result` for the lease's key under the lease, which completes it (every waiter
    /// gets the result). When the Record fails the lease is given up, or kept after a deadline
    /// ([`gives_up_after`]); [`FinishFailed`] says which.
    pub async fn finish_tune(
        &self,
        lease: TuneLease,
        result: v1::Result,
    ) -> std::result::Result<v1::RecordResponse, FinishFailed> {
        self.finish_tune_with(lease, result, Vec::new()).await
    }

    /// [`Client::finish_tune`], with `also` Recorded in the same Record, under the same lease:
    /// for a tuner whose lease stands for several keys (FlashInfer's op, whose winner is one of
    /// its runners' keys), so that the leased key and the others land together.
    pub async fn finish_tune_with(
        &self,
        lease: TuneLease,
        result: v1::Result,
        also: Vec<v1::Entry>,
    ) -> std::result::Result<v1::RecordResponse, FinishFailed> {
        let TuneLease { key, lease } = lease;
        let mut entries = also;
        entries.push(v1::Entry {
            key: Some(key),
            result: Some(result),
        });
        let error = match self
            .record_with_lease(entries, lease.lease_id.clone())
            .await
        {
            Ok(response) => return Ok(response),
            Err(error) => error,
        };
        let lease = if gives_up_after(&error) {
            match self.give_up_lease(lease.lease_id).await {
                Ok(_) => LeaseAfterFailure::GivenUp,
                Err(give_up) => LeaseAfterFailure::GiveUpFailed(give_up),
            }
        } else {
            LeaseAfterFailure::Kept
        };
        Err(FinishFailed { error, lease })
    }

    /// Gives the lease up without a result (tuning failed): the next waiter that can tune gets
    /// it at once.
    pub async fn abandon(&self, lease: TuneLease) -> Result<()> {
        self.give_up_lease(lease.lease.lease_id).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(status: tonic::Status) -> ClientError {
        ClientError::Rpc(status)
    }

    #[test]
    fn a_failed_record_gives_the_lease_up_except_past_its_deadline() {
        assert!(gives_up_after(&rpc(tonic::Status::invalid_argument(
            "entries[0].result.config: not JSON"
        ))));
        assert!(gives_up_after(&rpc(tonic::Status::unavailable(
            "the journal writer has stopped"
        ))));
        assert!(gives_up_after(&rpc(tonic::Status::resource_exhausted(
            "request message of 9 bytes is over the daemon's limit"
        ))));
        // The daemon's deadline, and this client's own timer (tonic's CANCELLED).
        assert!(!gives_up_after(&rpc(tonic::Status::deadline_exceeded(
            "late"
        ))));
        assert!(!gives_up_after(&rpc(tonic::Status::cancelled(
            tonic::TimeoutExpired(()).to_string()
        ))));
        // A caller that went away is no deadline: the lease is given up.
        assert!(gives_up_after(&rpc(tonic::Status::cancelled("gone"))));
    }

    #[test]
    fn only_invalid_argument_is_a_refused_result() {
        let failed = |status| FinishFailed {
            error: rpc(status),
            lease: LeaseAfterFailure::GivenUp,
        };
        assert!(failed(tonic::Status::invalid_argument("bad")).refused());
        assert!(!failed(tonic::Status::unavailable("down")).refused());
        assert!(!failed(tonic::Status::resource_exhausted("too large")).refused());
        assert!(!failed(tonic::Status::deadline_exceeded("late")).refused());
    }
}
