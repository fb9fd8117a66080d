//! The node's artifact store: the files a tuner built for a result (a compiled kernel, a
//! module), each held once under its SHA-256 digest, served by GetArtifact and fetched
//! lazily from the tiers below (the shared directory, Redis) when a held entry names a blob
//! this node lacks.
//!
//! [`Artifacts`] is the handle every caller shares. Its rules are one pure type
//! (`index::Index`: what is held, what a live entry names, what fits, what may be
//! collected; with `charges::Charges`, which uid each blob a live entry names is charged to);
//! its files are `disk`, always run on the blocking pool with a bounded wait, so
//! no request waits on the disk beyond it; uploads and downloads stream (`put`, `get`), and
//! neither ever holds a blob in memory; a rank on this node can instead be handed a
//! descriptor of a held blob's file (`handoff`: what is handed; the socket is
//! `crate::handoff`). `upkeep` verifies what a previous run left and
//! deletes blobs no live entry has named for `--artifact-grace-secs`.

mod charges;
mod disk;
mod error;
mod get;
mod handoff;
pub mod index;
mod put;
pub mod tiers;
mod upkeep;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::validate::InvalidField;
use crate::report::LogOnce;
use crate::store::{Change, ChangeListener};
use crate::wire::stored::StoredEntry;

#[cfg(test)]
pub use disk::BlobDir;
pub use disk::Partial;
pub use error::ArtifactError;
pub use get::Chunk;
pub use index::Limits;
pub use tiers::BlobSource;

/// How long one blocking file operation (a chunk written or read, an fsync, a rename) may
/// take before the request it serves is answered UNAVAILABLE.
const IO_WAIT: Duration = Duration::from_secs(60);

/// The store's typed settings (`config::Config::artifact_settings`).
#[derive(Clone, Debug)]
pub struct ArtifactSettings {
    pub state_dir: PathBuf,
    pub limits: Limits,
}

