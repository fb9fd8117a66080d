//! Owns the bundles benchmark (issue 52): what exporting a bundle and starting a daemon on one
//! cost, and what a replayed miss costs a rank. Side by side in one run, on the release
//! binaries:
//!
//! - **entries**: a staging daemon holding 100,000 entries (200-byte problems, JSON configs,
//!   Recorded in batches) is exported by the real `tunecache bundle export` (a child process,
//!   signed with an Ed25519 key `openssl` made): its wall, the CLI's peak RSS (`wait4`), the
//!   staging daemon's RSS before and its peak during the export (VmHWM, reset through
//!   `clear_refs` first), the bundle's size. Then a fresh daemon starts with `--bundle FILE
//!   --bundle-trust-key PUB --replay`: the time from its spawn until Stats answers with every
//!   bundled entry, and its peak RSS against a fresh daemon's with no bundle (the idle
//!   baseline, started in the same round).
//! - **artifacts**: the same for 16 entries naming 16 blobs of 64 MiB (1 GiB of xorshift
//!   bytes, written to a file 1 MiB at a time and uploaded with `put_artifact`), judged against
//!   the issue's target: export and start-up peak RSS under 100 MB above the daemon's idle.
//! - **replay latency**: on the replaying daemon of the entries case, one-key Resolves in
//!   replay mode (`Client::replay`) of keys in no bundle (a new key each time, and one key
//!   asked again and again), against the floor of Resolves of bundled keys (hits).
//!
//! Every round measures each case once; the results (`bundles.json`) give the median and range
//! over the rounds, and `bundles.md` is rendered from them by `current::render`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tunecache_bench::daemon::{
    process_memory, reset_peak_memory, without_tunecache_env, workspace_binary, DaemonConfig,
    DaemonProcess,
};
use tunecache_client::{proto, Client, Resolution, ResolveOptions};

use super::{load_average, machine_info, median, MachineInfo};

/// The issue's bound on export's and start-up's peak RSS above the daemon's idle.
const RSS_GOAL_BYTES: u64 = 100_000_000;
const DEVICE: &str = "NVIDIA H200|sm_90";
/// Entries per Record while the staging daemon is filled.
const RECORD_BATCH: usize = 1000;
/// Resolves asked untimed before each timed series.
const WARM_UP: usize = 100;

/// What `bundles` is asked to measure.
pub struct BundlesOptions {
    pub out_dir: PathBuf,
    pub rounds: usize,
    pub entries: usize,
    pub blobs: usize,
    pub blob_mib: u64,
    pub resolves: usize,
    pub command_line: String,
}

/// One export and one start-up on its bundle.
#[derive(Debug, Clone, Serialize)]
pub struct BundleRound {
    pub export_ms: f64,
    pub cli_peak_rss_kib: u64,
    pub staging_rss_before_kib: u64,
    pub staging_peak_rss_kib: u64,
    pub bundle_bytes: u64,
    /// From the spawn of the `--bundle --replay` daemon until Stats answers every entry.
    pub startup_ms: f64,
    pub startup_peak_rss_kib: u64,
    /// A fresh daemon with no bundle, once it answers.
    pub idle_peak_rss_kib: u64,
}

/// p50, p90, p99 of one series of Resolves, microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyRound {
    pub miss_new_key: Latency,
    pub miss_same_key: Latency,
    pub hit: Latency,
}

/// A figure over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub case: String,
    pub what: String,
    pub unit: String,
    pub rounds: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The issue's bound, in `unit`, where it sets one.
    pub goal_max: Option<f64>,
    pub met: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct BundlesResults {
    pub command_line: String,
    pub machine: MachineInfo,
    pub daemon: String,
    pub cli: String,
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
    pub entries: usize,
    pub blobs: usize,
    pub blob_bytes: u64,
    pub resolves: usize,
    pub entry_rounds: Vec<BundleRound>,
    pub artifact_rounds: Vec<BundleRound>,
    pub latency_rounds: Vec<LatencyRound>,
    /// Every figure of the table, with its median and range over the rounds.
    pub figures: Vec<Figure>,
}

