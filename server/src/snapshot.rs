//! Shared-filesystem snapshots and node-to-node merge, built so that a slow or hung shared
//! filesystem can never stall a rank.
//!
//! Each daemon publishes its whole cache as `DIR/<node>.tunecache.json` (written to a temp
//! file in the same directory, then renamed over the target) and, every interval, reads the
//! other nodes' files that changed and merges them into its store through `Store::apply`,
//! and so through the one merge rule. All nodes therefore converge on the same winners.
//!
//! Pieces, mini-redis style:
//! - `SnapshotHandle`: cheap, cloneable handle over the shared state, held by the gRPC service
//!   (Snapshot RPC, Stats fields 40–49) and by the background task.
//! - one dedicated I/O thread (`tunecache-snapshot-io`) does every filesystem call. The async
//!   side hands it one job at a time and waits at most `IO_WAIT_BOUND`; a job that does not
//!   come back is abandoned (never joined), reported in Stats as the stuck operation and on
//!   the health service `tunecache.v1.TuneCache/snapshots`, and no further job is queued
//!   behind it until it returns. Lookup, Record, Resolve and Scan never wait on it.
//! - `SnapshotTask`: the periodic load-then-write loop; a drop guard that stops it. It also
//!   ends when the daemon's `CancellationToken` is cancelled. Shutdown never waits for the
//!   I/O thread: if it is stuck in the kernel, the process exits around it.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tunecache_proto::v1;

use crate::config::Config;
use crate::entry::{unix_now_ms, CacheKey, TunedResult};
use crate::error::{Error, Result};
use crate::shared_file::{self, FileVersion, OpenError};
use crate::snapshot_format::{self, ParsedSnapshot, SNAPSHOT_SUFFIX};
use crate::store::{CacheMap, Store};

/// gRPC health service name that reports snapshot trouble. NOT_SERVING here means the
/// shared directory is stuck or failing; the cache itself (`tunecache.v1.TuneCache`) keeps
/// SERVING, because ranks must keep using it.
pub const HEALTH_SERVICE_NAME: &str = "tunecache.v1.TuneCache/snapshots";
/// Longest the async side waits for one shared-filesystem job (the Snapshot RPC's bound).
pub const IO_WAIT_BOUND: Duration = Duration::from_secs(10);
/// A job running longer than this is reported as stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(5);
/// Loaded entries go to the store in batches of this many, so one huge peer file does not
/// hold the writer thread (and every Record behind it) for long.
const APPLY_BATCH: usize = 10_000;
/// Temp files older than this belong to writers that crashed; they are removed.
const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);
/// Longest wait between retries after the shared directory failed.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How often a read that raced a replacement (ENOENT, ESTALE) is tried again.
const REPLACEMENT_RETRIES: usize = 3;
/// How often the health status is brought up to date.
const HEALTH_POLL: Duration = Duration::from_secs(1);
/// Marks our temp files; they start with '.' so no reader takes them for a snapshot.
const TEMP_MARKER: &str = ".tunecache.json.tmp.";

/// What the snapshot machinery needs from the daemon's flags.
#[derive(Clone, Debug)]
pub struct SnapshotSettings {
    pub dir: PathBuf,
    pub node: String,
    pub interval: Duration,
    pub fsync: bool,
    /// Larger files in the shared directory are skipped with one warning.
    pub max_file_bytes: u64,
}

impl SnapshotSettings {
    /// `None` when the daemon runs without `--shared-dir`.
    pub fn from_config(config: &Config) -> Option<SnapshotSettings> {
        let dir = config.shared_dir.clone()?;
        Some(SnapshotSettings {
            dir,
            node: config.node_name(),
            interval: config.snapshot_interval(),
            fsync: config.snapshot_fsync,
            max_file_bytes: config.snapshot_max_file_bytes,
        })
    }
}

/// The two kinds of shared-filesystem job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    Write,
    Load,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Write => "writing snapshot",
            Operation::Load => "loading peer snapshots",
        }
    }
}

/// The job the I/O thread is running right now.
struct InFlight {
    operation: Operation,
    since_unix_ms: i64,
    started: Instant,
}

