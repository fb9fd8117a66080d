//! Resolve: asking the daemon for a key and being told a hit, a lease to tune it here, or a
//! miss after waiting.

use std::time::Duration;

use tunecache_proto::v1;

use crate::{opening, Client, Result};

/// What `Resolve` told the caller to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// Cached, or tuned by someone else while the caller waited.
    Hit(v1::Result),
    /// The caller tunes it now, then records with this lease.
    TuneHere(v1::Lease),
    /// Nobody will have a result in time; the reason says why. Use the default tactic.
    Miss(String),
}

/// How a rank resolves a key.
#[derive(Debug, Clone, Copy)]
pub struct ResolveOptions {
    /// How long to wait for someone else's result.
    pub wait: Duration,
    /// Whether this caller can tune the problem itself.
    pub can_tune: bool,
    /// How long tuning takes at most, if this caller gets the lease (zero: daemon default).
    pub lease: Duration,
}

impl Default for ResolveOptions {
    fn default() -> Self {
        ResolveOptions {
            wait: Duration::from_secs(120),
            can_tune: true,
            lease: Duration::ZERO,
        }
    }
}

fn millis_u32(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}

impl Client {
    /// Asks the daemon for `key` in this client's view: a hit, a lease to tune it here, or a
    /// miss after waiting.
    pub async fn resolve(&self, key: v1::Key, options: ResolveOptions) -> Result<Resolution> {
        use v1::resolve_response::Outcome;
        let message = v1::ResolveRequest {
            key: Some(key),
            wait_ms: millis_u32(options.wait),
            can_tune: options.can_tune,
            lease_ms: millis_u32(options.lease),
            view: self.view.clone(),
            replay: false,
        };
        let answer = opening::call(message, options.wait + self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.resolve(request).await }
        });
        let response = answer.await?.into_inner();
        Ok(match response.outcome {
            Some(Outcome::Hit(result)) => Resolution::Hit(result),
            Some(Outcome::TuneHere(lease)) => Resolution::TuneHere(lease),
            Some(Outcome::Miss(miss)) => Resolution::Miss(miss.reason),
            None => Resolution::Miss("the daemon sent no outcome".to_owned()),
        })
    }
}
