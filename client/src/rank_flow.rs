//! The rank flow, [`Client::get_or_tune`]: resolve, tune under the lease and record, or fall
//! back; a rank never fails because of its cache, and the daemon calls that failed on the way
//! are answered to a caller that reports them.

use tunecache_proto::v1;

use crate::tuning::{FinishFailed, LeaseAfterFailure, TuneStart};
use crate::{Client, ClientError, ResolveOptions};

/// How the rank flow ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RankOutcome {
    /// Cached, or tuned by another rank or the node's tuner.
    Cached(v1::Result),
    /// This rank tuned it and recorded the result.
    Tuned(v1::Result),
    /// No result: use the fallback (default tactic). The reason says why.
    Fallback(String),
}

impl RankOutcome {
    /// The result, if any; `None` means use the fallback.
    pub fn result(&self) -> Option<&v1::Result> {
        match self {
            RankOutcome::Cached(result) | RankOutcome::Tuned(result) => Some(result),
            RankOutcome::Fallback(_) => None,
        }
    }
}

impl Client {
    /// The whole rank flow: resolve; if told to tune, run `tune` and record its result
    /// with the lease (or give the lease up if `tune` fails); on a miss, fall back. Errors
    /// talking to the daemon also fall back: a rank never fails because of its cache.
    ///
    /// Files beside the config (a compiled kernel): `tune` uploads them and names them in the
    /// result's `artifacts`, `result.artifacts = client.put_artifacts([("kernel.cubin", path)])
    /// .await?`, since a Record may name only blobs the node holds. A rank that gets the
    /// result (cached or tuned) writes them out with [`Client::fetch_artifacts`].
    pub async fn get_or_tune<F, Fut, E>(
        &self,
        key: v1::Key,
        options: ResolveOptions,
        tune: F,
    ) -> RankOutcome
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<v1::Result, E>>,
        E: std::fmt::Display,
    {
        self.get_or_tune_traced(key, options, tune).await.0
    }

    /// [`Client::get_or_tune`], also answering each daemon call that failed on the way, for a
    /// caller that reports them (the Python binding logs them, once per process).
    ///
    /// The flow is [`Client::begin_tune`], `tune`, then [`Client::finish_tune`] (or
    /// [`Client::abandon`] when `tune` fails). A Record the daemon refuses as invalid
    /// (`INVALID_ARGUMENT`: a config over 64 KiB, or not JSON) is a fallback: no other rank will
    /// ever get that result, and a rank that used it would disagree with its peers. Any other
    /// failed Record keeps the tuned result. What becomes of the lease then is
    /// [`tuning::gives_up_after`](crate::tuning::gives_up_after)'s rule.
    pub async fn get_or_tune_traced<F, Fut, E>(
        &self,
        key: v1::Key,
        options: ResolveOptions,
        tune: F,
    ) -> (RankOutcome, Vec<FlowFailure>)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<v1::Result, E>>,
        E: std::fmt::Display,
    {
        let mut failures = Vec::new();
        let lease = match self.begin_tune(key, options).await {
            Ok(TuneStart::Hit(result)) => return (RankOutcome::Cached(result), failures),
            Ok(TuneStart::Miss(reason)) => return (RankOutcome::Fallback(reason), failures),
            Ok(TuneStart::Tune(lease)) => lease,
            Err(error) => {
                let reason = format!("tunecache unavailable: {error}");
                failures.push(FlowFailure {
                    call: FlowCall::Resolve,
                    error,
                });
                return (RankOutcome::Fallback(reason), failures);
            }
        };
        let result = match tune().await {
            Ok(result) => result,
            Err(error) => {
                if let Err(give_up) = self.abandon(lease).await {
                    failures.push(FlowFailure {
                        call: FlowCall::GiveUpLease,
                        error: give_up,
                    });
                }
                return (
                    RankOutcome::Fallback(format!("tuning failed: {error}")),
                    failures,
                );
            }
        };
        let failed = match self.finish_tune(lease, result.clone()).await {
            Ok(_) => return (RankOutcome::Tuned(result), failures),
            Err(failed) => failed,
        };
        let outcome = if failed.refused() {
            let message = match &failed.error {
                ClientError::Rpc(status) => status.message().to_owned(),
                other => other.to_string(),
            };
            RankOutcome::Fallback(format!("the daemon refused the tuned result: {message}"))
        } else {
            RankOutcome::Tuned(result)
        };
        let FinishFailed { error, lease } = failed;
        failures.push(FlowFailure {
            call: FlowCall::Record,
            error,
        });
        if let LeaseAfterFailure::GiveUpFailed(give_up) = lease {
            failures.push(FlowFailure {
                call: FlowCall::GiveUpLease,
                error: give_up,
            });
        }
        (outcome, failures)
    }
}

/// Which daemon call of the rank flow failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowCall {
    Resolve,
    /// The Record of the tuned result, with the lease.
    Record,
    /// The Record with the lease and no entries that gives the lease up.
    GiveUpLease,
}

/// A daemon call of the rank flow that failed; the flow went on (see
/// [`Client::get_or_tune_traced`]).
#[derive(Debug)]
pub struct FlowFailure {
    pub call: FlowCall,
    pub error: ClientError,
}
