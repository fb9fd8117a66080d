//! The Redis cluster tier: nodes share results through one Redis (a server, Sentinel-managed
//! primary or Redis Cluster), so a result tuned anywhere becomes a local hit everywhere,
//! and a missing key is tuned once per cluster (see `lease`).
//!
//! Off the request path entirely: the store's change feed fills a bounded publish queue that
//! a task drains in pipelined batches (`publish`); a follower task bootstraps from Redis,
//! then reads the stream of published winners and applies them to the store (`follow`).
//! Entries learned this way are not republished. Redis being slow, hung or gone only makes
//! Resolve fall back to node-local coordination after the cluster timeout.
//!
//! Built in two steps (`Unstarted`): from its settings, the link to Redis and the blob
//! fetching side the artifact store is opened with; then started with that store. A
//! `Cluster` keeps each concern in a struct of its own: the Redis it talks to (`Redis`,
//! shared with the fetching side), the publish queue, the follower's places, its tuning and
//! what it has observed. As one of the daemon's tiers it is `tier`.

mod backoff;
mod blobs;
mod checkpoint;
mod follow;
mod forget;
pub mod keys;
mod lease;
mod lifecycle;
mod link;
pub mod memory;
mod places;
mod publish;
mod refusals;
mod scripts;
mod stats;
mod tier;
mod tombstone_expiry;
mod values;
pub(crate) mod views;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::IntoConnectionInfo;

use crate::artifacts::Artifacts;
use crate::error::{TierError, TierResult};
use crate::model::entry::{CacheKey, TunedResult};
use crate::model::lifecycle::Day;
use crate::store::{Change, ChangeListener, Source, Store, StoredEntry, UseChange};
use crate::tasks::Tasks;
pub use stats::ClusterCounters;

pub use lease::{Claim, ClusterLease};
pub use link::LinkState;

/// What the `--cluster-*` flags say.
#[derive(Clone)]
pub struct ClusterSettings {
    pub info: redis::ConnectionInfo,
    pub shown_url: String,
    pub prefix: String,
    pub timeout: Duration,
    pub lease_ttl: Duration,
    pub node_name: String,
    /// PEM certificates to verify a `rediss://` server with, instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// Most keys the publish queue holds while Redis is away.
    pub publish_queue: usize,
    /// Messages each shard's stream keeps (approximately); a node further behind reads the
    /// shard again.
    pub stream_max_len: u64,
    /// How often the audit compares this node with Redis (besides after every reconnect).
    pub audit_interval: Duration,
    /// Tests only (`--cluster-clock-offset-ms`): added to this node's clock as the tier
    /// reads it.
    pub clock_offset_ms: i64,
    /// Where this node keeps its stream places (`places`); none: it keeps none.
    pub state_dir: Option<std::path::PathBuf>,
    /// The journal replayed whole, so saved places can be believed.
    pub places_trusted: bool,
    /// `--cluster-checkpoint-every` (0: automatic).
    pub checkpoint_every: u64,
    /// How often a node looks for checkpoints to rebuild (jittered by half).
    pub checkpoint_check: Duration,
    /// `--cluster-key-file`: checkpoints carry MACs under it, and need them to be loaded.
    pub key: Option<crate::model::shared_key::SharedKey>,
    /// `--cluster-max-artifact-bytes`: larger blobs stay on the node and the shared directory.
    pub blob_limit_bytes: u64,
}

/// The defaults of the settings above that have one.
pub const DEFAULT_PUBLISH_QUEUE: usize = 100_000;
pub const DEFAULT_STREAM_MAX_LEN: u64 = 10_000;
pub const DEFAULT_AUDIT_SECS: u64 = 600;
pub const DEFAULT_CHECKPOINT_CHECK_MS: u64 = 10_000;

