//! The daemon side of tuning: runs the `tunecache-tuner` worker as a child process, feeds it
//! one job at a time from a bounded queue, and restarts it when it dies.
//!
//! Why a separate process: a faulting kernel poisons its CUDA context for good and a hung
//! kernel cannot be interrupted, so the only safe recovery is to kill the process that owns
//! the context. Keeping that process separate means only the worker dies, never the daemon.
//!
//! Guarantees:
//! * a job is only accepted for a device fingerprint the running worker reported in `Ready`,
//!   so results measured on one device kind never answer keys of another;
//! * the worker names each candidate before running it (`Running` frames); when the worker
//!   dies of something a candidate can cause (a poisoned CUDA context, exit status
//!   [`POISONED_EXIT_CODE`], or a crash signal), that candidate is excluded and the job is
//!   retried on a fresh worker, which reports it with the reason and finishes with the best
//!   of the rest; at most [`MAX_DEATHS_PER_JOB`] deaths per job;
//! * a death that names no candidate (e.g. SIGKILL from outside, or during set-up) is retried
//!   once; if that worker dies too, the caller gets an error naming the death (exit status or
//!   signal, last stderr lines);
//! * a job running past `job_timeout` gets the worker killed and fails with a reason that
//!   names the candidate it was running;
//! * restarts back off exponentially (200 ms doubling to 30 s, reset by a successful job);
//! * when the last [`TunerHandle`] is dropped, or [`TunerHandle::shutdown`] is called, the
//!   worker is killed (and `kill_on_drop` covers a runtime that shuts down first).
//!
//! One worker runs one job at a time, so jobs are serialised per node (and so per device).
//!
//! The supervisor trusts the problem text it is given to be canonical (the daemon
//! canonicalises each request key once, in `validate::key`); the worker parses it again and
//! fails the job, without dying, if it does not parse. A result is checked once, here, with
//! the same rule as a rank's Record (`validate::result`), before it is counted as done.
//! `tuner::start` shows the wiring.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use tunecache_proto::tuner::v1::{ExcludedCandidate, Ready};
use tunecache_proto::tuner::BackendChoice;
use tunecache_proto::v1;

use crate::model::entry::TunedResult;
use crate::sync::lock;
use supervise::supervise;
use worker::spawn_worker;

mod supervise;
mod worker;

/// How long `shutdown` waits for the worker's pipe readers once the worker is gone.
const WORKER_TASKS_GRACE: Duration = Duration::from_secs(2);

/// How long a starting worker may take to say `Ready` (CUDA init on many GPUs takes seconds).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Lines of worker stderr kept to explain a death.
const STDERR_TAIL_LINES: usize = 20;
/// Lines of that tail quoted in a death reason.
const STDERR_LINES_IN_REASON: usize = 4;
/// Worker deaths one job may cause before it fails: each death blamed on a candidate
/// excludes that candidate, so this many faulting candidates are survived, less one.
pub const MAX_DEATHS_PER_JOB: u32 = 4;

/// How to run the worker.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Path of the `tunecache-tuner` binary.
    pub worker_path: PathBuf,
    /// Passed as `--backend`.
    pub backend: BackendChoice,
    /// Longest one job may run before the worker is killed.
    pub job_timeout: Duration,
    /// Jobs that may wait behind the running one; more are refused with `QueueFull`.
    pub queue_capacity: usize,
    /// Passed as `--device`: the GPU (CUDA ordinal) to tune on; `None` lets the worker pick
    /// (the least-loaded by NVML, else the last).
    pub device: Option<u32>,
    /// More arguments for the worker (tests use the hidden `--inject-fault`).
    pub worker_args: Vec<String>,
}

/// Why the supervisor could not start; the daemon logs "tuning off: {error}" and carries on.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("invalid tuner config: {0}")]
    Config(String),
    #[error("cannot start tuner worker {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tuner worker {path} did not come up: {reason}")]
    Handshake { path: PathBuf, reason: String },
}

/// Why a job was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// Maps to RESOURCE_EXHAUSTED.
    #[error("tuner queue is full ({capacity} jobs waiting)")]
    QueueFull { capacity: usize },
    /// The worker does not tune this fingerprint.
    #[error("no tuner device {fingerprint:?} on this node (devices: {available:?})")]
    NoDevice {
        fingerprint: String,
        available: Vec<String>,
    },
    #[error("tuning is off: {0}")]
    Off(String),
}

