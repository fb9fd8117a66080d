//! Real `redis-server` processes for the cluster tier's tests: one server (restartable on
//! the same port, with or without its data), a Redis Cluster of three masters, and the
//! helpers that wait for a node to connect or for a key to become a hit.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tunecache_client::proto;

use crate::{eventually, eventually_blocking, require_tool, wait, DaemonOptions, Lazy, TestDaemon};

/// A `redis-server` owned by the test, killed on drop.
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    /// Its working directory (AOF/RDB files, log).
    pub dir: PathBuf,
    args: Vec<String>,
}

/// Ports handed out by [`free_port`] in this process (each with its cluster bus port), and
/// the locks that keep other test processes off them until this one exits.
static HANDED_OUT: std::sync::Mutex<Vec<(u16, Vec<nix::fcntl::Flock<std::fs::File>>)>> =
    std::sync::Mutex::new(Vec::new());

/// The lowest port the kernel hands out as an ephemeral (outgoing) port; ports below it are
/// never taken by some connection's local end between `free_port` and the server's bind.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Takes `port` for this process across processes: an exclusive `flock` on
/// `$TMPDIR/tunecache-test-ports/<port>.lock`, held (the descriptor kept open) until the
/// process exits, so the lock of a process that died is free again.
fn lock_port(port: u16) -> Option<nix::fcntl::Flock<std::fs::File>> {
    let dir = std::env::temp_dir().join("tunecache-test-ports");
    std::fs::create_dir_all(&dir).ok()?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(format!("{port}.lock")))
        .ok()?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).ok()
}

/// A TCP port nothing listens on now, with its Redis Cluster bus port (+ 10000) free too,
/// that no other `free_port` call hands out while this test process lives: not in this
/// process (tests run in parallel threads) and, through a lock file per port, not in another
/// test process on the machine either. Both ports lie below the kernel's ephemeral range, so
/// an outgoing connection cannot take one before the server binds it.
pub fn free_port() -> u16 {
    // Candidates in [10000, low - 10000), so that port + 10000 is below `low` too; where the
    // ephemeral range starts too low for that, anywhere up to 55000.
    let low = u32::from(ephemeral_low());
    let (first, end) = if low >= 30_000 {
        (10_000, low - 10_000)
    } else {
        (10_000, 55_000)
    };
    let span = end - first;
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for attempt in 0..span {
        // From a per-process starting point, in steps of a prime (which visits every
        // candidate unless it divides the span).
        let offset = seed.wrapping_add(attempt.wrapping_mul(7_919)) % span;
        let port = (first + offset) as u16;
        let bus = port + 10_000;
        let taken = |p: u16| handed_out.iter().any(|(q, _)| *q == p || *q + 10_000 == p);
        if taken(port) || taken(bus) {
            continue;
        }
        let bindable = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if !bindable(port) || !bindable(bus) {
            continue;
        }
        let Some(port_lock) = lock_port(port) else {
            continue;
        };
        let Some(bus_lock) = lock_port(bus) else {
            continue;
        };
        handed_out.push((port, vec![port_lock, bus_lock]));
        return port;
    }
    panic!("no free port pair in [{first}, {end})");
}

impl Redis {
    /// `None` (the test is skipped) when redis-server is missing outside CI.
    pub fn server() -> Option<PathBuf> {
        require_tool("redis-server", Some("REDIS_SERVER"))
    }

