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
//! - `uses`: this node's uses of keys (its ranks' reads, repeated Records), told by the
//!   change feed and published in the next segment's `used` list, so every node that holds
//!   a key keeps it as long as any node uses it (`model::lifecycle`).
//! - `blobs`: the artifact blobs under `v2/artifacts/`, published before the segments that
//!   name them and fetched lazily as a tier of the artifact store.
//! - `Unstarted`: the tier built from its settings, its blob fetching side ready for the
//!   artifact store; `Unstarted::start` starts it.
//! - `periodic`: the periodic load-then-publish loop (one `pass` each), a task of the
//!   daemon's (`tasks`) that ends when the daemon stops, and the tier as the daemon's tier
//!   list sees it (`crate::tiers::Tier`: health, resume point, the last publish).
//!   Shutdown never waits for the I/O thread: if it is stuck in the kernel, the process
//!   exits around it.

mod blobs;
pub mod format;
mod io;
mod pass;
mod periodic;
mod plan;
pub mod segments;
pub(crate) mod shared_file;
mod stats;
mod uses;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tunecache_proto::v1;

use crate::error::{Error, Result};
use crate::model::entry::unix_now_ms;
use crate::store::{Source, Store};
use crate::sync::lock;
use crate::tasks::Tasks;

use io::{IoJob, IoWorker};
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
    /// Changes to this node's own contributions, its local uses of keys and expiries, counted
    /// by the store's change feed; a publish with the count unchanged since the last one has
    /// nothing to write.
    own_changes: AtomicU64,
    /// Local uses of keys not yet published, and entries expiry dropped (`uses`).
    uses: uses::PendingUses,
    settings: SnapshotSettings,
    /// The node's artifact store: the blobs a publish links in before its segment.
    artifacts: Arc<crate::artifacts::Artifacts>,
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
    /// The health poll last found a job stuck (so it logs each change once).
    reported_stuck: AtomicBool,
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

/// The shared-directory tier built from its settings and not started yet: its fetching
/// side (`blob_source`) exists already, so the artifact store can be opened with it before
/// `start` hands the tier that store.
pub struct Unstarted {
    settings: SnapshotSettings,
    blobs: Arc<blobs::SharedDirBlobs>,
}

impl Unstarted {
    /// Checks the settings; makes no filesystem call.
    pub fn new(settings: SnapshotSettings) -> Result<Unstarted> {
        if let Err(why) = crate::model::names::check_node_name(&settings.node) {
            return Err(Error::InvalidNodeName(why));
        }
        // Blobs a held entry names and this node lacks are fetched from `v2/artifacts/`.
        let blobs = Arc::new(blobs::SharedDirBlobs::new(
            &settings.dir.join(segments::SEGMENT_DIR),
            &settings.writer_uids,
            settings.key.is_some(),
            Arc::new(blobs::Squats::default()),
        ));
        Ok(Unstarted { settings, blobs })
    }

    /// The tier's fetching side, for the artifact store.
    pub fn blob_source(&self) -> Arc<dyn crate::artifacts::BlobSource> {
        self.blobs.clone()
    }

    /// Starts the I/O thread and the periodic load-then-publish loop (`periodic`), a task of
    /// the daemon's. Makes no filesystem call itself, so a hung shared directory cannot delay
    /// the daemon's start.
    pub fn start(
        self,
        store: Store,
        artifacts: Arc<crate::artifacts::Artifacts>,
        tasks: &Tasks,
    ) -> Result<SnapshotHandle> {
        let Unstarted { settings, blobs } = self;
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
        let shared = Arc::new(Shared {
            own_changes: AtomicU64::new(0),
            uses: uses::PendingUses::default(),
            settings,
            artifacts,
            counters: SnapshotCounters::default(),
            last_error: Mutex::new(String::new()),
            in_flight: Mutex::new(None),
            job_outstanding: AtomicBool::new(false),
            last_write_ok: AtomicBool::new(true),
            logged_failures: Mutex::new(HashSet::new()),
            squats: blobs.squats(),
            blobs_failing: AtomicBool::new(false),
            shutdown_publish: Mutex::new(String::new()),
            merged_write: Mutex::new(()),
            reported_stuck: AtomicBool::new(false),
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
        let handle = SnapshotHandle {
            shared,
            slot: Arc::new(tokio::sync::Mutex::new(slot)),
            store,
            stop: tasks.stop_token(),
        };
        tasks.spawn(handle.clone().run_periodic());
        Ok(handle)
    }
}

impl SnapshotHandle {
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

    /// The job that has run longer than `STUCK_AFTER`, if any.
    fn stuck(&self) -> Option<(Operation, i64)> {
        lock(&self.shared.in_flight)
            .as_ref()
            .filter(|in_flight| in_flight.started.elapsed() >= STUCK_AFTER)
            .map(|in_flight| (in_flight.operation, in_flight.since_unix_ms))
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
}

/// The snapshot writer's subscription to the store's change feed: counts the changes to
/// this node's own contributions (a Record, the tuner, or its own segment read back) and its
/// local uses of keys, so a publish knows without looking whether there is anything new to
/// write; keeps the uses for the next segment and the entries expiry dropped (`uses`).
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

    /// A use made here goes out in the next segment, even one with no new entry.
    fn used(&self, uses: &[crate::store::UseChange]) {
        if let Some(shared) = self.0.upgrade() {
            if shared.uses.note(uses) {
                shared.own_changes.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// What expired stops counting as published, so no compaction carries it again; the
    /// next pass's publish job takes them (and so they are not held long).
    fn expired(&self, entries: &[crate::wire::stored::StoredEntry]) {
        if let Some(shared) = self.0.upgrade() {
            if !entries.is_empty() {
                shared.uses.note_expired(entries);
                shared.own_changes.fetch_add(1, Ordering::Release);
            }
        }
    }
}
