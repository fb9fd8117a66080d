//! The supervising task: feeds the worker one job at a time, answers each job, replaces a
//! worker that dies or hangs (backing off between restarts), and decides after a death
//! whether a job is retried, with its culprit candidate excluded, or failed
//! (`after_death`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tunecache_proto::tuner::v1::ExcludedCandidate;

use super::worker::{run_job, spawn_worker, JobOutcome, Worker};
use super::{
    Death, Phase, QueuedJob, Shared, SupervisorConfig, INITIAL_BACKOFF, MAX_BACKOFF,
    MAX_DEATHS_PER_JOB,
};

/// Notes on `job` that its worker died running `candidate` (excluding the candidate when
/// the death is its doing) and says whether to retry it: `None`, or the message to fail it
/// with.
fn after_death(job: &mut QueuedJob, death: Death, candidate: Option<String>) -> Option<String> {
    job.deaths += 1;
    match candidate.filter(|_| death.blames_candidate) {
        Some(name) if !job.excluded.iter().any(|e| e.candidate == name) => {
            job.excluded.push(ExcludedCandidate {
                candidate: name,
                reason: death.reason.clone(),
            });
        }
        // No candidate to blame, or one already excluded (so not its doing).
        _ => job.unattributed_deaths += 1,
    }
    if job.unattributed_deaths < 2 && job.deaths < MAX_DEATHS_PER_JOB {
        return None;
    }
    let excluded = if job.excluded.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = job.excluded.iter().map(|e| e.candidate.as_str()).collect();
        format!("; candidates excluded for killing it: {}", names.join(", "))
    };
    let times = match job.deaths {
        2 => "twice".to_string(),
        n => format!("{n} times"),
    };
    Some(format!(
        "tuning failed: the worker died {times} on this job{excluded}; last time: {}",
        death.reason
    ))
}

pub(super) async fn supervise(
    config: SupervisorConfig,
    shared: Arc<Shared>,
    mut jobs: mpsc::Receiver<QueuedJob>,
    mut shutdown: watch::Receiver<bool>,
    first_worker: Worker,
) {
    let mut worker = Some(first_worker);
    let mut backoff = INITIAL_BACKOFF;
    // A job whose worker died, to run first on the next worker.
    let mut retry: Option<QueuedJob> = None;
    let mut next_job_id: u64 = 1;

    'supervise: loop {
        let mut current = match worker.take() {
            Some(current) => current,
            None => {
                shared.set_phase(Phase::Restarting);
                shared.status().worker_pid = None;
                tracing::info!(
                    backoff_ms = backoff.as_millis() as u64,
                    "restarting the tuner worker"
                );
                tokio::select! {
                    _ = shutdown.changed() => break 'supervise,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                match spawn_worker(&config, &shared.tasks).await {
                    Ok((fresh, ready)) => {
                        shared.counters.restarts.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(backend = %ready.backend, pid = ?fresh.pid, "tuner worker restarted");
                        shared.adopt(&ready, fresh.pid);
                        fresh
                    }
                    Err(error) => {
                        tracing::warn!(%error, "tuner worker restart failed");
                        continue 'supervise;
                    }
                }
            }
        };

        let job = match retry.take() {
            Some(job) => job,
            None => {
                enum Idle {
                    Job(QueuedJob),
                    Stop,
                    Died(String),
                }
                let idle = tokio::select! {
                    _ = shutdown.changed() => Idle::Stop,
                    job = jobs.recv() => job.map_or(Idle::Stop, Idle::Job),
                    reason = current.wait_for_death() => Idle::Died(reason),
                };
                match idle {
                    Idle::Job(job) => job,
                    Idle::Stop => {
                        worker = Some(current);
                        break 'supervise;
                    }
                    Idle::Died(reason) => {
                        tracing::warn!(%reason, "tuner worker died while idle");
                        continue 'supervise;
                    }
                }
            }
        };

        let job_id = next_job_id;
        next_job_id += 1;
        match run_job(
            &mut current,
            job_id,
            &job,
            config.job_timeout,
            &mut shutdown,
        )
        .await
        {
            JobOutcome::Done(result) => {
                backoff = INITIAL_BACKOFF;
                shared.answer(job, Ok(result));
                worker = Some(current);
            }
            JobOutcome::Failed(error) => {
                shared.answer(job, Err(error));
                worker = Some(current);
            }
            JobOutcome::WorkerDied(death, candidate) => {
                tracing::warn!(reason = %death.reason, ?candidate, job_id, "tuner worker died during a job");
                let mut job = job;
                match after_death(&mut job, death, candidate) {
                    None => retry = Some(job),
                    Some(error) => shared.answer(job, Err(error)),
                }
            }
            JobOutcome::TimedOut(candidate) => {
                current.kill().await;
                tracing::warn!(
                    job_id,
                    ?candidate,
                    timeout_s = config.job_timeout.as_secs_f64(),
                    "tuning job timed out; worker killed"
                );
                let during = candidate.map_or_else(String::new, |name| {
                    format!(" while running candidate {name:?}")
                });
                shared.answer(
                    job,
                    Err(format!(
                        "tuning timed out after {:.1} s{during}; the worker was killed (it may have hung in a kernel) and is restarted",
                        config.job_timeout.as_secs_f64()
                    )),
                );
            }
            JobOutcome::Shutdown => {
                shared.answer(job, Err("the tuner is shutting down".to_string()));
                worker = Some(current);
                break 'supervise;
            }
        }
    }

    // Shutdown: kill the worker and fail whatever is still waiting.
    if let Some(mut current) = worker {
        current.kill().await;
    }
    shared.set_phase(Phase::Off("shut down".to_string()));
    shared.status().worker_pid = None;
    if let Some(job) = retry {
        shared.answer(job, Err("the tuner is shutting down".to_string()));
    }
    jobs.close();
    while let Ok(job) = jobs.try_recv() {
        shared.answer(job, Err("the tuner is shutting down".to_string()));
    }
    tracing::info!("tuner supervisor stopped");
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    #[test]
    fn deaths_exclude_candidates_up_to_the_limit_and_unblamed_ones_retry_once() {
        let (reply, _receiver) = oneshot::channel();
        let mut job = QueuedJob {
            op: "gemm".into(),
            problem: "{}".into(),
            device: "cpu|x|y".into(),
            deaths: 0,
            unattributed_deaths: 0,
            excluded: Vec::new(),
            reply,
        };
        let crash = |why: &str| Death {
            reason: why.to_string(),
            blames_candidate: true,
        };
        assert_eq!(
            after_death(&mut job, crash("abort a"), Some("a".into())),
            None
        );
        assert_eq!(
            after_death(&mut job, crash("abort b"), Some("b".into())),
            None
        );
        assert_eq!(job.excluded.len(), 2);
        assert_eq!(job.excluded[1].reason, "abort b");
        // A SIGKILL names no culprit: one of those is retried, as before.
        let kill = Death {
            reason: "SIGKILL".into(),
            blames_candidate: false,
        };
        assert_eq!(after_death(&mut job, kill, Some("c".into())), None);
        assert_eq!(job.excluded.len(), 2, "a kill from outside excludes nobody");
        let error = after_death(&mut job, crash("abort d"), Some("d".into())).expect("the limit");
        assert_eq!(job.deaths, MAX_DEATHS_PER_JOB);
        assert!(error.contains("died 4 times"), "{error}");
        assert!(error.contains("a, b, d"), "{error}");
    }
}
