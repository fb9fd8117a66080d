//! Shared-filesystem snapshots and node-to-node merge, built so that a slow or hung shared
//! filesystem can never stall a rank, and so that what crosses the shared filesystem grows
//! with what is new, never with nodes × cache size.
//!
//! Each daemon publishes only its own contributions (entries from its ranks' Records and its
//! tuner, see `Origin`), as immutable segments `DIR/v2/<node>.<first>-<last>.seg.json`, each
//! written to a temp file and renamed in; every interval it reads the segments of other
//! nodes it has not read yet (and version-1 files of older daemons that changed), and merges
//! them into its store as learned entries through `Store::apply_learned`, and so through the
//! one merge rule. All nodes therefore converge on the same winners.
//! Where it stands with each other node's segments is kept in its state directory once the
//! journal holds what it merged (`plan::merged`), so a restart reads only what is new.
//!
//! Pieces, mini-redis style:
//! - `SnapshotHandle`: cheap, cloneable handle over the shared state, held by the gRPC service
//!   (Snapshot RPC, Stats fields 40–59, declared in `stats`) and by the background task.
//! - one dedicated I/O thread (`tunecache-snapshot-io`, `io`) does every filesystem call. The
//!   async side hands it one job at a time and waits at most `IO_WAIT_BOUND`; a job that does
//!   not come back is abandoned (never joined), reported in Stats as the stuck operation and
//!   on the health service `tunecache.v1.TuneCache/snapshots`, and no further job is queued
//!   behind it until it returns. Lookup, Record, Resolve and Scan never wait on it.
//! - `plan`: the rules as one pure step, from a listing, this node's own record and its
//!   settings to what to read, trust, publish and compact; `io` carries out what it decides.
//! - `segments`: the version-2 names and the rule for what a reader takes next.
//! - `format`: the bytes of a shared-directory file; `shared_file`: opening one safely.
//! - `blobs`: the artifact blobs under `v2/artifacts/`, published before the segments that
//!   name them and fetched lazily as a tier of the artifact store.
//! - `SnapshotHandle::start_background`: the periodic load-then-publish loop, a task of the
//!   daemon's (`tasks`) that ends when the daemon stops. Shutdown never waits for the I/O
//!   thread: if it is stuck in the kernel, the process exits around it.

mod blobs;
pub mod format;
mod io;
mod plan;
pub mod segments;
pub(crate) mod shared_file;
mod stats;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tunecache_proto::v1;

use crate::error::{Error, Result};
use crate::journal::FsyncPolicy;
use crate::model::entry::unix_now_ms;
use crate::store::{Source, Store};
use crate::sync::lock;
use crate::tasks::Tasks;

use io::{IoJob, IoWorker, WriteReport};
use plan::merged::MergedRecord;
use stats::SnapshotCounters;

/// gRPC health service name that reports snapshot trouble. NOT_SERVING here means the
/// shared directory is stuck or failing; the cache itself (`tunecache.v1.TuneCache`) keeps
/// SERVING, because ranks must keep using it.
pub const HEALTH_SERVICE_NAME: &str = "tunecache.v1.TuneCache/snapshots";
/// Longest the async side waits for one shared-filesystem job (the Snapshot RPC's bound).
pub const IO_WAIT_BOUND: Duration = Duration::from_secs(10);
/// A job running longer than this is reported as stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(5);
/// Default bound on a node's own segments before they are compacted into one.
pub const DEFAULT_COMPACT_SEGMENTS: usize = 64;
/// Loaded entries go to the store in batches of this many, so one huge peer file does not
/// hold the writer thread (and every Record behind it) for long.
const APPLY_BATCH: usize = 10_000;
/// Longest wait between retries after the shared directory failed.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How often the health status is brought up to date.
const HEALTH_POLL: Duration = Duration::from_secs(1);

