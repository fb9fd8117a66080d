//! Test harness: a daemon on a temporary socket and state directory, either the real
//! `tunecached` binary or `server::run` inside the test process ([`TestDaemon`]), waited on until
//! it answers; the rank processes, mounts, CLI runs and entries the tests use around it.
//!
//! The binaries must be built first (`cargo build --workspace --bins`, which README's test
//! command does); `TUNECACHE_BIN_DIR` overrides where they are looked for.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tunecache_client::proto;

pub mod blobs;
pub mod daemon;
pub mod faketime;
pub mod raw_grpc;
pub mod redis;
pub mod shared_users;
pub mod slurm;
pub mod slurm_jobs;
pub mod wait;

pub use daemon::{DaemonOptions, Kind, TestDaemon, FACT_LIMIT};
pub use faketime::Faketime;
pub use wait::{
    eventually, eventually_blocking, eventually_some, eventually_sync, wait, Lazy, Wait, POLL,
};

/// Directory holding the workspace's binaries: `$TUNECACHE_BIN_DIR`, else the cargo target
/// directory this test binary was built into (`target/<profile>/deps/<test>` → `target/<profile>`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TUNECACHE_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("current test executable");
    let deps = exe.parent().expect("test binary lives in a directory");
    deps.parent().expect("deps has a parent").to_path_buf()
}

/// Path of a workspace binary; panics with the build command when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} not found: build the binaries first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}

/// Runs the `tunecache` CLI against the daemon at `socket` and waits for it.
pub fn cli(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin("tunecache"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run the tunecache CLI")
}

// --- Builders: the keys, results and entries the tests record. ---

/// The device of the tests' keys.
pub const TEST_DEVICE: &str = "test-device";
/// When the tests' results were tuned, unless a test says otherwise ([`result_at`]).
pub const TUNED_AT_UNIX_MS: i64 = 1_700_000_000_000;

/// A key of `op` and `problem` in `namespace` on [`TEST_DEVICE`]: shared by all ranks when
/// `rank` is `None`, else that rank's own.
pub fn key_in(namespace: &str, op: &str, problem: &str, rank: Option<u32>) -> proto::Key {
    tunecache_client::key(namespace, op, TEST_DEVICE, problem, rank)
}

/// A shared-by-all-ranks key in namespace `test`.
pub fn test_key(op: &str, problem: &str) -> proto::Key {
    key_in("test", op, problem, None)
}

/// A result tuned by `tuned_by` at `tuned_at_unix_ms`.
pub fn result_at(
    config: &str,
    time_us: f64,
    tuned_by: &str,
    tuned_at_unix_ms: i64,
) -> proto::Result {
    proto::Result {
        config: config.to_owned(),
        time_us,
        tuned_by: tuned_by.to_owned(),
        tuned_at_unix_ms,
        forget_epoch: 0,
        artifacts: Default::default(),
    }
}

/// A result tuned by `tuned_by` at [`TUNED_AT_UNIX_MS`].
pub fn result(config: &str, time_us: f64, tuned_by: &str) -> proto::Result {
    result_at(config, time_us, tuned_by, TUNED_AT_UNIX_MS)
}

pub fn entry(key: proto::Key, config: &str, time_us: f64, tuned_by: &str) -> proto::Entry {
    proto::Entry {
        key: Some(key),
        result: Some(result(config, time_us, tuned_by)),
    }
}

/// `entry` with its result naming `artifacts`.
pub fn with_artifacts(mut entry: proto::Entry, artifacts: Vec<proto::Artifact>) -> proto::Entry {
    if let Some(result) = entry.result.as_mut() {
        result.artifacts = artifacts;
    }
    entry
}

/// SIGSTOPs `pid` and waits until every one of its threads is stopped. `kill` returns once the
/// signal is queued; the group stop completes only when a thread of the process has run to
/// take it, and until then the other threads go on serving (seen: a Record answered after
/// `kill` returned, on a loaded 2-core machine).
pub fn stop_process(pid: Pid) {
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let running = || {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // The state follows the command's closing parenthesis: "pid (comm) S ...".
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next());
                !matches!(state, Some('T' | 't'))
            })
            .count()
    };
    let stopped = Lazy(|| format!("every thread of {pid} stopped ({} not)", running()));
    wait(FACT_LIMIT, stopped)
        .every(Duration::from_millis(1))
        .blocking(|| running() == 0);
}

