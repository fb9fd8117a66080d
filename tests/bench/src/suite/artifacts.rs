//! Owns the `artifacts` subcommand: what GetArtifact costs against the plainest way to move
//! the same bytes on the same node, measured side by side in one run against one release
//! `tunecached` (the harness's [`DaemonProcess`]):
//!
//! * **one large blob** (256 MiB of random bytes by default, put once): `Client::get_artifact`
//!   into a counting sink (nothing holds more than a chunk), which takes a held blob as a
//!   descriptor (the handoff), and the same call with the handoff off, the GetArtifact stream
//!   itself; both against
//!   the floor, a plain Unix-socket copy of the same bytes: a server thread reads the daemon's
//!   own blob file in 1 MiB reads (the daemon's chunk) and writes each into a `UnixStream`, the
//!   client reads it in 1 MiB reads into a sink. Throughput in MiB/s.
//! * **R ranks x B small blobs** (8 x 100 distinct blobs of 2 MiB by default): R rank
//!   processes (this binary re-executed as the hidden `artifacts-rank`), each with its own
//!   client connection, `get_artifact` every blob into a sink (handed, then streamed with the
//!   handoff off), against R processes reading the
//!   same blobs' source files from a local directory in 1 MiB reads; with it, the third row,
//!   the same ranks writing the blobs into a per-rank directory with `fetch_artifact_list` (what
//!   `Client::fetch_artifacts` does: each handed blob copied file to file into a temporary
//!   file, synced, renamed).
//!   Every rank connects and reads its list before a barrier; the wall is from its release
//!   until the last rank has answered.
//!
//! Before timing, every path runs once untimed, so the page cache is warm for all of them;
//! then each round measures every path in turn, the order reversed on odd rounds, so a loaded
//! machine biases each alike. The tables give the median over rounds (and the range), the
//! ratio of the medians and the goals (GetArtifact >= 50% of the socket copy's
//! throughput; R ranks within 2x of the file reads). Results go to `artifacts.json`; the
//! Markdown table, `artifacts.md`, is rendered from that JSON by `current::render`, the
//! renderer `tunecache-bench report` uses for BENCHMARKS.md.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWrite;
use tunecache_bench::daemon::{workspace_binary, DaemonConfig, DaemonProcess};
use tunecache_client::{proto, Client};

use super::transport::cpu_ns;
use super::{load_average, machine_info, median, MachineInfo};

/// Every read and write of the floors: the daemon's chunk (`tunecache_proto::artifact::
/// CHUNK_BYTES`, 1 MiB), which is also the most a GetArtifact message carries.
pub const COPY_BUFFER_BYTES: usize = 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;
/// The goals.
pub const BIG_GOAL_AT_LEAST: f64 = 0.5;
pub const RANKS_GOAL_AT_MOST: f64 = 2.0;

/// What the `artifacts` subcommand was asked to do.
#[derive(Debug, Clone)]
pub struct ArtifactsOptions {
    pub out_dir: PathBuf,
    /// Timed rounds (each measures every path once).
    pub rounds: usize,
    /// Size of the one large blob, MiB.
    pub big_mib: u64,
    /// Rank processes of the small-blob case.
    pub ranks: usize,
    /// Distinct small blobs every rank fetches.
    pub blobs: usize,
    /// Size of each small blob, KiB.
    pub blob_kib: u64,
    /// Leave out the `fetch_artifact_list` row.
    pub skip_fetch: bool,
    /// The command line, recorded in the results.
    pub command_line: String,
}

/// What an `artifacts-rank` process does after the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RankMode {
    /// `Client::get_artifact` every blob into a sink: a descriptor handoff for a held blob.
    Get,
    /// The same with the handoff off: every blob streamed by GetArtifact.
    Stream,
    /// Read every blob's source file into a sink, in 1 MiB reads.
    Files,
    /// `fetch_artifact_list` every blob into `--dir` (written, synced, verified, renamed).
    Fetch,
}

