//! One worker process: spawning it and its `Ready` handshake, its pipes (a task owns stdout
//! and forwards whole frames; another keeps the last stderr lines for death reasons), how
//! its death is described, and running one job on it to an outcome.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tunecache_proto::tuner::frame::{read_frame_async, write_frame_async};
use tunecache_proto::tuner::v1::{
    from_worker, job_done, to_worker, FromWorker, Ready, ToWorker, TuneJob,
};
use tunecache_proto::tuner::POISONED_EXIT_CODE;

use super::{
    Death, QueuedJob, SupervisorConfig, SupervisorError, READY_TIMEOUT, STDERR_LINES_IN_REASON,
    STDERR_TAIL_LINES,
};
use crate::model::entry::TunedResult;
use crate::sync::lock;

/// One running worker process and its pipes.
pub(super) struct Worker {
    child: Child,
    pub(super) pid: Option<u32>,
    stdin: ChildStdin,
    /// Frames from stdout; closed when stdout ends (the worker died or closed it).
    frames: mpsc::UnboundedReceiver<FromWorker>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_task: Option<JoinHandle<()>>,
}

impl Worker {
    /// Waits until the worker's stdout ends, ignoring stray frames; returns why it died.
    pub(super) async fn wait_for_death(&mut self) -> String {
        while let Some(frame) = self.frames.recv().await {
            tracing::warn!(?frame, "tuner worker sent a frame while idle; ignored");
        }
        self.death_reason().await
    }

    async fn death_reason(&mut self) -> String {
        self.death().await.reason
    }

    pub(super) async fn kill(&mut self) {
        if let Err(error) = self.child.kill().await {
            tracing::warn!(%error, pid = ?self.pid, "could not kill the tuner worker");
        }
    }

    /// Reaps the worker and describes its end: exit status or signal, plus last stderr lines.
    async fn death(&mut self) -> Death {
        let (ending, blames_candidate) =
            match tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await {
                Ok(Ok(status)) => (describe_exit(status), crash_of_a_candidate(status)),
                Ok(Err(error)) => (format!("could not be reaped ({error})"), false),
                Err(_) => {
                    self.kill().await;
                    (
                        "closed its stdout without exiting, so it was killed".to_string(),
                        false,
                    )
                }
            };
        // Let the stderr reader drain what the worker wrote last.
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(Duration::from_millis(500), task).await;
        }
        let tail: Vec<String> = {
            let lines = lock(&self.stderr_tail);
            lines
                .iter()
                .rev()
                .take(STDERR_LINES_IN_REASON)
                .rev()
                .cloned()
                .collect()
        };
        let pid = self.pid.map_or_else(|| "?".to_string(), |p| p.to_string());
        let reason = if tail.is_empty() {
            format!("tuner worker (pid {pid}) died: {ending}")
        } else {
            format!(
                "tuner worker (pid {pid}) died: {ending}; last stderr: {}",
                tail.join(" | ")
            )
        };
        Death {
            reason,
            blames_candidate,
        }
    }
}

/// Whether an exit can be the doing of the code the worker was running: its own exit after
/// a sticky CUDA error, a crash signal, or another failing exit status. SIGKILL, SIGTERM,
/// SIGINT and SIGHUP come from outside (the OOM killer, an operator, a shutdown).
pub(super) fn crash_of_a_candidate(status: ExitStatus) -> bool {
    match (status.signal(), status.code()) {
        (Some(signal), _) => !matches!(signal, 1 | 2 | 9 | 15),
        (None, Some(code)) => code != 0,
        (None, None) => false,
    }
}

pub(super) fn describe_exit(status: ExitStatus) -> String {
    if let Some(signal) = status.signal() {
        let name = match signal {
            6 => " (SIGABRT)",
            9 => " (SIGKILL)",
            11 => " (SIGSEGV)",
            15 => " (SIGTERM)",
            _ => "",
        };
        format!("killed by signal {signal}{name}")
    } else {
        match status.code() {
            Some(POISONED_EXIT_CODE) => format!(
                "exited with status {POISONED_EXIT_CODE} (a sticky CUDA error poisoned its context)"
            ),
            Some(code) => format!("exited with status {code}"),
            None => "exited".to_string(),
        }
    }
}