#[derive(Default)]
struct SnapshotCounters {
    written: AtomicU64,
    skipped_unchanged: AtomicU64,
    errors: AtomicU64,
    peer_files_loaded: AtomicU64,
    peer_files_skipped: AtomicU64,
    last_snapshot_unix_ms: AtomicI64,
    /// Bytes read from shared-directory files (shared with the readers that count them).
    bytes_read: Arc<AtomicU64>,
}

/// State shared by the handle, the background task and the I/O thread.
struct Shared {
    settings: SnapshotSettings,
    own_file_name: String,
    counters: SnapshotCounters,
    last_error: Mutex<String>,
    in_flight: Mutex<Option<InFlight>>,
    /// A job was handed to the I/O thread and has not come back; no other is queued.
    job_outstanding: AtomicBool,
    /// False after a failed write until the next successful one; drives health.
    last_write_ok: AtomicBool,
    /// "operation:error kind" pairs already logged, so each kind is logged once.
    logged_failures: Mutex<HashSet<String>>,
}

/// Owned by whoever holds the I/O slot (the async mutex): one job at a time.
struct IoSlot {
    jobs: mpsc::Sender<IoJob>,
    last_written_generation: Option<u64>,
    last_written_bytes: u64,
    /// Writes wait for one complete load, so a wiped node never publishes an empty file
    /// over the snapshot it is about to start from.
    initial_load_done: bool,
    consecutive_failures: u32,
    retry_after: Option<Instant>,
}

enum IoJob {
    Write {
        map: Arc<CacheMap>,
        reply: oneshot::Sender<Result<WriteReport>>,
    },
    Load {
        include_own: bool,
        reply: oneshot::Sender<Result<LoadReport>>,
    },
}

struct WriteReport {
    bytes: u64,
    entries: usize,
}

struct LoadedFile {
    name: OsString,
    node: String,
    entries: Vec<(CacheKey, TunedResult)>,
}

#[derive(Default)]
struct LoadReport {
    files: Vec<LoadedFile>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these leaves plain data behind; keep using it.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Cheap, cloneable handle to the snapshot machinery.
#[derive(Clone)]
pub struct SnapshotHandle {
    shared: Arc<Shared>,
    slot: Arc<tokio::sync::Mutex<IoSlot>>,
    store: Store,
    stop: CancellationToken,
}

/// The periodic snapshot task; stopped when dropped or when the daemon's token is cancelled.
pub struct SnapshotTask {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SnapshotTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SnapshotHandle {
    /// Starts the I/O thread. Makes no filesystem call itself, so a hung shared directory
    /// cannot delay the daemon's start.
    pub fn start(
        settings: SnapshotSettings,
        store: Store,
        stop: CancellationToken,
    ) -> Result<Self> {
        if settings.node.is_empty() || settings.node.starts_with('.') || settings.node.contains('/')
        {
            return Err(Error::InvalidNodeName(settings.node));
        }
        let own_file_name = snapshot_format::snapshot_file_name(&settings.node);
        let shared = Arc::new(Shared {
            settings,
            own_file_name,
            counters: SnapshotCounters::default(),
            last_error: Mutex::new(String::new()),
            in_flight: Mutex::new(None),
            job_outstanding: AtomicBool::new(false),
            last_write_ok: AtomicBool::new(true),
            logged_failures: Mutex::new(HashSet::new()),
        });
        let (jobs, job_receiver) = mpsc::channel();
        let worker = IoWorker {
            shared: Arc::clone(&shared),
            seen: HashMap::new(),
        };
        // Detached on purpose: a thread stuck in the kernel on a hung mount is abandoned,
        // never joined. It ends by itself once every handle (and so `jobs`) is gone.
        std::thread::Builder::new()
            .name("tunecache-snapshot-io".into())
            .spawn(move || worker.run(job_receiver))
            .map_err(|e| Error::io("starting the snapshot I/O thread", &shared.settings.dir, e))?;
        let slot = IoSlot {
            jobs,
            last_written_generation: None,
            last_written_bytes: 0,
            initial_load_done: false,
            consecutive_failures: 0,
            retry_after: None,
        };
        Ok(SnapshotHandle {
            shared,
            slot: Arc::new(tokio::sync::Mutex::new(slot)),
            store,
            stop,
        })
    }

