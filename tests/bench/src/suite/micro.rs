//! Owns the daemon micro-benchmarks of the suite: Lookup latency (single keys, 1,000-key
//! batches) and throughput at 1/8/32 concurrent clients; a Python grpcio client scanning
//! 5,000 entries; snapshot write and load time and peak memory at 100k and 1M entries; the
//! daemon's resident memory per 100k entries; and how long a node takes to see a peer's new
//! entry through the shared directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tunecache_bench::daemon::{DaemonConfig, DaemonProcess};
use tunecache_bench::tunecache_system::{existing_entries, record_all, DEVICE, NAMESPACE};
use tunecache_client::{proto as v1, Client};

use super::slowfs::SlowMount;
use super::{median, progress};

pub struct MicroOptions {
    pub quick: bool,
    pub daemon_binary: PathBuf,
    pub slowfs_binary: PathBuf,
    pub scratch: PathBuf,
    pub python_dir: PathBuf,
    pub slowfs_threads: usize,
    pub slowfs_latency_ms: u64,
}

/// Percentiles of a set of latencies, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

pub(super) fn latency_of(mut micros: Vec<f64>) -> Latency {
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if micros.is_empty() {
            return 0.0;
        }
        let index = ((micros.len() as f64 * q).ceil() as usize).clamp(1, micros.len()) - 1;
        micros[index]
    };
    Latency {
        samples: micros.len(),
        p50_us: at(0.50),
        p99_us: at(0.99),
        max_us: micros.last().copied().unwrap_or(0.0),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub clients: usize,
    pub keys_per_call: usize,
    pub seconds: f64,
    pub keys: u64,
    pub keys_per_s: f64,
    /// The daemon's CPU time (user and system) per 1,000 keys looked up: what the daemon's
    /// code costs, which a busy machine changes far less than it changes `keys_per_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_cpu_ms_per_1000_keys: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LookupResults {
    pub entries_in_cache: usize,
    pub single_key: Latency,
    /// The transport floor: a bare gRPC health Check on the same socket, connection and
    /// daemon runtime, timed the same way as `single_key`.
    #[serde(default)]
    pub echo: Option<Latency>,
    pub batch_1000: Latency,
    pub throughput: Vec<Throughput>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PythonScan {
    /// Why it did not run, when it did not.
    pub skipped: Option<String>,
    pub entries: usize,
    pub runs: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// Bytes of the Scan responses on the wire (the gRPC messages, without framing).
    #[serde(default)]
    pub wire_bytes: usize,
    /// Python's own parse of those same bytes (protobuf `FromString` plus touching every
    /// entry), median of the runs.
    #[serde(default)]
    pub parse_ms: f64,
    /// One bare echo round trip from Python (health Check), median.
    #[serde(default)]
    pub echo_ms: f64,
    /// The same Scan as `Client.scan(..., lazy=True)` (issue 54), medians in ms: the mapping
    /// alone (transfer and key index), with a tenth of its entries read, with every one read.
    /// `None` for a client without it.
    pub lazy: Option<LazyScan>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LazyScan {
    pub mapping_ms: f64,
    pub read_tenth_ms: f64,
    pub read_all_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotScale {
    pub entries: usize,
    pub file_bytes: u64,
    /// The daemon's own time for the write (Snapshot RPC `duration_ms`).
    pub write_ms: f64,
    /// The Snapshot RPC as the caller saw it.
    pub write_call_ms: f64,
    /// Peak resident memory of the writer during the snapshot (VmHWM reset before it).
    pub write_peak_rss_mib: f64,
    /// Resident memory of the writer before recording and after recording the entries.
    pub rss_empty_mib: f64,
    pub rss_loaded_mib: f64,
    /// (rss_loaded - rss_empty) per 100,000 entries.
    pub rss_per_100k_mib: f64,
    /// Second daemon, empty state, same shared dir: spawn until Stats shows every entry.
    pub load_ms: f64,
    /// Peak resident memory of the loading daemon, from its start.
    pub load_peak_rss_mib: f64,
    pub load_rss_after_mib: f64,
    /// Time to record the entries through gRPC (not a target, for context).
    pub record_ms: f64,
    /// Mean encoded size of one `Entry` message of this data set.
    #[serde(default)]
    pub entry_encoded_bytes: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerPickup {
    pub filesystem: String,
    pub snapshot_interval_s: u64,
    pub samples_ms: Vec<f64>,
    pub median_ms: f64,
    pub max_ms: f64,
    pub missed: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct MicroResults {
    pub lookup: LookupResults,
    pub python_scan: PythonScan,
    pub snapshots: Vec<SnapshotScale>,
    pub peer_pickup: Vec<PeerPickup>,
}

const MIB: f64 = 1024.0;

pub(super) fn daemon_config(
    options: &MicroOptions,
    name: &str,
    shared_dir: Option<&Path>,
    interval_s: u64,
) -> DaemonConfig {
    DaemonConfig {
        binary: options.daemon_binary.clone(),
        work_dir: options.scratch.join(format!("micro-{name}")),
        node_name: name.to_owned(),
        shared_dir: shared_dir.map(Path::to_path_buf),
        snapshot_interval_s: interval_s,
        extra_args: Vec::new(),
    }
}

pub(super) fn key_of(entry: &v1::Entry) -> v1::Key {
    entry.key.clone().unwrap_or_default()
}

async fn measure_lookup(options: &MicroOptions) -> Result<LookupResults> {
    let entries_in_cache = if options.quick { 2_000 } else { 100_000 };
    let (single_calls, batch_calls, seconds) = if options.quick {
        (200, 10, 0.3)
    } else {
        (20_000, 500, 3.0)
    };
    let mut daemon = DaemonProcess::spawn(&daemon_config(options, "lookup", None, 30))?;
    let client = daemon.wait_ready().await?;
    let entries = existing_entries(8, entries_in_cache, 0.5);
    let keys: Arc<Vec<v1::Key>> = Arc::new(entries.iter().map(key_of).collect());
    record_all(&client, entries).await?;

    // Warm the connection and the daemon's paths before timing.
    for key in keys.iter().take(1_000) {
        client.lookup(vec![key.clone()]).await?;
    }
    let mut single = Vec::with_capacity(single_calls);
    for call in 0..single_calls {
        let key = keys[(call * 7919) % keys.len()].clone();
        let started = Instant::now();
        let hits = client.lookup(vec![key]).await?;
        single.push(started.elapsed().as_secs_f64() * 1e6);
        if hits.len() != 1 {
            bail!("single lookup missed a preloaded key");
        }
    }
    let echo = measure_echo(&daemon.socket, single_calls).await?;
    let mut batch = Vec::with_capacity(batch_calls);
    for call in 0..batch_calls {
        let start = (call * 1_000) % (keys.len() - 1_000);
        let request: Vec<v1::Key> = keys[start..start + 1_000].to_vec();
        let started = Instant::now();
        let hits = client.lookup(request).await?;
        batch.push(started.elapsed().as_secs_f64() * 1e6);
        if hits.len() != 1_000 {
            bail!("batch lookup missed preloaded keys");
        }
    }

    let mut throughput = Vec::new();
    let daemon_pid = daemon.pid()?;
    for keys_per_call in [1usize, 1_000] {
        for clients in [1usize, 8, 32] {
            let cpu_before = process_cpu_s(daemon_pid)?;
            let mut measured =
                measure_throughput(&daemon.socket, &keys, clients, keys_per_call, seconds).await?;
            let cpu_ms = (process_cpu_s(daemon_pid)? - cpu_before) * 1e3;
            measured.daemon_cpu_ms_per_1000_keys =
                Some(cpu_ms / (measured.keys.max(1) as f64 / 1_000.0));
            throughput.push(measured);
        }
    }
    daemon.stop();
    Ok(LookupResults {
        entries_in_cache,
        single_key: latency_of(single),
        echo: Some(echo),
        batch_1000: latency_of(batch),
        throughput,
    })
}

/// The transport floor: `calls` bare health Checks, each timed, on one connection to
/// `socket` (what the daemon's tonic server, runtime and socket cost with no cache work).
async fn measure_echo(socket: &Path, calls: usize) -> Result<Latency> {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let channel = tunecache_client::connect_channel(socket).await?;
    let mut health = HealthClient::new(channel);
    let request = || HealthCheckRequest {
        service: String::new(),
    };
    for _ in 0..1_000 {
        health.check(request()).await.context("health check")?;
    }
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        health.check(request()).await.context("health check")?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(latency_of(times))
}

/// The CPU time process `pid` has used, user and system, all its threads (ended ones too), in
/// seconds (`/proc/<pid>/stat`, in USER_HZ ticks of 10 ms).
pub(super) fn process_cpu_s(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command's closing parenthesis; utime and stime are the 12th and
    // 13th of them (fields 14 and 15 of the line).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("/proc/<pid>/stat without a command")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| -> Result<f64> {
        Ok(fields
            .get(index)
            .context("/proc/<pid>/stat is short")?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// `clients` tasks, each with its own connection, look keys up for `seconds`.
pub(super) async fn measure_throughput(
    socket: &Path,
    keys: &Arc<Vec<v1::Key>>,
    clients: usize,
    keys_per_call: usize,
    seconds: f64,
) -> Result<Throughput> {
    let mut connected = Vec::with_capacity(clients);
    for _ in 0..clients {
        connected.push(Client::connect(socket).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let looked_up = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for (task, client) in connected.into_iter().enumerate() {
        let (stop, looked_up, keys) = (stop.clone(), looked_up.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut call = task * 104_729;
            while !stop.load(Ordering::Relaxed) {
                let start = (call * keys_per_call) % (keys.len() - keys_per_call);
                let request = keys[start..start + keys_per_call].to_vec();
                let hits = client.lookup(request).await?;
                looked_up.fetch_add(hits.len() as u64, Ordering::Relaxed);
                call += 1;
            }
            Ok::<_, tunecache_client::ClientError>(())
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.context("lookup task")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let keys = looked_up.load(Ordering::Relaxed);
    Ok(Throughput {
        clients,
        keys_per_call,
        seconds: elapsed,
        keys,
        keys_per_s: keys as f64 / elapsed,
        daemon_cpu_ms_per_1000_keys: None,
    })
}

/// Python, shared by `pyscan` and `transport`: `timed_scans` times Scans through the client;
/// `scan_floor` takes the Scan's bytes raw off the wire and returns (wire bytes, the client's
/// parse of them (see flavor.py), one bare echo round trip (health Check)), medians in ms. Works
/// with either Python client (the binding of today or the grpcio package before it).
pub(super) const PYTHON_FLOOR: &str = concat!(
    include_str!("../../python/flavor.py"),
    r#"
import statistics, time
def timed_scans(client, namespace, device, runs):
    """Scans through the client `runs` times after one warm-up; returns (entries, ms each)."""
    def scan():
        return [entry for chunk in client.scan(namespace, device) for entry in chunk]
    count = len(scan())
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        entries = scan()
        times.append((time.perf_counter() - started) * 1e3)
        assert len(entries) == count
    return count, times
def scan_floor(client, namespace, device, runs, count):
    chunks, channel = raw_scan_chunks(client.socket_path, namespace, device)
    parse = []
    for _ in range(runs):
        started = time.perf_counter()
        parsed = decode_scan(chunks)
        parse.append((time.perf_counter() - started) * 1e3)
        assert len(parsed) == count
    echo_call = channel.unary_unary("/grpc.health.v1.Health/Check")
    for _ in range(100):
        echo_call(b"")
    echo = []
    for _ in range(max(runs, 201)):
        started = time.perf_counter()
        echo_call(b"")
        echo.append((time.perf_counter() - started) * 1e3)
    return sum(len(c) for c in chunks), statistics.median(parse), statistics.median(echo)
"#
);

const PYTHON_SCAN: &str = r#"
import json, sys, time
from tunecache import Client
socket, namespace, device, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
client = Client(socket, timeout=60)
count, times = timed_scans(client, namespace, device, runs)
wire_bytes, parse_ms, echo_ms = scan_floor(client, namespace, device, runs, count)
lazy = None
if "lazy" in (getattr(Client.scan, "__text_signature__", None) or ""):
    tenth = [entry.key for chunk in client.scan(namespace, device) for entry in chunk][::10]
    def lazy_scan(read):
        view = client.scan(namespace, device, lazy=True)
        assert len(view) == count
        read(view)
    def lazy_ms(read):
        lazy_scan(read)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            lazy_scan(read)
            times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times)
    lazy = {"mapping_ms": lazy_ms(lambda view: None),
            "read_tenth_ms": lazy_ms(lambda view: [view[key] for key in tenth]),
            "read_all_ms": lazy_ms(lambda view: view.values())}
print(json.dumps({"entries": count, "times_ms": times, "wire_bytes": wire_bytes,
                  "parse_ms": parse_ms, "echo_ms": echo_ms, "lazy": lazy}))
"#;

async fn measure_python_scan(options: &MicroOptions) -> Result<PythonScan> {
    let entries = if options.quick { 200 } else { 5_000 };
    let runs = if options.quick { 3 } else { 31 };
    let python = options.python_dir.join(".venv/bin/python");
    let skipped = |why: String| PythonScan {
        skipped: Some(why),
        entries,
        runs: 0,
        median_ms: 0.0,
        min_ms: 0.0,
        max_ms: 0.0,
        wire_bytes: 0,
        parse_ms: 0.0,
        echo_ms: 0.0,
        lazy: None,
    };
    if !python.exists() {
        return Ok(skipped(format!(
            "{} not found (create it with client/python/run_tests.sh)",
            python.display()
        )));
    }
    let mut daemon = DaemonProcess::spawn(&daemon_config(options, "pyscan", None, 30))?;
    let client = daemon.wait_ready().await?;
    record_all(&client, existing_entries(8, entries, 0.5)).await?;
    let output = Command::new(&python)
        .arg("-c")
        .arg(format!("{PYTHON_FLOOR}{PYTHON_SCAN}"))
        .arg(&daemon.socket)
        .arg(NAMESPACE)
        .arg(DEVICE)
        .arg(runs.to_string())
        // The package installed in the venv (the wheel); no source tree may shadow it.
        .env_remove("PYTHONPATH")
        .env("TUNECACHE_VIEW", "")
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    daemon.stop();
    if !output.status.success() {
        return Ok(skipped(format!(
            "python failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    #[derive(serde::Deserialize)]
    struct Reported {
        entries: usize,
        times_ms: Vec<f64>,
        wire_bytes: usize,
        parse_ms: f64,
        echo_ms: f64,
        lazy: Option<LazyScan>,
    }
    let reported: Reported = serde_json::from_slice(&output.stdout).context("python report")?;
    let mut times = reported.times_ms;
    let min_ms = times.iter().copied().fold(f64::INFINITY, f64::min);
    let max_ms = times.iter().copied().fold(0.0, f64::max);
    Ok(PythonScan {
        skipped: None,
        entries: reported.entries,
        runs: times.len(),
        median_ms: median(&mut times),
        min_ms,
        max_ms,
        wire_bytes: reported.wire_bytes,
        parse_ms: reported.parse_ms,
        echo_ms: reported.echo_ms,
        lazy: reported.lazy,
    })
}

/// How long a daemon is left idle before its steady-state memory is read.
const SETTLE: Duration = Duration::from_secs(1);

async fn measure_snapshot_scale(options: &MicroOptions, entries: usize) -> Result<SnapshotScale> {
    let shared = options.scratch.join(format!("snapshots-{entries}"));
    std::fs::create_dir_all(&shared)?;
    let writer_name = format!("writer-{entries}");
    // A long interval: only the Snapshot RPC writes, so the timing is of one write.
    let mut writer =
        DaemonProcess::spawn(&daemon_config(options, &writer_name, Some(&shared), 3_600))?;
    let client = writer.wait_ready().await?;
    let empty = writer.memory()?;
    let generated = existing_entries(64, entries, 0.5);
    let entry_encoded_bytes = generated
        .iter()
        .map(|entry| prost::Message::encoded_len(entry) as f64)
        .sum::<f64>()
        / entries as f64;
    let record_started = Instant::now();
    record_all(&client, generated).await?;
    let record_ms = record_started.elapsed().as_secs_f64() * 1e3;
    // Steady state: the writer hands a burst's freed heap pages back once idle for 200 ms.
    tokio::time::sleep(SETTLE).await;
    let loaded = writer.memory()?;
    // Reset VmHWM (clear_refs 5) so the peak below is the snapshot's alone.
    let pid = writer.pid()?;
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").context("resetting VmHWM")?;
    let mut request = tonic::Request::new(v1::SnapshotRequest {});
    request.set_timeout(Duration::from_secs(120));
    let call_started = Instant::now();
    let response = client
        .raw()
        .snapshot(request)
        .await
        .map_err(|status| anyhow::anyhow!("Snapshot RPC: {}", status.message()))?
        .into_inner();
    let write_call_ms = call_started.elapsed().as_secs_f64() * 1e3;
    let after_write = writer.memory()?;
    writer.stop();

    let reader_name = format!("reader-{entries}");
    let mut reader =
        DaemonProcess::spawn(&daemon_config(options, &reader_name, Some(&shared), 3_600))?;
    let reader_client = reader.wait_ready().await?;
    let load_limit = Duration::from_secs(120);
    loop {
        let stats = reader_client.stats().await?;
        if stats.entries as usize >= entries {
            break;
        }
        if reader.spawned_at.elapsed() > load_limit {
            bail!(
                "reader saw {} of {entries} entries after {load_limit:?}",
                stats.entries
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let load_ms = reader.spawned_at.elapsed().as_secs_f64() * 1e3;
    tokio::time::sleep(SETTLE).await;
    let reader_memory = reader.memory()?;
    reader.stop();
    let _ = std::fs::remove_dir_all(&shared);

    let rss_empty_mib = empty.rss_kib as f64 / MIB;
    let rss_loaded_mib = loaded.rss_kib as f64 / MIB;
    Ok(SnapshotScale {
        entries,
        file_bytes: response.bytes,
        write_ms: response.duration_ms as f64,
        write_call_ms,
        write_peak_rss_mib: after_write.hwm_kib as f64 / MIB,
        rss_empty_mib,
        rss_loaded_mib,
        rss_per_100k_mib: (rss_loaded_mib - rss_empty_mib) * 100_000.0 / entries as f64,
        load_ms,
        load_peak_rss_mib: reader_memory.hwm_kib as f64 / MIB,
        load_rss_after_mib: reader_memory.rss_kib as f64 / MIB,
        record_ms,
        entry_encoded_bytes,
    })
}

/// Two daemons share `shared` with a 1 s interval; record on A, poll Lookup on B.
async fn measure_pickup(
    options: &MicroOptions,
    label: &str,
    shared: &Path,
    samples: usize,
) -> Result<PeerPickup> {
    let interval_s = 1;
    let mut node_a = DaemonProcess::spawn(&daemon_config(
        options,
        &format!("pick-a-{label}"),
        Some(shared),
        interval_s,
    ))?;
    let mut node_b = DaemonProcess::spawn(&daemon_config(
        options,
        &format!("pick-b-{label}"),
        Some(shared),
        interval_s,
    ))?;
    let client_a = node_a.wait_ready().await?;
    let client_b = node_b.wait_ready().await?;
    // Let both finish their first load pass so the timing is of steady state.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let limit = Duration::from_secs(30);
    let mut samples_ms = Vec::with_capacity(samples);
    let mut missed = 0;
    for sample in 0..samples {
        let key = v1::Key {
            namespace: NAMESPACE.to_owned(),
            op: "bench::pickup".to_owned(),
            device: DEVICE.to_owned(),
            problem: format!("{label}-{sample}"),
            rank: None,
        };
        let entry = v1::Entry {
            key: Some(key.clone()),
            result: Some(v1::Result {
                config: "{}".to_owned(),
                time_us: 1.0,
                tuned_by: "bench/pickup".to_owned(),
                tuned_at_unix_ms: 1_700_000_000_000,
                forget_epoch: 0,
                artifacts: Default::default(),
            }),
        };
        let recorded = Instant::now();
        client_a.record(vec![entry]).await?;
        loop {
            if !client_b.lookup(vec![key.clone()]).await?.is_empty() {
                samples_ms.push(recorded.elapsed().as_secs_f64() * 1e3);
                break;
            }
            if recorded.elapsed() > limit {
                missed += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Spread the samples over the interval phase: wait a non-multiple of it.
        tokio::time::sleep(Duration::from_millis(370)).await;
    }
    node_a.stop();
    node_b.stop();
    let max_ms = samples_ms.iter().copied().fold(0.0, f64::max);
    let mut sorted = samples_ms.clone();
    Ok(PeerPickup {
        filesystem: label.to_owned(),
        snapshot_interval_s: interval_s,
        median_ms: median(&mut sorted),
        max_ms,
        samples_ms,
        missed,
    })
}

/// Runs only the named micro-benchmarks (`lookup`, `pyscan`, `memory` = snapshot scale at
/// 100k and 1M entries, `pickup`, `transport` = the interleaved transport comparison, `views`
/// = reads with and without a job view, `views-hostile` = a job's first view read beside
/// another uid that churns views at its cap, `forget` = a Forget flood beside a bystander,
/// `replay` = the first answers after SIGKILL and restart) and returns their results as JSON, with the ratios
/// the data-path targets are judged by.
pub fn run_selected(options: &MicroOptions, only: &[String]) -> Result<serde_json::Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let wants = |name: &str| only.iter().any(|item| item == name);
    runtime.block_on(async {
        let mut out = serde_json::Map::new();
        if wants("lookup") {
            progress("lookup latency, echo floor and throughput ...");
            let lookup = measure_lookup(options).await?;
            if let Some(echo) = &lookup.echo {
                out.insert(
                    "lookup_p50_over_echo_p50".into(),
                    (lookup.single_key.p50_us / echo.p50_us).into(),
                );
            }
            out.insert("lookup".into(), serde_json::to_value(lookup)?);
        }
        if wants("pyscan") {
            progress("python scan ...");
            let scan = measure_python_scan(options).await?;
            let floor = scan.parse_ms + scan.echo_ms;
            if floor > 0.0 {
                out.insert(
                    "python_scan_over_floor".into(),
                    (scan.median_ms / floor).into(),
                );
            }
            out.insert("python_scan".into(), serde_json::to_value(scan)?);
        }
        if wants("memory") {
            let scales: &[usize] = if options.quick {
                &[1_000, 10_000]
            } else {
                &[100_000, 1_000_000]
            };
            let mut rows = Vec::new();
            for &entries in scales {
                progress(&format!("memory and snapshot at {entries} entries ..."));
                let scale = measure_snapshot_scale(options, entries).await?;
                let per_entry =
                    (scale.rss_loaded_mib - scale.rss_empty_mib) * MIB * 1024.0 / entries as f64;
                let mut row = serde_json::to_value(&scale)?;
                row["rss_bytes_per_entry"] = per_entry.into();
                row["rss_per_entry_over_encoded"] = (per_entry / scale.entry_encoded_bytes).into();
                row["load_peak_over_steady"] =
                    (scale.load_peak_rss_mib / scale.load_rss_after_mib).into();
                // The stricter reading: against the writer, which was given the same entries.
                row["load_peak_over_writer_steady"] =
                    (scale.load_peak_rss_mib / scale.rss_loaded_mib).into();
                rows.push(row);
            }
            out.insert("memory".into(), rows.into());
        }
        if wants("transport") {
            let transport = super::transport::run(options).await?;
            eprintln!("{}", super::transport::table(&transport));
            out.insert("transport".into(), serde_json::to_value(transport)?);
        }
        if wants("views") {
            let views = super::views::run(options).await?;
            out.insert("views".into(), serde_json::to_value(views)?);
        }
        if wants("views-hostile") {
            let hostile = super::views_hostile::run(options).await?;
            out.insert("views_hostile".into(), serde_json::to_value(hostile)?);
        }
        if wants("forget") {
            let flood = super::forget_flood::run(options).await?;
            out.insert("forget_flood".into(), serde_json::to_value(flood)?);
        }
        if wants("replay") {
            let replay = super::replay::run(options).await?;
            out.insert("replay".into(), serde_json::to_value(replay)?);
        }
        if wants("pickup") {
            let local = options.scratch.join("pickup-local");
            std::fs::create_dir_all(&local)?;
            let samples = if options.quick { 1 } else { 7 };
            let pickup = measure_pickup(options, "local", &local, samples).await?;
            out.insert("pickup_local".into(), serde_json::to_value(pickup)?);
        }
        Ok(out.into())
    })
}

/// Runs every micro-benchmark on a multi-threaded runtime (clients and daemons share cores).
pub fn run_micro(options: &MicroOptions) -> Result<MicroResults> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async {
        progress("lookup latency and throughput ...");
        let lookup = measure_lookup(options).await?;
        progress("python scan ...");
        let python_scan = measure_python_scan(options).await?;
        let scales: &[usize] = if options.quick {
            &[1_000, 10_000]
        } else {
            &[100_000, 1_000_000]
        };
        let mut snapshots = Vec::new();
        for &entries in scales {
            progress(&format!("snapshot write/load at {entries} entries ..."));
            snapshots.push(measure_snapshot_scale(options, entries).await?);
        }
        let samples = if options.quick { 1 } else { 7 };
        let mut peer_pickup = Vec::new();
        progress("peer pickup on local disk ...");
        let local = options.scratch.join("pickup-local");
        std::fs::create_dir_all(&local)?;
        peer_pickup.push(measure_pickup(options, "local", &local, samples).await?);
        let label = format!("slowfs-{}ms", options.slowfs_latency_ms);
        match SlowMount::mount(
            &options.slowfs_binary,
            &options.scratch.join("pickup-slowfs"),
            options.slowfs_latency_ms,
            options.slowfs_threads,
        ) {
            Ok(mount) => {
                progress(&format!("peer pickup on {label} ..."));
                let measured = measure_pickup(options, &label, mount.mountpoint(), samples).await;
                drop(mount);
                peer_pickup.push(measured?);
            }
            Err(err) => progress(&format!("peer pickup on {label} skipped: {err:#}")),
        }
        Ok(MicroResults {
            lookup,
            python_scan,
            snapshots,
            peer_pickup,
        })
    })
}
