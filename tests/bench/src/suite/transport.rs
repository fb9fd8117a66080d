//! Owns the transport comparison (`tunecache-bench micro --only transport`): the same
//! workload against daemons that differ only in transport settings (runtime flavour, HTTP/2
//! windows and frame size) or in the Python client's channel options, run interleaved so a
//! loaded machine biases every variant alike, and printed as one table.
//!
//! Every variant's daemon is started once and filled once; then each round measures every
//! variant in turn (the order reversed on odd rounds: A B C, C B A, ...). Per round and
//! variant: the echo floor (a bare health Check), single-key Lookup, 1,000-key Lookup with the
//! CPU the daemon and this process spent per call, single-entry Record (the journal writer's
//! wake-up and acknowledgement), 32 clients of single-key Lookups, and a 5,000-entry Scan
//! from Python beside Python's parse of the same bytes plus one echo. The table gives the
//! median over rounds of each round's figure.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tunecache_bench::daemon::{DaemonConfig, DaemonProcess};
use tunecache_bench::tunecache_system::{
    existing_entries, in_namespace, record_all, DEVICE, NAMESPACE,
};
use tunecache_client::{proto as v1, Client};

use super::micro::{key_of, MicroOptions};
use super::{median, progress};

/// One setting under test: daemon flags and the Python client's extra channel options.
struct Variant {
    name: &'static str,
    daemon_args: &'static [&'static str],
    /// `(option, value)` pairs added to the Python channel's options.
    python_options: &'static [(&'static str, i64)],
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "default",
        daemon_args: &[],
        python_options: &[],
    },
    Variant {
        name: "current-thread",
        daemon_args: &["--runtime", "current-thread"],
        python_options: &[],
    },
    Variant {
        name: "window-8MiB",
        daemon_args: &["--http2-window-bytes", "8388608"],
        python_options: &[],
    },
    Variant {
        name: "frame-1MiB",
        daemon_args: &["--http2-max-frame-bytes", "1048576"],
        python_options: &[],
    },
    Variant {
        name: "adaptive-window",
        daemon_args: &["--http2-adaptive-window"],
        python_options: &[],
    },
    Variant {
        name: "py-frame+window",
        daemon_args: &[],
        python_options: &[
            ("grpc.http2.max_frame_size", 1 << 20),
            ("grpc.http2.lookahead_bytes", 8 << 20),
            ("grpc.experimental.tcp_read_chunk_size", 1 << 20),
            ("grpc.experimental.tcp_min_read_chunk_size", 256 << 10),
            ("grpc.experimental.tcp_max_read_chunk_size", 4 << 20),
        ],
    },
];

/// Keys Lookup draws from, in their own namespace so the Scan sees only its 5,000.
const LOOKUP_NAMESPACE: &str = "bench-lookup";

/// One round's figures for one variant.
struct Sample {
    rust: RustSample,
    python: PythonSample,
}