    /// Starts the periodic load-then-write loop and keeps `HEALTH_SERVICE_NAME` up to date.
    pub fn spawn_background(&self, health: HealthReporter) -> SnapshotTask {
        let handle = self.clone();
        let task = tokio::spawn(async move {
            tokio::join!(handle.clone().run_periodic(), handle.report_health(health));
        });
        SnapshotTask { task }
    }

    /// The Snapshot RPC: writes now, or reports `skipped_unchanged`, within `IO_WAIT_BOUND`.
    pub async fn snapshot_now(&self) -> Result<v1::SnapshotResponse> {
        let started = Instant::now();
        // One bound for the whole call: waiting for a pass in progress counts too.
        let work = async {
            let mut slot = self.slot.lock().await;
            if !slot.initial_load_done {
                self.load_and_apply(&mut slot).await?;
            }
            self.write_if_changed(&mut slot).await
        };
        let written = tokio::select! {
            () = self.stop.cancelled() => {
                return Err(Error::SharedDirUnavailable("the daemon is shutting down".into()));
            }
            written = tokio::time::timeout(IO_WAIT_BOUND, work) => {
                written.map_err(|_| Error::SharedDirTimeout {
                    operation: Operation::Write.as_str(),
                    waited: IO_WAIT_BOUND,
                })??
            }
        };
        Ok(v1::SnapshotResponse {
            path: self.own_path().display().to_string(),
            entries: written.entries as u64,
            bytes: written.bytes,
            duration_ms: started.elapsed().as_millis() as u64,
            skipped_unchanged: written.skipped_unchanged,
        })
    }

    /// Fills the snapshot fields (40–49) of a Stats response. Touches no filesystem.
    pub fn fill_stats(&self, stats: &mut v1::StatsResponse) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.shared.counters;
        stats.shared_dir = self.shared.settings.dir.display().to_string();
        stats.last_snapshot_unix_ms = counters.last_snapshot_unix_ms.load(Ordering::Relaxed);
        stats.snapshots_written = load(&counters.written);
        stats.snapshots_skipped_unchanged = load(&counters.skipped_unchanged);
        stats.snapshot_errors = load(&counters.errors);
        stats.peer_files_loaded = load(&counters.peer_files_loaded);
        stats.peer_files_skipped = load(&counters.peer_files_skipped);
        stats.last_snapshot_error = lock(&self.shared.last_error).clone();
        if let Some((operation, since_unix_ms)) = self.stuck() {
            stats.stuck_operation = operation.as_str().to_owned();
            stats.stuck_since_unix_ms = since_unix_ms;
        }
    }

    fn own_path(&self) -> PathBuf {
        self.shared.settings.dir.join(&self.shared.own_file_name)
    }

    /// The job that has run longer than `STUCK_AFTER`, if any.
    fn stuck(&self) -> Option<(Operation, i64)> {
        lock(&self.shared.in_flight)
            .as_ref()
            .filter(|in_flight| in_flight.started.elapsed() >= STUCK_AFTER)
            .map(|in_flight| (in_flight.operation, in_flight.since_unix_ms))
    }

    async fn run_periodic(self) {
        let mut ticker = tokio::time::interval(self.shared.settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = self.periodic_pass() => {}
            }
        }
    }

