//! The `tunecache-bench` binary: command-line front of the benchmark harness. `peer` runs a
//! multi-rank file-lock scenario and prints its JSON result; `generate` writes an initial
//! cache file; `suite` runs the whole benchmark (scenario matrix and daemon
//! micro-benchmarks) and writes its JSON, Markdown and SVG outputs; `artifacts` measures
//! GetArtifact against its floors; `report` regenerates the tables of BENCHMARKS.md from those
//! outputs.

mod suite;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tunecache_bench::filelock::Variant;
use tunecache_bench::scenario::{filelock_rank_binary, run_scenario, FileLockPeer, ScenarioSpec};
use tunecache_bench::workload::write_initial_cache;

/// E of `suite --python-matrix`: a rank loading a 5,000-entry cache and adding 100 entries,
/// the start-up the Python cold-start target is stated for.
const PYTHON_MATRIX_NEW_ENTRIES: usize = 100;

#[derive(Debug, Parser)]
#[command(
    name = "tunecache-bench",
    version,
    about = "tunecache benchmark harness"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run R file-lock ranks together on one cache file; print the scenario result as JSON.
    Peer {
        #[arg(long, value_enum)]
        variant: Variant,
        #[arg(long)]
        ranks: u32,
        /// Entries in the cache before the ranks start.
        #[arg(long)]
        existing: usize,
        /// Entries each rank tunes.
        #[arg(long)]
        new: usize,
        /// Directory for the cache file (e.g. on a slowfs mount).
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 0.5)]
        shared_fraction: f64,
        /// "after" variant's writer-lock timeout.
        #[arg(long, default_value_t = 120.0)]
        lock_timeout_s: f64,
        /// The rank binary (default: `filelock-rank` beside this executable).
        #[arg(long)]
        rank_binary: Option<PathBuf>,
    },
    /// Run the whole benchmark suite; write results.json, results.md, wall_vs_ranks.svg.
    Suite {
        /// Directory for the outputs.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Tiny R and S, few iterations: checks the harness end to end, judges nothing.
        #[arg(long)]
        quick: bool,
        /// Time limit of one scenario run, in seconds [default: 120, quick: 30].
        #[arg(long)]
        run_limit_s: Option<f64>,
        #[arg(long)]
        skip_matrix: bool,
        #[arg(long)]
        skip_micro: bool,
        /// The Python client directory (with its .venv) [default: client/python of this
        /// workspace].
        #[arg(long)]
        python_dir: Option<PathBuf>,
        /// Add Python ranks to the matrix (the file-lock "before" peer and tunecache through
        /// the Python client, grpcio) and the Python parse floor; needs the client's .venv.
        #[arg(long)]
        python: bool,
        /// Run the matrix on these filesystems only (local, slowfs-<N>ms) [default: the
        /// suite's: local, slowfs-5ms, slowfs-50ms; quick: local, slowfs-1ms].
        #[arg(long, value_delimiter = ',')]
        filesystems: Option<Vec<String>>,
        /// Ranks R of the matrix [default: 8,32,128; quick: 2,4].
        #[arg(long, value_delimiter = ',')]
        ranks: Option<Vec<u32>>,
        /// Entries each rank tunes and saves, E [default: 50; quick: 10].
        #[arg(long)]
        new_entries: Option<usize>,
        /// The Python cold-start matrix alone: --python --skip-micro --filesystems
        /// local,slowfs-50ms --new-entries 100 (each flag given explicitly wins).
        #[arg(long)]
        python_matrix: bool,
    },
    /// Issue 38: N nodes joining at once, and restarted on their state directories, against a
    /// redis-server holding E entries, for each binary given (this build, main's): time until
    /// the last is warm, Redis commands, CPU and bytes out; writes startup.json and startup.md.
    Startup {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// `label=path` of each tunecached to measure, e.g. `main=/tmp/tunecached-main`; this
        /// build's as `branch` when none is given.
        #[arg(long = "binary", value_delimiter = ',')]
        binaries: Vec<String>,
        #[arg(long, value_delimiter = ',', default_value = "8,16,32")]
        nodes: Vec<usize>,
        #[arg(long, default_value_t = 100_000)]
        entries: usize,
        #[arg(long, default_value_t = 1000)]
        new_while_down: usize,
        #[arg(long, default_value_t = 600.0)]
        limit_s: f64,
    },
    /// N daemons sharing one directory: bytes per new entry, time to reach every node, idle
    /// bytes and a joining node's load time, snapshot format 2 beside format 1.
    Cluster {
        /// Directory for cluster.json and cluster.md.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Cluster sizes.
        #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
        nodes: Vec<usize>,
        /// Entries in the cluster before the new one.
        #[arg(long, default_value_t = 5000)]
        existing: usize,
        #[arg(long, default_value_t = 1)]
        interval_s: u64,
        /// slowfs latencies (ms) to run on besides the local disk; empty for none.
        #[arg(long, value_delimiter = ',', default_value = "5")]
        slowfs_ms: Vec<u64>,
        /// A format-1 tunecached (the last release before format 2) to compare with.
        #[arg(long)]
        v1_binary: Option<PathBuf>,
        /// The cluster size a fresh node joins.
        #[arg(long, default_value_t = 64)]
        join_nodes: usize,
        /// Give up on one step (converge, settle, reach) after this many seconds.
        #[arg(long, default_value_t = 300.0)]
        limit_s: f64,
    },
    /// Issue 28's Python-client figures: per process, a 5,000-entry Scan against its floor, and
    /// cold start at each R on local disk, for the package of today (the binding of the Rust
    /// client, in client/python/.venv) and the grpcio package before it, with the file-lock
    /// peers; writes python-client.json.
    PythonClient {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// The grpcio package before issue 28, with its .venv (make it with
        /// tests/bench/python/grpcio_before.sh DIR).
        #[arg(long)]
        grpcio_dir: PathBuf,
        /// The Python client directory (with its .venv holding the wheel) [default:
        /// client/python].
        #[arg(long)]
        python_dir: Option<PathBuf>,
        #[arg(long, value_delimiter = ',', default_value = "32,128")]
        ranks: Vec<u32>,
        /// Fresh processes per client and mode (per-process figures).
        #[arg(long, default_value_t = 15)]
        processes: usize,
        #[arg(long, default_value_t = 31)]
        scan_runs: usize,
        /// Cold-start runs per system and R (the median run is reported).
        #[arg(long, default_value_t = 3)]
        cold_runs: usize,
        /// Small sizes: checks the harness, judges nothing.
        #[arg(long)]
        quick: bool,
    },
    /// GetArtifact against its floors, side by side in one run: one large blob (256 MiB)
    /// streamed into a sink against a plain Unix-socket copy of the same bytes (MiB/s), and R
    /// rank processes each fetching B small blobs (8 x 100 x 2 MiB) against R processes
    /// reading the same files from a local directory (wall), with fetch_artifact_list into a
    /// per-rank directory as a third row; writes artifacts.json and artifacts.md.
    Artifacts {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Timed rounds; each measures every path once, in alternating order.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Size of the large blob, MiB (the daemon's default --max-artifact-bytes is 256 MiB).
        #[arg(long, default_value_t = 256)]
        big_mib: u64,
        /// Rank processes of the small-blob case.
        #[arg(long, default_value_t = 8)]
        ranks: usize,
        /// Distinct small blobs each rank fetches.
        #[arg(long, default_value_t = 100)]
        blobs: usize,
        /// Size of each small blob, KiB.
        #[arg(long, default_value_t = 2048)]
        blob_kib: u64,
        /// Leave out the fetch_artifact_list row (files written, synced, verified).
        #[arg(long)]
        skip_fetch: bool,
    },
    /// Issue 37's BitBLAS benchmark: R rank processes loading a database of N operators (2 MiB
    /// of files each) through the drop-in (a cold node, then a warm one), side by side with stock
    /// BitBLAS from a local directory, from per-rank copies of it and from slowfs at
    /// --slowfs-ms; writes bitblas.json and bitblas.md. Runs tests/bench/python/bitblas_load.py
    /// on --python (the package's wheel installed; default client/python/.venv, made by
    /// client/python/run_tests.sh) with the BitBLAS stand-in of client/python/tests.
    Bitblas {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        #[arg(long)]
        python: Option<PathBuf>,
        #[arg(long, default_value_t = 100)]
        ops: usize,
        #[arg(long, default_value_t = 2.0)]
        file_mib: f64,
        #[arg(long, default_value_t = 8)]
        ranks: usize,
        /// 0: no slowfs mode.
        #[arg(long, default_value_t = 5)]
        slowfs_ms: u64,
        /// Runs of every mode, interleaved (medians are reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Issue 57's FlashInfer benchmark: R rank processes run FlashInfer's autotune_v2 over K keys
    /// whose stand-in profile takes P ms, through the drop-in (an empty daemon, then a warm one),
    /// side by side with one rank alone and stock FlashInfer on a local directory (cold, warm) and
    /// on slowfs at --slowfs-ms; writes flashinfer.json and flashinfer.md. Runs
    /// tests/bench/python/flashinfer_tune.py on --python (the package's wheel installed; default
    /// client/python/.venv, made by client/python/run_tests.sh, which also extracts FlashInfer's
    /// code) with the FlashInfer stand-ins of client/python/tests.
    Flashinfer {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        #[arg(long)]
        python: Option<PathBuf>,
        #[arg(long, default_value_t = 8)]
        ranks: usize,
        #[arg(long, default_value_t = 200)]
        keys: usize,
        #[arg(long, default_value_t = 50.0)]
        profile_ms: f64,
        /// 0: no slowfs mode.
        #[arg(long, default_value_t = 5)]
        slowfs_ms: u64,
        /// Runs of every mode, interleaved (medians are reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Issue 58's PyTorch Inductor benchmark: R rank processes compile the same frozen Linears
    /// (--shapes) with `torch.compile(mode="max-autotune")` on the CPU, side by side with one
    /// rank alone, stock Inductor on one shared cache directory, stock with
    /// `distributed_max_autotune_gemm` in a gloo process group (recorded as not run, with what
    /// Inductor did, where it fails or distributes nothing), and the drop-in on a fresh daemon
    /// (cold) and the same daemon again (warm); writes inductor.json and inductor.md. Runs
    /// tests/bench/python/inductor_tune.py on --python (torch 2.15.0 and the package's wheel
    /// installed; default client/python/.venv, made by client/python/run_tests.sh) with the
    /// ranks of client/python/tests/inductor_rank.py.
    Inductor {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        #[arg(long)]
        python: Option<PathBuf>,
        #[arg(long, default_value_t = 8)]
        ranks: usize,
        /// JSON: [[in_features, out_features, batch], ...].
        #[arg(long, default_value = suite::inductor::DEFAULT_SHAPES)]
        shapes: String,
        /// Runs of every mode, interleaved (medians are reported); each is minutes on 2 cores.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// A directory holding numpy, put on PYTHONPATH for the distributed mode only
        /// (torch.distributed's all_gather_object needs it; without it Inductor fails there).
        #[arg(long)]
        numpy_dir: Option<PathBuf>,
    },
    /// One rank of `artifacts` (started by it): connects, says `ready`, waits for a line on
    /// stdin, fetches or reads every blob of --list, answers one JSON line.
    #[command(hide = true)]
    ArtifactsRank {
        #[arg(long, value_enum)]
        mode: suite::artifacts::RankMode,
        #[arg(long)]
        socket: PathBuf,
        /// One `sha256 size path` line per blob.
        #[arg(long)]
        list: PathBuf,
        /// Where `--mode fetch` writes the blobs.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The first fetch of blobs the node lacks but the shared directory holds (issue 49):
    /// node A publishes B blobs; each round a fresh node B learns them and one client takes
    /// each by get_artifact (handed, or streamed when the daemon does not hand it), timed
    /// blob by blob. Compare daemon builds by running it with each one's TUNECACHE_BIN_DIR.
    /// Prints JSON.
    ColdBlob {
        #[arg(long, default_value_t = 20)]
        blobs: usize,
        /// Size of each blob, KiB.
        #[arg(long, default_value_t = 16384)]
        blob_kib: u64,
        /// Fresh nodes B, each taking every blob once.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Issue 52's bundles: `tunecache bundle export` of 100,000 entries and of 1 GiB of
    /// artifacts (wall, the CLI's and the staging daemon's peak RSS, the bundle's size), a
    /// daemon's start-up on each bundle with `--replay` (time until it serves, peak RSS against
    /// an idle daemon's), and the latency of a replayed miss against a hit; writes
    /// bundles.json and bundles.md.
    Bundles {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        /// Rounds; each measures every case once.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Entries of the entries case.
        #[arg(long, default_value_t = 100_000)]
        entries: usize,
        /// Blobs of the artifacts case, one entry naming each.
        #[arg(long, default_value_t = 16)]
        blobs: usize,
        /// Size of each blob, MiB.
        #[arg(long, default_value_t = 64)]
        blob_mib: u64,
        /// One-key Resolves of each series of the replay latency.
        #[arg(long, default_value_t = 2000)]
        resolves: usize,
    },
    /// Issue 54: p50 and p99 of a one-key Lookup (Rust client, one connection, a key that
    /// hits), sampled while the daemon holding --entries is idle, while R rank processes start
    /// at once and each Scans the whole cache, while the writer merges a --batch-entry batch
    /// (Records of 10,000, back to back), and while both run; writes lookup-load.json and
    /// lookup-load.md.
    LookupLoad(suite::lookup_load::LookupLoadOptions),
    /// Issue 54: at each size, bytes per entry (daemon RSS above an empty daemon's, over
    /// entries, against the encoded entry), start-up from the journal (spawn until Stats
    /// answers every entry, peak RSS) and one-key Lookup p50/p99 after it; writes scale.json
    /// and scale.md.
    Scale(suite::scale::ScaleOptions),
    /// A simulated year of one node's cache with lifecycle (issue 51): entries, bytes per
    /// tier, hit rate and last-use writes per week; writes lifecycle.json and lifecycle.md.
    Lifecycle(suite::lifecycle::LifecycleOptions),
    /// Run only some daemon micro-benchmarks; print their results and target ratios as JSON.
    Micro {
        /// Comma-separated: lookup (with the echo floor), pyscan, memory, pickup, transport
        /// (daemon and client transport settings compared, interleaved), views (Lookup and
        /// Scan without a view, in a view, as a view's first read; one node and the Redis
        /// tier, which needs redis-server), forget (a bystander's Record while an
        /// administrator sends 20,000 scope Forgets, and while another uid sends 20,000
        /// only_if Forgets at two --max-exact-forgets-per-uid budgets), replay (SIGKILL and
        /// restart with 51,523 one-entry frames, 100,000 entries, 1,000,000 tombstones: when
        /// the first answer and the first answered Lookup come).
        #[arg(long, value_delimiter = ',', default_value = "lookup,pyscan,memory")]
        only: Vec<String>,
        /// Small sizes, few iterations: checks the harness, judges nothing.
        #[arg(long)]
        quick: bool,
        /// The Python client directory (with its .venv) [default: client/python].
        #[arg(long)]
        python_dir: Option<PathBuf>,
    },
    /// Multi-node tuning alone: N daemons x R ranks, P problems; no sharing, shared
    /// directory at 1 s, Redis tier. Prints the Markdown table; writes multinode.json.
    Multinode {
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "4,8")]
        nodes: Vec<usize>,
        #[arg(long, default_value_t = 4)]
        ranks_per_node: usize,
        #[arg(long, default_value_t = 50)]
        problems: usize,
        #[arg(long, default_value_t = 200)]
        tune_ms: u64,
    },
    /// Snapshot passes over a shared directory of N one-entry segments in three mixes of
    /// owners, for each daemon binary given (before and after a change, side by side).
    Segments {
        #[arg(long, default_value_t = 50_000)]
        segments: usize,
        /// Passes timed after the first.
        #[arg(long, default_value_t = 3)]
        later: usize,
        /// Daemon binaries to compare [default: this workspace's tunecached].
        #[arg(long, value_delimiter = ',')]
        daemon_bin: Vec<PathBuf>,
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// Regenerate the tables of BENCHMARKS.md from the raw outputs they name: every block
    /// between `<!-- report:begin KIND SOURCE -->` and `<!-- report:end -->` is rendered again
    /// from SOURCE (relative to the Markdown file). With --table, print one table instead.
    Report {
        /// The Markdown file to update (or check).
        #[arg(default_value = "BENCHMARKS.md")]
        markdown: PathBuf,
        /// Change nothing; exit non-zero if a block differs from its source.
        #[arg(long)]
        check: bool,
        /// Print the table of this kind (single-node, shared-filesystem, peer-pickup,
        /// cluster, multinode, segments, data-path, transport, python-ranks, memory, views,
        /// artifacts) from --source, instead of updating a file.
        #[arg(long, requires = "source")]
        table: Option<String>,
        /// The raw output to render --table from.
        #[arg(long)]
        source: Option<PathBuf>,
    },
    /// Write an initial cache file with S existing entries.
    Generate {
        #[arg(long)]
        cache: PathBuf,
        #[arg(long)]
        ranks: u32,
        #[arg(long)]
        existing: usize,
        #[arg(long, default_value_t = 0.5)]
        shared_fraction: f64,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Commands::Peer {
            variant,
            ranks,
            existing,
            new,
            dir,
            shared_fraction,
            lock_timeout_s,
            rank_binary,
        } => {
            let mut peer =
                FileLockPeer::new(variant, rank_binary.unwrap_or_else(filelock_rank_binary));
            peer.lock_timeout = Duration::try_from_secs_f64(lock_timeout_s)
                .context("--lock-timeout-s must be a non-negative number of seconds")?;
            let spec = ScenarioSpec {
                dir,
                ranks,
                existing,
                new_entries: new,
                shared_fraction,
            };
            let result = run_scenario(&mut peer, &spec)?;
            println!("{}", serde_json::to_string(&result)?);
        }
        Commands::Suite {
            out,
            quick,
            run_limit_s,
            skip_matrix,
            skip_micro,
            python_dir,
            python,
            filesystems,
            ranks,
            new_entries,
            python_matrix,
        } => {
            let (python, skip_micro, filesystems, new_entries) = if python_matrix {
                (
                    true,
                    true,
                    filesystems.or_else(|| Some(vec!["local".into(), "slowfs-50ms".into()])),
                    new_entries.or(Some(PYTHON_MATRIX_NEW_ENTRIES)),
                )
            } else {
                (python, skip_micro, filesystems, new_entries)
            };
            let run_limit_s = run_limit_s.unwrap_or(if quick { 30.0 } else { 120.0 });
            let options = suite::SuiteOptions {
                out_dir: out.clone(),
                quick,
                run_limit: Duration::try_from_secs_f64(run_limit_s)
                    .context("--run-limit-s must be a non-negative number of seconds")?,
                skip_matrix,
                skip_micro,
                python_dir: python_dir.unwrap_or_else(|| {
                    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../client/python")
                }),
                python,
                filesystems,
                ranks,
                new_entries,
                command_line: command_line(),
            };
            suite::run_suite(&options)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::Startup {
            out,
            binaries,
            nodes,
            entries,
            new_while_down,
            limit_s,
        } => {
            let mut labelled = Vec::new();
            for binary in &binaries {
                let (label, path) = binary
                    .split_once('=')
                    .context("--binary takes label=path")?;
                labelled.push((label.to_owned(), PathBuf::from(path)));
            }
            if labelled.is_empty() {
                labelled.push((
                    "branch".to_owned(),
                    tunecache_bench::daemon::workspace_binary("tunecached"),
                ));
            }
            let options = suite::startup::StartupOptions {
                out_dir: out.clone(),
                binaries: labelled,
                nodes,
                entries,
                new_while_down,
                limit: Duration::try_from_secs_f64(limit_s)
                    .context("--limit-s must be a non-negative number of seconds")?,
            };
            let command_line = command_line();
            suite::startup::run_startup(&options, &command_line)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::Cluster {
            out,
            nodes,
            existing,
            interval_s,
            slowfs_ms,
            v1_binary,
            join_nodes,
            limit_s,
        } => {
            let options = suite::cluster::ClusterOptions {
                out_dir: out.clone(),
                nodes,
                existing,
                interval_s: interval_s.max(1),
                latencies_ms: slowfs_ms,
                v1_binary,
                join_nodes,
                limit: Duration::try_from_secs_f64(limit_s)
                    .context("--limit-s must be a non-negative number of seconds")?,
            };
            let command_line = command_line();
            suite::cluster::run_cluster(&options, &command_line)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::PythonClient {
            out,
            grpcio_dir,
            python_dir,
            ranks,
            processes,
            scan_runs,
            cold_runs,
            quick,
        } => {
            let options = suite::python_client::PythonClientOptions {
                out_dir: out.clone(),
                python_dir: python_dir.unwrap_or_else(|| {
                    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../client/python")
                }),
                grpcio_dir,
                ranks,
                processes,
                scan_runs,
                cold_runs,
                quick,
                command_line: command_line(),
            };
            suite::python_client::run(&options)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::Artifacts {
            out,
            rounds,
            big_mib,
            ranks,
            blobs,
            blob_kib,
            skip_fetch,
        } => {
            let options = suite::artifacts::ArtifactsOptions {
                out_dir: out.clone(),
                rounds,
                big_mib,
                ranks,
                blobs,
                blob_kib,
                skip_fetch,
                command_line: command_line(),
            };
            suite::artifacts::run_artifacts(&options)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::Bitblas {
            out,
            python,
            ops,
            file_mib,
            ranks,
            slowfs_ms,
            runs,
        } => {
            let options = suite::bitblas::BitblasOptions {
                out_dir: out.clone(),
                python: python.unwrap_or_else(package_python),
                ops,
                file_mib,
                ranks,
                slowfs_ms,
                runs,
                command_line: command_line(),
            };
            suite::bitblas::run(&options)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::Flashinfer {
            out,
            python,
            ranks,
            keys,
            profile_ms,
            slowfs_ms,
            runs,
        } => {
            let options = suite::flashinfer::FlashinferOptions {
                out_dir: out.clone(),
                python: python.unwrap_or_else(package_python),
                ranks,
                keys,
                profile_ms,
                slowfs_ms,
                runs,
                command_line: command_line(),
            };
            suite::flashinfer::run(&options)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::Inductor {
            out,
            python,
            ranks,
            shapes,
            runs,
            numpy_dir,
        } => {
            let options = suite::inductor::InductorOptions {
                out_dir: out.clone(),
                python: python.unwrap_or_else(package_python),
                ranks,
                shapes,
                runs,
                numpy_dir,
                command_line: command_line(),
            };
            suite::inductor::run(&options)?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::ArtifactsRank {
            mode,
            socket,
            list,
            dir,
        } => {
            suite::artifacts::run_rank(&suite::artifacts::RankOptions {
                mode,
                socket,
                list,
                dir,
            })?;
        }
        Commands::ColdBlob {
            blobs,
            blob_kib,
            rounds,
        } => {
            let results = suite::cold_blob::run(&suite::cold_blob::ColdBlobOptions {
                blobs,
                blob_kib,
                rounds,
                command_line: command_line(),
            })?;
            println!("{}", serde_json::to_string_pretty(&results)?);
        }
        Commands::Bundles {
            out,
            rounds,
            entries,
            blobs,
            blob_mib,
            resolves,
        } => {
            suite::bundles::run(&suite::bundles::BundlesOptions {
                out_dir: out.clone(),
                rounds,
                entries,
                blobs,
                blob_mib,
                resolves,
                command_line: command_line(),
            })?;
            println!("{}", serde_json::json!({ "out": out }));
        }
        Commands::LookupLoad(mut options) => {
            options.command_line = command_line();
            suite::lookup_load::run(&options)?;
            println!("{}", serde_json::json!({ "out": options.out_dir }));
        }
        Commands::Lifecycle(mut options) => {
            options.command_line = command_line();
            suite::lifecycle::run(&options)?;
            println!("{}", serde_json::json!({ "out": options.out_dir }));
        }
        Commands::Scale(mut options) => {
            options.command_line = command_line();
            suite::scale::run(&options)?;
            println!("{}", serde_json::json!({ "out": options.out_dir }));
        }
        Commands::Micro {
            only,
            quick,
            python_dir,
        } => {
            let result = suite::run_micro_only(&only, quick, python_dir)?;
            println!("{}", serde_json::to_string_pretty(&result)?);
        }
        Commands::Multinode {
            out,
            nodes,
            ranks_per_node,
            problems,
            tune_ms,
        } => {
            let scratch = tempfile::Builder::new()
                .prefix("tunecache-multinode-")
                .tempdir()?;
            let options = tunecache_bench::multinode::MultiNodeOptions {
                daemon_binary: tunecache_bench::daemon::workspace_binary("tunecached"),
                redis_server: tunecache_bench::multinode::find_redis_server(),
                scratch: scratch.path().to_path_buf(),
                node_counts: nodes,
                ranks_per_node,
                problems,
                tune_ms,
                limit: Duration::from_secs(300),
            };
            let results = tunecache_bench::multinode::run_multinode(&options)?;
            std::fs::create_dir_all(&out)?;
            std::fs::write(
                out.join("multinode.json"),
                serde_json::to_string_pretty(&results)?,
            )?;
            let table = tunecache_bench::multinode::markdown(&results);
            std::fs::write(out.join("multinode.md"), &table)?;
            println!("{table}");
        }
        Commands::Segments {
            segments,
            later,
            mut daemon_bin,
            out,
        } => {
            if daemon_bin.is_empty() {
                daemon_bin.push(tunecache_bench::daemon::workspace_binary("tunecached"));
            }
            let rows = tunecache_bench::segments::run_all(&daemon_bin, segments, later)?;
            std::fs::create_dir_all(&out)?;
            std::fs::write(
                out.join("segments.json"),
                serde_json::to_string_pretty(&rows)?,
            )?;
            let table = tunecache_bench::segments::markdown(&rows);
            std::fs::write(out.join("segments.md"), &table)?;
            println!("{table}");
        }
        Commands::Report {
            markdown,
            check,
            table,
            source,
        } => {
            use tunecache_bench::current;
            if let (Some(kind), Some(source)) = (table, source) {
                print!(
                    "{}",
                    current::render(&kind, &current::read_source(&source)?)?
                );
                return Ok(());
            }
            let blocks = if check {
                current::check(&markdown)?
            } else {
                current::update(&markdown)?
            };
            let mut stale = 0;
            for block in &blocks {
                let what = match block.outcome {
                    current::Outcome::Unchanged => "up to date",
                    current::Outcome::Changed if check => {
                        stale += 1;
                        "differs from its source"
                    }
                    current::Outcome::Changed => "rewritten",
                    current::Outcome::SourceMissing => "kept as recorded (source missing)",
                };
                eprintln!("{} <- {}: {what}", block.kind, block.source.display());
            }
            anyhow::ensure!(
                stale == 0,
                "{stale} table(s) in {} differ from their sources: run `tunecache-bench report {}`",
                markdown.display(),
                markdown.display()
            );
        }
        Commands::Generate {
            cache,
            ranks,
            existing,
            shared_fraction,
        } => {
            let bytes = write_initial_cache(&cache, ranks, existing, shared_fraction)?;
            println!("{}", serde_json::json!({ "cache": cache, "bytes": bytes }));
        }
    }
    Ok(())
}

/// This process's command line, as a benchmark's output records it.
fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The interpreter the Python drop-in benchmarks default to: client/python/run_tests.sh's venv,
/// which has the package's wheel and the frameworks installed.
fn package_python() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../client/python/.venv/bin/python")
}