/// The medians over rounds of one variant.
#[derive(Debug, Clone, Serialize)]
pub struct VariantSummary {
    pub name: String,
    pub daemon_args: Vec<String>,
    pub python_options: Vec<(String, i64)>,
    pub rounds: usize,
    pub echo_p50_us: f64,
    pub lookup_p50_us: f64,
    /// Median over rounds of that round's Lookup p50 / echo p50.
    pub lookup_over_echo: f64,
    pub batch_1000_p50_us: f64,
    /// CPU per 1,000-key call, daemon and client (medians over rounds).
    pub batch_daemon_cpu_us: f64,
    pub batch_client_cpu_us: f64,
    pub record_p50_us: f64,
    /// Single-key Lookups per second, 32 clients at once.
    pub lookups_per_s_32: f64,
    pub python_scan_ms: f64,
    pub python_parse_ms: f64,
    pub python_echo_ms: f64,
    /// Median over rounds of that round's Scan / (parse + echo).
    pub python_scan_over_floor: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TransportResults {
    pub rounds: usize,
    pub scan_entries: usize,
    pub lookup_entries: usize,
    pub seconds: f64,
    pub variants: Vec<VariantSummary>,
}

struct Sizes {
    rounds: usize,
    scan_entries: usize,
    lookup_entries: usize,
    single_calls: usize,
    batch_calls: usize,
    record_calls: usize,
    python_runs: usize,
    throughput_seconds: f64,
}

/// Serves `<variant index> <runs>` lines on stdin with one JSON line each (after
/// `PYTHON_FLOOR`, which defines `timed_scans` and `scan_floor`).
const PYTHON_DRIVER: &str = r#"
import json, statistics, sys
import grpc
from tunecache import Client
from tunecache.client import CHANNEL_OPTIONS
namespace, device, setups = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
clients = []
for socket, extra in setups:
    client = Client(socket, timeout=60)
    # grpcio's channel options apply to the grpcio package only; the binding has its own
    # transport (tonic), which the daemon-side variants still vary.
    if extra and client_flavor() == "grpcio":
        client._channel.close()
        client._channel = grpc.insecure_channel(
            "unix:" + socket, options=list(CHANNEL_OPTIONS) + [tuple(o) for o in extra])
        client._stub = client._stub.__class__(client._channel)
    clients.append(client)
def measure(client, runs):
    count, times = timed_scans(client, namespace, device, runs)
    _, parse_ms, echo_ms = scan_floor(client, namespace, device, runs, count)
    return {"entries": count, "scan_ms": statistics.median(times),
            "parse_ms": parse_ms, "echo_ms": echo_ms}
print("ready", flush=True)
for line in sys.stdin:
    index, runs = (int(word) for word in line.split())
    print(json.dumps(measure(clients[index], runs)), flush=True)
"#;

/// The long-lived Python process that scans for every variant on request.
struct PythonDriver {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

#[derive(serde::Deserialize)]
struct PythonSample {
    entries: usize,
    scan_ms: f64,
    parse_ms: f64,
    echo_ms: f64,
}

impl PythonDriver {
    async fn start(options: &MicroOptions, sockets: &[&Path]) -> Result<Self> {
        let python = options.python_dir.join(".venv/bin/python");
        if !python.exists() {
            bail!(
                "{} not found (create it with client/python/run_tests.sh)",
                python.display()
            );
        }
        let setups: Vec<(String, Vec<(&str, i64)>)> = sockets
            .iter()
            .zip(VARIANTS)
            .map(|(socket, variant)| {
                (
                    socket.display().to_string(),
                    variant.python_options.to_vec(),
                )
            })
            .collect();
        let mut child = tokio::process::Command::new(&python)
            .arg("-c")
            .arg(format!("{}{PYTHON_DRIVER}", super::micro::PYTHON_FLOOR))
            .arg(NAMESPACE)
            .arg(DEVICE)
            .arg(serde_json::to_string(&setups)?)
            .env_remove("PYTHONPATH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", python.display()))?;
        let stdin = child.stdin.take().context("python stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("python stdout")?).lines();
        let mut driver = PythonDriver {
            child,
            stdin,
            stdout,
        };
        let first = driver.next_line().await?;
        if first != "ready" {
            bail!("python driver said {first:?} instead of ready");
        }
        Ok(driver)
    }

    async fn next_line(&mut self) -> Result<String> {
        match self.stdout.next_line().await? {
            Some(line) => Ok(line),
            None => {
                let status = self.child.wait().await?;
                bail!("python driver exited ({status}); its stderr is above")
            }
        }
    }

