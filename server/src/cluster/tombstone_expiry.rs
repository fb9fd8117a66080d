//! Which tombstones expire from Redis (`forget::load_all` deletes those past the retention):
//! judged by Redis's clock (`TIME`), never this node's, and none at all while the two clocks
//! disagree by more than `MAX_CLOCK_SKEW_MS`; the skew is recorded for Stats and health.
//! Past the bound the store's expiry pauses too (`Store::set_expiry_paused`): entries are
//! judged by this node's days, and a node whose clock runs 100 days fast would otherwise
//! expire, here and in Redis, what every other node still uses.

use std::sync::atomic::Ordering;

use super::link::{timed, Conn};
use super::Cluster;
use crate::error::TierResult;

/// Most a node's clock and Redis's may differ for this node to expire tombstones from
/// Redis: past it, it logs the skew, shows it in Stats and health, and expires nothing.
pub const MAX_CLOCK_SKEW_MS: i64 = 3600 * 1000;

/// Which tombstones `load_all` expires from Redis: judged by Redis's own clock, never this
/// node's, so one node's wrong clock cannot delete every node's tombstones; and none at all
/// while the two clocks differ by more than `MAX_CLOCK_SKEW_MS` (a clock that far off may
/// be Redis's as well as this node's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Tombstones stamped before this (unix ms, Redis's clock) go.
    Before(i64),
    /// Nothing goes: the clocks differ by `skew_ms` (this node's minus Redis's).
    Paused { skew_ms: i64 },
}

pub fn expiry(redis_now_ms: i64, node_now_ms: i64, retention_ms: i64) -> Expiry {
    let skew_ms = node_now_ms.saturating_sub(redis_now_ms);
    if skew_ms.saturating_abs() > MAX_CLOCK_SKEW_MS {
        return Expiry::Paused { skew_ms };
    }
    Expiry::Before(redis_now_ms.saturating_sub(retention_ms))
}

/// Redis's clock (`TIME`), in unix ms.
pub(super) async fn redis_now_ms(conn: &mut Conn) -> TierResult<i64> {
    let (secs, micros): (i64, i64) = timed(
        "reading redis's clock",
        redis::cmd("TIME").query_async(conn),
    )
    .await?;
    Ok(secs.saturating_mul(1000).saturating_add(micros / 1000))
}

impl Cluster {
    /// Records the skew between this node's clock and Redis's; returns what may expire.
    pub(super) fn judge_clock(&self, redis_now_ms: i64) -> Expiry {
        let expiry = expiry(
            redis_now_ms,
            self.node_now_ms(),
            self.store.forget_retention_ms(),
        );
        let skew_ms = self.node_now_ms().saturating_sub(redis_now_ms);
        self.observed
            .clock_skew_ms
            .store(skew_ms, Ordering::Relaxed);
        let paused = matches!(expiry, Expiry::Paused { .. });
        self.store.set_expiry_paused(paused.then(|| {
            format!(
                "this node's clock and redis's differ by {skew_ms} ms, more than \
                 {MAX_CLOCK_SKEW_MS} ms (docs/cluster.md \"Clocks\")"
            )
        }));
        if self.observed.prune_paused.swap(paused, Ordering::Relaxed) != paused {
            if paused {
                tracing::warn!(
                    skew_ms,
                    bound_ms = MAX_CLOCK_SKEW_MS,
                    "cluster tier: this node's clock and redis's differ by more than the bound; \
                     expiring no tombstone and no entry, here or in redis, until they agree \
                     (Stats cluster_clock_skew_ms and expiry_paused, health NOT_SERVING)"
                );
            } else {
                tracing::info!(
                    skew_ms,
                    "cluster tier: this node's clock agrees with redis's again"
                );
            }
        }
        expiry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_is_judged_by_redis_clock_and_paused_when_the_clocks_disagree() {
        let day = 86_400_000i64;
        let redis = 1_800_000_000_000;
        let retention = 90 * day;
        // The node's clock plays no part while it is within the bound.
        assert_eq!(
            expiry(redis, redis + 59 * 60 * 1000, retention),
            Expiry::Before(redis - retention)
        );
        assert_eq!(
            expiry(redis, redis - 59 * 60 * 1000, retention),
            Expiry::Before(redis - retention)
        );
        // A node 100 days fast (finding 9) or slow expires nothing.
        for skew in [100 * day, -100 * day, MAX_CLOCK_SKEW_MS + 1] {
            assert_eq!(
                expiry(redis, redis + skew, retention),
                Expiry::Paused { skew_ms: skew }
            );
        }
    }
}