impl ClusterSettings {
    /// Checks the `--cluster-*` values `Config::cluster_settings` hands over: the URL parses,
    /// the password file reads, the prefix is a usable key prefix. The password comes from the
    /// URL or the password file and never appears in `shown_url`. The CA file, when given,
    /// must hold at least one PEM certificate and needs a `rediss://` URL.
    pub fn new(
        url: &str,
        password_file: Option<&Path>,
        tls_ca_file: Option<&Path>,
        prefix: String,
        timeout: Duration,
        lease_ttl: Duration,
        node_name: String,
    ) -> crate::Result<ClusterSettings> {
        let bad = |why: String| crate::Error::ClusterConfig(why);
        let mut info = url.into_connection_info().map_err(|e| {
            bad(format!(
                "--cluster-url: {}",
                e.to_string().replace(url, "<url>")
            ))
        })?;
        if let Some(path) = password_file {
            info.redis.password = Some(read_password(path).map_err(|e| bad(e.to_string()))?);
        }
        let tls_ca = match tls_ca_file {
            None => None,
            Some(path) => {
                if !matches!(info.addr, redis::ConnectionAddr::TcpTls { .. }) {
                    return Err(bad(
                        "--cluster-tls-ca-file needs a rediss:// --cluster-url".to_owned()
                    ));
                }
                Some(read_ca(path).map_err(|e| bad(e.to_string()))?)
            }
        };
        keys::check_prefix(&prefix).map_err(|e| bad(e.to_string()))?;
        Ok(ClusterSettings {
            shown_url: link::shown_url(&info),
            info,
            prefix,
            timeout,
            lease_ttl,
            node_name,
            tls_ca,
            publish_queue: DEFAULT_PUBLISH_QUEUE,
            stream_max_len: DEFAULT_STREAM_MAX_LEN,
            audit_interval: Duration::from_secs(DEFAULT_AUDIT_SECS),
            clock_offset_ms: 0,
            state_dir: None,
            places_trusted: true,
            checkpoint_every: 0,
            checkpoint_check: Duration::from_millis(DEFAULT_CHECKPOINT_CHECK_MS),
            key: None,
            blob_limit_bytes: tunecache_proto::artifact::DEFAULT_CLUSTER_MAX_ARTIFACT_BYTES,
        })
    }
}