    /// One interval: read what changed in the shared directory, then publish our state if
    /// it changed. Skipped while a Snapshot RPC holds the slot or during backoff.
    async fn periodic_pass(&self) {
        let Ok(mut slot) = self.slot.try_lock() else {
            return;
        };
        if slot.retry_after.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let outcome = match self.load_and_apply(&mut slot).await {
            Ok(()) => self.write_if_changed(&mut slot).await.map(|_| ()),
            Err(error) => Err(error),
        };
        match outcome {
            Ok(()) => {
                slot.consecutive_failures = 0;
                slot.retry_after = None;
            }
            // A stuck job costs nothing while we wait for it: no backoff, so the next
            // snapshot lands as soon as the filesystem answers again.
            Err(Error::SharedDirStuck { .. }) => {}
            Err(error) => {
                slot.consecutive_failures = slot.consecutive_failures.saturating_add(1);
                let backoff = self
                    .shared
                    .settings
                    .interval
                    .saturating_mul(1 << slot.consecutive_failures.min(10))
                    .min(MAX_BACKOFF);
                slot.retry_after = Some(Instant::now() + backoff);
                tracing::debug!(%error, ?backoff, "shared directory pass failed; backing off");
            }
        }
    }

    /// Hands one job to the I/O thread and waits for it at most `IO_WAIT_BOUND`.
    async fn run_job<T>(
        &self,
        slot: &mut IoSlot,
        operation: Operation,
        job: impl FnOnce(oneshot::Sender<Result<T>>) -> IoJob,
    ) -> Result<T> {
        if self.shared.job_outstanding.load(Ordering::Acquire) {
            // The last job never came back; queueing behind it would only pile up.
            let (operation, since_unix_ms) = lock(&self.shared.in_flight)
                .as_ref()
                .map_or((operation, unix_now_ms()), |f| {
                    (f.operation, f.since_unix_ms)
                });
            return Err(Error::SharedDirStuck {
                operation: operation.as_str(),
                since_unix_ms,
            });
        }
        let (reply, outcome) = oneshot::channel();
        self.shared.job_outstanding.store(true, Ordering::Release);
        if slot.jobs.send(job(reply)).is_err() {
            self.shared.job_outstanding.store(false, Ordering::Release);
            return Err(Error::SharedDirUnavailable(
                "the snapshot I/O thread has stopped".into(),
            ));
        }
        match tokio::time::timeout(IO_WAIT_BOUND, outcome).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::SharedDirUnavailable(
                "the snapshot I/O thread has stopped".into(),
            )),
            Err(_) => {
                tracing::warn!(
                    operation = operation.as_str(),
                    dir = %self.shared.settings.dir.display(),
                    "shared directory did not answer within {IO_WAIT_BOUND:?}; \
                     abandoning the wait (the I/O thread stays blocked until it returns)"
                );
                Err(Error::SharedDirTimeout {
                    operation: operation.as_str(),
                    waited: IO_WAIT_BOUND,
                })
            }
        }
    }

    /// Reads the peers' changed files and merges them into the store through the merge rule.
    async fn load_and_apply(&self, slot: &mut IoSlot) -> Result<()> {
        // A wiped node (empty store) also starts from the file it published before.
        let include_own = self.store.is_empty();
        let started = Instant::now();
        let report = self
            .run_job(slot, Operation::Load, |reply| IoJob::Load {
                include_own,
                reply,
            })
            .await?;
        let read_elapsed = started.elapsed();
        for file in report.files {
            let merge_started = Instant::now();
            let total = file.entries.len();
            let mut stored = 0;
            let mut entries = file.entries.into_iter();
            loop {
                let batch: Vec<_> = entries.by_ref().take(APPLY_BATCH).collect();
                if batch.is_empty() {
                    break;
                }
                stored += self.store.apply(batch).await?.stored;
            }
            tracing::info!(
                file = ?file.name,
                node = %file.node,
                entries = total,
                stored,
                read = ?read_elapsed,
                merge = ?merge_started.elapsed(),
                "merged a snapshot from the shared directory"
            );
        }
        slot.initial_load_done = true;
        Ok(())
    }

    /// Publishes the current version unless it is the one published last; then nothing
    /// touches the filesystem at all.
    async fn write_if_changed(&self, slot: &mut IoSlot) -> Result<Written> {
        if !slot.initial_load_done {
            return Err(Error::SharedDirUnavailable(
                "the first load of the shared directory has not finished".into(),
            ));
        }
        // Generation before map: a change landing in between is published next time.
        let generation = self.store.counters().generation.load(Ordering::Acquire);
        let map = self.store.current();
        if slot.last_written_generation == Some(generation) {
            self.shared
                .counters
                .skipped_unchanged
                .fetch_add(1, Ordering::Relaxed);
            return Ok(Written {
                entries: map.len(),
                bytes: slot.last_written_bytes,
                skipped_unchanged: true,
            });
        }
        let report = self
            .run_job(slot, Operation::Write, |reply| IoJob::Write { map, reply })
            .await?;
        slot.last_written_generation = Some(generation);
        slot.last_written_bytes = report.bytes;
        Ok(Written {
            entries: report.entries,
            bytes: report.bytes,
            skipped_unchanged: false,
        })
    }

    /// Keeps the snapshot health status current and logs when a job gets stuck or returns.
    async fn report_health(self, health: HealthReporter) {
        let mut reported: Option<ServingStatus> = None;
        let mut reported_stuck = false;
        let mut ticker = tokio::time::interval(HEALTH_POLL);
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let stuck = self.stuck();
            match (stuck, reported_stuck) {
                (Some((operation, since_unix_ms)), false) => tracing::warn!(
                    operation = operation.as_str(),
                    since_unix_ms,
                    dir = %self.shared.settings.dir.display(),
                    "shared directory stuck; lookups and records go on, snapshots wait"
                ),
                (None, true) => tracing::info!("shared directory answers again"),
                _ => {}
            }
            reported_stuck = stuck.is_some();
            let healthy = stuck.is_none() && self.shared.last_write_ok.load(Ordering::Relaxed);
            let status = if healthy {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            if reported != Some(status) {
                health.set_service_status(HEALTH_SERVICE_NAME, status).await;
                reported = Some(status);
            }
        }
    }
}