crate::report::stats_registry! {
    /// Counters for the daemon's Stats.
    #[derive(Debug, Default)]
    pub struct TunerCounters {
        /// Jobs accepted and not yet answered (waiting or running).
        pub queue_depth: AtomicU64 as tuner_queue_depth
            => gauge(45, "Jobs queued for the tuner worker."),
        /// Jobs answered with a result.
        pub jobs_done: AtomicU64 as tuner_jobs_done => counter(27, "Tuner worker jobs finished."),
        /// Jobs answered with an error.
        pub jobs_failed: AtomicU64 as tuner_jobs_failed => counter(28, "Tuner worker jobs failed."),
        /// Workers started after the first one.
        pub restarts: AtomicU64 as tuner_restarts => counter(29, "Tuner worker restarts."),
    }
}

/// What the caller of [`TunerHandle::submit`] eventually receives: a result that passed
/// `validate::result`, or why there is none.
pub type JobReply = Result<TunedResult, String>;

#[derive(Debug, Clone)]
enum Phase {
    Running,
    Restarting,
    Off(String),
}

#[derive(Debug)]
struct Status {
    phase: Phase,
    backend: String,
    note: String,
    devices: Vec<v1::Device>,
    worker_pid: Option<u32>,
}

#[derive(Debug)]
struct Shared {
    status: Mutex<Status>,
    counters: TunerCounters,
    /// The supervisor's task and each worker's pipe readers: `shutdown` waits for them all.
    tasks: TaskTracker,
}

impl Shared {
    /// Fresh shared state in `phase`, with no worker adopted yet and zero counters.
    fn new(phase: Phase) -> Shared {
        Shared {
            status: Mutex::new(Status {
                phase,
                backend: String::new(),
                note: String::new(),
                devices: Vec::new(),
                worker_pid: None,
            }),
            counters: TunerCounters::default(),
            tasks: TaskTracker::new(),
        }
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        lock(&self.status)
    }

    fn set_phase(&self, phase: Phase) {
        self.status().phase = phase;
    }

    fn adopt(&self, ready: &Ready, pid: Option<u32>) {
        let mut status = self.status();
        status.phase = Phase::Running;
        status.backend = ready.backend.clone();
        status.note = ready.note.clone();
        status.devices = ready.devices.clone();
        status.worker_pid = pid;
    }

    fn answer(&self, job: QueuedJob, reply: JobReply) {
        let counter = if reply.is_ok() {
            &self.counters.jobs_done
        } else {
            &self.counters.jobs_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.counters.queue_depth.fetch_sub(1, Ordering::Relaxed);
        // The caller may have stopped waiting; that is its business.
        let _ = job.reply.send(reply);
    }
}

struct QueuedJob {
    op: String,
    problem: String,
    device: String,
    /// Worker deaths this job has already seen.
    deaths: u32,
    /// Of those, the deaths no candidate was blamed for.
    unattributed_deaths: u32,
    /// Candidates that killed a worker on this job, with how.
    excluded: Vec<ExcludedCandidate>,
    reply: oneshot::Sender<JobReply>,
}

/// How a worker ended, and whether a candidate it was running can be the cause.
struct Death {
    reason: String,
    /// A crash a candidate can cause (poisoned context, SIGSEGV, SIGABRT, ...), not a kill
    /// from outside (SIGKILL from the OOM killer or an operator, SIGTERM).
    blames_candidate: bool,
}

/// Starts the worker supervisor.
pub struct Supervisor;

impl Supervisor {
    /// Spawns the worker, waits for its `Ready`, and supervises it from a background task.
    pub async fn start(config: SupervisorConfig) -> Result<TunerHandle, SupervisorError> {
        if config.queue_capacity == 0 {
            return Err(SupervisorError::Config(
                "queue_capacity must be at least 1".into(),
            ));
        }
        if config.job_timeout.is_zero() {
            return Err(SupervisorError::Config(
                "job_timeout must be positive".into(),
            ));
        }
        let shared = Arc::new(Shared::new(Phase::Running));
        let (worker, ready) = spawn_worker(&config, &shared.tasks).await?;
        tracing::info!(backend = %ready.backend, note = %ready.note, devices = ready.devices.len(), pid = ?worker.pid, "tuner worker ready");
        shared.adopt(&ready, worker.pid);
        let (jobs_tx, jobs_rx) = mpsc::channel(config.queue_capacity);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let capacity = config.queue_capacity;
        let task = shared.tasks.spawn(supervise(
            config,
            shared.clone(),
            jobs_rx,
            shutdown_rx,
            worker,
        ));
        Ok(TunerHandle {
            inner: Arc::new(HandleInner {
                shared,
                jobs: jobs_tx,
                capacity,
                shutdown: shutdown_tx,
                task: Mutex::new(Some(task)),
            }),
        })
    }
}

/// Cheap-to-clone handle to the tuner; the worker is killed when the last clone is dropped.
#[derive(Clone)]
pub struct TunerHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<QueuedJob>,
    capacity: usize,
    shutdown: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        // Drop guard: tell the supervisor task to kill the worker and fail what is queued.
        let _ = self.shutdown.send(true);
    }
}