pub(super) async fn spawn_worker(
    config: &SupervisorConfig,
    tasks: &TaskTracker,
) -> Result<(Worker, Ready), SupervisorError> {
    let handshake = |reason: String| SupervisorError::Handshake {
        path: config.worker_path.clone(),
        reason,
    };
    let mut command = Command::new(&config.worker_path);
    command.arg("--backend").arg(config.backend.as_str());
    if let Some(device) = config.device {
        command.arg("--device").arg(device.to_string());
    }
    let mut child = command
        .args(&config.worker_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| SupervisorError::Spawn {
            path: config.worker_path.clone(),
            source,
        })?;
    let pid = child.id();
    let (Some(stdin), Some(mut stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(handshake("the worker's pipes were not set up".to_string()));
    };

    let stderr_tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL_LINES)));
    let tail = stderr_tail.clone();
    let stderr_task = tasks.spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(target: "tunecache_tuner_worker", pid = ?pid, "{line}");
            let mut tail = lock(&tail);
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    });

    // Reading frames is not cancel-safe, so one task owns stdout and forwards whole frames.
    let (frames_tx, frames) = mpsc::unbounded_channel();
    tasks.spawn(async move {
        loop {
            match read_frame_async::<_, FromWorker>(&mut stdout).await {
                Ok(Some(frame)) => {
                    if frames_tx.send(frame).is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%error, pid = ?pid, "bad frame from the tuner worker; treating it as dead");
                    break;
                }
            }
        }
    });

    let mut worker = Worker {
        child,
        pid,
        stdin,
        frames,
        stderr_tail,
        stderr_task: Some(stderr_task),
    };
    match tokio::time::timeout(READY_TIMEOUT, worker.frames.recv()).await {
        Ok(Some(FromWorker {
            msg: Some(from_worker::Msg::Ready(ready)),
        })) => {
            if ready.devices.is_empty() {
                return Err(handshake(format!(
                    "backend {:?} reported no devices ({})",
                    ready.backend, ready.note
                )));
            }
            Ok((worker, ready))
        }
        Ok(Some(other)) => Err(handshake(format!("expected Ready, got {other:?}"))),
        Ok(None) => Err(handshake(worker.death_reason().await)),
        Err(_) => Err(handshake(format!(
            "no Ready within {} s",
            READY_TIMEOUT.as_secs()
        ))),
    }
}

pub(super) enum JobOutcome {
    Done(TunedResult),
    Failed(String),
    /// The worker died; the candidate it had announced last, if any.
    WorkerDied(Death, Option<String>),
    /// The job ran past its timeout; the candidate the worker had announced last, if any.
    TimedOut(Option<String>),
    Shutdown,
}

pub(super) async fn run_job(
    worker: &mut Worker,
    job_id: u64,
    job: &QueuedJob,
    job_timeout: Duration,
    shutdown: &mut watch::Receiver<bool>,
) -> JobOutcome {
    let frame = ToWorker {
        msg: Some(to_worker::Msg::Job(TuneJob {
            job_id,
            op: job.op.clone(),
            problem: job.problem.clone(),
            device: job.device.clone(),
            timeout_ms: u32::try_from(job_timeout.as_millis()).unwrap_or(u32::MAX),
            excluded: job.excluded.clone(),
        })),
    };
    if let Err(error) = write_frame_async(&mut worker.stdin, &frame).await {
        tracing::warn!(%error, "could not send a job to the tuner worker");
        return JobOutcome::WorkerDied(worker.death().await, None);
    }
    let deadline = tokio::time::Instant::now() + job_timeout;
    // The candidate the worker said it is running; blamed if the worker dies or hangs.
    let mut running: Option<String> = None;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return JobOutcome::Shutdown,
            _ = tokio::time::sleep_until(deadline) => return JobOutcome::TimedOut(running),
            frame = worker.frames.recv() => match frame {
                None => return JobOutcome::WorkerDied(worker.death().await, running),
                Some(FromWorker { msg: Some(from_worker::Msg::Running(now)) }) if now.job_id == job_id => {
                    running = Some(now.candidate);
                }
                Some(FromWorker { msg: Some(from_worker::Msg::Done(done)) }) if done.job_id == job_id => {
                    return match done.outcome {
                        Some(job_done::Outcome::Result(result)) => match crate::model::validate::result("result", Some(result)) {
                            Ok(result) => JobOutcome::Done(result),
                            Err(why) => JobOutcome::Failed(format!("the tuner worker returned an invalid result: {why}")),
                        },
                        Some(job_done::Outcome::Error(error)) => JobOutcome::Failed(error),
                        None => JobOutcome::Failed("the tuner worker answered with neither result nor error".to_string()),
                    };
                }
                Some(other) => tracing::warn!(?other, job_id, "unexpected frame from the tuner worker; ignored"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(raw: i32) -> ExitStatus {
        ExitStatus::from_raw(raw)
    }

    #[test]
    fn crashes_blame_the_candidate_and_kills_from_outside_do_not() {
        // Raw wait statuses: a signal in the low bits, an exit code in the second byte.
        assert!(crash_of_a_candidate(status(POISONED_EXIT_CODE << 8)));
        assert!(crash_of_a_candidate(status(6))); // SIGABRT
        assert!(crash_of_a_candidate(status(11))); // SIGSEGV
        assert!(!crash_of_a_candidate(status(9))); // SIGKILL: the OOM killer, an operator
        assert!(!crash_of_a_candidate(status(15))); // SIGTERM
        assert!(!crash_of_a_candidate(status(0)));
        assert!(describe_exit(status(POISONED_EXIT_CODE << 8)).contains("sticky CUDA error"));
    }
}