fn read_ca(path: &Path) -> TierResult<Vec<u8>> {
    let pem = std::fs::read(path).map_err(|e| TierError::io("--cluster-tls-ca-file", path, e))?;
    if !pem
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .any(|w| w == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(TierError::Config(format!(
            "--cluster-tls-ca-file {}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(pem)
}

fn read_password(path: &Path) -> TierResult<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TierError::io("--cluster-password-file", path, e))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}

/// The publish queue: the newest changed result per key, bounded. On overflow it is cleared
/// and a full republish is scheduled instead (bounded work, nothing lost for good).
#[derive(Default)]
struct Pending {
    entries: HashMap<CacheKey, TunedResult>,
}

/// The Redis this tier talks to, shared with its blob fetching side (`blobs::ClusterBlobs`,
/// built before the artifact store opens): the connection, where each key lives, and the
/// keys found holding another type than that layout says.
pub struct Redis {
    link: Arc<link::Link>,
    layout: keys::Layout,
    wrong_types: refusals::WrongTypes,
}

impl Redis {
    /// The link from `settings` (it connects once its task runs, `Link::run`).
    fn new(settings: &ClusterSettings) -> Arc<Redis> {
        Arc::new(Redis {
            link: link::Link::new(
                settings.info.clone(),
                settings.shown_url.clone(),
                settings.tls_ca.clone(),
            ),
            layout: keys::Layout::new(&settings.prefix),
            wrong_types: refusals::WrongTypes::default(),
        })
    }
}

/// What this node has to publish and the publisher's state: the change feed fills it, the
/// publisher (`publish`) drains it.
struct PublishQueue {
    pending: Mutex<Pending>,
    /// Tombstones of this node's Forgets waiting to be published (few: administrators'
    /// acts and broken-config reports; bounded by `limit`).
    forgets: Mutex<Vec<crate::model::forget::Tombstone>>,
    /// Most keys `pending` holds (`--cluster-publish-queue`).
    limit: usize,
    wake: tokio::sync::Notify,
    /// Set when every local winner must be published again (queue overflow, flushed server).
    republish_all: AtomicBool,
    /// Entries the publisher took from the queue and Redis has not yet answered for.
    publishing: AtomicUsize,
}

/// The follower's places in the shards' streams, its resume point (`places`).
struct FollowerPlaces {
    /// Where they are kept; none: nowhere.
    state_dir: Option<std::path::PathBuf>,
    /// The journal replayed whole, so the saved places can be believed.
    trusted: bool,
    /// A learned batch the store refused (a full disk): no place is saved this run.
    unsafe_to_save: AtomicBool,
    /// The newest places whose entries are all applied: saved at shutdown.
    latest: Mutex<Option<places::SavedPlaces>>,
}

/// How the tier treats Redis, fixed for the run (from `ClusterSettings`).
struct Tuning {
    /// How long a command may take before the tier falls back (Resolve, pins).
    timeout: Duration,
    lease_ttl: Duration,
    stream_max_len: u64,
    audit_interval: Duration,
    /// Tests only: added to this node's clock as the tier reads it.
    clock_offset_ms: i64,
    checkpoint_every: u64,
    checkpoint_check: Duration,
    /// The cluster's key (`--cluster-key-file`): checkpoints are built with MACs under it and
    /// loaded only with MACs that verify.
    key: Option<crate::model::shared_key::SharedKey>,
}

/// What the tier has found about Redis while it runs, for Stats and health.
#[derive(Default)]
struct Observed {
    /// Claims in a row that ran out of time (three log a warning).
    slow_claims: AtomicU64,
    bootstrapped: AtomicBool,
    /// Values read from Redis that a client's request could not carry, per source.
    refusals: refusals::Refusals,
    /// This node's clock minus Redis's `TIME` at the last reading (`forget::load_all`).
    clock_skew_ms: AtomicI64,
    /// The skew is over `forget::MAX_CLOCK_SKEW`: no tombstone is expired from Redis.
    prune_paused: AtomicBool,
}

/// The cluster tier, built whole by `Unstarted::start`: each concern a struct of its own.
pub struct Cluster {
    /// The Redis it talks to (shared with the blob fetching side).
    redis: Arc<Redis>,
    store: Store,
    /// Artifact blobs in Redis (`blobs`).
    blobs: blobs::BlobTier,
    queue: PublishQueue,
    /// Last uses to carry to Redis, expired entries to delete there (`lifecycle`).
    lifecycle: lifecycle::LifecycleQueue,
    places: FollowerPlaces,
    tuning: Tuning,
    observed: Observed,
    pub counters: ClusterCounters,
    node_name: String,
    prefix: String,
    /// Random per daemon run: tokens and stream messages carry it.
    instance: u64,
    /// Numbers this run's lease tokens.
    token_counter: AtomicU64,
    /// Where its tasks run (renewals, releases), also when started off the runtime.
    tasks: Tasks,
}

/// A random number from the OS (`getrandom`), for ids, tokens and jitter; time and pid if
/// the OS source fails.
fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        now ^ u64::from(std::process::id()).rotate_left(32)
    })
}

/// The cluster tier built from its settings and not started yet: its link to Redis and its
/// blob fetching side exist already (no connection is made), so the artifact store can be
/// opened with that side before `start` hands the tier the store.
pub struct Unstarted {
    settings: ClusterSettings,
    redis: Arc<Redis>,
}

impl Unstarted {
    pub fn new(settings: ClusterSettings) -> Unstarted {
        let redis = Redis::new(&settings);
        Unstarted { settings, redis }
    }

    /// Redis as a tier the artifact store fetches blobs from.
    pub fn blob_source(&self) -> Arc<dyn crate::artifacts::BlobSource> {
        Arc::new(blobs::ClusterBlobs(Arc::clone(&self.redis)))
    }