crate::report::stats_registry! {
    /// What the store counted, for Stats.
    #[derive(Default)]
    struct Counters {
        uploads: AtomicU64 as artifact_uploads
            => counter(113, "PutArtifact calls that stored a new blob."),
        uploads_already_held: AtomicU64 as artifact_uploads_already_held
            => counter(114, "PutArtifact calls answered already_held."),
        uploads_refused: AtomicU64 as artifact_uploads_refused
            => counter(115, "PutArtifact calls refused (digest, size or a limit)."),
        digest_failures: AtomicU64 as artifact_digest_failures => counter(
            116,
            "Blobs whose bytes did not hash to their digest: uploads, this node's disk, the tiers.",
        ),
        fetches_local: AtomicU64 as artifact_fetches_local
            => counter(117, "GetArtifact calls served from this node's store."),
        fetches_shared_dir: AtomicU64 as artifact_fetches_shared_dir
            => counter(118, "Blobs fetched from the shared directory into the store."),
        fetches_cluster: AtomicU64 as artifact_fetches_cluster
            => counter(119, "Blobs fetched from the Redis tier into the store."),
        fetches_bundle: AtomicU64 as artifact_fetches_bundle
            => counter(140, "Blobs taken from a bundle file into the store because a rank asked for them."),
        fetches_missing: AtomicU64 as artifact_fetches_missing
            => counter(120, "GetArtifact calls answered NOT_FOUND or UNAVAILABLE."),
        bytes_served: AtomicU64 as artifact_bytes_served
            => counter(121, "Bytes GetArtifact streamed."),
        bytes_read_from_tiers: AtomicU64 as artifact_bytes_read_from_tiers
            => counter(122, "Bytes read from the shared directory or Redis for blobs."),
        collections: AtomicU64 as artifact_collections
            => counter(123, "Unreferenced blobs deleted after --artifact-grace-secs."),
        bytes_over_blob_limit: AtomicU64 as artifact_bytes_over_blob_limit
            => counter(124, "Announced bytes of uploads refused by --max-artifact-bytes."),
        bytes_over_store_limit: AtomicU64 as artifact_bytes_over_store_limit
            => counter(125, "Bytes of uploads refused by --artifact-store-mib."),
        bytes_over_uid_limit: AtomicU64 as artifact_bytes_over_uid_limit
            => counter(126, "Bytes of uploads refused by --artifact-unreferenced-mib-per-uid."),
        bytes_over_uid_share: AtomicU64 as artifact_bytes_over_uid_store_limit
            => counter(134, "Bytes of uploads refused by --artifact-store-mib-per-uid."),
        fetches_over_store_limit: AtomicU64 as artifact_fetches_over_store_limit
            => counter(135, "Fetches from the tiers refused by --artifact-store-mib."),
        records_refused: AtomicU64 as artifact_records_refused
            => counter(129, "Records refused for naming a blob this node cannot serve."),
        handoffs: AtomicU64 as artifact_handoffs => counter(
            132,
            "Blobs handed to a rank on this node as a read-only descriptor (the handoff socket).",
        ),
        unnamed_by_expiry: AtomicU64 as artifacts_unnamed_by_expiry => counter(
            147,
            "Blobs no entry names any more because their entries expired.",
        ),
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The handle over the node's blob store.
pub struct Artifacts {
    dir: disk::BlobDir,
    index: Mutex<index::Index>,
    /// The index's clock: milliseconds since this handle was made.
    started: Instant,
    counters: Counters,
    /// The tiers below (their fetching sides), in `crate::tiers::TIER_ORDER`.
    sources: Vec<Arc<dyn BlobSource>>,
    /// Fetches from the tiers in progress, one per digest: later callers wait on the first's.
    fetches: Mutex<HashMap<String, tiers::FlightReceiver>>,
    logged: LogOnce,
    /// Where fetches from the tiers and the upkeep run.
    tasks: crate::tasks::Tasks,
    /// Wakes the upkeep for a collection scan now (a Forget removed entries, whose charges
    /// the scan ends).
    rescan: tokio::sync::Notify,
    /// Blobs named by entries that expired, not yet checked by a scan: those it finds no
    /// entry naming any more are counted as unnamed by expiry.
    expired_names: Mutex<std::collections::HashSet<String>>,
}

/// A Record's entries that name blobs, charged to its uid by the change feed while this is
/// held (`Artifacts::check_record`, `RecordCharges::hold_while`).
pub struct RecordCharges {
    artifacts: Arc<Artifacts>,
    uid: u32,
    entries: Vec<charges::EntryIds>,
}

impl RecordCharges {
    /// Runs `apply` (the Record's write) to its end, holding the charges until then. A write
    /// the store queued is applied whether or not its caller still waits, so when the Record
    /// names blobs it runs on a task of its own: a caller that goes away must not leave its
    /// entries live and charged to nobody.
    pub async fn hold_while<T: Send + 'static>(
        self,
        apply: impl std::future::Future<Output = Result<T, Error>> + Send + 'static,
    ) -> Result<T, Error> {
        if self.entries.is_empty() {
            return apply.await;
        }
        let (done, applied) = tokio::sync::oneshot::channel();
        let tasks = self.artifacts.tasks.clone();
        tasks.spawn(async move {
            let _held = self;
            let _ = done.send(apply.await);
        });
        // Dropped only when the daemon stops.
        applied.await.unwrap_or(Err(Error::WriterGone))
    }
}

impl Drop for RecordCharges {
    fn drop(&mut self) {
        if self.entries.is_empty() {
            return;
        }
        let mut index = crate::sync::lock(&self.artifacts.index);
        for ids in &self.entries {
            index.charges_mut().answered(self.uid, *ids);
        }
    }
}

impl Artifacts {
    /// Opens the store's directories (blocking: call off the runtime), with the tiers below
    /// it that a missing blob is fetched from (`sources`, asked in `crate::tiers::TIER_ORDER`
    /// whatever order they come in). Blobs a previous run left are held unverified until
    /// `upkeep` hashes them; none is served before it is.
    pub fn open(
        settings: &ArtifactSettings,
        mut sources: Vec<Arc<dyn BlobSource>>,
        tasks: &crate::tasks::Tasks,
    ) -> Result<Arc<Artifacts>, Error> {
        sources.sort_by_key(|source| source.kind().rank());
        let (dir, found) = disk::BlobDir::open(&settings.state_dir)
            .map_err(|e| Error::io("opening the artifact store", &settings.state_dir, e))?;
        let mut index = index::Index::new(settings.limits);
        for (digest, size) in found {
            index.found(digest, size, 0);
        }
        let limits = settings.limits;
        tracing::info!(
            max_artifact_bytes = limits.max_blob_bytes,
            artifact_store_bytes = limits.store_bytes,
            artifact_store_bytes_per_uid = limits.store_bytes_per_uid,
            artifact_unreferenced_bytes_per_uid = limits.unreferenced_bytes_per_uid,
            artifact_grace_secs = limits.grace_ms / 1000,
            blobs = index.len(),
            bytes = index.held_bytes(),
            "artifact store: one blob is at most --max-artifact-bytes, the store at most \
             --artifact-store-mib, what one uid's live entries name and its uploads at most \
             --artifact-store-mib-per-uid, of which its unreferenced uploads at most \
             --artifact-unreferenced-mib-per-uid; unreferenced blobs go after \
             --artifact-grace-secs"
        );
        Ok(Arc::new(Artifacts {
            dir,
            index: Mutex::new(index),
            started: Instant::now(),
            counters: Counters::default(),
            sources,
            fetches: Mutex::new(HashMap::new()),
            logged: LogOnce::default(),
            tasks: tasks.clone(),
            rescan: tokio::sync::Notify::new(),
            expired_names: Default::default(),
        }))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// `--artifact-grace-secs`, in milliseconds.
    pub fn grace_ms(&self) -> u64 {
        crate::sync::lock(&self.index).limits().grace_ms
    }

    /// The digests (and sizes) the live entries name, as the index knows them.
    pub fn named_digests(&self) -> Vec<(String, u64)> {
        crate::sync::lock(&self.index).named().collect()
    }

    /// The file of a held blob, for a tier that publishes it (the shared directory). `None`
    /// when this node does not hold it.
    pub fn held_path(&self, digest: &str) -> Option<PathBuf> {
        crate::sync::lock(&self.index)
            .blob(digest)
            .map(|_| self.dir.path_of(digest))
    }

    /// Refuses a Record that names a blob this node cannot serve (FAILED_PRECONDITION naming
    /// the entry, the artifact and the digest) or names it with another size
    /// (INVALID_ARGUMENT); otherwise keeps every blob it names for the grace period from now.
    /// Checked before anything of the batch is applied. Apply the Record through the answer
    /// (`RecordCharges::hold_while`): the entries it makes live are charged to `uid`. A
    /// Record is never refused for `uid`'s share: the blobs it names are held already, so it
    /// takes no room in the store (its uploads are what the share refuses).
    pub fn check_record(
        self: &Arc<Self>,
        uid: u32,
        entries: &[(CacheKey, TunedResult)],
    ) -> Result<RecordCharges, ArtifactError> {
        let mut charged = RecordCharges {
            artifacts: Arc::clone(self),
            uid,
            entries: Vec::new(),
        };
        if entries
            .iter()
            .all(|(_, result)| result.artifacts.is_empty())
        {
            return Ok(charged);
        }
        let now = self.now_ms();
        let mut index = crate::sync::lock(&self.index);
        for (i, (_, result)) in entries.iter().enumerate() {
            for (j, artifact) in result.artifacts.view().iter().enumerate() {
                let path = format!("entries[{i}].result.artifacts[{j}]");
                let refusal = match index.blob(artifact.sha256) {
                    None => ArtifactError::NotHeld {
                        path,
                        digest: artifact.sha256.to_owned(),
                    },
                    Some(blob) if blob.size != artifact.size => InvalidField::new(
                        format!("{path}.size"),
                        format!(
                            "{}, but blob {} is {} bytes",
                            artifact.size, artifact.sha256, blob.size
                        ),
                    )
                    .into(),
                    Some(_) => continue,
                };
                add(&self.counters.records_refused, 1);
                return Err(refusal);
            }
        }
        for (key, result) in entries {
            for artifact in result.artifacts.view().iter() {
                index.name(artifact.sha256, artifact.size, now);
            }
            if !result.artifacts.is_empty() {
                let ids = index.charges().hasher().ids(&key.view(), &result.view());
                index.charges_mut().asked(uid, ids);
                charged.entries.push(ids);
            }
        }
        Ok(charged)
    }

    /// StatArtifacts: the digests this node cannot serve now (it would fetch them).
    pub fn missing(&self, digests: &[String]) -> Result<Vec<String>, ArtifactError> {
        if digests.len() > crate::model::validate::MAX_BATCH {
            return Err(ArtifactError::Invalid(crate::model::validate::too_many(
                "sha256",
            )));
        }
        for (i, digest) in digests.iter().enumerate() {
            tunecache_proto::artifact::check_digest(digest)
                .map_err(|r| InvalidField::new(format!("sha256[{i}]"), r.to_string()))?;
        }
        let index = crate::sync::lock(&self.index);
        Ok(digests
            .iter()
            .filter(|digest| index.blob(digest).is_none())
            .cloned()
            .collect())
    }

    /// Runs a blocking file operation off the runtime, answering UNAVAILABLE if it does not
    /// return within `IO_WAIT` (a hung disk).
    async fn blocking<T: Send + 'static>(
        what: &'static str,
        op: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> Result<T, ArtifactError> {
        let path = Path::new("artifacts");
        let error = match tokio::time::timeout(IO_WAIT, tokio::task::spawn_blocking(op)).await {
            Ok(Ok(Ok(value))) => return Ok(value),
            Ok(Ok(Err(error))) => Error::io(what, path, error),
            Ok(Err(join)) => Error::io(what, path, std::io::Error::other(join)),
            Err(_) => Error::io(
                what,
                path,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer from the disk within {IO_WAIT:?}"),
                ),
            ),
        };
        Err(error.into())
    }

    /// A held blob whose bytes do not hash to its digest: dropped and counted, never served.
    async fn drop_corrupt(&self, digest: &str) {
        add(&self.counters.digest_failures, 1);
        if self.logged.first(format!("corrupt {digest}")) {
            tracing::warn!(
                digest,
                "a held blob's bytes do not hash to its digest: dropped (fetched again from \
                 the tiers when asked; logged once per blob, Stats counts \
                 artifact_digest_failures)"
            );
        }
        if crate::sync::lock(&self.index)
            .begin_delete(digest)
            .is_none()
        {
            return;
        }
        let (dir, name) = (self.dir.clone(), digest.to_owned());
        if Self::blocking("removing a corrupt blob", move || dir.remove(&name))
            .await
            .is_ok()
        {
            crate::sync::lock(&self.index).deleted(digest);
        }
    }
}

crate::report::stats_registry! {
    /// The store's Stats fields: what it holds, its bounds, and what it counted.
    impl FillStats for Artifacts {
        fn fill_stats(artifacts, stats) {
            let (blobs, bytes, limits) = {
                let index = crate::sync::lock(&artifacts.index);
                (index.len() as u64, index.held_bytes(), index.limits())
            };
        }
        include Counters = artifacts.counters;
        fields {
            artifact_blobs_held = blobs => gauge(111, "Artifact blobs held in this node's store."),
            artifact_bytes_held = bytes => gauge(112, "Bytes of the artifact blobs held."),
            max_artifact_bytes = limits.max_blob_bytes
                => gauge(127, "The largest blob this node stores (--max-artifact-bytes)."),
            artifact_store_bytes = limits.store_bytes
                => gauge(128, "The artifact store's bound in bytes (--artifact-store-mib)."),
            artifact_store_bytes_per_uid = limits.store_bytes_per_uid => gauge(
                133,
                "One uid's share of the artifact store in bytes (--artifact-store-mib-per-uid).",
            ),
        }
    }
}

/// The change feed names the blobs of every entry that reaches the cache (a Record, a peer's
/// segment, Redis), so a GetArtifact of one this node lacks is fetched, and collection keeps
/// it; and it tells the charges which entry is now its key's live one (charged to the uid
/// whose Record asked for it, else to nobody).
impl ChangeListener for Artifacts {
    fn entries_changed(&self, changes: &[Change]) {
        let now = self.now_ms();
        let mut index = crate::sync::lock(&self.index);
        for change in changes.iter().filter(|c| c.in_cache) {
            let (key, result) = change.entry.views();
            for artifact in result.artifacts.iter() {
                index.name(artifact.sha256, artifact.size, now);
            }
            if !index.charges().is_idle() {
                let ids = index.charges().hasher().ids(&key, &result);
                let named = result.artifacts.iter();
                let digests = named.map(|artifact| (artifact.sha256.to_owned(), artifact.size));
                index.charges_mut().live(ids, digests);
            }
        }
    }

    /// A Forget removed entries (the feed names no entry it removed): the next collection
    /// scan, now, ends their charges.
    fn forgotten(&self, _forgets: &[crate::store::ForgetChange]) {
        self.rescan.notify_one();
    }

    /// Entries expired: the blobs they named may be unnamed now, which the next collection
    /// scan, now, finds (and collects after the grace period, as any unnamed blob).
    fn expired(&self, entries: &[StoredEntry]) {
        let mut names = crate::sync::lock(&self.expired_names);
        for entry in entries {
            names.extend(entry.result().artifacts.iter().map(|a| a.sha256.to_owned()));
        }
        self.rescan.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::artifacts::ArtifactList;
    use crate::store::Source;
    use crate::wire::stored::StoredEntry;
    use tunecache_proto::v1;

    const MIB: u64 = 1024 * 1024;

    /// A Record naming a held blob whose caller goes away before the store applies it (a
    /// queued write is applied anyway) is still charged to its uid: otherwise a caller could
    /// make its entries live and charged to nobody by hanging up.
    #[tokio::test]
    async fn a_record_whose_caller_went_away_is_still_charged_to_it() {
        let state = tempfile::tempdir().unwrap();
        let settings = ArtifactSettings {
            state_dir: state.path().to_path_buf(),
            limits: Limits {
                max_blob_bytes: 8 * MIB,
                store_bytes: 64 * MIB,
                store_bytes_per_uid: 16 * MIB,
                unreferenced_bytes_per_uid: 16 * MIB,
                grace_ms: 1_000,
            },
        };
        let tasks = crate::tasks::Tasks::new();
        let artifacts = Artifacts::open(&settings, Vec::new(), &tasks).unwrap();
        let digest = "ab".repeat(32);
        crate::sync::lock(&artifacts.index).insert(digest.clone(), 4 * MIB, Some(7), 0);
        let key = crate::model::testing::key("p");
        let result = TunedResult {
            artifacts: ArtifactList::from_wire(vec![v1::Artifact {
                name: "k.so".into(),
                sha256: digest,
                size: 4 * MIB,
            }]),
            ..crate::model::testing::result(1.0)
        };
        let charges = artifacts
            .check_record(7, &[(key.clone(), result.clone())])
            .unwrap();
        // The store's writer, which applies the queued write once released (the change feed
        // tells it) whether or not the Record still waits for it.
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (applied, wait_applied) = tokio::sync::oneshot::channel::<()>();
        let writer = Arc::clone(&artifacts);
        tokio::spawn(async move {
            let _ = released.await;
            writer.entries_changed(&[Change {
                entry: StoredEntry::new(&key, &result),
                source: Source::Record { lease: None },
                in_cache: true,
                own: true,
            }]);
            let _ = applied.send(());
        });
        let apply = async move {
            let _ = wait_applied.await;
            Ok(())
        };
        // The caller goes away while the write waits in the queue.
        let gone = tokio::time::timeout(Duration::from_millis(10), charges.hold_while(apply));
        assert!(gone.await.is_err());
        release.send(()).unwrap();
        let charged = || crate::sync::lock(&artifacts.index).charges().bytes_of(7);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while charged() != 4 * MIB {
            assert!(std::time::Instant::now() < deadline, "never charged");
            tokio::task::yield_now().await;
        }
    }
}