    async fn measure(&mut self, variant: usize, runs: usize) -> Result<PythonSample> {
        self.stdin
            .write_all(format!("{variant} {runs}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self.next_line().await?;
        serde_json::from_str(&line).with_context(|| format!("python driver said {line:?}"))
    }
}

/// CPU time the process `pid` has used so far, all threads, in nanoseconds (the first field
/// of each thread's `schedstat`: ns resolution, unlike `stat`'s clock ticks).
pub(super) fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(text) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            continue; // the thread ended meanwhile
        };
        total += text
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

fn p50(mut micros: Vec<f64>) -> f64 {
    median(&mut micros)
}

async fn timed<F, Fut>(calls: usize, mut call: F) -> Result<f64>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut times = Vec::with_capacity(calls);
    for index in 0..calls {
        // The request is built before the clock starts.
        let pending = call(index);
        let started = Instant::now();
        pending.await?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(p50(times))
}

/// A variant's daemon with its connections, filled and warmed.
struct Target {
    daemon: DaemonProcess,
    client: Client,
    health: tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
}

async fn start_target(
    options: &MicroOptions,
    index: usize,
    variant: &Variant,
    sizes: &Sizes,
    lookup_entries: Vec<v1::Entry>,
) -> Result<Target> {
    let config = DaemonConfig {
        binary: options.daemon_binary.clone(),
        work_dir: options.scratch.join(format!("transport-{index}")),
        node_name: format!("transport-{index}"),
        shared_dir: None,
        snapshot_interval_s: 3_600,
        extra_args: variant.daemon_args.iter().map(|s| s.to_string()).collect(),
    };
    let mut daemon = DaemonProcess::spawn(&config)?;
    let client = daemon.wait_ready().await?;
    record_all(&client, existing_entries(8, sizes.scan_entries, 0.5)).await?;
    record_all(&client, lookup_entries).await?;
    let channel = tunecache_client::connect_channel(&daemon.socket).await?;
    let health = tonic_health::pb::health_client::HealthClient::new(channel);
    Ok(Target {
        daemon,
        client,
        health,
    })
}

/// This round's Rust-side figures for one variant.
struct RustSample {
    echo_us: f64,
    lookup_us: f64,
    batch_1000_us: f64,
    /// CPU per 1,000-key call: the daemon's and this (client) process's.
    batch_daemon_cpu_us: f64,
    batch_client_cpu_us: f64,
    record_us: f64,
    /// Single-key Lookups per second from 32 concurrent clients.
    lookups_per_s_32: f64,
}

async fn measure_rust(
    target: &mut Target,
    keys: &Arc<Vec<v1::Key>>,
    sizes: &Sizes,
) -> Result<RustSample> {
    use tonic_health::pb::HealthCheckRequest;
    // Warm both connections (and the daemon's caches) after the other variants ran.
    for _ in 0..50 {
        target
            .health
            .check(HealthCheckRequest::default())
            .await
            .context("health check")?;
        target.client.lookup(vec![keys[0].clone()]).await?;
    }
    let health = &mut target.health;
    let echo = timed(sizes.single_calls, |_| {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest::default())
                .await
                .context("health check")?;
            Ok(())
        }
    })
    .await?;
    let client = &target.client;
    let lookup = timed(sizes.single_calls, |call| {
        let key = keys[(call * 7919) % keys.len()].clone();
        async move {
            if client.lookup(vec![key]).await?.len() != 1 {
                bail!("single lookup missed a preloaded key");
            }
            Ok(())
        }
    })
    .await?;
    let daemon_pid = target.daemon.pid()?;
    let (daemon_before, client_before) = (cpu_ns(daemon_pid)?, cpu_ns(std::process::id())?);
    let batch = timed(sizes.batch_calls, |call| {
        let start = (call * 1_000) % (keys.len() - 1_000);
        let request = keys[start..start + 1_000].to_vec();
        async move {
            if client.lookup(request).await?.len() != 1_000 {
                bail!("batch lookup missed preloaded keys");
            }
            Ok(())
        }
    })
    .await?;
    let per_call =
        |before: u64, after: u64| (after - before) as f64 / 1e3 / sizes.batch_calls as f64;
    let batch_daemon_cpu_us = per_call(daemon_before, cpu_ns(daemon_pid)?);
    let batch_client_cpu_us = per_call(client_before, cpu_ns(std::process::id())?);
    let record = timed(sizes.record_calls, |_| {
        // A new key each call, so every Record is journalled and acknowledged by the writer.
        let entry = v1::Entry {
            key: Some(v1::Key {
                namespace: "bench-record".to_owned(),
                op: "bench::record".to_owned(),
                device: DEVICE.to_owned(),
                problem: format!("m={}", RECORDS.fetch_add(1, Ordering::Relaxed)),
                rank: None,
            }),
            result: Some(v1::Result {
                config: "{}".to_owned(),
                time_us: 1.0,
                tuned_by: "bench/record".to_owned(),
                tuned_at_unix_ms: 1_700_000_000_000,
                forget_epoch: 0,
                artifacts: Default::default(),
            }),
        };
        async move {
            client.record(vec![entry]).await?;
            Ok(())
        }
    })
    .await?;
    let throughput = super::micro::measure_throughput(
        &target.daemon.socket,
        keys,
        32,
        1,
        sizes.throughput_seconds,
    )
    .await?;
    Ok(RustSample {
        lookups_per_s_32: throughput.keys_per_s,
        echo_us: echo,
        lookup_us: lookup,
        batch_1000_us: batch,
        batch_daemon_cpu_us,
        batch_client_cpu_us,
        record_us: record,
    })
}

/// Numbers the Records' keys, so each is new.
static RECORDS: AtomicU64 = AtomicU64::new(0);

fn summarise(variant: &Variant, samples: &[Sample]) -> VariantSummary {
    let med = |pick: &dyn Fn(&Sample) -> f64| {
        let mut values: Vec<f64> = samples.iter().map(pick).collect();
        median(&mut values)
    };
    VariantSummary {
        name: variant.name.to_owned(),
        daemon_args: variant.daemon_args.iter().map(|s| s.to_string()).collect(),
        python_options: variant
            .python_options
            .iter()
            .map(|(name, value)| (name.to_string(), *value))
            .collect(),
        rounds: samples.len(),
        echo_p50_us: med(&|s| s.rust.echo_us),
        lookup_p50_us: med(&|s| s.rust.lookup_us),
        lookup_over_echo: med(&|s| s.rust.lookup_us / s.rust.echo_us),
        batch_1000_p50_us: med(&|s| s.rust.batch_1000_us),
        batch_daemon_cpu_us: med(&|s| s.rust.batch_daemon_cpu_us),
        batch_client_cpu_us: med(&|s| s.rust.batch_client_cpu_us),
        record_p50_us: med(&|s| s.rust.record_us),
        lookups_per_s_32: med(&|s| s.rust.lookups_per_s_32),
        python_scan_ms: med(&|s| s.python.scan_ms),
        python_parse_ms: med(&|s| s.python.parse_ms),
        python_echo_ms: med(&|s| s.python.echo_ms),
        python_scan_over_floor: med(&|s| s.python.scan_ms / (s.python.parse_ms + s.python.echo_ms)),
    }
}

/// The table the command prints (Markdown, to stderr beside the progress lines).
pub fn table(results: &TransportResults) -> String {
    let mut out = format!(
        "transport: {} rounds, interleaved; medians over rounds of per-round p50s \
         ({} s in all)\n\n",
        results.rounds, results.seconds as u64
    );
    out.push_str(
        "| variant | echo µs | Lookup µs | Lookup/echo | 1,000-key ms | CPU daemon + client ms \
         | Record µs | 32 clients k/s | py Scan ms | py parse+echo ms | Scan/floor |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for v in &results.variants {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} + {:.2} | {:.1} | {:.1} | {:.2} | {:.2} + {:.2} | {:.2} |\n",
            v.name,
            v.echo_p50_us,
            v.lookup_p50_us,
            v.lookup_over_echo,
            v.batch_1000_p50_us / 1e3,
            v.batch_daemon_cpu_us / 1e3,
            v.batch_client_cpu_us / 1e3,
            v.record_p50_us,
            v.lookups_per_s_32 / 1e3,
            v.python_scan_ms,
            v.python_parse_ms,
            v.python_echo_ms,
            v.python_scan_over_floor,
        ));
    }
    out
}