    /// Starts the tier in the background (connector, publisher, follower, the renewal of its
    /// blobs) and registers it on the store's change feed; the blobs of `artifacts` up to
    /// `--cluster-max-artifact-bytes` are written to Redis before the entries naming them are
    /// announced. Never waits for Redis.
    pub fn start(self, store: Store, artifacts: Arc<Artifacts>, tasks: &Tasks) -> Arc<Cluster> {
        let Unstarted { settings, redis } = self;
        let blob_limit = settings.blob_limit_bytes;
        let cluster = Arc::new(Cluster {
            redis: Arc::clone(&redis),
            store: store.clone(),
            blobs: blobs::BlobTier::new(artifacts, blob_limit),
            queue: PublishQueue {
                pending: Mutex::default(),
                forgets: Mutex::default(),
                limit: settings.publish_queue.max(1),
                wake: tokio::sync::Notify::new(),
                republish_all: AtomicBool::new(false),
                publishing: AtomicUsize::new(0),
            },
            lifecycle: lifecycle::LifecycleQueue::new(settings.publish_queue),
            places: FollowerPlaces {
                state_dir: settings.state_dir.clone(),
                trusted: settings.places_trusted,
                unsafe_to_save: AtomicBool::new(false),
                latest: Mutex::default(),
            },
            tuning: Tuning {
                timeout: settings.timeout,
                lease_ttl: settings.lease_ttl,
                stream_max_len: settings.stream_max_len.max(1),
                audit_interval: settings.audit_interval,
                clock_offset_ms: settings.clock_offset_ms,
                checkpoint_every: settings.checkpoint_every,
                checkpoint_check: settings.checkpoint_check,
                key: settings.key.clone(),
            },
            observed: Observed::default(),
            counters: ClusterCounters::default(),
            node_name: settings.node_name,
            prefix: settings.prefix.clone(),
            instance: random_u64(),
            token_counter: AtomicU64::new(0),
            tasks: tasks.clone(),
        });
        store.add_change_listener(Arc::new(ChangeFeed(Arc::downgrade(&cluster))));
        tracing::info!(
            url = %settings.shown_url,
            prefix = %settings.prefix,
            timeout_ms = settings.timeout.as_millis() as u64,
            publish_queue_limit = settings.publish_queue,
            stream_max_len = settings.stream_max_len,
            audit_secs = settings.audit_interval.as_secs(),
            checkpoint_macs = settings.key.is_some(),
            "cluster tier on"
        );
        tracing::info!(
            cluster_max_artifact_bytes = blob_limit,
            "cluster tier: blobs up to --cluster-max-artifact-bytes go to Redis"
        );
        tasks.spawn(Arc::clone(&redis.link).run(tasks.stop_token()));
        tasks.spawn(publish::run(Arc::clone(&cluster), tasks.stop_token()));
        tasks.spawn(forget::run(Arc::clone(&cluster), tasks.stop_token()));
        tasks.spawn(follow::run(Arc::clone(&cluster), tasks.stop_token()));
        tasks.spawn(blobs::run_keeper(Arc::clone(&cluster), tasks.stop_token()));
        cluster
    }
}

