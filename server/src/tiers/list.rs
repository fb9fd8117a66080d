//! The daemon's tiers as one list, built once and kept in `TIER_ORDER`: what the daemon asks
//! of every tier goes through it (the health names, the last publish at shutdown), so no
//! tier is wired in by hand and none is forgotten.

use std::sync::Arc;
use std::time::Duration;

use tonic_health::server::HealthReporter;

use super::Tier;
use crate::tasks::Tasks;

/// Longest the last publish at shutdown may take, every tier together: a hung filesystem or
/// Redis never holds the shutdown longer.
pub const SHUTDOWN_PUBLISH_LIMIT: Duration = Duration::from_secs(3);

/// The tiers this daemon runs, in `TIER_ORDER`.
#[derive(Clone, Default)]
pub struct Tiers {
    tiers: Vec<Arc<dyn Tier>>,
}

impl Tiers {
    /// The list of `tiers`, in `TIER_ORDER` whatever order they come in.
    pub fn new(tiers: impl IntoIterator<Item = Arc<dyn Tier>>) -> Tiers {
        let mut tiers: Vec<Arc<dyn Tier>> = tiers.into_iter().collect();
        tiers.sort_by_key(|tier| tier.kind().rank());
        Tiers { tiers }
    }

    /// The kinds listed, in order.
    #[cfg(test)]
    fn kinds(&self) -> Vec<super::TierKind> {
        self.tiers.iter().map(|tier| tier.kind()).collect()
    }

    /// Keeps each tier's health name current (SERVING while it works), as tasks of the
    /// daemon's that end when it stops.
    pub fn report_health(&self, reporter: &HealthReporter, tasks: &Tasks) {
        for tier in &self.tiers {
            let tier = Arc::clone(tier);
            let health = tier.health();
            tasks.spawn(crate::report::health::report(
                reporter.clone(),
                health.name,
                health.poll,
                tasks.stop_token(),
                move || tier.serving(),
            ));
        }
    }

    /// The last publish, at shutdown: each tier in turn saves its resume point and publishes
    /// what is pending, all of them within `limit`; says what happened to each that
    /// publishes.
    pub async fn publish_at_shutdown(&self, limit: Duration) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        let mut said = Vec::new();
        for tier in &self.tiers {
            let kind = tier.kind();
            match tokio::time::timeout_at(deadline, tier.save_resume_point()).await {
                Ok(Ok(())) => {}
                Ok(Err(why)) => {
                    tracing::debug!(?kind, %why, "resume point not saved at shutdown");
                }
                Err(_) => tracing::debug!(?kind, "resume point not saved in time at shutdown"),
            }
            if let Some(outcome) = tier.publish_pending(deadline).await {
                said.push(format!("{}: {outcome}", kind.part_name()));
            }
        }
        if said.is_empty() {
            "nothing to publish (no shared directory, no cluster tier)".to_owned()
        } else {
            said.join("; ")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::super::{TierFuture, TierHealth, TierKind, TIER_ORDER};
    use super::*;
    use crate::error::TierResult;

    /// A tier recording what it is asked.
    struct Fake {
        kind: TierKind,
        publishes: bool,
        asked: Arc<Mutex<Vec<String>>>,
        /// Its resume point never gets saved (a hung disk).
        hangs: bool,
    }

    impl Tier for Fake {
        fn kind(&self) -> TierKind {
            self.kind
        }

        fn health(&self) -> TierHealth {
            TierHealth {
                name: "fake",
                poll: Duration::from_millis(10),
            }
        }

        fn serving(&self) -> bool {
            true
        }

        fn save_resume_point(&self) -> TierFuture<'_, TierResult<()>> {
            crate::sync::lock(&self.asked).push(format!("{:?} saves", self.kind));
            let hangs = self.hangs;
            Box::pin(async move {
                if hangs {
                    std::future::pending::<()>().await;
                }
                Ok(())
            })
        }

        fn publish_pending(
            &self,
            _deadline: tokio::time::Instant,
        ) -> TierFuture<'_, Option<String>> {
            crate::sync::lock(&self.asked).push(format!("{:?} publishes", self.kind));
            let publishes = self.publishes;
            Box::pin(async move { publishes.then(|| "published 1".to_owned()) })
        }
    }

    fn fake(kind: TierKind, publishes: bool, asked: &Arc<Mutex<Vec<String>>>) -> Arc<dyn Tier> {
        Arc::new(Fake {
            kind,
            publishes,
            asked: Arc::clone(asked),
            hangs: false,
        })
    }

    #[test]
    fn the_list_is_in_the_declared_order_whatever_order_the_tiers_are_built_in() {
        let asked = Arc::default();
        let built_backwards = Tiers::new(TIER_ORDER.iter().rev().map(|k| fake(*k, true, &asked)));
        assert_eq!(built_backwards.kinds(), TIER_ORDER);
        let built_forwards = Tiers::new(TIER_ORDER.iter().map(|k| fake(*k, true, &asked)));
        assert_eq!(built_forwards.kinds(), TIER_ORDER);
    }

    #[tokio::test]
    async fn the_shutdown_publish_asks_every_tier_in_order_and_reports_each_publisher() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let tiers = Tiers::new([
            fake(TierKind::Cluster, true, &asked),
            fake(TierKind::SharedDir, true, &asked),
        ]);
        let said = tiers.publish_at_shutdown(Duration::from_secs(1)).await;
        assert_eq!(
            said,
            "shared directory: published 1; cluster tier: published 1"
        );
        assert_eq!(
            *crate::sync::lock(&asked),
            [
                "SharedDir saves",
                "SharedDir publishes",
                "Cluster saves",
                "Cluster publishes"
            ]
        );

        // A read-only tier is asked too, and reported by nobody.
        crate::sync::lock(&asked).clear();
        let read_only = Tiers::new([fake(TierKind::SharedDir, false, &asked)]);
        let said = read_only.publish_at_shutdown(Duration::from_secs(1)).await;
        assert_eq!(
            said,
            "nothing to publish (no shared directory, no cluster tier)"
        );
        assert_eq!(
            *crate::sync::lock(&asked),
            ["SharedDir saves", "SharedDir publishes"]
        );
        assert_eq!(
            Tiers::default()
                .publish_at_shutdown(Duration::from_secs(1))
                .await,
            "nothing to publish (no shared directory, no cluster tier)"
        );
    }

    #[tokio::test]
    async fn a_hung_tier_holds_the_shutdown_publish_no_longer_than_its_limit() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let hung: Arc<dyn Tier> = Arc::new(Fake {
            kind: TierKind::SharedDir,
            publishes: true,
            asked: Arc::clone(&asked),
            hangs: true,
        });
        let tiers = Tiers::new([hung, fake(TierKind::Cluster, true, &asked)]);
        let started = std::time::Instant::now();
        let said = tokio::time::timeout(
            Duration::from_secs(5),
            tiers.publish_at_shutdown(Duration::from_millis(100)),
        )
        .await
        .expect("a hung tier held the shutdown publish past its limit");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // The tier after the hung one is still asked, and says what it did.
        assert_eq!(
            said,
            "shared directory: published 1; cluster tier: published 1"
        );
        assert_eq!(crate::sync::lock(&asked).len(), 4);
    }
}
