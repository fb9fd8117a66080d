//! The node's tuner: starts the worker under supervision, or explains why tuning is off.
//!
//! The worker is a child process (`tunecache-tuner`, crate `tunecache-gpu-tuner`) so that a
//! faulting kernel or a driver error kills only the worker; the `supervisor` restarts it.
//! With no worker, the daemon serves as before and every miss follows the lease path.

use std::time::Duration;

mod supervisor;

pub use supervisor::{
    JobReply, SubmitError, Supervisor, SupervisorConfig, SupervisorError, TunerCounters,
    TunerHandle, MAX_DEATHS_PER_JOB, READY_TIMEOUT,
};

use tunecache_proto::v1::StatsResponse;

use crate::config::{Config, TunerSetting};
use crate::rpc::stats::FillStats;

/// The tuner handle for this daemon: running, or `off` with the reason (logged once).
pub async fn start(config: &Config) -> TunerHandle {
    let worker_path = match config.tuner_setting() {
        TunerSetting::Off => {
            tracing::info!("tuning off: --tuner off");
            return TunerHandle::off("--tuner off");
        }
        TunerSetting::Worker(path) => path,
    };
    let supervisor_config = SupervisorConfig {
        worker_path: worker_path.clone(),
        backend: config.tuner_backend,
        job_timeout: Duration::from_secs(config.tuner_job_timeout.max(1)),
        queue_capacity: config.tuner_queue.max(1),
        device: config.tuner_device,
        worker_args: Vec::new(),
    };
    match Supervisor::start(supervisor_config).await {
        Ok(tuner) => {
            let devices: Vec<String> = tuner.devices().into_iter().map(|d| d.fingerprint).collect();
            tracing::info!(
                backend = %tuner.backend(),
                note = %tuner.note(),
                ?devices,
                "tuner worker running"
            );
            tuner
        }
        Err(error) => {
            tracing::warn!(worker = %worker_path.display(), %error, "tuning off: the daemon serves without a tuner");
            TunerHandle::off(error.to_string())
        }
    }
}

impl FillStats for TunerHandle {
    fn fill_stats(&self, stats: &mut StatsResponse) {
        let counters = self.counters();
        stats.tuner_backend = self.backend();
        stats.tuner_state = state_with_note(self);
        stats.tuner_queue_depth = counters.queue_depth;
        stats.tuner_jobs_done = counters.jobs_done;
        stats.tuner_jobs_failed = counters.jobs_failed;
        stats.tuner_restarts = counters.restarts;
    }
}

/// The tuner's state plus why its backend was chosen (e.g. "auto: cuda unavailable ..."),
/// so an operator sees from Stats alone that a node measures on the CPU stand-in.
fn state_with_note(tuner: &TunerHandle) -> String {
    let state = tuner.state();
    let note = tuner.note();
    if note.is_empty() || state.starts_with("off") {
        state
    } else {
        format!("{state}; {note}")
    }
}
