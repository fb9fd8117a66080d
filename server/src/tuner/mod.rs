//! The node's tuner: starts the worker under supervision, or explains why tuning is off.
//!
//! The worker is a child process (`tunecache-tuner`, crate `tunecache-gpu-tuner`) so that a
//! faulting kernel or a driver error kills only the worker; the `supervisor` restarts it.
//! With no worker, the daemon serves as before and every miss follows the lease path.

mod supervisor;

pub use supervisor::{
    JobReply, SubmitError, Supervisor, SupervisorConfig, SupervisorError, TunerCounters,
    TunerHandle, MAX_DEATHS_PER_JOB, READY_TIMEOUT,
};

/// The tuner handle for this daemon, from its settings (`None`: `--tuner off`): running, or
/// `off` with the reason (logged once).
pub async fn start(settings: Option<SupervisorConfig>) -> TunerHandle {
    let Some(supervisor_config) = settings else {
        tracing::info!("tuning off: --tuner off");
        return TunerHandle::off("--tuner off");
    };
    let worker_path = supervisor_config.worker_path.clone();
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

crate::report::stats_registry! {
    /// The tuner's Stats fields: its backend, its state and its jobs.
    impl FillStats for TunerHandle {
        fn fill_stats(tuner, stats) {}
        include TunerCounters = tuner.counters();
        fields {
            tuner_backend = tuner.backend() => not_exported,
            tuner_state = state_with_note(tuner) => not_exported,
        }
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