impl RankMode {
    fn name(self) -> &'static str {
        match self {
            RankMode::Get => "get",
            RankMode::Stream => "stream",
            RankMode::Files => "files",
            RankMode::Fetch => "fetch",
        }
    }
}

/// One `artifacts-rank` process's arguments.
#[derive(Debug, Clone)]
pub struct RankOptions {
    pub mode: RankMode,
    pub socket: PathBuf,
    /// The blob list: one `sha256 size path` line per blob.
    pub list: PathBuf,
    /// `fetch`: the directory to write the blobs into.
    pub dir: Option<PathBuf>,
}

/// A series of per-round figures and its summary.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub values: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Series {
    fn of(values: Vec<f64>) -> Series {
        let mut sorted = values.clone();
        let median = median(&mut sorted);
        Series {
            median,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            values,
        }
    }
}

/// The large blob: GetArtifact against the socket copy.
#[derive(Debug, Clone, Serialize)]
pub struct BigResult {
    pub bytes: u64,
    pub sha256: String,
    /// What the floor's server read.
    pub floor_source: String,
    pub copy_buffer_bytes: usize,
    /// `Client::get_artifact`: the descriptor handoff (the daemon holds the blob).
    pub get_mib_s: Series,
    /// The same call with the handoff off: the GetArtifact stream itself.
    pub stream_mib_s: Series,
    pub floor_mib_s: Series,
    /// `get_artifact`'s median throughput over the floor's.
    pub ratio: f64,
    /// The GetArtifact stream's median throughput over the floor's.
    pub stream_ratio: f64,
    pub goal_at_least: f64,
    pub met: bool,
    /// CPU per round: the daemon's and this process's (the client) during GetArtifact; this
    /// process's (the floor's server thread and its client) during the copy.
    pub get_daemon_cpu_ms: Series,
    pub get_client_cpu_ms: Series,
    pub stream_daemon_cpu_ms: Series,
    pub stream_client_cpu_ms: Series,
    pub floor_cpu_ms: Series,
}