fn progress(message: &str) {
    eprintln!("[bundles] {message}");
}

fn round_progress(case: &str, round: usize, result: &BundleRound) {
    progress(&format!(
        "{case} round {}: export {:.0} ms, start-up {:.0} ms, {} bytes",
        round + 1,
        result.export_ms,
        result.startup_ms,
        result.bundle_bytes
    ));
}

fn daemon(binary: &Path, work_dir: &Path, extra_args: Vec<String>) -> Result<DaemonProcess> {
    Ok(DaemonProcess::spawn(&DaemonConfig {
        binary: binary.to_path_buf(),
        work_dir: work_dir.to_path_buf(),
        node_name: "bench-node".to_owned(),
        shared_dir: None,
        snapshot_interval_s: 3600,
        extra_args,
    })?)
}

/// A key as a TensorRT-LLM GEMM tactic cache names one: a problem of about 190 bytes.
fn key(namespace: &str, index: usize) -> proto::Key {
    let (m, n, k) = (16 * (1 + index % 512), 128 * (1 + index / 512 % 64), 4096);
    let problem = format!(
        "gemm(M={m},N={n},K={k},batch={},A=bf16[row],B=bf16[col],C=bf16[row],acc=fp32,\
         alpha=1.0,beta=0.0,epilogue=bias_gelu,split_k=1,workspace=33554432,stream_k=auto,\
         swizzle=4,cluster=2x1x1,id={index:07})",
        1 + index / 32_768
    );
    tunecache_client::key(namespace, "trtllm::gemm", DEVICE, &problem, None)
}

fn result(index: usize, artifacts: Vec<proto::Artifact>) -> proto::Result {
    proto::Result {
        config: format!(
            r#"{{"tile":[128,{},64],"stages":{},"warps":8,"cluster":[2,1,1],"split_k":1,"swizzle":4,"tactic":"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas_{}"}}"#,
            64 << (index % 3),
            3 + index % 3,
            index % 97
        ),
        time_us: 10.0 + (index % 1000) as f64 / 10.0,
        tuned_by: "bundles bench".to_owned(),
        tuned_at_unix_ms: 1_700_000_000_000,
        artifacts,
        ..Default::default()
    }
}

/// Bundled entries live in these namespaces, in turn.
const NAMESPACES: [&str; 4] = ["trtllm", "bitblas", "flashinfer", "triton"];

fn bundled_key(index: usize) -> proto::Key {
    key(NAMESPACES[index % NAMESPACES.len()], index)
}

async fn fill_entries(client: &Client, entries: usize) -> Result<()> {
    let mut next = 0;
    while next < entries {
        let end = (next + RECORD_BATCH).min(entries);
        let batch = (next..end)
            .map(|index| proto::Entry {
                key: Some(bundled_key(index)),
                result: Some(result(index, Vec::new())),
            })
            .collect();
        client.record(batch).await?;
        next = end;
    }
    Ok(())
}

/// Writes `bytes` of a xorshift stream seeded by `seed` to `path`, 1 MiB at a time: bytes zstd
/// cannot shrink, never held whole.
async fn write_blob(path: &Path, seed: u64, bytes: u64) -> Result<()> {
    let mut file = tokio::io::BufWriter::new(tokio::fs::File::create(path).await?);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for word in chunk.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let take = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..take]).await?;
        left -= take as u64;
    }
    file.flush().await?;
    Ok(())
}

async fn fill_artifacts(client: &Client, scratch: &Path, blobs: usize, bytes: u64) -> Result<()> {
    let path = scratch.join("upload.bin");
    for index in 0..blobs {
        write_blob(&path, index as u64 + 1, bytes).await?;
        let stored = client.put_artifact(&path).await?;
        tokio::fs::remove_file(&path).await?;
        let entry = proto::Entry {
            key: Some(bundled_key(index)),
            result: Some(result(index, vec![stored.named("kernel.cubin")?])),
        };
        client.record(vec![entry]).await?;
    }
    Ok(())
}

