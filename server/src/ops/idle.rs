//! `--exit-when-idle`: remembers when a client last called the TuneCache service, and resolves a
//! shutdown future once nobody has for the configured time. The daemon then stops exactly as on
//! SIGTERM (drain, flush, remove the socket), so an auto-started or socket-activated daemon goes
//! away when its job is done and comes back on the next call.
//!
//! Only TuneCache calls count, and requests on the descriptor handoff (`crate::handoff`, which
//! touches the same clock: `admission`): health checks and reflection (monitoring) do not keep
//! the daemon alive. A Resolve that is still waiting, or a lease a rank is still tuning under, counts as
//! activity (read from Stats' `waiters` and `leases_active`), so the daemon never quits under a
//! rank that is between calls. With `--job-markers`, neither does it while a job of its user
//! runs on the node (`jobs_here`), however long the job goes without a call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::server::NamedService;

use crate::report::StatsProbe;

use super::jobs_here::JobMarkers;

/// Longest pause between two idleness checks.
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// When the last TuneCache call arrived, as milliseconds since the clock was made.
#[derive(Clone)]
pub struct ActivityClock {
    origin: Instant,
    last_call_ms: Arc<AtomicU64>,
}

impl Default for ActivityClock {
    fn default() -> Self {
        ActivityClock {
            origin: Instant::now(),
            last_call_ms: Arc::default(),
        }
    }
}

impl ActivityClock {
    pub fn touch(&self) {
        let now_ms = self.origin.elapsed().as_millis() as u64;
        self.last_call_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// How long ago the last call arrived (since start-up when none has).
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_call_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}

/// Wraps a gRPC service so that every call it receives touches the clock.
#[derive(Clone)]
pub struct Touching<S> {
    inner: S,
    clock: ActivityClock,
}

impl<S> Touching<S> {
    pub fn new(inner: S, clock: ActivityClock) -> Self {
        Touching { inner, clock }
    }
}

impl<S, R> tower::Service<R> for Touching<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.clock.touch();
        self.inner.call(request)
    }
}

impl<S: NamedService> NamedService for Touching<S> {
    const NAME: &'static str = S::NAME;
}

/// Longest the idle timer waits for one look at the job markers (`jobs_here`); a look that
/// takes longer counts as "a job may run".
const JOBS_CHECK_BOUND: Duration = Duration::from_secs(5);

/// Resolves once no call has arrived for `idle`, no Resolve is waiting, no lease is held and,
/// with `jobs`, no job marked there has run on this node for `idle` either; never resolves
/// when `idle` is `None`. While no call arrives the markers are looked at every check, so the
/// daemon exits within `idle` and one check of its user's last job here ending.
pub async fn exit_when_idle(
    idle: Option<Duration>,
    clock: ActivityClock,
    probe: StatsProbe,
    jobs: Option<JobMarkers>,
) {
    let Some(idle) = idle else {
        return std::future::pending().await;
    };
    let check_interval = (idle / 4).clamp(Duration::from_millis(100), MAX_CHECK_INTERVAL);
    // When a job was last seen running here; the start counts as one (its prolog ran).
    let mut job_seen = Instant::now();
    let mut holding: Vec<String> = Vec::new();
    loop {
        let quiet_for = clock.idle_for();
        if quiet_for < idle {
            tokio::time::sleep((idle - quiet_for).min(check_interval)).await;
            continue;
        }
        if let Some(jobs) = &jobs {
            let running = jobs_running(jobs).await;
            if !running.is_empty() {
                if running != holding {
                    tracing::info!(
                        jobs = ?running,
                        idle_secs = idle.as_secs(),
                        "no client called for --exit-when-idle, but jobs of this user still run \
                         on this node; staying until they end"
                    );
                    holding = running;
                }
                job_seen = Instant::now();
                tokio::time::sleep(check_interval).await;
                continue;
            }
            holding.clear();
            let since_job = job_seen.elapsed();
            if since_job < idle {
                tokio::time::sleep((idle - since_job).min(check_interval)).await;
                continue;
            }
        }
        let busy = probe
            .read()
            .await
            .is_none_or(|stats| stats.waiters > 0 || stats.leases_active > 0);
        if !busy {
            tracing::info!(
                idle_secs = idle.as_secs(),
                "no client called for --exit-when-idle; exiting"
            );
            return;
        }
        tokio::time::sleep(check_interval).await;
    }
}

/// The marked jobs running here, looked at off the runtime and bounded; a look that fails or
/// takes too long answers "unknown", which holds the daemon like a running job.
async fn jobs_running(jobs: &JobMarkers) -> Vec<String> {
    let markers = jobs.clone();
    let look = tokio::task::spawn_blocking(move || markers.running());
    match tokio::time::timeout(JOBS_CHECK_BOUND, look).await {
        Ok(Ok(Ok(running))) => running,
        outcome => {
            tracing::debug!(dir = ?jobs.dir(), ?outcome, "the job markers could not be looked at; staying");
            vec!["unknown".to_owned()]
        }
    }
}