impl Cluster {
    pub fn state(&self) -> LinkState {
        self.redis.link.state()
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Another daemon publishes under this node's name (a second daemon given the same
    /// `--node-name`): counted, and logged once.
    pub(crate) fn name_taken_by(&self, other: &str) {
        if self.counters.name_conflicts.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                node = %self.node_name,
                other = %other,
                "cluster tier: another daemon publishes under this node's name (the same \
                 --node-name given twice); give each daemon its own"
            );
        }
    }

    /// This node's clock (unix ms) as the tier reads it.
    pub(crate) fn node_now_ms(&self) -> i64 {
        crate::model::entry::unix_now_ms().saturating_add(self.tuning.clock_offset_ms)
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn node_id(&self) -> String {
        format!("{}/{:016x}", self.node_name, self.instance)
    }

    /// A command on connection `generation` failed: a key of the wrong type (one of `keys`)
    /// is named and gone on without; anything else drops the connection (and backs off).
    pub(crate) fn command_failed(&self, generation: u64, error: &redis::RedisError, keys: &[&str]) {
        if refusals::is_wrong_type(error) {
            self.redis
                .wrong_types
                .found(refusals::wrong_typed_key(error, keys));
        } else {
            self.redis.link.failed(generation, error);
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        crate::sync::lock(&self.queue.pending)
    }

    /// Applies entries learned from Redis, each with the last use Redis knew (`u`; 0: none),
    /// to the store without publishing them back. Those already expired on arrival are
    /// deleted from Redis too (`lifecycle`).
    pub(crate) async fn apply_learned(&self, entries: Vec<(CacheKey, TunedResult, Day)>) -> u32 {
        if entries.is_empty() {
            return 0;
        }
        self.expire_arrivals(&entries);
        // Learned, not this node's own contributions: snapshots do not republish them, and
        // the change feed tells this tier they came from it, so it does not either.
        let outcome = self
            .store
            .apply_learned_used(entries, Source::Cluster)
            .await;
        match outcome {
            Ok(outcome) => {
                self.counters
                    .received
                    .fetch_add(u64::from(outcome.stored), Ordering::Relaxed);
                outcome.stored
            }
            Err(error) => {
                // Their places move on all the same: saved, they would claim entries the
                // journal lacks. None is saved this run (the audit repairs the cache).
                if !self.places.unsafe_to_save.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%error, "cluster tier: storing entries learned from redis failed; stream places are no longer saved this run");
                }
                0
            }
        }
    }

    /// Every local winner is to be published again (flushed server, queue overflow).
    fn schedule_republish_all(&self) {
        self.queue.republish_all.store(true, Ordering::Relaxed);
        self.queue.wake.notify_one();
    }

    /// Queues results for publishing (the audit found Redis lacking them), as the change
    /// feed does, within the queue's bound.
    fn queue_for_publish(&self, entries: Vec<(CacheKey, TunedResult)>) {
        let mut pending = self.lock_pending();
        for (key, result) in entries {
            if !self.admit(&mut pending, &key) {
                break;
            }
            pending.entries.insert(key, result);
        }
        drop(pending);
        self.queue.wake.notify_one();
    }

    /// Whether `key` fits in the queue. When it does not, the queue is cleared and every
    /// winner will be republished instead (bounded memory, nothing lost for good).
    fn admit(&self, pending: &mut Pending, key: &CacheKey) -> bool {
        if pending.entries.len() < self.queue.limit || pending.entries.contains_key(key) {
            return true;
        }
        let dropped = pending.entries.len() as u64;
        pending.entries.clear();
        self.counters
            .publish_dropped
            .fetch_add(dropped, Ordering::Relaxed);
        if !self.queue.republish_all.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limit = self.queue.limit,
                "cluster tier: publish queue full; will republish every winner once redis keeps up"
            );
        }
        false
    }

    fn link_url(&self) -> String {
        self.redis.link.shown_url().to_owned()
    }
}

/// The store's change feed into the publish queue and the lifecycle's queues. Runs on the
/// writer thread: it only takes short locks and never blocks on Redis.
struct ChangeFeed(std::sync::Weak<Cluster>);

impl ChangeListener for ChangeFeed {
    fn entries_changed(&self, changes: &[Change]) {
        let Some(cluster) = self.0.upgrade() else {
            return;
        };
        let mut pending = cluster.lock_pending();
        let mut queued = false;
        // What this tier brought from Redis is there already: only the rest is published.
        let news = changes
            .iter()
            .filter(|change| change.in_cache && change.source != Source::Cluster);
        for change in news {
            let (key, result) = change.entry.to_pair();
            if cluster.admit(&mut pending, &key) {
                pending.entries.insert(key, result);
                queued = true;
            }
        }
        drop(pending);
        if queued || cluster.queue.republish_all.load(Ordering::Relaxed) {
            cluster.queue.wake.notify_one();
        }
    }

    /// Forgets asked of this node go to Redis; those learned elsewhere are there already
    /// (or in the shared directory, whose writer announces them itself).
    fn forgotten(&self, forgets: &[crate::store::ForgetChange]) {
        let Some(cluster) = self.0.upgrade() else {
            return;
        };
        let mut pending = crate::sync::lock(&cluster.queue.forgets);
        for forget in forgets.iter().filter(|f| f.source == Source::Forget) {
            if pending.len() >= cluster.queue.limit {
                // Bounded: the full republish publishes every tombstone this node holds.
                pending.clear();
                cluster.queue.republish_all.store(true, Ordering::Relaxed);
                break;
            }
            pending.push(forget.tombstone.clone());
        }
        drop(pending);
        cluster.queue.wake.notify_one();
    }

    /// This node's uses go to Redis; those a tier reported are there already.
    fn used(&self, uses: &[UseChange]) {
        if let Some(cluster) = self.0.upgrade() {
            cluster.queue_uses(uses);
        }
    }

    /// What this node's sweep expired is deleted from Redis, unless used elsewhere since.
    fn expired(&self, entries: &[StoredEntry]) {
        if let Some(cluster) = self.0.upgrade() {
            cluster.queue_expired(entries);
        }
    }
}
