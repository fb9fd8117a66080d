//! Resolve: asking the daemon for a key and being told a hit, a lease to tune it here, or a
//! miss after waiting.

use std::time::Duration;

use tunecache_proto::v1;

use crate::mode::Mode;
use crate::{opening, replay, Client, Result};

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

/// The Resolve a client in `mode` and `view` sends for `key`: in replay, with `replay: true`,
/// no wait and no lease, whatever `options` asked ([`replay::options`]).
pub(crate) fn request(
    mode: Mode,
    view: &str,
    key: v1::Key,
    options: ResolveOptions,
) -> v1::ResolveRequest {
    let replaying = mode == Mode::Replay;
    let options = if replaying {
        replay::options(options)
    } else {
        options
    };
    v1::ResolveRequest {
        key: Some(key),
        wait_ms: millis_u32(options.wait),
        can_tune: options.can_tune,
        lease_ms: millis_u32(options.lease),
        view: view.to_owned(),
        replay: replaying,
    }
}

impl Client {
    /// Asks the daemon for `key` in this client's view: a hit, a lease to tune it here, or a
    /// miss after waiting. In replay ([`Client::mode`]) a hit or a miss at once, never a lease,
    /// whatever `options` asked; a miss is logged once per key ([`replay::log_miss`]).
    pub async fn resolve(&self, key: v1::Key, options: ResolveOptions) -> Result<Resolution> {
        use v1::resolve_response::Outcome;
        let message = request(self.mode, &self.view, key, options);
        let wait = Duration::from_millis(u64::from(message.wait_ms));
        let replayed = message.replay.then(|| message.key.clone()).flatten();
        let answer = opening::call(message, wait + self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.resolve(request).await }
        });
        let response = answer.await?.into_inner();
        let resolution = match response.outcome {
            Some(Outcome::Hit(result)) => Resolution::Hit(result),
            Some(Outcome::TuneHere(lease)) => Resolution::TuneHere(lease),
            Some(Outcome::Miss(miss)) => Resolution::Miss(miss.reason),
            None => Resolution::Miss("the daemon sent no outcome".to_owned()),
        };
        if let (Some(key), Resolution::Miss(reason)) = (&replayed, &resolution) {
            replay::log_miss(&self.view, key, reason);
        }
        Ok(resolution)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked() -> ResolveOptions {
        ResolveOptions {
            wait: Duration::from_secs(30),
            can_tune: true,
            lease: Duration::from_secs(90),
        }
    }

    #[test]
    fn replay_sends_replay_and_never_waits_nor_tunes_whatever_was_asked() {
        let key = crate::key("n", "op", "dev", "p", Some(3));
        let sent = request(Mode::Replay, "job-7", key.clone(), asked());
        assert_eq!(
            sent,
            v1::ResolveRequest {
                key: Some(key),
                wait_ms: 0,
                can_tune: false,
                lease_ms: 0,
                view: "job-7".to_owned(),
                replay: true,
            }
        );
    }

    #[test]
    fn tune_sends_what_was_asked() {
        let sent = request(
            Mode::Tune,
            "",
            crate::key("n", "op", "dev", "p", None),
            asked(),
        );
        assert_eq!(
            (sent.wait_ms, sent.can_tune, sent.lease_ms, sent.replay),
            (30_000, true, 90_000, false)
        );
    }
}