/// What the snapshot machinery needs from the daemon's flags.
#[derive(Clone, Debug)]
pub struct SnapshotSettings {
    pub dir: PathBuf,
    pub node: String,
    pub interval: Duration,
    pub fsync: bool,
    /// Larger files in the shared directory are skipped with one warning.
    pub max_file_bytes: u64,
    /// More own segments than this are compacted into one.
    pub compact_segments: usize,
    /// Where this node records which segments it wrote (its state directory).
    pub state_dir: PathBuf,
    /// With a key, every file must carry a MAC that verifies under it.
    pub key: Option<crate::snapshot::format::SharedKey>,
    /// Without a key, only files owned by these uids count (this daemon's own first, then
    /// `--shared-dir-writer-uid`), and `v2/` must be owned by one of them or root.
    pub writer_uids: Vec<u32>,
    /// `--shared-dir-public`: in the `v2/` every user shares, this daemon's segments are
    /// readable by every user (a site-wide daemon's), not by its own uid alone.
    pub public: bool,
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

/// State shared by the handle, the background task and the I/O thread.
struct Shared {
    /// Changes to this node's own contributions, counted by the store's change feed; a
    /// publish with the count unchanged since the last one has nothing to write.
    own_changes: AtomicU64,
    settings: SnapshotSettings,
    /// The node's artifact store: the blobs a publish links in before its segment.
    artifacts: Option<Arc<crate::artifacts::Artifacts>>,
    counters: SnapshotCounters,
    last_error: Mutex<String>,
    in_flight: Mutex<Option<InFlight>>,
    /// A job was handed to the I/O thread and has not come back; no other is queued.
    job_outstanding: AtomicBool,
    /// False after a failed write until the next successful one; drives health.
    last_write_ok: AtomicBool,
    /// "operation:error kind" pairs already logged, so each kind is logged once.
    logged_failures: Mutex<HashSet<String>>,
    /// Names squatted in `v2/artifacts/` (shared with the tier that reads blobs).
    squats: Arc<blobs::Squats>,
    /// Blobs a publish could not link in are waiting for the next pass; drives health, and a
    /// pass with nothing new still runs a publish for them.
    blobs_failing: AtomicBool,
    /// What the last publish at shutdown did (empty before shutdown).
    shutdown_publish: Mutex<String>,
    /// Held while the record of merged places is written (`io::merged::write`).
    merged_write: Mutex<()>,
}

impl Shared {
    fn begin(&self, operation: Operation) {
        *lock(&self.in_flight) = Some(InFlight {
            operation,
            since_unix_ms: unix_now_ms(),
            started: Instant::now(),
        });
    }

    fn end(&self) {
        *lock(&self.in_flight) = None;
        self.job_outstanding.store(false, Ordering::Release);
    }

    /// Counts and reports a failure; logs each kind of failure of each operation once.
    fn failed(
        &self,
        operation: Operation,
        what: &str,
        path: &Path,
        error: &std::io::Error,
    ) -> Error {
        // The path escaped ({:?}): a peer's file name may hold a newline or a fake log line.
        let message = format!("{} failed: {what} {path:?}: {error}", operation.as_str());
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_error) = message.clone();
        if operation == Operation::Write {
            self.last_write_ok.store(false, Ordering::Relaxed);
        }
        let kind = format!("{}:{:?}", operation.as_str(), error.kind());
        if lock(&self.logged_failures).insert(kind) {
            tracing::warn!(
                "{message} (logged once per kind of failure; retried with backoff, local data is kept)"
            );
        } else {
            tracing::debug!("{message}");
        }
        Error::SharedDirUnavailable(message)
    }

    /// Reports a shared directory that is unsafe to use: counted, kept as the last error,
    /// logged once per message, and the publish health goes down until it is fixed.
    fn refused(&self, message: &str) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_error) = message.to_owned();
        self.last_write_ok.store(false, Ordering::Relaxed);
        if lock(&self.logged_failures).insert(format!("unsafe:{message}")) {
            tracing::error!("{message}");
        }
    }

    /// Reports blobs that could not be published (the entries naming them were): counted,
    /// kept as the last error, logged once per cause, and the snapshots health is down until
    /// a later pass publishes them.
    fn blobs_failed(&self, message: &str, cause: &str) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_error) = message.to_owned();
        self.blobs_failing.store(true, Ordering::Release);
        if lock(&self.logged_failures).insert(format!("blobs:{cause}")) {
            tracing::warn!(
                "{message} (logged once per cause; the entries naming it are published, the \
                 blob is retried every pass)"
            );
        } else {
            tracing::debug!("{message}");
        }
    }

    /// No blob is held back any more: each was published, or no entry names it now.
    fn blobs_all_published(&self) {
        if self.blobs_failing.swap(false, Ordering::AcqRel) {
            tracing::info!("no artifact blob is held back any more");
            lock(&self.logged_failures).retain(|cause| !cause.starts_with("blobs:"));
        }
    }

    /// Records a successful publish of `path`.
    fn wrote(&self, path: &Path) {
        self.counters.written.fetch_add(1, Ordering::Relaxed);
        self.counters
            .last_snapshot_unix_ms
            .store(unix_now_ms(), Ordering::Relaxed);
        if !self.last_write_ok.swap(true, Ordering::Relaxed) {
            tracing::info!(path = %path.display(), "snapshot written again after failures");
        }
        lock(&self.logged_failures).retain(|kind| !kind.starts_with(Operation::Write.as_str()));
    }
}