/// An Ed25519 key pair made by `openssl`: the private key (mode 600) and its public key.
fn make_keys(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let private = dir.join("staging.pem");
    let public = dir.join("staging.pub");
    let run = |args: &[&str]| -> Result<()> {
        let status = Command::new("openssl")
            .args(args)
            .stdout(Stdio::null())
            .status()
            .context("running openssl")?;
        ensure!(status.success(), "openssl {args:?}: {status}");
        Ok(())
    };
    let private_text = private.to_string_lossy();
    run(&["genpkey", "-algorithm", "ed25519", "-out", &private_text])?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600))?;
    run(&[
        "pkey",
        "-in",
        &private_text,
        "-pubout",
        "-out",
        &public.to_string_lossy(),
    ])?;
    Ok((private, public))
}

/// Waits for the child `pid` with `wait4`: its exit status and peak RSS (ru_maxrss, KiB).
fn wait_with_peak(pid: u32) -> Result<(i32, u64)> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: `status` and `usage` are valid for writes for the duration of the call.
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    ensure!(
        reaped == pid,
        "wait4({pid}): {}",
        std::io::Error::last_os_error()
    );
    Ok((status, u64::try_from(usage.ru_maxrss).unwrap_or(0)))
}

/// What one `tunecache bundle export` cost.
struct Export {
    wall_ms: f64,
    cli_peak_rss_kib: u64,
    staging_rss_before_kib: u64,
    staging_peak_rss_kib: u64,
    bundle_bytes: u64,
}