/// Runs the interleaved comparison.
pub async fn run(options: &MicroOptions) -> Result<TransportResults> {
    let started = Instant::now();
    let sizes = if options.quick {
        Sizes {
            rounds: 2,
            scan_entries: 200,
            lookup_entries: 2_000,
            single_calls: 50,
            batch_calls: 3,
            record_calls: 20,
            python_runs: 3,
            throughput_seconds: 0.1,
        }
    } else {
        Sizes {
            rounds: 10,
            scan_entries: 5_000,
            lookup_entries: 20_000,
            single_calls: 1_500,
            batch_calls: 60,
            record_calls: 300,
            python_runs: 15,
            throughput_seconds: 0.5,
        }
    };
    let lookup_entries = in_namespace(
        existing_entries(8, sizes.lookup_entries, 0.5),
        LOOKUP_NAMESPACE,
    );
    let keys: Arc<Vec<v1::Key>> = Arc::new(lookup_entries.iter().map(key_of).collect());
    let mut targets = Vec::with_capacity(VARIANTS.len());
    for (index, variant) in VARIANTS.iter().enumerate() {
        progress(&format!("transport: starting {} ...", variant.name));
        targets.push(start_target(options, index, variant, &sizes, lookup_entries.clone()).await?);
    }
    let sockets: Vec<&Path> = targets.iter().map(|t| t.daemon.socket.as_path()).collect();
    let mut python = PythonDriver::start(options, &sockets).await?;
    let mut samples: Vec<Vec<Sample>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    for round in 0..sizes.rounds {
        progress(&format!(
            "transport: round {} of {} ...",
            round + 1,
            sizes.rounds
        ));
        let order: Vec<usize> = if round % 2 == 0 {
            (0..VARIANTS.len()).collect()
        } else {
            (0..VARIANTS.len()).rev().collect()
        };
        for index in order {
            let rust = measure_rust(&mut targets[index], &keys, &sizes).await?;
            let py = python.measure(index, sizes.python_runs).await?;
            if py.entries != sizes.scan_entries {
                bail!(
                    "{}: Python scanned {} entries, expected {}",
                    VARIANTS[index].name,
                    py.entries,
                    sizes.scan_entries
                );
            }
            samples[index].push(Sample { rust, python: py });
        }
    }
    drop(python);
    for target in &mut targets {
        target.daemon.stop();
    }
    let variants = VARIANTS
        .iter()
        .zip(&samples)
        .map(|(variant, samples)| summarise(variant, samples))
        .collect();
    Ok(TransportResults {
        rounds: sizes.rounds,
        scan_entries: sizes.scan_entries,
        lookup_entries: sizes.lookup_entries,
        seconds: started.elapsed().as_secs_f64(),
        variants,
    })
}