/// Owned by whoever holds the I/O slot (the async mutex): one job at a time.
struct IoSlot {
    jobs: mpsc::Sender<IoJob>,
    /// `Shared::own_changes` at the last publish (or when it was found to hold nothing new).
    last_published_changes: Option<u64>,
    /// Writes wait for one complete load, so a wiped node learns what it published before
    /// and never publishes it again as new.
    initial_load_done: bool,
    /// Why the last load failed (cleared by one that succeeds): what a publish refused for
    /// want of a first load names as its cause.
    last_load_error: Option<String>,
    consecutive_failures: u32,
    retry_after: Option<Instant>,
    /// The places merged through, not yet in the state directory.
    unsaved_places: Option<MergedRecord>,
    /// A merge began and has not finished (given up on by the Snapshot RPC's bound, or
    /// failed in the store).
    merging: bool,
    /// A merge was cut short this run: the I/O thread's places are past entries the store
    /// may never have taken, so none is recorded again until the daemon restarts (and then
    /// reads on from the last record, written before it).
    places_unsafe: bool,
    /// The last load read every trusted node's segments through, and the store took them.
    caught_up: bool,
    /// When the shared directory's blobs were last swept.
    last_sweep: Option<Instant>,
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
/// What a publish (or a publish with nothing new) produced.
struct Written {
    path: PathBuf,
    entries: usize,
    bytes: u64,
    skipped_unchanged: bool,
}

impl SnapshotHandle {
    /// Starts the I/O thread. Makes no filesystem call itself, so a hung shared directory
    /// cannot delay the daemon's start.
    pub fn start(
        settings: SnapshotSettings,
        store: Store,
        artifacts: Option<Arc<crate::artifacts::Artifacts>>,
        tasks: &Tasks,
    ) -> Result<Self> {
        if let Err(why) = crate::model::names::check_node_name(&settings.node) {
            return Err(Error::InvalidNodeName(why));
        }
        match &settings.key {
            Some(_) => tracing::info!(
                dir = ?settings.dir,
                "shared directory: only files with a MAC under --shared-dir-key-file count"
            ),
            None => tracing::info!(
                dir = ?settings.dir,
                writer_uids = ?settings.writer_uids,
                "shared directory: no --shared-dir-key-file; only files owned by these uids (this daemon's and --shared-dir-writer-uid) count"
            ),
        }
        let squats = Arc::new(blobs::Squats::default());
        if let Some(artifacts) = &artifacts {
            // Blobs a held entry names and this node lacks are fetched from `v2/artifacts/`.
            artifacts.add_source(Arc::new(blobs::SharedDirBlobs::new(
                &settings.dir.join(segments::SEGMENT_DIR),
                &settings.writer_uids,
                settings.key.is_some(),
                Arc::clone(&squats),
            )));
        }
        let shared = Arc::new(Shared {
            own_changes: AtomicU64::new(0),
            settings,
            artifacts,
            counters: SnapshotCounters::default(),
            last_error: Mutex::new(String::new()),
            in_flight: Mutex::new(None),
            job_outstanding: AtomicBool::new(false),
            last_write_ok: AtomicBool::new(true),
            logged_failures: Mutex::new(HashSet::new()),
            squats,
            blobs_failing: AtomicBool::new(false),
            shutdown_publish: Mutex::new(String::new()),
            merged_write: Mutex::new(()),
        });
        let (jobs, job_receiver) = mpsc::channel();
        let worker = IoWorker::new(Arc::clone(&shared));
        // Detached on purpose: a thread stuck in the kernel on a hung mount is abandoned,
        // never joined. It ends by itself once every handle (and so `jobs`) is gone.
        std::thread::Builder::new()
            .name("tunecache-snapshot-io".into())
            .spawn(move || worker.run(job_receiver))
            .map_err(|e| Error::io("starting the snapshot I/O thread", &shared.settings.dir, e))?;
        let slot = IoSlot {
            jobs,
            last_published_changes: None,
            initial_load_done: false,
            last_load_error: None,
            consecutive_failures: 0,
            retry_after: None,
            unsaved_places: None,
            merging: false,
            places_unsafe: false,
            caught_up: false,
            last_sweep: None,
        };
        store.add_change_listener(Arc::new(OwnChanges(Arc::downgrade(&shared))));
        Ok(SnapshotHandle {
            shared,
            slot: Arc::new(tokio::sync::Mutex::new(slot)),
            store,
            stop: tasks.stop_token(),
        })
    }