/// The R ranks x B blobs: GetArtifact (and fetch_artifact_list) against file reads.
#[derive(Debug, Clone, Serialize)]
pub struct RanksResult {
    pub ranks: usize,
    pub blobs: usize,
    pub blob_bytes: u64,
    pub copy_buffer_bytes: usize,
    pub get_wall_ms: Series,
    /// The same ranks with the handoff off (GetArtifact streams).
    pub stream_wall_ms: Series,
    pub files_wall_ms: Series,
    /// `None` with --skip-fetch.
    pub fetch_wall_ms: Option<Series>,
    /// GetArtifact's median wall over the file reads'.
    pub ratio: f64,
    pub stream_ratio: f64,
    pub fetch_ratio: Option<f64>,
    pub goal_at_most: f64,
    pub met: bool,
    pub get_daemon_cpu_ms: Series,
    pub stream_daemon_cpu_ms: Series,
    pub fetch_daemon_cpu_ms: Option<Series>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArtifactsResults {
    pub command_line: String,
    pub machine: MachineInfo,
    /// `/proc/loadavg`'s three figures when the run started and when it ended.
    pub load_average_start: Vec<f64>,
    pub load_average_end: Vec<f64>,
    pub rounds: usize,
    pub big: BigResult,
    pub ranks: RanksResult,
    /// The daemon's artifact counters after the run.
    pub daemon_fetches_local: u64,
    pub daemon_bytes_served: u64,
    pub daemon_digest_failures: u64,
    pub daemon_handoffs: u64,
}

fn progress(message: &str) {
    eprintln!("[artifacts] {message}");
}

/// Writes `bytes` pseudo-random bytes (xorshift64*, seeded) to `path`, a buffer at a time.
fn write_random(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut buf = vec![0u8; COPY_BUFFER_BYTES];
    let mut left = bytes;
    while left > 0 {
        for word in buf.chunks_exact_mut(8) {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        file.write_all(&buf[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    Ok(())
}

/// Reads `reader` to its end in [`COPY_BUFFER_BYTES`] reads into nothing; the bytes read.
fn drain(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut total = 0;
    loop {
        match reader.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
}

/// Fills `buf` from `file`, short only at its end.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// An `AsyncWrite` that keeps nothing and counts what it was given.
#[derive(Debug, Default)]
struct CountingSink {
    bytes: u64,
}

impl AsyncWrite for CountingSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().bytes += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The floor's server: a thread that answers every connection on `socket` with the bytes of
/// `file`, read and written in [`COPY_BUFFER_BYTES`] pieces. It lives until the process ends.
fn start_copy_server(socket: &Path, file: PathBuf) -> Result<()> {
    let listener =
        UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
    std::thread::Builder::new()
        .name("copy-floor".to_owned())
        .spawn(move || {
            let mut buf = vec![0u8; COPY_BUFFER_BYTES];
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                let served = File::open(&file).and_then(|mut source| loop {
                    let n = read_full(&mut source, &mut buf)?;
                    if n == 0 {
                        break Ok(());
                    }
                    stream.write_all(&buf[..n])?;
                });
                if let Err(error) = served {
                    eprintln!("[artifacts] copy floor: {error}");
                }
            }
        })?;
    Ok(())
}

/// One copy through the floor's socket: the bytes read.
fn copy_once(socket: &Path, buf: &mut [u8]) -> Result<u64> {
    let mut stream =
        UnixStream::connect(socket).with_context(|| format!("connecting {}", socket.display()))?;
    Ok(drain(&mut stream, buf)?)
}

async fn get_once(client: &Client, sha256: &str) -> Result<u64> {
    let mut sink = CountingSink::default();
    let size = client.get_artifact(sha256, &mut sink).await?;
    ensure!(
        size == sink.bytes,
        "GetArtifact answered {size} bytes, the sink got {}",
        sink.bytes
    );
    Ok(size)
}

fn cpu_ms(pid: u32) -> Result<f64> {
    Ok(cpu_ns(pid)? as f64 / 1e6)
}

/// A blob the small-blob ranks fetch: its digest, size and source file.
#[derive(Debug, Clone)]
struct Blob {
    sha256: String,
    size: u64,
    path: PathBuf,
}

fn write_list(path: &Path, blobs: &[Blob]) -> Result<()> {
    let mut text = String::new();
    for blob in blobs {
        let source = blob
            .path
            .to_str()
            .context("a blob path that is not UTF-8")?;
        text.push_str(&format!("{} {} {source}\n", blob.sha256, blob.size));
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn read_list(path: &Path) -> Result<Vec<Blob>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(sha256), Some(size), Some(source)) => Ok(Blob {
                    sha256: sha256.to_owned(),
                    size: size.parse()?,
                    path: PathBuf::from(source),
                }),
                _ => bail!("bad blob list line {line:?}"),
            }
        })
        .collect()
}

/// What one rank answers after its work.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankAnswer {
    bytes: u64,
    ms: f64,
}

/// A rank process waiting at the barrier.
struct RankProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl RankProcess {
    fn spawn(mode: RankMode, socket: &Path, list: &Path, dir: Option<&Path>) -> Result<Self> {
        let exe = std::env::current_exe().context("this executable")?;
        let mut command = Command::new(exe);
        command
            .arg("artifacts-rank")
            .arg("--mode")
            .arg(mode.name())
            .arg("--socket")
            .arg(socket)
            .arg("--list")
            .arg(list);
        if let Some(dir) = dir {
            command.arg("--dir").arg(dir);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting an artifacts-rank")?;
        let stdin = child.stdin.take().context("rank stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("rank stdout")?);
        Ok(RankProcess {
            child,
            stdin,
            stdout,
        })
    }

    fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            let status = self.child.wait()?;
            bail!("an artifacts-rank ended early ({status})");
        }
        Ok(line.trim().to_owned())
    }
}

/// One round of R ranks in `mode`: spawned, released together once all are ready; the wall
/// from the release until the last answered, in ms, and the daemon's CPU meanwhile.
fn ranks_round(
    mode: RankMode,
    ranks: usize,
    socket: &Path,
    list: &Path,
    fetch_root: &Path,
    expect_bytes: u64,
    daemon_pid: u32,
) -> Result<(f64, f64)> {
    let mut processes = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let dir = (mode == RankMode::Fetch).then(|| fetch_root.join(format!("rank-{rank}")));
        if let Some(dir) = &dir {
            // Every round writes into an empty directory.
            let _ = std::fs::remove_dir_all(dir);
            std::fs::create_dir_all(dir)?;
        }
        processes.push(RankProcess::spawn(mode, socket, list, dir.as_deref())?);
    }
    for process in &mut processes {
        let line = process.line()?;
        ensure!(line == "ready", "an artifacts-rank said {line:?}");
    }
    let cpu_before = cpu_ms(daemon_pid)?;
    let released = Instant::now();
    for process in &mut processes {
        process.stdin.write_all(b"go\n")?;
        process.stdin.flush()?;
    }
    let mut answers = Vec::with_capacity(ranks);
    for process in &mut processes {
        let line = process.line()?;
        answers.push(
            serde_json::from_str::<RankAnswer>(&line)
                .with_context(|| format!("an artifacts-rank said {line:?}"))?,
        );
    }
    let wall_ms = released.elapsed().as_secs_f64() * 1e3;
    let daemon_cpu = cpu_ms(daemon_pid)? - cpu_before;
    for mut process in processes {
        drop(process.stdin);
        let status = process.child.wait()?;
        ensure!(status.success(), "an artifacts-rank exited {status}");
    }
    for answer in &answers {
        ensure!(
            answer.bytes == expect_bytes,
            "a {} rank moved {} bytes, not {expect_bytes}",
            mode.name(),
            answer.bytes
        );
    }
    Ok((wall_ms, daemon_cpu))
}