/// Runs the CLI's `bundle export` of everything `staging` serves into `out`, signed by `key`.
fn export(cli: &Path, staging: &DaemonProcess, key: &Path, out: &Path) -> Result<Export> {
    let pid = staging.pid()?;
    reset_peak_memory(pid)?;
    let before = process_memory(pid)?;
    let log = out.with_extension("export.log");
    let mut command = Command::new(cli);
    command
        .arg("--socket")
        .arg(&staging.socket)
        .args(["bundle", "export", "--out"])
        .arg(out)
        .arg("--sign-key")
        .arg(key)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::options().append(true).open(&log)?);
    without_tunecache_env(&mut command);
    let started = Instant::now();
    let child = command
        .spawn()
        .context("starting tunecache bundle export")?;
    let (status, cli_peak_rss_kib) = wait_with_peak(child.id())?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    if status != 0 {
        bail!(
            "tunecache bundle export failed (wait status {status}): {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let after = process_memory(pid)?;
    Ok(Export {
        wall_ms,
        cli_peak_rss_kib,
        staging_rss_before_kib: before.rss_kib,
        staging_peak_rss_kib: after.hwm_kib,
        bundle_bytes: std::fs::metadata(out)?.len(),
    })
}

/// Spawns a daemon on `bundle` (or on none), waits until Stats answers with `entries` bundled
/// entries; answers the time since the spawn, the daemon and its client.
async fn start(
    binary: &Path,
    work_dir: &Path,
    bundle: Option<(&Path, &Path)>,
    entries: usize,
) -> Result<(f64, DaemonProcess, Client)> {
    let mut args = Vec::new();
    if let Some((bundle, trust)) = bundle {
        args.extend([
            "--bundle".to_owned(),
            bundle.display().to_string(),
            "--bundle-trust-key".to_owned(),
            trust.display().to_string(),
            "--replay".to_owned(),
        ]);
    }
    let started = Instant::now();
    let mut process = daemon(binary, work_dir, args)?;
    let client = process.wait_ready().await?;
    let expected = if bundle.is_some() { entries as u64 } else { 0 };
    loop {
        let stats = client.stats().await?;
        if stats.bundle_entries == expected {
            break;
        }
        ensure!(
            started.elapsed() < tunecache_bench::daemon::READY_LIMIT,
            "the daemon answers {} bundled entries, not {expected}",
            stats.bundle_entries
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok((started.elapsed().as_secs_f64() * 1e3, process, client))
}

/// One round of a case: export `staging` into a fresh bundle, start an idle daemon and one on
/// the bundle. Answers the round and the replaying daemon, still running.
async fn bundle_round(
    binaries: &Binaries,
    staging: &DaemonProcess,
    dir: &Path,
    entries: usize,
) -> Result<(BundleRound, DaemonProcess, Client)> {
    std::fs::create_dir_all(dir)?;
    let bundle = dir.join("bench.tcb");
    let exported = tokio::task::block_in_place(|| {
        export(&binaries.cli, staging, &binaries.private_key, &bundle)
    })?;
    let (_, mut idle, idle_client) = start(&binaries.daemon, &dir.join("idle"), None, 0).await?;
    let idle_peak_rss_kib = idle.memory()?.hwm_kib;
    drop(idle_client);
    idle.stop();
    let (startup_ms, replaying, client) = start(
        &binaries.daemon,
        &dir.join("replay"),
        Some((&bundle, &binaries.public_key)),
        entries,
    )
    .await?;
    let round = BundleRound {
        export_ms: exported.wall_ms,
        cli_peak_rss_kib: exported.cli_peak_rss_kib,
        staging_rss_before_kib: exported.staging_rss_before_kib,
        staging_peak_rss_kib: exported.staging_peak_rss_kib,
        bundle_bytes: exported.bundle_bytes,
        startup_ms,
        startup_peak_rss_kib: replaying.memory()?.hwm_kib,
        idle_peak_rss_kib,
    };
    Ok((round, replaying, client))
}

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// Resolves `keys` one after the other in replay mode, timing each; every answer must be a hit
/// (`hits`) or a miss.
async fn resolve_series(client: &Client, keys: Vec<proto::Key>, hits: bool) -> Result<Latency> {
    let mut times = Vec::with_capacity(keys.len());
    for key in keys {
        let one = Instant::now();
        let answer = client.resolve(key, ResolveOptions::default()).await?;
        times.push(one.elapsed().as_secs_f64() * 1e6);
        match (&answer, hits) {
            (Resolution::Hit(_), true) | (Resolution::Miss(_), false) => {}
            (other, _) => bail!("a replayed Resolve answered {other:?}"),
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Latency {
        p50_us: percentile(&times, 0.50),
        p90_us: percentile(&times, 0.90),
        p99_us: percentile(&times, 0.99),
    })
}

/// Resolves of keys in no bundle (new each time, one repeated) and of bundled keys, on the
/// replaying daemon of round `round`.
async fn latency_round(
    client: &Client,
    round: usize,
    resolves: usize,
    bundled: usize,
) -> Result<LatencyRound> {
    let client = client.clone().replay();
    let missing = |index: usize| key("replay-miss", round * 1_000_000 + index);
    let fresh = |base: usize| (base..base + resolves).map(missing).collect::<Vec<_>>();
    let same = vec![missing(999_999); resolves];
    let hits = (0..resolves)
        .map(|index| bundled_key(index * 7919 % bundled.max(1)))
        .collect::<Vec<_>>();
    resolve_series(
        &client,
        fresh(resolves)[..WARM_UP.min(resolves)].to_vec(),
        false,
    )
    .await?;
    resolve_series(&client, hits[..WARM_UP.min(resolves)].to_vec(), true).await?;
    // The order alternates between rounds, so that neither series always runs first.
    let (miss_new_key, hit) = if round.is_multiple_of(2) {
        let miss = resolve_series(&client, fresh(2 * resolves), false).await?;
        (miss, resolve_series(&client, hits, true).await?)
    } else {
        let hit = resolve_series(&client, hits, true).await?;
        (
            resolve_series(&client, fresh(2 * resolves), false).await?,
            hit,
        )
    };
    let miss_same_key = resolve_series(&client, same, false).await?;
    Ok(LatencyRound {
        miss_new_key,
        miss_same_key,
        hit,
    })
}

struct Binaries {
    daemon: PathBuf,
    cli: PathBuf,
    private_key: PathBuf,
    public_key: PathBuf,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// How far `peak` (KiB) is above `idle` (KiB), in MB (the unit of the issue's bound).
fn above(peak: u64, idle: u64) -> f64 {
    peak.saturating_sub(idle) as f64 * 1024.0 / 1e6
}

/// Figures of one case over its rounds.
fn bundle_figures(case: &str, rounds: &[BundleRound]) -> Vec<Figure> {
    let goal = Some(RSS_GOAL_BYTES as f64 / 1e6);
    type Of = fn(&BundleRound) -> f64;
    let rows: [(&str, &str, Option<f64>, Of); 8] = [
        ("export: `tunecache bundle export` wall", "ms", None, |r| {
            r.export_ms
        }),
        ("export: the CLI's peak RSS", "MiB", None, |r| {
            mib(r.cli_peak_rss_kib)
        }),
        (
            "export: the staging daemon's RSS before",
            "MiB",
            None,
            |r| mib(r.staging_rss_before_kib),
        ),
        (
            "export: the staging daemon's peak RSS above its RSS before",
            "MB",
            goal,
            |r| above(r.staging_peak_rss_kib, r.staging_rss_before_kib),
        ),
        ("bundle size", "bytes", None, |r| r.bundle_bytes as f64),
        (
            "start-up with `--bundle --bundle-trust-key --replay`: spawn to serving every entry",
            "ms",
            None,
            |r| r.startup_ms,
        ),
        (
            "start-up: the idle daemon's peak RSS (no bundle)",
            "MiB",
            None,
            |r| mib(r.idle_peak_rss_kib),
        ),
        (
            "start-up: the replaying daemon's peak RSS above the idle daemon's",
            "MB",
            goal,
            |r| above(r.startup_peak_rss_kib, r.idle_peak_rss_kib),
        ),
    ];
    rows.into_iter()
        .map(|(what, unit, goal_max, of)| figure(case, what, unit, goal_max, rounds.iter().map(of)))
        .collect()
}

fn figure(
    case: &str,
    what: &str,
    unit: &str,
    goal_max: Option<f64>,
    values: impl Iterator<Item = f64>,
) -> Figure {
    let mut values: Vec<f64> = values.collect();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(0.0, f64::max);
    Figure {
        case: case.to_owned(),
        what: what.to_owned(),
        unit: unit.to_owned(),
        rounds: values.len(),
        median: median(&mut values),
        min,
        max,
        goal_max,
        met: goal_max.map(|goal| max <= goal),
    }
}

fn latency_figures(resolves: usize, rounds: &[LatencyRound]) -> Vec<Figure> {
    let case = format!("replay: {resolves} one-key Resolves on the entries' replaying daemon");
    type Series = fn(&LatencyRound) -> &Latency;
    let series: [(&str, Series); 3] = [
        ("miss, a new key each time", |r| &r.miss_new_key),
        ("miss, the same key each time", |r| &r.miss_same_key),
        ("hit, a bundled key (the floor)", |r| &r.hit),
    ];
    let mut figures = Vec::new();
    for (what, of) in series {
        type Part = fn(&Latency) -> f64;
        let parts: [(&str, Part); 3] = [
            ("p50", |l| l.p50_us),
            ("p90", |l| l.p90_us),
            ("p99", |l| l.p99_us),
        ];
        for (name, part) in parts {
            figures.push(figure(
                &case,
                &format!("{what}: {name}"),
                "us",
                None,
                rounds.iter().map(|r| part(of(r))),
            ));
        }
    }
    figures
}

/// Runs every case `rounds` times; writes `bundles.json` and `bundles.md` into `out_dir`.
pub fn run(options: &BundlesOptions) -> Result<BundlesResults> {
    ensure!(
        options.rounds > 0 && options.entries > 0 && options.resolves > 0,
        "--rounds, --entries and --resolves must be at least 1"
    );
    let load_average_start = load_average();
    let scratch = tempfile::Builder::new()
        .prefix("tunecache-bundles-")
        .tempdir()?;
    let (private_key, public_key) = make_keys(scratch.path())?;
    let binaries = Binaries {
        daemon: workspace_binary("tunecached"),
        cli: workspace_binary("tunecache"),
        private_key,
        public_key,
    };
    for binary in [&binaries.daemon, &binaries.cli] {
        ensure!(binary.exists(), "{} not found", binary.display());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let blob_bytes = options.blob_mib * 1024 * 1024;
    let (entry_rounds, latency_rounds, artifact_rounds) = runtime.block_on(async {
        let mut staging = daemon(
            &binaries.daemon,
            &scratch.path().join("staging"),
            Vec::new(),
        )?;
        let client = staging.wait_ready().await?;
        progress(&format!("recording {} entries", options.entries));
        fill_entries(&client, options.entries).await?;
        let mut entry_rounds = Vec::new();
        let mut latency_rounds = Vec::new();
        for round in 0..options.rounds {
            let dir = scratch.path().join(format!("entries-{round}"));
            let (result, mut replaying, replay_client) =
                bundle_round(&binaries, &staging, &dir, options.entries).await?;
            round_progress("entries", round, &result);
            entry_rounds.push(result);
            let latency =
                latency_round(&replay_client, round, options.resolves, options.entries).await?;
            progress(&format!(
                "latency round {}: miss p50 {:.0} us, hit p50 {:.0} us",
                round + 1,
                latency.miss_new_key.p50_us,
                latency.hit.p50_us
            ));
            latency_rounds.push(latency);
            drop(replay_client);
            replaying.stop();
            std::fs::remove_dir_all(&dir)?;
        }
        drop(client);
        staging.stop();
        std::fs::remove_dir_all(scratch.path().join("staging"))?;

        let mut staging = daemon(&binaries.daemon, &scratch.path().join("blobs"), Vec::new())?;
        let client = staging.wait_ready().await?;
        progress(&format!(
            "uploading {} blobs of {} MiB",
            options.blobs, options.blob_mib
        ));
        fill_artifacts(&client, scratch.path(), options.blobs, blob_bytes).await?;
        let mut artifact_rounds = Vec::new();
        for round in 0..options.rounds {
            let dir = scratch.path().join(format!("artifacts-{round}"));
            let (result, mut replaying, replay_client) =
                bundle_round(&binaries, &staging, &dir, options.blobs).await?;
            round_progress("artifacts", round, &result);
            artifact_rounds.push(result);
            drop(replay_client);
            replaying.stop();
            std::fs::remove_dir_all(&dir)?;
        }
        drop(client);
        staging.stop();
        anyhow::Ok((entry_rounds, latency_rounds, artifact_rounds))
    })?;
    let entries_case = format!("{} entries, no artifacts", options.entries);
    let artifacts_case = format!(
        "{} entries naming {} blobs of {} MiB",
        options.blobs, options.blobs, options.blob_mib
    );
    let mut figures = bundle_figures(&entries_case, &entry_rounds);
    figures.extend(bundle_figures(&artifacts_case, &artifact_rounds));
    figures.extend(latency_figures(options.resolves, &latency_rounds));
    let results = BundlesResults {
        command_line: options.command_line.clone(),
        machine: machine_info(&options.command_line),
        daemon: binaries.daemon.display().to_string(),
        cli: binaries.cli.display().to_string(),
        load_average_start,
        load_average_end: load_average(),
        entries: options.entries,
        blobs: options.blobs,
        blob_bytes,
        resolves: options.resolves,
        entry_rounds,
        artifact_rounds,
        latency_rounds,
        figures,
    };
    std::fs::create_dir_all(&options.out_dir)?;
    let json = serde_json::to_value(&results)?;
    std::fs::write(
        options.out_dir.join("bundles.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let table = tunecache_bench::current::render("bundles", &json)?;
    std::fs::write(options.out_dir.join("bundles.md"), &table)?;
    Ok(results)
}