    /// Starts the periodic load-then-publish loop and keeps `HEALTH_SERVICE_NAME` up to date,
    /// as tasks of the daemon's that end when it stops.
    pub fn start_background(&self, health: HealthReporter, tasks: &Tasks) {
        let handle = self.clone();
        tasks.spawn(async move {
            tokio::join!(handle.clone().run_periodic(), handle.report_health(health));
        });
    }

    /// The Snapshot RPC: reads what is new, then publishes this node's new contributions now
    /// (or reports `skipped_unchanged`), within `IO_WAIT_BOUND`.
    pub async fn snapshot_now(&self) -> Result<v1::SnapshotResponse> {
        let started = Instant::now();
        // One bound for the whole call: waiting for a pass in progress counts too.
        let work = async {
            let mut slot = self.slot.lock().await;
            self.pass(&mut slot).await
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
            path: written.path.display().to_string(),
            entries: written.entries as u64,
            bytes: written.bytes,
            duration_ms: started.elapsed().as_millis() as u64,
            skipped_unchanged: written.skipped_unchanged,
        })
    }

    /// The last publish, at shutdown: what is not yet published goes out before `deadline`
    /// (the daemon's stop does not cut it short); says what happened.
    pub async fn publish_at_shutdown(&self, deadline: tokio::time::Instant) -> String {
        let work = async {
            let mut slot = self.slot.lock().await;
            let written = self.publish_if_changed(&mut slot).await;
            self.save_places(&mut slot).await;
            written
        };
        let outcome = match tokio::time::timeout_at(deadline, work).await {
            Ok(Ok(written)) if written.skipped_unchanged => "nothing new to publish".to_owned(),
            Ok(Ok(written)) => format!(
                "published {} bytes ({} contributions in all) to {:?}",
                written.bytes, written.entries, written.path
            ),
            Ok(Err(error)) => format!("failed: {error}"),
            Err(_) => "not done in time (the shared directory is slow or hung)".to_owned(),
        };
        *lock(&self.shared.shutdown_publish) = outcome.clone();
        outcome
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

    /// One interval: read what is new in the shared directory, then publish our new
    /// contributions. Skipped while a Snapshot RPC holds the slot or during backoff.
    async fn periodic_pass(&self) {
        let Ok(mut slot) = self.slot.try_lock() else {
            return;
        };
        if slot.retry_after.is_some_and(|at| Instant::now() < at) {
            return;
        }
        match self.pass(&mut slot).await {
            Ok(_) => {
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

    /// Load, then publish; counts the file bytes this pass read and wrote.
    async fn pass(&self, slot: &mut IoSlot) -> Result<Written> {
        let counters = &self.shared.counters;
        let read_before = counters.bytes_read.load(Ordering::Relaxed);
        let written_before = counters.bytes_written.load(Ordering::Relaxed);
        let outcome = match self.load_and_apply(slot).await {
            Ok(()) => {
                slot.last_load_error = None;
                let published = self.publish_if_changed(slot).await;
                if published.is_ok() {
                    self.sweep_blobs_if_due(slot).await;
                }
                published
            }
            Err(error) => {
                slot.last_load_error = Some(error.to_string());
                Err(error)
            }
        };
        // A stuck job has not finished: its bytes belong to the pass that sees it return.
        if !matches!(outcome, Err(Error::SharedDirStuck { .. })) {
            let read = counters.bytes_read.load(Ordering::Relaxed) - read_before;
            let written = counters.bytes_written.load(Ordering::Relaxed) - written_before;
            counters.last_pass_bytes_read.store(read, Ordering::Relaxed);
            counters
                .last_pass_bytes_written
                .store(written, Ordering::Relaxed);
            counters.passes.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Collects the shared directory's blobs no entry names (`blobs::sweep`), at most once per
    /// `--artifact-grace-secs` (and 100 ms), and only after a load that caught up: then the
    /// store holds every live entry of the directory. A sweep lists the whole blob directory,
    /// so it runs once per grace period rather than every pass: what every node's listing
    /// costs the shared filesystem stays one listing per node per hour at the default. A
    /// failure is logged; the pass goes on.
    async fn sweep_blobs_if_due(&self, slot: &mut IoSlot) {
        let Some(artifacts) = self.shared.artifacts.as_ref() else {
            return;
        };
        let grace = Duration::from_millis(artifacts.grace_ms());
        let interval = grace.max(Duration::from_millis(100));
        if !slot.caught_up || slot.last_sweep.is_some_and(|at| at.elapsed() < interval) {
            return;
        }
        slot.last_sweep = Some(Instant::now());
        let entries = self.store.current();
        match self
            .run_job(slot, Operation::Write, |reply| IoJob::SweepBlobs {
                entries,
                grace,
                reply,
            })
            .await
        {
            Ok(report) => {
                let counters = &self.shared.counters;
                counters
                    .blobs_collected
                    .fetch_add(report.deleted as u64, Ordering::Relaxed);
                if report != blobs::SweepReport::default() {
                    tracing::info!(
                        trashed = report.trashed,
                        restored = report.restored,
                        deleted = report.deleted,
                        deleted_bytes = report.deleted_bytes,
                        temps_deleted = report.temps_deleted,
                        "swept the shared directory's artifact blobs"
                    );
                }
            }
            Err(error) => tracing::debug!(%error, "sweeping the shared directory's blobs failed"),
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

    /// Reads what is new and merges it into the store through the merge rule: other nodes'
    /// entries as learned, this node's own segments (first load) as its own again.
    async fn load_and_apply(&self, slot: &mut IoSlot) -> Result<()> {
        // A wiped node (empty store) also starts from the version-1 file it published before.
        let include_own_v1 = self.store.is_empty();
        let started = Instant::now();
        let report = self
            .run_job(slot, Operation::Load, |reply| IoJob::Load {
                include_own_v1,
                reply,
            })
            .await?;
        let read_elapsed = started.elapsed();
        // Until the store has taken every file below, it does not hold every live entry.
        slot.caught_up = false;
        let caught_up = report.caught_up;
        if std::mem::replace(&mut slot.merging, true) && !slot.places_unsafe {
            slot.places_unsafe = true;
            tracing::warn!(
                "a merge from the shared directory was cut short; the segments merged are not \
                 recorded again this run, so a restart reads on from the last record"
            );
        }
        if report.own_vanished {
            // What vanished has to go out again although nothing changed here.
            slot.last_published_changes = None;
        }
        // Every file's tombstones before any file's entries: a forgotten entry in an older
        // segment is never served, not even for the moment until a newer segment is merged.
        let mut files = report.files;
        for file in &mut files {
            let tombstones = std::mem::take(&mut file.tombstones);
            let forgotten = self
                .store
                .apply_tombstones(tombstones, Source::Snapshot, file.origin)
                .await?;
            if forgotten > 0 {
                tracing::info!(file = %file.name, forgotten, "a Forget from the shared directory dropped entries");
            }
        }
        for file in files {
            let merge_started = Instant::now();
            let total = file.entries.len();
            let mut stored = 0;
            let mut entries = file.entries.into_iter();
            loop {
                let batch: Vec<_> = entries.by_ref().take(APPLY_BATCH).collect();
                if batch.is_empty() {
                    break;
                }
                stored += self.store.apply_stored(batch, file.origin).await?.stored;
            }
            tracing::info!(
                file = %file.name,
                node = %file.node,
                entries = total,
                stored,
                read = ?read_elapsed,
                merge = ?merge_started.elapsed(),
                "merged from the shared directory"
            );
        }
        slot.merging = false;
        slot.caught_up = caught_up;
        if let Some(record) = report.merged {
            slot.unsaved_places = Some(record);
        }
        self.save_places(slot).await;
        slot.initial_load_done = true;
        Ok(())
    }

    /// Records in the state directory the places merged through (`io::merged`), once the
    /// journal holds what they claim: it is synced first, so after any crash the record is
    /// at most as new as the journal. A failure is kept for the next pass and costs only
    /// reading again after a restart.
    async fn save_places(&self, slot: &mut IoSlot) {
        if slot.places_unsafe {
            slot.unsaved_places = None;
            return;
        }
        let Some(record) = slot.unsaved_places.take() else {
            return;
        };
        let saved = async {
            self.store
                .sync_journal()
                .await
                .map_err(|e| format!("journal sync: {e}"))?;
            let sync = self.store.fsync_policy() != FsyncPolicy::Never;
            let shared = Arc::clone(&self.shared);
            let written = record.clone();
            tokio::task::spawn_blocking(move || io::merged::write(&shared, &written, sync))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
        };
        if let Err(why) = saved.await {
            slot.unsaved_places = Some(record);
            if lock(&self.shared.logged_failures).insert("recording merged segments".to_owned()) {
                tracing::warn!(
                    dir = ?self.shared.settings.state_dir,
                    "the segments merged are not recorded in the state directory ({why}); \
                     retried each pass, a restart until then reads them again (logged once)"
                );
            } else {
                tracing::debug!(%why, "the segments merged are not recorded yet");
            }
        }
    }

    /// Publishes the own contributions not yet published, unless nothing changed since the
    /// last publish; then nothing touches the filesystem at all.
    async fn publish_if_changed(&self, slot: &mut IoSlot) -> Result<Written> {
        if !slot.initial_load_done {
            let why = match &slot.last_load_error {
                Some(cause) => format!(
                    "this node has not read what it published before, so it cannot tell what \
                     is new: {cause}"
                ),
                None => "the first load of the shared directory has not finished".to_owned(),
            };
            return Err(Error::SharedDirUnavailable(why));
        }
        // Count before map: a change landing in between is published next time.
        let changes = self.shared.own_changes.load(Ordering::Acquire);
        let published = self.shared.counters.published.load(Ordering::Relaxed) as usize;
        // Blobs held back by an earlier publish go out as soon as they can.
        let blobs_failing = self.shared.blobs_failing.load(Ordering::Acquire);
        if slot.last_published_changes == Some(changes) && !blobs_failing {
            self.shared
                .counters
                .skipped_unchanged
                .fetch_add(1, Ordering::Relaxed);
            return Ok(Written {
                path: self.shared.settings.dir.join(segments::SEGMENT_DIR),
                entries: published,
                bytes: 0,
                skipped_unchanged: true,
            });
        }
        let own = self.store.own_contributions();
        let own_tombstones = self.store.own_tombstones();
        let all_tombstones = self.store.tombstones();
        let report: WriteReport = self
            .run_job(slot, Operation::Write, |reply| IoJob::Write {
                own,
                own_tombstones,
                all_tombstones,
                reply,
            })
            .await?;
        slot.last_published_changes = Some(changes);
        self.shared
            .counters
            .published
            .store(report.published as u64, Ordering::Relaxed);
        if !report.wrote {
            self.shared
                .counters
                .skipped_unchanged
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(Written {
            path: report.path,
            entries: report.published,
            bytes: report.bytes,
            skipped_unchanged: !report.wrote,
        })
    }

    /// Keeps the snapshot health status current and logs when a job gets stuck or returns.
    async fn report_health(self, health: HealthReporter) {
        let mut reported_stuck = false;
        let stop = self.stop.clone();
        crate::report::health::report(health, HEALTH_SERVICE_NAME, HEALTH_POLL, stop, || {
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
            stuck.is_none()
                && self.shared.last_write_ok.load(Ordering::Relaxed)
                && !self.shared.blobs_failing.load(Ordering::Acquire)
        })
        .await;
    }
}

/// The snapshot writer's subscription to the store's change feed: counts the changes to
/// this node's own contributions (a Record, the tuner, or its own segment read back), so a
/// publish knows without looking whether there is anything new to write.
struct OwnChanges(std::sync::Weak<Shared>);

impl crate::store::ChangeListener for OwnChanges {
    fn entries_changed(&self, changes: &[crate::store::Change]) {
        if let Some(shared) = self.0.upgrade() {
            if changes.iter().any(|change| change.own) {
                shared.own_changes.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// A Forget made here is published like a contribution.
    fn forgotten(&self, forgets: &[crate::store::ForgetChange]) {
        if let Some(shared) = self.0.upgrade() {
            if forgets.iter().any(|forget| forget.source == Source::Forget) {
                shared.own_changes.fetch_add(1, Ordering::Release);
            }
        }
    }
}