/// The hidden `artifacts-rank`: set up, say `ready`, wait for a line, do the work, answer
/// a [`RankAnswer`] line.
pub fn run_rank(options: &RankOptions) -> Result<()> {
    let blobs = read_list(&options.list)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = match options.mode {
        RankMode::Files => None,
        RankMode::Get | RankMode::Fetch => {
            Some(runtime.block_on(Client::connect(&options.socket))?)
        }
        RankMode::Stream => Some(
            runtime
                .block_on(Client::connect(&options.socket))?
                .without_handoff(),
        ),
    };
    let artifacts: Vec<proto::Artifact> = blobs
        .iter()
        .enumerate()
        .map(|(index, blob)| proto::Artifact {
            name: format!("blob-{index:04}.bin"),
            sha256: blob.sha256.clone(),
            size: blob.size,
        })
        .collect();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let started = Instant::now();
    let bytes = match (options.mode, &client) {
        (RankMode::Files, _) => {
            let mut buf = vec![0u8; COPY_BUFFER_BYTES];
            let mut total = 0;
            for blob in &blobs {
                let mut file = File::open(&blob.path)?;
                total += drain(&mut file, &mut buf)?;
            }
            total
        }
        (RankMode::Get | RankMode::Stream, Some(client)) => runtime.block_on(async {
            let mut total = 0;
            for blob in &blobs {
                total += get_once(client, &blob.sha256).await?;
            }
            anyhow::Ok(total)
        })?,
        (RankMode::Fetch, Some(client)) => {
            let dir = options.dir.as_deref().context("fetch needs --dir")?;
            let written = runtime.block_on(client.fetch_artifact_list(&artifacts, dir))?;
            ensure!(
                written.len() == blobs.len(),
                "fetched {} files",
                written.len()
            );
            let mut total = 0;
            for (path, blob) in written.iter().zip(&blobs) {
                let len = std::fs::metadata(path)?.len();
                ensure!(len == blob.size, "{} holds {len} bytes", path.display());
                total += len;
            }
            total
        }
        _ => unreachable!("a client for every mode that needs one"),
    };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    writeln!(
        stdout,
        "{}",
        serde_json::to_string(&RankAnswer { bytes, ms })?
    )?;
    stdout.flush()?;
    Ok(())
}

