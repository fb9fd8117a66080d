//! Owns the tunecache side of the comparison: how the benchmark workload (the same keys the
//! file-lock peer writes) maps onto daemon keys and results, the rank's "load" (Scan, then
//! parse what it received into its in-memory view), and [`TunecacheSystem`], the
//! [`SystemUnderTest`] that starts a real `tunecached` whose `--shared-dir` is the scenario
//! directory (the filesystem under test) while its socket and state stay on local disk.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tunecache_client::{proto as v1, Client};

use crate::cache_file::{CacheEntry, Section};
use crate::daemon::{DaemonConfig, DaemonProcess};
use crate::scenario::{create_scenario_dir, ScenarioError, ScenarioSpec, SystemUnderTest};
use crate::workload::{
    rank_entry, rank_key, shared_count, shared_entry, shared_key, tuned_entries, EXISTING_EPOCH,
};

/// Namespace of every benchmark entry.
pub const NAMESPACE: &str = "trtllm";
/// Device fingerprint of every benchmark entry (the same made-up GPU the peer writes).
pub const DEVICE: &str = "NVIDIA H100 80GB HBM3|sm_90|cuda 12.8";
/// Op of the shared (MoE) entries and of the rank-specific (GEMM) entries.
pub const SHARED_OP: &str = "trtllm::fused_moe";
pub const RANK_OP: &str = "trtllm::fp8_block_scale_gemm";
/// Node name of the scenario daemon; its segments are `<dir>/v2/<NODE>.<first>-<last>.seg.json`.
pub const NODE_NAME: &str = "bench-node";
/// Most entries per Record call (the daemon's batch limit).
pub const RECORD_BATCH: usize = 10_000;
/// Deadline of the Snapshot RPC the scenario's `finish` sends; generous on a slow mount.
const SNAPSHOT_DEADLINE: Duration = Duration::from_secs(120);
/// A fixed timestamp keeps results deterministic (the merge rule compares it last).
const TUNED_AT_UNIX_MS: i64 = 1_700_000_000_000;

/// The config text the daemon stores for a peer entry: the peer's `runner_id` and `tactic`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct TacticConfig {
    runner_id: i64,
    tactic: String,
}

