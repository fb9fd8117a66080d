//! A component's own name on the gRPC health service (the cluster tier, the shared
//! directory): its state is polled at a fixed period and the status set only when it changes.

use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// Reports `name` as SERVING while `serving()` says so, NOT_SERVING otherwise, checking at
/// once and then every `period` until `stop`.
pub(crate) async fn report(
    reporter: HealthReporter,
    name: &str,
    period: Duration,
    stop: CancellationToken,
    mut serving: impl FnMut() -> bool,
) {
    let mut reported = None;
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let status = if serving() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if reported != Some(status) {
            reporter.set_service_status(name, status).await;
            reported = Some(status);
        }
    }
}