/// The order of a round's paths: as given on even rounds, reversed on odd ones.
fn ordered<T: Copy>(paths: &[T], round: usize) -> Vec<T> {
    let mut order = paths.to_vec();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

fn measure_big(
    options: &ArtifactsOptions,
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    daemon: &DaemonProcess,
    scratch: &Path,
) -> Result<BigResult> {
    let bytes = options.big_mib * 1024 * 1024;
    let source = scratch.join("big.bin");
    progress(&format!("writing a {} MiB random blob", options.big_mib));
    write_random(&source, bytes, 0xB16)?;
    let stored = runtime.block_on(client.put_artifact(&source))?;
    ensure!(stored.size == bytes, "stored {} bytes", stored.size);
    // The floor reads the daemon's own blob file when it is where the store keeps it.
    let blob_file = scratch
        .join("daemon/state/artifacts/blobs")
        .join(&stored.sha256);
    let (floor_file, floor_source) = if blob_file.is_file() {
        (
            blob_file,
            "the daemon's blob file (`<state-dir>/artifacts/blobs/<sha256>`)",
        )
    } else {
        (
            source.clone(),
            "the uploaded file, beside the daemon's store",
        )
    };
    let socket = scratch.join("copy-floor.sock");
    start_copy_server(&socket, floor_file)?;
    let mut buf = vec![0u8; COPY_BUFFER_BYTES];
    let daemon_pid = daemon.pid()?;
    let own_pid = std::process::id();

    #[derive(Clone, Copy)]
    enum BigPath {
        Get,
        Stream,
        Copy,
    }
    let streaming = client.clone().without_handoff();
    // One of each untimed: the page cache warm, the blob verified.
    ensure!(runtime.block_on(get_once(client, &stored.sha256))? == bytes);
    ensure!(runtime.block_on(get_once(&streaming, &stored.sha256))? == bytes);
    ensure!(copy_once(&socket, &mut buf)? == bytes);
    let (mut get, mut stream, mut copy) = (Vec::new(), Vec::new(), Vec::new());
    let (mut get_daemon_cpu, mut get_client_cpu, mut copy_cpu) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut stream_daemon_cpu, mut stream_client_cpu) = (Vec::new(), Vec::new());
    for round in 0..options.rounds {
        for path in ordered(&[BigPath::Get, BigPath::Stream, BigPath::Copy], round) {
            let (daemon_before, own_before) = (cpu_ms(daemon_pid)?, cpu_ms(own_pid)?);
            let started = Instant::now();
            let moved = match path {
                BigPath::Get => runtime.block_on(get_once(client, &stored.sha256))?,
                BigPath::Stream => runtime.block_on(get_once(&streaming, &stored.sha256))?,
                BigPath::Copy => copy_once(&socket, &mut buf)?,
            };
            let secs = started.elapsed().as_secs_f64();
            let (daemon_cpu, own_cpu) = (
                cpu_ms(daemon_pid)? - daemon_before,
                cpu_ms(own_pid)? - own_before,
            );
            ensure!(moved == bytes, "moved {moved} of {bytes} bytes");
            let mib_s = bytes as f64 / MIB / secs;
            match path {
                BigPath::Get => {
                    get.push(mib_s);
                    get_daemon_cpu.push(daemon_cpu);
                    get_client_cpu.push(own_cpu);
                }
                BigPath::Stream => {
                    stream.push(mib_s);
                    stream_daemon_cpu.push(daemon_cpu);
                    stream_client_cpu.push(own_cpu);
                }
                BigPath::Copy => {
                    copy.push(mib_s);
                    copy_cpu.push(own_cpu);
                }
            }
        }
        progress(&format!(
            "large blob, round {}: get_artifact {:.0} MiB/s, GetArtifact stream {:.0} MiB/s, \
             socket copy {:.0} MiB/s",
            round + 1,
            get.last().copied().unwrap_or(f64::NAN),
            stream.last().copied().unwrap_or(f64::NAN),
            copy.last().copied().unwrap_or(f64::NAN)
        ));
    }
    let (get, stream, copy) = (Series::of(get), Series::of(stream), Series::of(copy));
    let ratio = get.median / copy.median;
    let stream_ratio = stream.median / copy.median;
    Ok(BigResult {
        bytes,
        sha256: stored.sha256,
        floor_source: floor_source.to_owned(),
        copy_buffer_bytes: COPY_BUFFER_BYTES,
        ratio,
        goal_at_least: BIG_GOAL_AT_LEAST,
        met: ratio >= BIG_GOAL_AT_LEAST,
        stream_ratio,
        get_mib_s: get,
        stream_mib_s: stream,
        floor_mib_s: copy,
        get_daemon_cpu_ms: Series::of(get_daemon_cpu),
        get_client_cpu_ms: Series::of(get_client_cpu),
        stream_daemon_cpu_ms: Series::of(stream_daemon_cpu),
        stream_client_cpu_ms: Series::of(stream_client_cpu),
        floor_cpu_ms: Series::of(copy_cpu),
    })
}