impl std::fmt::Debug for TunerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunerHandle")
            .field("state", &self.state())
            .field("backend", &self.backend())
            .field("counters", &self.counters())
            .finish()
    }
}

impl TunerHandle {
    /// A handle for a node where tuning is off (e.g. the worker could not start): every
    /// submit fails with [`SubmitError::Off`] and Stats say why.
    pub fn off(reason: impl Into<String>) -> TunerHandle {
        let (jobs, _) = mpsc::channel(1);
        let (shutdown, _) = watch::channel(false);
        TunerHandle {
            inner: Arc::new(HandleInner {
                shared: Arc::new(Shared::new(Phase::Off(reason.into()))),
                jobs,
                capacity: 1,
                shutdown,
                task: Mutex::new(None),
            }),
        }
    }

    /// The devices of the current worker (those of the last `Ready` while restarting).
    pub fn devices(&self) -> Vec<v1::Device> {
        let status = self.inner.shared.status();
        match status.phase {
            Phase::Off(_) => Vec::new(),
            _ => status.devices.clone(),
        }
    }

    /// `"cuda"`, `"cpu"`, or `"off"` when no worker is supervised.
    pub fn backend(&self) -> String {
        let status = self.inner.shared.status();
        match status.phase {
            Phase::Off(_) => "off".to_string(),
            _ => status.backend.clone(),
        }
    }

    /// `"running"`, `"restarting"` or `"off: <why>"`, for Stats.
    pub fn state(&self) -> String {
        match &self.inner.shared.status().phase {
            Phase::Running => "running".to_string(),
            Phase::Restarting => "restarting".to_string(),
            Phase::Off(why) => format!("off: {why}"),
        }
    }

    /// Why the worker chose its backend (its `Ready.note`).
    pub fn note(&self) -> String {
        self.inner.shared.status().note.clone()
    }

    /// Process id of the current worker, if one is running.
    pub fn worker_pid(&self) -> Option<u32> {
        self.inner.shared.status().worker_pid
    }

    pub fn counters(&self) -> &TunerCounters {
        &self.inner.shared.counters
    }

    /// Queues a tuning job for `device_fingerprint`. `canonical_problem` is the key's problem
    /// as `validate::key` left it: it is not parsed again here (this runs under the
    /// coordinator's lock); the worker parses it and fails the job if it does not parse.
    pub fn submit(
        &self,
        op: &str,
        canonical_problem: &str,
        device_fingerprint: &str,
    ) -> Result<oneshot::Receiver<JobReply>, SubmitError> {
        {
            let status = self.inner.shared.status();
            if let Phase::Off(why) = &status.phase {
                return Err(SubmitError::Off(why.clone()));
            }
            if !status
                .devices
                .iter()
                .any(|d| d.fingerprint == device_fingerprint)
            {
                return Err(SubmitError::NoDevice {
                    fingerprint: device_fingerprint.to_string(),
                    available: status
                        .devices
                        .iter()
                        .map(|d| d.fingerprint.clone())
                        .collect(),
                });
            }
        }
        let (reply, receiver) = oneshot::channel();
        let job = QueuedJob {
            op: op.to_string(),
            problem: canonical_problem.to_string(),
            device: device_fingerprint.to_string(),
            deaths: 0,
            unattributed_deaths: 0,
            excluded: Vec::new(),
            reply,
        };
        let shared = &self.inner.shared;
        shared.counters.queue_depth.fetch_add(1, Ordering::Relaxed);
        match self.inner.jobs.try_send(job) {
            Ok(()) => Ok(receiver),
            Err(refused) => {
                shared.counters.queue_depth.fetch_sub(1, Ordering::Relaxed);
                Err(match refused {
                    mpsc::error::TrySendError::Full(_) => SubmitError::QueueFull {
                        capacity: self.inner.capacity,
                    },
                    mpsc::error::TrySendError::Closed(_) => {
                        SubmitError::Off("the tuner supervisor has stopped".to_string())
                    }
                })
            }
        }
    }

    /// Kills the worker, fails queued jobs, and waits for the supervisor task to finish.
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        let task = lock(&self.inner.task).take();
        if let Some(task) = task {
            if let Err(error) = task.await {
                tracing::warn!(%error, "tuner supervisor task ended abnormally");
            }
        }
        // The worker is killed with its handle; its pipe readers end at the pipes' close.
        let tasks = &self.inner.shared.tasks;
        tasks.close();
        if tokio::time::timeout(WORKER_TASKS_GRACE, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "the tuner worker's pipe readers still running after {WORKER_TASKS_GRACE:?}"
            );
        }
    }
}