/// What a write (or a skipped write) produced.
struct Written {
    entries: usize,
    bytes: u64,
    skipped_unchanged: bool,
}

/// The I/O thread's state: which version of each peer file it has already taken in.
struct IoWorker {
    shared: Arc<Shared>,
    seen: HashMap<OsString, FileVersion>,
}

impl IoWorker {
    fn run(mut self, jobs: mpsc::Receiver<IoJob>) {
        while let Ok(job) = jobs.recv() {
            match job {
                IoJob::Write { map, reply } => {
                    self.begin(Operation::Write);
                    let outcome = self.write(&map);
                    drop(map);
                    self.end();
                    let _ = reply.send(outcome);
                }
                IoJob::Load { include_own, reply } => {
                    self.begin(Operation::Load);
                    let outcome = self.load(include_own);
                    self.end();
                    if let Err(Ok(abandoned)) = reply.send(outcome) {
                        // Nobody waited for these entries any more: read them again next
                        // time rather than losing them.
                        for file in abandoned.files {
                            self.seen.remove(&file.name);
                        }
                    }
                }
            }
        }
    }

    fn begin(&self, operation: Operation) {
        *lock(&self.shared.in_flight) = Some(InFlight {
            operation,
            since_unix_ms: unix_now_ms(),
            started: Instant::now(),
        });
    }

    fn end(&self) {
        *lock(&self.shared.in_flight) = None;
        self.shared.job_outstanding.store(false, Ordering::Release);
    }

    fn dir(&self) -> &Path {
        &self.shared.settings.dir
    }