/// Every process id in /proc.
fn proc_pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

/// Pids of the direct children of `parent`, read from /proc.
pub fn child_pids(parent: Pid) -> Vec<Pid> {
    proc_pids()
        .into_iter()
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the parenthesised command name: state, then the parent pid.
            let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            after_name.split_whitespace().nth(1) == Some(&parent.as_raw().to_string())
        })
        .map(Pid::from_raw)
        .collect()
}

// --- Deployment tests: external tools and processes. ---

/// An external tool the test needs (`$<ENV>` first, then PATH). When it is missing the test is
/// skipped with a message, except under CI (`CI` set), where a missing tool fails the test so
/// a broken CI image cannot pass silently.
pub fn require_tool(name: &str, env: Option<&str>) -> Option<PathBuf> {
    let configured = env
        .and_then(std::env::var_os)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    let found = configured.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|candidate| candidate.is_file())
        })
    });
    if found.is_none() {
        let hint = env.map_or(String::new(), |env| format!(" or set ${env}"));
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is required under CI: install it{hint}"
        );
        eprintln!("SKIPPED: {name} not found on PATH{hint}");
    }
    found
}

/// Whether the tests run as root (needed to act as another uid or chown to another group).
/// Like a missing tool, not being root skips outside CI and fails under CI.
pub fn require_root(what: &str) -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} needs root under CI"
    );
    eprintln!("SKIPPED: {what} needs root");
    false
}

/// Pids of running `tunecached` processes whose command line mentions `socket`, read from
/// /proc (zombies excluded: they no longer have a command line).
pub fn daemon_pids_on(socket: &Path) -> Vec<i32> {
    let socket = socket.as_os_str().as_encoded_bytes();
    proc_pids()
        .into_iter()
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let mut args = cmdline.split(|&b| b == 0);
            let is_daemon = args
                .next()
                .is_some_and(|arg0| arg0.ends_with(b"tunecached"));
            is_daemon && cmdline.windows(socket.len()).any(|window| window == socket)
        })
        .collect()
}