fn measure_ranks(
    options: &ArtifactsOptions,
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    daemon: &DaemonProcess,
    scratch: &Path,
) -> Result<RanksResult> {
    let blob_bytes = options.blob_kib * 1024;
    let sources = scratch.join("small");
    std::fs::create_dir_all(&sources)?;
    progress(&format!(
        "writing and putting {} random blobs of {} KiB",
        options.blobs, options.blob_kib
    ));
    let mut blobs = Vec::with_capacity(options.blobs);
    for index in 0..options.blobs {
        let path = sources.join(format!("blob-{index:04}.bin"));
        write_random(&path, blob_bytes, 1 + index as u64)?;
        let stored = runtime.block_on(client.put_artifact(&path))?;
        blobs.push(Blob {
            sha256: stored.sha256,
            size: stored.size,
            path,
        });
    }
    let list = scratch.join("blobs.txt");
    write_list(&list, &blobs)?;
    let fetch_root = scratch.join("fetched");
    let expect = blob_bytes * options.blobs as u64;
    let daemon_pid = daemon.pid()?;
    let mut modes = vec![RankMode::Get, RankMode::Stream, RankMode::Files];
    if !options.skip_fetch {
        modes.push(RankMode::Fetch);
    }
    let round = |mode| {
        ranks_round(
            mode,
            options.ranks,
            &daemon.socket,
            &list,
            &fetch_root,
            expect,
            daemon_pid,
        )
    };
    // One of each untimed: the page cache warm for the files and the daemon's blobs alike.
    for &mode in &modes {
        round(mode)?;
    }
    let (mut get, mut files, mut fetch) = (Vec::new(), Vec::new(), Vec::new());
    let (mut get_cpu, mut fetch_cpu) = (Vec::new(), Vec::new());
    let (mut stream, mut stream_cpu) = (Vec::new(), Vec::new());
    for index in 0..options.rounds {
        for mode in ordered(&modes, index) {
            let (wall, cpu) = round(mode)?;
            match mode {
                RankMode::Get => {
                    get.push(wall);
                    get_cpu.push(cpu);
                }
                RankMode::Stream => {
                    stream.push(wall);
                    stream_cpu.push(cpu);
                }
                RankMode::Files => files.push(wall),
                RankMode::Fetch => {
                    fetch.push(wall);
                    fetch_cpu.push(cpu);
                }
            }
        }
        progress(&format!(
            "{} ranks x {} blobs, round {}: get_artifact {:.0} ms, GetArtifact stream {:.0} ms, \
             file reads {:.0} ms{}",
            options.ranks,
            options.blobs,
            index + 1,
            get.last().copied().unwrap_or(f64::NAN),
            stream.last().copied().unwrap_or(f64::NAN),
            files.last().copied().unwrap_or(f64::NAN),
            fetch
                .last()
                .map(|ms| format!(", fetch_artifact_list {ms:.0} ms"))
                .unwrap_or_default()
        ));
    }
    let _ = std::fs::remove_dir_all(&fetch_root);
    let (get, stream, files) = (Series::of(get), Series::of(stream), Series::of(files));
    let fetch = (!options.skip_fetch).then(|| Series::of(fetch));
    let ratio = get.median / files.median;
    let stream_ratio = stream.median / files.median;
    Ok(RanksResult {
        ranks: options.ranks,
        blobs: options.blobs,
        blob_bytes,
        copy_buffer_bytes: COPY_BUFFER_BYTES,
        ratio,
        fetch_ratio: fetch.as_ref().map(|fetch| fetch.median / files.median),
        goal_at_most: RANKS_GOAL_AT_MOST,
        met: ratio <= RANKS_GOAL_AT_MOST,
        stream_ratio,
        get_wall_ms: get,
        stream_wall_ms: stream,
        files_wall_ms: files,
        fetch_wall_ms: fetch,
        get_daemon_cpu_ms: Series::of(get_cpu),
        stream_daemon_cpu_ms: Series::of(stream_cpu),
        fetch_daemon_cpu_ms: (!options.skip_fetch).then(|| Series::of(fetch_cpu)),
    })
}