/// One workload entry as a daemon entry; `rank: None` is shared by all ranks.
pub fn daemon_entry(key: &str, entry: &CacheEntry, rank: Option<u32>) -> v1::Entry {
    let config = TacticConfig {
        runner_id: entry.runner_id,
        tactic: entry.tactic.clone(),
    };
    v1::Entry {
        key: Some(v1::Key {
            namespace: NAMESPACE.to_owned(),
            op: if rank.is_some() { RANK_OP } else { SHARED_OP }.to_owned(),
            device: DEVICE.to_owned(),
            problem: key.to_owned(),
            rank,
        }),
        result: Some(v1::Result {
            // Serializing a struct of an integer and a string cannot fail.
            config: serde_json::to_string(&config).unwrap_or_default(),
            time_us: entry.min_time * 1000.0,
            tuned_by: match rank {
                Some(rank) => format!("bench/rank{rank}"),
                None => "bench/shared".to_owned(),
            },
            tuned_at_unix_ms: TUNED_AT_UNIX_MS,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    }
}

/// The `existing` entries of the initial cache, split as `write_initial_cache` splits them.
pub fn existing_entries(ranks: u32, existing: usize, shared_fraction: f64) -> Vec<v1::Entry> {
    let shared_total = shared_count(existing, shared_fraction);
    let ranks = ranks.max(1);
    let per_rank_total = existing - shared_total;
    let mut entries = Vec::with_capacity(existing);
    entries.extend((0..shared_total).map(|index| {
        daemon_entry(
            &shared_key(EXISTING_EPOCH, index),
            &shared_entry(EXISTING_EPOCH, index),
            None,
        )
    }));
    for rank in 0..ranks {
        let share = per_rank_total / ranks as usize
            + usize::from((rank as usize) < per_rank_total % ranks as usize);
        entries.extend((0..share).map(|index| {
            daemon_entry(
                &rank_key(EXISTING_EPOCH, index),
                &rank_entry(rank, EXISTING_EPOCH, index),
                Some(rank),
            )
        }));
    }
    entries
}

/// `entries` moved into `namespace`: the same data set beside the workload's, so a Scan of
/// either namespace sees only its own.
pub fn in_namespace(entries: Vec<v1::Entry>, namespace: &str) -> Vec<v1::Entry> {
    entries
        .into_iter()
        .map(|mut entry| {
            if let Some(key) = entry.key.as_mut() {
                key.namespace = namespace.to_owned();
            }
            entry
        })
        .collect()
}

/// The new entries rank `rank` records: shared ones without a rank, its own with `rank` set.
pub fn tuned_daemon_entries(
    rank: u32,
    epoch: u64,
    new_entries: usize,
    shared_fraction: f64,
) -> Vec<v1::Entry> {
    let tuned = tuned_entries(rank, epoch, new_entries, shared_fraction);
    tuned
        .shared
        .iter()
        .map(|(key, entry)| daemon_entry(key, entry, None))
        .chain(
            tuned
                .own
                .iter()
                .map(|(key, entry)| daemon_entry(key, entry, Some(rank))),
        )
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("entry without key or result")]
    Incomplete,
    #[error("config of {problem} is not a tactic: {source}")]
    Config {
        problem: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A rank's in-memory cache, as the autotuner holds it after a load.
#[derive(Debug, Default)]
pub struct RankView {
    pub shared: Section,
    pub own: Section,
}

impl RankView {
    /// Parses the scanned entries this rank uses (shared, and its own rank's) the way the
    /// peer parses its file sections: key text -> `CacheEntry`.
    pub fn from_scan(rank: u32, entries: &[v1::Entry]) -> Result<Self, ViewError> {
        let mut view = RankView::default();
        for entry in entries {
            let (Some(key), Some(result)) = (&entry.key, &entry.result) else {
                return Err(ViewError::Incomplete);
            };
            let section = match key.rank {
                None => &mut view.shared,
                Some(owner) if owner == rank => &mut view.own,
                Some(_) => continue,
            };
            let config: TacticConfig =
                serde_json::from_str(&result.config).map_err(|source| ViewError::Config {
                    problem: key.problem.clone(),
                    source,
                })?;
            section.insert(
                key.problem.clone(),
                CacheEntry {
                    runner_id: config.runner_id,
                    tactic: config.tactic,
                    min_time: result.time_us / 1000.0,
                },
            );
        }
        Ok(view)
    }

    pub fn len(&self) -> usize {
        self.shared.len() + self.own.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Records `entries` in batches the daemon accepts.
pub async fn record_all(
    client: &Client,
    entries: Vec<v1::Entry>,
) -> Result<(), tunecache_client::ClientError> {
    let mut entries = entries;
    while !entries.is_empty() {
        let rest = entries.split_off(entries.len().min(RECORD_BATCH));
        client.record(entries).await?;
        entries = rest;
    }
    Ok(())
}

/// The `tunecache-rank` process that plays rank `rank` of `spec` against the daemon at `socket`,
/// waiting at the scenario barrier.
pub fn rank_command(rank_binary: &Path, socket: &Path, spec: &ScenarioSpec, rank: u32) -> Command {
    let mut command = Command::new(rank_binary);
    command.arg("--socket").arg(socket);
    spec.rank_args(&mut command, rank).arg("--barrier-stdin");
    command
}

/// What the daemon did for the shared filesystem during one scenario.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SnapshotAccounting {
    /// Snapshots written from barrier release through `finish` (its Snapshot RPC included).
    pub snapshots_written: u64,
    /// Size of this node's published files (format-2 segments) after `finish`.
    pub snapshot_file_bytes: u64,
    /// Bytes the daemon wrote to the shared dir from barrier release through `finish`, from its
    /// own `snapshot_bytes_written` counter (format 2 appends segments of what is new).
    pub bytes_written: u64,
    /// The daemon's own time for the final Snapshot RPC (filesystem work included).
    pub final_snapshot_ms: f64,
    /// Wall time of that RPC as the caller saw it.
    pub final_snapshot_call_ms: f64,
    pub final_snapshot_error: Option<String>,
}

/// tunecache as a system under test: one daemon per scenario, R `tunecache-rank` processes.
pub struct TunecacheSystem {
    pub daemon_binary: PathBuf,
    pub rank_binary: PathBuf,
    /// Local-disk directory for the daemons' sockets, state and logs.
    pub local_root: PathBuf,
    runtime: tokio::runtime::Runtime,
    daemon: Option<DaemonProcess>,
    client: Option<Client>,
    socket: PathBuf,
    snapshots_before: u64,
    snapshot_bytes_before: u64,
    runs: u32,
    /// Filled by `finish`.
    pub last_accounting: SnapshotAccounting,
}

fn prepare_error(context: &str) -> impl FnOnce(String) -> ScenarioError + '_ {
    move |detail| ScenarioError::Prepare(format!("{context}: {detail}"))
}

impl TunecacheSystem {
    pub fn new(
        daemon_binary: PathBuf,
        rank_binary: PathBuf,
        local_root: &Path,
    ) -> Result<Self, ScenarioError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| ScenarioError::Prepare(format!("tokio runtime: {err}")))?;
        Ok(Self {
            daemon_binary,
            rank_binary,
            local_root: local_root.to_path_buf(),
            runtime,
            daemon: None,
            client: None,
            socket: PathBuf::new(),
            snapshots_before: 0,
            snapshot_bytes_before: 0,
            runs: 0,
            last_accounting: SnapshotAccounting::default(),
        })
    }

    /// The socket of the daemon `prepare` started (empty before the first `prepare`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

/// Total size of the segments this scenario's node published under `<dir>/v2/`.
fn published_bytes(dir: &Path) -> u64 {
    let prefix = format!("{NODE_NAME}.");
    std::fs::read_dir(dir.join("v2"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|entry| entry.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .sum()
}

impl SystemUnderTest for TunecacheSystem {
    fn name(&self) -> String {
        "tunecache".to_owned()
    }

    fn prepare(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        create_scenario_dir(spec)?;
        self.runs += 1;
        let config = DaemonConfig {
            binary: self.daemon_binary.clone(),
            work_dir: self.local_root.join(format!("daemon-{}", self.runs)),
            node_name: NODE_NAME.to_owned(),
            shared_dir: Some(spec.dir.clone()),
            // The default interval: the runs are shorter, so the final Snapshot RPC is what
            // publishes the ranks' entries, as the first periodic pass would.
            snapshot_interval_s: 30,
            extra_args: Vec::new(),
        };
        let mut daemon =
            DaemonProcess::spawn(&config).map_err(|err| ScenarioError::Prepare(err.to_string()))?;
        self.socket = daemon.socket.clone();
        let existing = existing_entries(spec.ranks, spec.existing, spec.shared_fraction);
        let client = self.runtime.block_on(async {
            let client = daemon
                .wait_ready()
                .await
                .map_err(|err| err.to_string())
                .map_err(prepare_error("starting tunecached"))?;
            record_all(&client, existing)
                .await
                .map_err(|err| err.to_string())
                .map_err(prepare_error("preloading entries"))?;
            // Publish the preloaded state, as the peer's initial file exists before the ranks.
            let mut request = tonic::Request::new(v1::SnapshotRequest {});
            request.set_timeout(SNAPSHOT_DEADLINE);
            client
                .raw()
                .snapshot(request)
                .await
                .map_err(|err| err.message().to_owned())
                .map_err(prepare_error("initial snapshot"))?;
            let stats = client
                .stats()
                .await
                .map_err(|err| err.to_string())
                .map_err(prepare_error("stats"))?;
            Ok::<_, ScenarioError>((
                client,
                stats.snapshots_written,
                stats.snapshot_bytes_written,
            ))
        });
        let (client, snapshots_before, snapshot_bytes_before) = client?;
        self.snapshots_before = snapshots_before;
        self.snapshot_bytes_before = snapshot_bytes_before;
        self.client = Some(client);
        self.daemon = Some(daemon);
        Ok(())
    }

    fn rank_command(&self, spec: &ScenarioSpec, rank: u32) -> Command {
        rank_command(&self.rank_binary, &self.socket, spec, rank)
    }

    fn finish(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        let mut accounting = SnapshotAccounting::default();
        if let Some(client) = self.client.take() {
            let started = Instant::now();
            let outcome = self.runtime.block_on(async {
                let mut request = tonic::Request::new(v1::SnapshotRequest {});
                request.set_timeout(SNAPSHOT_DEADLINE);
                let response = client.raw().snapshot(request).await;
                let stats = client.stats().await;
                (response, stats)
            });
            accounting.final_snapshot_call_ms = started.elapsed().as_secs_f64() * 1e3;
            let (response, stats) = outcome;
            match response {
                Ok(response) => {
                    accounting.final_snapshot_ms = response.into_inner().duration_ms as f64;
                }
                Err(status) => accounting.final_snapshot_error = Some(status.message().to_owned()),
            }
            if let Ok(stats) = stats {
                accounting.snapshots_written = stats
                    .snapshots_written
                    .saturating_sub(self.snapshots_before);
                accounting.bytes_written = stats
                    .snapshot_bytes_written
                    .saturating_sub(self.snapshot_bytes_before);
            }
            accounting.snapshot_file_bytes = published_bytes(&spec.dir);
        }
        if let Some(mut daemon) = self.daemon.take() {
            daemon.stop();
        }
        self.last_accounting = accounting;
        Ok(())
    }

    fn bytes_written_by_system(&self) -> u64 {
        self.last_accounting.bytes_written
    }
}