    /// Counts and reports a failure; logs each kind of failure of each operation once.
    fn failed(&self, operation: Operation, what: &str, path: &Path, error: &io::Error) -> Error {
        let message = format!(
            "{} failed: {what} {}: {error}",
            operation.as_str(),
            path.display()
        );
        self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.shared.last_error) = message.clone();
        if operation == Operation::Write {
            self.shared.last_write_ok.store(false, Ordering::Relaxed);
        }
        let kind = format!("{}:{:?}", operation.as_str(), error.kind());
        if lock(&self.shared.logged_failures).insert(kind) {
            tracing::warn!(
                "{message} (logged once per kind of failure; retried with backoff, local data is kept)"
            );
        } else {
            tracing::debug!("{message}");
        }
        Error::SharedDirUnavailable(message)
    }

    fn write(&self, map: &CacheMap) -> Result<WriteReport> {
        let started = Instant::now();
        let temp_path = self.dir().join(temp_file_name(&self.shared.settings.node));
        let own_path = self.dir().join(&self.shared.own_file_name);
        let bytes = match self.write_temp_then_rename(map, &temp_path, &own_path) {
            Ok(bytes) => bytes,
            Err((what, error)) => {
                if what != "creating" {
                    // Best effort: a temp file left behind is removed after an hour anyway.
                    let _ = fs::remove_file(&temp_path);
                }
                let path = if what == "renaming" {
                    &own_path
                } else {
                    &temp_path
                };
                return Err(self.failed(Operation::Write, what, path, &error));
            }
        };
        let counters = &self.shared.counters;
        counters.written.fetch_add(1, Ordering::Relaxed);
        counters
            .last_snapshot_unix_ms
            .store(unix_now_ms(), Ordering::Relaxed);
        if !self.shared.last_write_ok.swap(true, Ordering::Relaxed) {
            tracing::info!(path = %own_path.display(), "snapshot written again after failures");
        }
        lock(&self.shared.logged_failures)
            .retain(|kind| !kind.starts_with(Operation::Write.as_str()));
        tracing::debug!(
            path = %own_path.display(),
            entries = map.len(),
            bytes,
            elapsed = ?started.elapsed(),
            "snapshot written"
        );
        Ok(WriteReport {
            bytes,
            entries: map.len(),
        })
    }

    /// The steps of one write; an error names the step that failed.
    fn write_temp_then_rename(
        &self,
        map: &CacheMap,
        temp_path: &Path,
        own_path: &Path,
    ) -> Result<u64, (&'static str, io::Error)> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(temp_path)
            .map_err(|e| ("creating", e))?;
        let mut out = BufWriter::with_capacity(
            1 << 20,
            CountingWriter {
                inner: file,
                bytes: 0,
            },
        );
        snapshot_format::write_snapshot(&mut out, &self.shared.settings.node, unix_now_ms(), map)
            .map_err(|e| ("writing", io::Error::from(e)))?;
        let counted = out.into_inner().map_err(|e| ("writing", e.into_error()))?;
        if self.shared.settings.fsync {
            counted.inner.sync_all().map_err(|e| ("syncing", e))?;
        }
        drop(counted.inner);
        fs::rename(temp_path, own_path).map_err(|e| ("renaming", e))?;
        if self.shared.settings.fsync {
            File::open(self.dir())
                .and_then(|dir| dir.sync_all())
                .map_err(|e| ("syncing the directory of", e))?;
        }
        Ok(counted.bytes)
    }

    fn load(&mut self, include_own: bool) -> Result<LoadReport> {
        let dir = self.shared.settings.dir.clone();
        let listing = match fs::read_dir(&dir) {
            Ok(listing) => listing,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                // First node on a fresh shared directory: create it, nothing to read yet.
                fs::create_dir_all(&dir)
                    .map_err(|e| self.failed(Operation::Load, "creating", &dir, &e))?;
                return Ok(LoadReport::default());
            }
            Err(error) => return Err(self.failed(Operation::Load, "listing", &dir, &error)),
        };
        let mut report = LoadReport::default();
        let mut present = HashSet::new();
        for dirent in listing {
            let dirent = dirent.map_err(|e| self.failed(Operation::Load, "listing", &dir, &e))?;
            let name = dirent.file_name();
            let Some(text) = name.to_str() else { continue };
            if text.starts_with('.') {
                if text.contains(TEMP_MARKER) {
                    remove_if_stale(&dirent.path());
                }
                continue;
            }
            if !text.ends_with(SNAPSHOT_SUFFIX) || text.len() == SNAPSHOT_SUFFIX.len() {
                continue;
            }
            if text == self.shared.own_file_name && !include_own {
                continue;
            }
            present.insert(name.clone());
            if let Some(file) = self.read_if_changed(&dirent.path(), name) {
                report.files.push(file);
            }
        }
        // Forget files that are gone (or our own, once no longer read) so a later file of
        // the same name is read afresh.
        self.seen.retain(|name, _| present.contains(name));
        Ok(report)
    }

    /// Reads one snapshot file unless this version was taken in (or skipped) before.
    fn read_if_changed(&mut self, path: &Path, name: OsString) -> Option<LoadedFile> {
        let mut attempt = 0;
        let (version, parsed) = loop {
            attempt += 1;
            match self.read_new_version(path, &name) {
                Ok(Some(read)) => break read,
                Ok(None) => return None,
                // A replacement raced us: the name now points at a newer file, or, on NFS,
                // our handle went stale. Look again.
                Err(error) if is_replacement_race(&error) && attempt <= REPLACEMENT_RETRIES => {
                    std::thread::sleep(Duration::from_millis(20 * attempt as u64));
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
                Err(error) => {
                    let _ = self.failed(Operation::Load, "reading", path, &error);
                    return None;
                }
            }
        };
        let counters = &self.shared.counters;
        // Either way this version is done with: loaded now, or warned about once.
        self.seen.insert(name.clone(), version);
        match parsed {
            Ok(parsed) => {
                counters.peer_files_loaded.fetch_add(1, Ordering::Relaxed);
                if parsed.invalid_entries > 0 {
                    tracing::warn!(
                        path = %path.display(),
                        invalid = parsed.invalid_entries,
                        "snapshot file holds entries a Record would refuse; they are skipped"
                    );
                }
                Some(LoadedFile {
                    name,
                    node: parsed.node,
                    entries: parsed.entries,
                })
            }
            Err(reason) => {
                counters.peer_files_skipped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    path = %path.display(),
                    bytes = version.size,
                    "{reason}; skipped until the file changes"
                );
                None
            }
        }
    }

    /// `Ok(None)` when the file is the version seen last time. Otherwise the version read
    /// and either its entries or why it was skipped (refused by type or size, or damaged).
    fn read_new_version(
        &self,
        path: &Path,
        name: &OsString,
    ) -> io::Result<Option<(FileVersion, Result<ParsedSnapshot>)>> {
        // lstat: a symlink's version is the link's own, so it is refused once, not per pass.
        let version = shared_file::version_of(path)?;
        if self.seen.get(name) == Some(&version) {
            return Ok(None);
        }
        let max_bytes = self.shared.settings.max_file_bytes;
        let opened = match shared_file::open(path, max_bytes) {
            Ok(opened) => opened,
            Err(OpenError::Io(error)) => return Err(error),
            Err(OpenError::Refused(refusal, refused_version)) => {
                let error = Error::SnapshotFormat(refusal.to_string());
                return Ok(Some((refused_version.unwrap_or(version), Err(error))));
            }
        };
        // The version of what is actually read, which may be newer than the lstat above.
        let version = opened.version;
        let reader = opened.reader(max_bytes, Arc::clone(&self.shared.counters.bytes_read));
        Ok(Some((version, snapshot_format::read_snapshot(reader))))
    }
}

fn is_replacement_race(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ESTALE)
}

/// `.<node>.tunecache.json.tmp.<pid>.<unique>`: hidden, so readers never take it for a
/// snapshot, and unique per writer.
fn temp_file_name(node: &str) -> String {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    let sequence = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!(
        ".{node}{TEMP_MARKER}{}.{nanos:08x}{sequence:x}",
        std::process::id()
    )
}

/// Removes a temp file left by a writer that crashed more than `STALE_TEMP_AGE` ago.
fn remove_if_stale(path: &Path) {
    let age = fs::symlink_metadata(path)
        .and_then(|metadata| metadata.modified())
        .ok()
        .and_then(|modified| modified.elapsed().ok());
    if age.is_some_and(|age| age > STALE_TEMP_AGE) {
        match fs::remove_file(path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed a crashed writer's temp file")
            }
            Err(error) => tracing::debug!(path = %path.display(), %error, "temp file not removed"),
        }
    }
}

/// Counts the bytes that reach the file, so the size is known without another stat.
struct CountingWriter {
    inner: File,
    bytes: u64,
}

impl Write for CountingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