/// The order in which one rank meets `count` problems: `0..count` for seed 0, else a
/// shuffle of its own, the same for the same seed (ranks meet the same ops in different
/// orders in practice, and one shared order would serialise them behind one tuner). Used by
/// the test rank and the multi-node benchmark.
pub fn rank_order(count: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    if seed == 0 {
        return order;
    }
    // xorshift64*: enough to give each rank its own order, reproducibly.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..count).rev() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let j = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// Runs the `tunecache` CLI on `socket` with `args` as uid/gid 65534 (nobody) through
/// `setpriv`, in the supplementary `groups` ("100,4242"), or in none when it is empty.
pub fn cli_as_nobody(
    setpriv: &Path,
    socket: &Path,
    groups: &str,
    args: &[&str],
) -> std::process::Output {
    let mut command = Command::new(setpriv);
    command.args(["--reuid", "65534", "--regid", "65534"]);
    if groups.is_empty() {
        command.arg("--clear-groups");
    } else {
        command.args(["--groups", groups]);
    }
    command
        .arg(bin("tunecache"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

// --- Rank processes: `tunecache-test-rank`s started together against a daemon. ---

/// A `tunecache-test-rank` on `daemon` that counts its tunings in `dir/tuned.txt` and starts
/// once `dir/start` exists (see `run_ranks`), with `extra` flags after those.
pub fn rank_command(daemon: &TestDaemon, dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(bin("tunecache-test-rank"));
    command
        .arg("--socket")
        .arg(&daemon.socket)
        .arg("--count-file")
        .arg(dir.join("tuned.txt"))
        .arg("--start-file")
        .arg(dir.join("start"))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// Starts every command, releases them together (creates `dir/start`), and returns each
/// one's JSON lines. Runs off the async runtime.
pub async fn run_ranks(mut commands: Vec<Command>, dir: &Path) -> Vec<Vec<serde_json::Value>> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let children: Vec<Child> = commands
            .iter_mut()
            .map(|c| c.spawn().expect("spawn rank"))
            .collect();
        std::fs::write(dir.join("start"), b"go").unwrap();
        children
            .into_iter()
            .map(|child| {
                let output = child.wait_with_output().expect("rank output");
                assert!(output.status.success(), "rank failed: {}", output.status);
                String::from_utf8(output.stdout)
                    .unwrap()
                    .lines()
                    .map(|line| serde_json::from_str(line).expect("rank JSON line"))
                    .collect()
            })
            .collect()
    })
    .await
    .expect("rank runner")
}

// --- Fault injection helpers: mounts (a FUSE mount whose server can be stopped, a tiny
// tmpfs, a read-only bind) that a failing test never leaves behind. ---

/// A mount undone however the test ends: a stopped FUSE server is continued first, then the
/// mount is detached lazily, so a failing test never leaves a hung mount behind.
pub struct TestMount {
    mount_point: PathBuf,
    /// The FUSE server of a bindfs mount.
    server: Option<Child>,
}

impl TestMount {
    /// A bindfs mount of `backing` at `mount_point`. Needs root, `bindfs`, `fusermount3` and
    /// /dev/fuse.
    pub fn bindfs(backing: &Path, mount_point: &Path) -> TestMount {
        for tool in ["bindfs", "fusermount3"] {
            assert!(
                require_tool(tool, None).is_some(),
                "{tool} is needed: apt-get install bindfs fuse3"
            );
        }
        std::fs::create_dir_all(backing).unwrap();
        std::fs::create_dir_all(mount_point).unwrap();
        let server = Command::new("bindfs")
            .arg("-f")
            .arg(backing)
            .arg(mount_point)
            .stdout(Stdio::null())
            .spawn()
            .expect("start bindfs");
        let mount = TestMount {
            mount_point: mount_point.to_path_buf(),
            server: Some(server),
        };
        eventually_blocking(Duration::from_secs(10), "bindfs mounting", || {
            mount.is_mounted()
        });
        mount
    }

    /// `mount ARGS MOUNT_POINT` (a tmpfs, a bind mount). Needs root.
    pub fn plain(mount_point: &Path, args: &[&str]) -> TestMount {
        std::fs::create_dir_all(mount_point).unwrap();
        let mount = TestMount {
            mount_point: mount_point.to_path_buf(),
            server: None,
        };
        assert!(
            quiet(Command::new("mount").args(args).arg(mount_point)),
            "mount {args:?} {} failed",
            mount_point.display()
        );
        mount
    }

    /// `mount -o OPTIONS MOUNT_POINT`, e.g. "remount,ro,bind".
    pub fn remount(&self, options: &str) {
        assert!(
            quiet(
                Command::new("mount")
                    .args(["-o", options])
                    .arg(&self.mount_point)
            ),
            "mount -o {options} {} failed",
            self.mount_point.display()
        );
    }

    fn is_mounted(&self) -> bool {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let path = self.mount_point.display().to_string();
        mountinfo
            .lines()
            .any(|line| line.split(' ').nth(4) == Some(path.as_str()))
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) the FUSE server: every call into the mount
    /// hangs while it is stopped.
    pub fn signal_server(&self, signal: Signal) {
        let server = self.server.as_ref().expect("bindfs running");
        kill(Pid::from_raw(server.id() as i32), signal).expect("signal bindfs");
    }

    /// Undoes the mount now (also done on drop; a second call does nothing).
    pub fn unmount(&mut self) {
        if let Some(server) = &self.server {
            let _ = kill(Pid::from_raw(server.id() as i32), Signal::SIGCONT);
        }
        if self.is_mounted()
            && !quiet(
                Command::new("fusermount3")
                    .arg("-u")
                    .arg("-z")
                    .arg(&self.mount_point),
            )
            && !quiet(Command::new("umount").arg("-l").arg(&self.mount_point))
        {
            eprintln!("could not unmount {}", self.mount_point.display());
        }
        if let Some(mut server) = self.server.take() {
            // A grace period for the server to exit once unmounted, killed after it.
            let _ = wait(Duration::from_secs(5), "bindfs exiting")
                .try_blocking_some(|| server.try_wait().ok().flatten());
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Runs `command` with its output discarded; whether it succeeded.
fn quiet(command: &mut Command) -> bool {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Options for a daemon in `dir` (made if missing) that publishes to and reads from `shared`
/// as `node`, every `interval_s` seconds, with `extra` flags after those.
pub fn shared_node(
    dir: &Path,
    shared: &Path,
    node: &str,
    interval_s: u64,
    extra: &[&str],
) -> DaemonOptions {
    std::fs::create_dir_all(dir).unwrap();
    let interval = interval_s.to_string();
    DaemonOptions::new(dir)
        .args([
            "--shared-dir",
            shared.to_str().unwrap(),
            "--node-name",
            node,
            "--snapshot-interval",
            interval.as_str(),
        ])
        .args(extra.iter().copied())
}

/// Entries `<prefix>-<i>` of op `gemm` for each `i` in `range`, with time `i + 1` µs.
pub fn numbered(prefix: &str, range: std::ops::Range<usize>, tuned_by: &str) -> Vec<proto::Entry> {
    numbered_op("gemm", prefix, range, tuned_by)
}

/// Entries `<prefix>-<i>` of `op` (namespace `test`) for each `i` in `range`: config
/// `{"tactic":i}`, time `i + 1` µs.
pub fn numbered_op(
    op: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
    tuned_by: &str,
) -> Vec<proto::Entry> {
    range
        .map(|i| {
            entry(
                test_key(op, &format!("{prefix}-{i}")),
                &format!(r#"{{"tactic":{i}}}"#),
                i as f64 + 1.0,
                tuned_by,
            )
        })
        .collect()
}

/// Copies the file `from` to `to` through `cp`, so that no descriptor of the new file is ever
/// open in this test process. Its tests run side by side: a child another test's thread forks
/// while this process holds the new file open for writing keeps that descriptor until its exec,
/// and running the copy meanwhile fails with ETXTBSY ("Text file busy").
pub fn copy_executable(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(status.success(), "cp {} {}", from.display(), to.display());
}

/// Writes `contents` to `path` with mode 0755 through `sh` (as [`copy_executable`], and why).
pub fn write_executable(path: &Path, contents: &str) {
    use std::io::Write;
    let mut child = Command::new("sh")
        .args(["-c", r#"cat > "$1" && chmod 755 "$1""#, "sh"])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .expect("run sh");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(contents.as_bytes())
        .expect("write the script to sh");
    let status = child.wait().expect("wait for sh");
    assert!(status.success(), "writing {} failed", path.display());
}

/// `GET path` over plain HTTP/1.1: (status line, body).
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP head and body");
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// The metrics address a daemon started with `--metrics-addr 127.0.0.1:0` logged.
pub fn metrics_addr(daemon: &TestDaemon) -> String {
    let log = daemon.log();
    log.split("metrics at http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"))
        .to_owned()
}

/// The merge rule, as `merge.rs` states it, for a test's expected winner: lower time, then
/// config, tuned_by and tuned_at bytes.
pub fn best_result(candidates: &[proto::Result]) -> proto::Result {
    candidates
        .iter()
        .min_by(|a, b| {
            a.time_us
                .total_cmp(&b.time_us)
                .then_with(|| a.config.as_bytes().cmp(b.config.as_bytes()))
                .then_with(|| a.tuned_by.as_bytes().cmp(b.tuned_by.as_bytes()))
                .then_with(|| a.tuned_at_unix_ms.cmp(&b.tuned_at_unix_ms))
        })
        .cloned()
        .expect("at least one candidate")
}

/// The bodies of the ```sh fenced blocks of a markdown text.
pub fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}