/// Runs both cases against one daemon; writes `artifacts.json` and `artifacts.md` into
/// `options.out_dir` and prints the table.
pub fn run_artifacts(options: &ArtifactsOptions) -> Result<ArtifactsResults> {
    ensure!(options.rounds > 0, "--rounds must be at least 1");
    ensure!(
        options.ranks > 0 && options.blobs > 0,
        "--ranks and --blobs must be at least 1"
    );
    std::fs::create_dir_all(&options.out_dir)?;
    let load_average_start = load_average();
    let binary = workspace_binary("tunecached");
    ensure!(
        binary.exists(),
        "{} not found: build it with cargo build --release -p tunecache-server",
        binary.display()
    );
    // The blobs' sources, the daemon's store and the fetched files share one filesystem.
    let scratch = tempfile::Builder::new()
        .prefix("tunecache-artifacts-")
        .tempdir_in(&options.out_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut daemon = DaemonProcess::spawn(&DaemonConfig {
        binary,
        work_dir: scratch.path().join("daemon"),
        node_name: "artifacts-bench".to_owned(),
        shared_dir: None,
        snapshot_interval_s: 3600,
        extra_args: Vec::new(),
    })?;
    let client = runtime
        .block_on(daemon.wait_ready())?
        .with_timeout(Duration::from_secs(120));
    let big = measure_big(options, &runtime, &client, &daemon, scratch.path())?;
    let ranks = measure_ranks(options, &runtime, &client, &daemon, scratch.path())?;
    let stats = runtime.block_on(client.stats())?;
    drop(client);
    daemon.stop();
    let results = ArtifactsResults {
        command_line: options.command_line.clone(),
        machine: machine_info(&options.command_line),
        load_average_start,
        load_average_end: load_average(),
        rounds: options.rounds,
        big,
        ranks,
        daemon_fetches_local: stats.artifact_fetches_local,
        daemon_bytes_served: stats.artifact_bytes_served,
        daemon_digest_failures: stats.artifact_digest_failures,
        daemon_handoffs: stats.artifact_handoffs,
    };
    let json = serde_json::to_value(&results)?;
    std::fs::write(
        options.out_dir.join("artifacts.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let table = tunecache_bench::current::render("artifacts", &json)?;
    std::fs::write(options.out_dir.join("artifacts.md"), &table)?;
    println!("{table}");
    Ok(results)
}