    /// A server on `port` with persistence off, plus `extra` arguments.
    pub fn start(dir: &Path, port: u16, extra: &[&str]) -> Redis {
        let mut args: Vec<String> = ["--save", "", "--appendonly", "no"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Redis::start_args(dir, port, args)
    }

    /// A server that keeps its data across a restart: AOF with fsync on every write.
    pub fn start_persistent(dir: &Path, port: u16) -> Redis {
        let args = [
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ];
        Redis::start_args(dir, port, args.iter().map(|s| (*s).to_owned()).collect())
    }

    fn start_args(dir: &Path, port: u16, args: Vec<String>) -> Redis {
        let dir = dir.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut redis = Redis {
            child: None,
            port,
            dir,
            args,
        };
        redis.spawn();
        redis
    }

    fn spawn(&mut self) {
        let server = Redis::server().expect("redis-server");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .unwrap();
        let child = Command::new(server)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        self.wait_ready();
    }

    /// SIGKILL, then the same server again on the same port and directory (so with its data
    /// when persistence is on).
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGKILL, then the server again on the same port with its data files deleted.
    pub fn kill_and_restart_empty(&mut self) {
        self.kill();
        for name in ["appendonlydir", "dump.rdb"] {
            let path = self.dir.join(name);
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_file(&path);
        }
        self.spawn();
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again after `kill`.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "redis is still running");
        self.spawn();
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis-cli` against this server; its trimmed stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// A string value's bytes as Redis holds them (`redis-cli --raw`, which ends the value
    /// with one newline); `None` when the key is missing or empty.
    pub fn get_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--raw", "GET", key])
            .output()
            .expect("redis-cli");
        let mut bytes = output.stdout;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
        }
        (!bytes.is_empty()).then_some(bytes)
    }

    /// `SET key <bytes>`, the bytes passed on stdin (`redis-cli -x`), so any bytes go.
    pub fn set_bytes(&self, key: &str, bytes: &[u8]) {
        use std::io::Write;
        let mut child = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "-x", "SET", key])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("redis-cli");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(bytes)
            .expect("write to redis-cli");
        let output = child.wait_with_output().expect("redis-cli");
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "OK");
    }

    /// How many of process `pid`'s connections to this server Redis holds blocked (a stream
    /// read waiting for news), from CLIENT LIST: the connections are told apart by their local
    /// ports, which /proc names for `pid`'s sockets. `None` when `pid` has no connection here.
    pub fn blocked_connections_of(&self, pid: Pid) -> Option<usize> {
        let ports = local_ports_to(pid, self.port);
        if ports.is_empty() {
            return None;
        }
        let clients = self.cli(&["CLIENT", "LIST"]);
        let blocked = clients
            .lines()
            .filter(|line| {
                let field = |name: &str| {
                    line.split(' ')
                        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                };
                let port = field("addr")
                    .and_then(|addr| addr.rsplit_once(':'))
                    .and_then(|(_, port)| port.parse::<u16>().ok());
                port.is_some_and(|port| ports.contains(&port))
                    && field("flags").is_some_and(|flags| flags.contains('b'))
            })
            .count();
        Some(blocked)
    }

    /// A number of `INFO <section>` (e.g. `total_connections_received` of `stats`).
    pub fn info_number(&self, section: &str, field: &str) -> u64 {
        let text = self.cli(&["INFO", section]);
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{field}:")))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO {section} has no number {field}: {text}"))
    }

    /// The names of the keys matching `pattern` (SCAN, so a Cluster master's own keys).
    pub fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let text = self.cli(&["--scan", "--pattern", pattern]);
        text.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The name of the entry of test key (`op`, `problem`) under the default prefix, found
    /// by SCAN (its shard tag is the daemon's business); `None` when Redis lacks it.
    pub fn entry_name(&self, op: &str, problem: &str) -> Option<String> {
        let text = serde_json::json!(["test", op, "test-device", problem, null]).to_string();
        let mut pattern = String::from("tunecache:e:{s??}");
        for c in text.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        let mut names = self.keys_matching(&pattern);
        assert!(names.len() <= 1, "{names:?}");
        names.pop()
    }

    fn wait_ready(&self) {
        let started = Lazy(|| {
            format!(
                "redis-server on {} starting: {}",
                self.port,
                std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
            )
        });
        eventually_blocking(Duration::from_secs(10), started, || {
            let answer = self.cli(&["PING"]);
            // A server loading its AOF answers LOADING; wait for PONG.
            answer == "PONG" || answer.contains("NOAUTH")
        });
    }

    pub fn signal(&self, signal: Signal) {
        let child = self.child.as_ref().expect("redis is running");
        kill(Pid::from_raw(child.id() as i32), signal).expect("signal redis");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A stopped server must be continued before it can die of SIGKILL's delivery
            // being observed by wait (SIGKILL works on stopped processes; this is belt and braces).
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
        }
        self.kill();
    }
}

/// The local ports of `pid`'s TCP connections to 127.0.0.1:`port`: its socket inodes (from
/// /proc/PID/fd) looked up in its /proc/PID/net/tcp.
fn local_ports_to(pid: Pid, port: u16) -> Vec<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: Vec<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, rem, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
            if *rem != remote || !inodes.iter().any(|i| i == inode) {
                return None;
            }
            u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()
        })
        .collect()
}

/// A Redis Cluster of three masters, no replicas.
pub struct RedisCluster {
    pub servers: Vec<Redis>,
}

impl RedisCluster {
    pub fn start(dir: &Path) -> RedisCluster {
        let ports = [free_port(), free_port(), free_port()];
        let servers: Vec<Redis> = ports
            .iter()
            .map(|&port| {
                Redis::start(
                    dir,
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                    ],
                )
            })
            .collect();
        let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stdout)
        );
        wait(Duration::from_secs(20), "the redis cluster forming")
            .every(Duration::from_millis(50))
            .blocking(|| {
                servers
                    .iter()
                    .all(|s| s.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            });
        RedisCluster { servers }
    }

    pub fn url(&self) -> String {
        self.servers[0].url()
    }
}

/// Options for a daemon of node `name` (in `dir/name`) on the cluster tier at `url`, tuner off.
pub fn cluster_node(dir: &Path, name: &str, url: &str, extra: &[&str]) -> DaemonOptions {
    let node_dir = dir.join(name);
    std::fs::create_dir_all(&node_dir).unwrap();
    DaemonOptions::new(&node_dir)
        .args(["--node-name", name, "--tuner", "off", "--cluster-url", url])
        .args(extra.iter().copied())
}

/// Waits until `daemon` is connected to Redis and bootstrapped.
pub async fn wait_connected(daemon: &TestDaemon) {
    let client = &daemon.client().await;
    let last_state = &std::sync::Mutex::new(String::new());
    let connected = Lazy(|| {
        format!(
            "connected (last state {}); {}",
            last_state.lock().unwrap(),
            daemon.diagnostics()
        )
    });
    eventually(Duration::from_secs(20), connected, move || async move {
        let stats = client.stats().await.unwrap();
        let connected = stats.cluster_state.starts_with("connected") && stats.cluster_bootstrapped;
        *last_state.lock().unwrap() = stats.cluster_state;
        connected
    })
    .await;
}

/// Waits (at most `limit`) until Lookup of `key` on `daemon` returns `expected` (any result
/// when `None`); returns how long it took.
pub async fn wait_for_hit(
    daemon: &TestDaemon,
    key: &proto::Key,
    expected: Option<&proto::Result>,
    limit: Duration,
) -> Duration {
    let client = daemon.client().await;
    let started = Instant::now();
    loop {
        let hits = client.lookup(vec![key.clone()]).await.unwrap();
        let got = hits.first().and_then(|e| e.result.clone());
        if got.is_some() && (expected.is_none() || got.as_ref() == expected) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{key:?} on {}: got {got:?}, want {expected:?} within {limit:?}; {}",
            daemon.socket.display(),
            daemon.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many of `entries` are hits with exactly their result on `daemon` now.
pub async fn hits_of(daemon: &TestDaemon, entries: &[proto::Entry]) -> usize {
    let client = daemon.client().await;
    let keys: Vec<proto::Key> = entries.iter().filter_map(|e| e.key.clone()).collect();
    let mut hits = 0;
    for chunk in keys.chunks(1000) {
        let got = client.lookup(chunk.to_vec()).await.unwrap();
        for found in got {
            let want = entries
                .iter()
                .find(|e| e.key == found.key)
                .and_then(|e| e.result.as_ref());
            if found.result.is_some() && found.result.as_ref() == want {
                hits += 1;
            }
        }
    }
    hits
}

/// Waits (at most `limit`) until every one of `entries` is a hit with its result on
/// `daemon`; returns how long it took, or how many arrived when the limit ran out.
pub async fn wait_for_all(
    daemon: &TestDaemon,
    entries: &[proto::Entry],
    limit: Duration,
) -> Result<Duration, usize> {
    let started = Instant::now();
    loop {
        let hits = hits_of(daemon, entries).await;
        if hits == entries.len() {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= limit {
            return Err(hits);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most 20 s) until `daemon` serves every one of `expected` with its result;
/// fails with how many it had and the daemon's log.
pub async fn holds_all(daemon: &TestDaemon, expected: &[proto::Entry]) {
    if let Err(got) = wait_for_all(daemon, expected, Duration::from_secs(20)).await {
        panic!(
            "{got} of {} on {}; log:\n{}",
            expected.len(),
            daemon.socket.display(),
            daemon.log()
        );
    }
}

/// Flags that make a node build checkpoints after every write, checking five times a
/// second.
pub const BUILD_CHECKPOINTS_OFTEN: [&str; 4] = [
    "--cluster-checkpoint-every",
    "1",
    "--cluster-checkpoint-check-ms",
    "200",
];

/// Waits until every shard of Redis (default prefix) has a checkpoint at its current
/// sequence number.
pub async fn wait_checkpoints_current(redis: &Redis) {
    wait(Duration::from_secs(30), "the checkpoints catching up")
        .every(Duration::from_millis(50))
        .until(|| {
            (0..16).all(|s| {
                let cp = redis.cli(&["HGET", &format!("tunecache:cp:{{s{s:02}}}"), "seq"]);
                let meta = redis.cli(&["HGET", &format!("tunecache:m:{{s{s:02}}}"), "s"]);
                !cp.is_empty() && cp == meta
            })
        })
        .await;
}
