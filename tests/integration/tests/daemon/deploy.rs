//! Deployment against the real binary and real tools: systemd socket activation
//! (`systemd-socket-activate`), sd_notify READY/WATCHDOG on a datagram socket, systemd's
//! directories, `systemd-analyze verify` and `security` (exposure score) of the shipped units
//! and drop-ins, peer-credential access checks with a client running as another uid
//! (`setpriv`), `--socket-group`, `--exit-when-idle`, and auto-start by 16 clients at once.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tunecache_client::Client;
use tunecache_integration::{
    bin, cli_as_nobody, daemon_pids_on, entry, eventually_sync, require_root, require_tool,
    test_key, wait, DaemonOptions, Lazy, TestDaemon,
};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

async fn connect_when_answering(socket: &Path, limit: Duration) -> Client {
    let what = Lazy(|| format!("an answer on {}", socket.display()));
    wait(limit, what)
        .until_some_async(|| async {
            let client = Client::connect(socket).await.ok()?;
            client.stats().await.ok()?;
            Some(client)
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_serves_on_the_inherited_socket_and_leaves_it() {
    let Some(activate) = require_tool("systemd-socket-activate", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("activated.sock");
    let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
    // systemd-socket-activate binds the socket, waits for the first connection, then execs the
    // daemon with LISTEN_FDS=1/LISTEN_PID (so the daemon's pid is the child's).
    let mut child = Command::new(activate)
        .arg("-l")
        .arg(&socket)
        .arg("-E")
        .arg("RUST_LOG=info")
        .arg(bin("tunecached"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        // A different --socket is ignored under activation.
        .arg("--socket")
        .arg(dir.path().join("not-used.sock"))
        .env_remove("TUNECACHE_SOCKET")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    eventually_sync(Duration::from_secs(10), "the activation socket", || {
        socket.exists()
    })
    .await;

    let client = connect_when_answering(&socket, Duration::from_secs(20)).await;
    client
        .record(vec![entry(
            test_key("gemm", "activated"),
            "{\"t\":1}",
            1.0,
            "sa",
        )])
        .await
        .unwrap();
    let hits = client
        .lookup(vec![test_key("gemm", "activated")])
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert!(!dir.path().join("not-used.sock").exists());
    drop(client);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap();
    assert!(status.success(), "{status}; log:\n{log}");
    assert!(log.contains("socket activation"), "{log}");
    // Not the daemon's socket to remove: the next activation needs it.
    assert!(
        socket.exists(),
        "the inherited socket was unlinked; log:\n{log}"
    );
}

/// Reads notifications until one contains `wanted`, failing after `limit`.
fn receive_until(notify: &UnixDatagram, wanted: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {wanted:?} within {limit:?}; got {seen:?}"
        );
        notify.set_read_timeout(Some(left)).unwrap();
        match notify.recv(&mut buffer) {
            Ok(n) => {
                let message = String::from_utf8_lossy(&buffer[..n]).into_owned();
                let done = message.lines().any(|line| line == wanted);
                seen.push(message);
                if done {
                    return seen;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {}
            // A signal to this test process (another test's children exiting) interrupts
            // the wait; it is not a failure of the daemon.
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => panic!("notify socket: {error}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_status_watchdog_and_stopping_reach_the_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let socket = dir.path().join("tunecache.sock");
    let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
    let mut child = Command::new(bin("tunecached"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("NOTIFY_SOCKET", &notify_path)
        // 2 s: the daemon pings every second.
        .env("WATCHDOG_USEC", "2000000")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();

    let first = receive_until(&notify, "READY=1", Duration::from_secs(20));
    // READY=1 comes only once serving: the socket answers right away, nothing came before.
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].contains("STATUS=serving 0 entries"), "{first:?}");
    let client = Client::connect(&socket).await.expect("serving at READY=1");
    client
        .record(vec![entry(test_key("gemm", "notify"), "{}", 1.0, "t")])
        .await
        .unwrap();
    let pings = receive_until(&notify, "WATCHDOG=1", Duration::from_secs(20));
    let last = pings.last().unwrap();
    assert!(last.contains("STATUS=serving 1 entries"), "{pings:?}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    receive_until(&notify, "STOPPING=1", Duration::from_secs(20));
    assert!(child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_directories_are_the_defaults_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("run");
    let state = dir.path().join("lib");
    std::fs::create_dir_all(&runtime).unwrap();
    let spawn = |extra: &[&str]| {
        Command::new(bin("tunecached"))
            .args(extra)
            .env("RUNTIME_DIRECTORY", &runtime)
            .env("STATE_DIRECTORY", &state)
            .env_remove("TUNECACHE_SOCKET")
            .env_remove("TUNECACHE_STATE_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut child = spawn(&[]);
    let client =
        connect_when_answering(&runtime.join("tunecache.sock"), Duration::from_secs(20)).await;
    client
        .record(vec![entry(test_key("gemm", "dirs"), "{}", 1.0, "t")])
        .await
        .unwrap();
    assert!(
        state.read_dir().unwrap().next().is_some(),
        "journal in $STATE_DIRECTORY"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());

    // An explicit flag beats systemd's directory.
    let flagged = dir.path().join("flagged.sock");
    let mut child = spawn(&["--socket", flagged.to_str().unwrap()]);
    connect_when_answering(&flagged, Duration::from_secs(20)).await;
    assert!(!runtime.join("tunecache.sock").exists());
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn shipped_units_pass_systemd_analyze_verify() {
    let Some(analyze) = require_tool("systemd-analyze", None) else {
        return;
    };
    let service =
        std::fs::read_to_string(repo_root().join("deploy/systemd/tunecached.service")).unwrap();
    assert!(service.contains("Type=notify"));
    assert!(service.contains("ExecStart=/usr/local/bin/tunecached"));
    // verify insists that ExecStart's binary exists: the layout points it at the one just built.
    let dir = lay_out_units(&[]);
    assert_verify_clean(&analyze, dir.path(), "the shipped units");
}

/// `systemd-analyze verify` of the units laid out in `dir` (drop-ins beside them included).
fn assert_verify_clean(analyze: &Path, dir: &Path, what: &str) {
    let output = Command::new(analyze)
        .arg("verify")
        .arg(dir.join("tunecached.socket"))
        .arg(dir.join("tunecached.service"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what}: {stderr}");
    // verify exits 0 on directives it ignores ("Unknown key", "Failed to parse"): no output at
    // all is the pass.
    assert!(
        stderr.trim().is_empty(),
        "systemd-analyze verify complained about {what}:\n{stderr}"
    );
}

/// Highest `systemd-analyze security` exposure the shipped unit may have, with or without the
/// shipped drop-ins ("OK" ends at 3.9; main's first unit scored 7.9 EXPOSED).
const MAX_EXPOSURE: f64 = 3.0;

/// Lays out `deploy/systemd/tunecached.{service,socket}` with the named drop-ins from
/// `deploy/systemd/tunecached.service.d/` in a temporary directory, as they would sit in
/// /etc/systemd/system. `ExecStart=` points at the binary just built: verify checks it exists.
fn lay_out_units(drop_ins: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let units = repo_root().join("deploy/systemd");
    let service = std::fs::read_to_string(units.join("tunecached.service")).unwrap();
    let service = service.replace(
        "ExecStart=/usr/local/bin/tunecached",
        &format!("ExecStart={}", bin("tunecached").display()),
    );
    std::fs::write(dir.path().join("tunecached.service"), service).unwrap();
    std::fs::copy(
        units.join("tunecached.socket"),
        dir.path().join("tunecached.socket"),
    )
    .unwrap();
    if !drop_ins.is_empty() {
        std::fs::create_dir(dir.path().join("tunecached.service.d")).unwrap();
    }
    for drop_in in drop_ins {
        std::fs::copy(
            units.join("tunecached.service.d").join(drop_in),
            dir.path().join("tunecached.service.d").join(drop_in),
        )
        .unwrap();
    }
    dir
}

/// `systemd-analyze security --offline=yes --threshold` of the unit laid out in `dir`: whether
/// it passed the threshold, the overall exposure it printed, and its report.
fn unit_exposure(analyze: &Path, dir: &Path) -> (bool, f64, String) {
    // --threshold takes the exposure times ten (systemd 252 rejects "3.0").
    let output = Command::new(analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(format!("--threshold={}", (MAX_EXPOSURE * 10.0) as u32))
        .arg(dir.join("tunecached.service"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let report = format!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    // "→ Overall exposure level for tunecached.service: 0.6 SAFE 😀"
    let exposure = stdout
        .lines()
        .find_map(|line| line.split_once("Overall exposure level for tunecached.service:"))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|number| number.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no overall exposure in:\n{report}"));
    (output.status.success(), exposure, report)
}

#[test]
fn shipped_unit_scores_ok_in_systemd_analyze_security() {
    let Some(analyze) = require_tool("systemd-analyze", None) else {
        return;
    };
    for drop_ins in [
        &[][..],
        &["shared-dir.conf"][..],
        &["shared-dir.conf", "redis.conf"][..],
        &["shared-dir.conf", "redis.conf", "bundle.conf"][..],
    ] {
        let dir = lay_out_units(drop_ins);
        let (passed, exposure, report) = unit_exposure(&analyze, dir.path());
        eprintln!("tunecached.service with {drop_ins:?}: exposure {exposure}");
        assert!(
            exposure <= MAX_EXPOSURE,
            "exposure {exposure} > {MAX_EXPOSURE} with drop-ins {drop_ins:?}:\n{report}"
        );
        assert!(
            passed,
            "--threshold failed with drop-ins {drop_ins:?}:\n{report}"
        );
        // The drop-ins are loaded from beside the unit, as from /etc: verify them as well.
        assert_verify_clean(&analyze, dir.path(), &format!("drop-ins {drop_ins:?}"));
    }
}

#[test]
fn unit_keeps_gpu_access_and_drop_ins_open_what_they_need() {
    let units = repo_root().join("deploy/systemd");
    let directives = |path: &Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    let service = directives(&units.join("tunecached.service"));
    let has = |lines: &[String], line: &str| lines.iter().any(|l| l == line);
    // A private /dev has no /dev/nvidia*: the tuner would silently fall back to the CPU.
    assert!(!service.iter().any(|l| l.starts_with("PrivateDevices=yes")));
    for line in [
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=char-nvidia-uvm rw",
        "LimitNOFILE=1024:65536",
        "RestrictAddressFamilies=AF_UNIX",
    ] {
        assert!(has(&service, line), "tunecached.service lacks {line}");
    }
    let documentation = service
        .iter()
        .find(|l| l.starts_with("Documentation="))
        .expect("Documentation=");
    assert!(
        documentation.contains("file:///usr/share/doc/tunecache/")
            || documentation.contains("man:"),
        "{documentation} is not the installed documentation"
    );

    // The shared-dir drop-in opens the directory the daemon reads from its environment.
    let shared = directives(&units.join("tunecached.service.d/shared-dir.conf"));
    let dir = shared
        .iter()
        .find_map(|l| l.strip_prefix("Environment=TUNECACHE_SHARED_DIR="))
        .expect("shared-dir.conf sets TUNECACHE_SHARED_DIR");
    assert!(has(&shared, &format!("ReadWritePaths={dir}")));
    assert!(has(&shared, &format!("RequiresMountsFor={dir}")));
    let config = std::fs::read_to_string(repo_root().join("server/src/config.rs")).unwrap();
    assert!(config.contains("env = \"TUNECACHE_SHARED_DIR\""));

    // The Redis drop-in: network ordering, TCP, and the password as a credential.
    let redis = directives(&units.join("tunecached.service.d/redis.conf"));
    for line in [
        "After=network-online.target",
        "Wants=network-online.target",
        "RestrictAddressFamilies=AF_INET AF_INET6",
        "PrivateNetwork=no",
        "LoadCredential=redis-password:/etc/tunecache/redis-password",
        "Environment=TUNECACHE_CLUSTER_PASSWORD_FILE=%d/redis-password",
    ] {
        assert!(has(&redis, line), "redis.conf lacks {line}");
    }
}

/// Lets anyone reach `socket` through the file system, so only the peer check is left.
fn open_to_everyone(dir: &Path, socket: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_of_other_uids_are_refused_unless_allowed() {
    if !require_root("acting as another uid") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::process(dir.path()).await;
    open_to_everyone(dir.path(), &daemon.socket);
    for _ in 0..2 {
        let output = cli_as_nobody(&setpriv, &daemon.socket, "", &["stats"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("(PermissionDenied)"), "{stderr}");
        assert!(stderr.contains("uid 65534 may not use"), "{stderr}");
    }
    // Root (this test) and the daemon's own uid are allowed.
    assert!(daemon.client().await.stats().await.is_ok());
    let refusals = daemon.log().matches("refused a caller").count();
    assert_eq!(refusals, 1, "logged once per uid:\n{}", daemon.log());
    drop(daemon);

    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--allow-uid", "1234,65534"])
        .process()
        .await;
    open_to_everyone(dir.path(), &daemon.socket);
    let output = cli_as_nobody(&setpriv, &daemon.socket, "", &["--json", "stats"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("\"entries\":0"));

    // By group: nobody's primary group 65534.
    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--allow-gid", "65534"])
        .process()
        .await;
    open_to_everyone(dir.path(), &daemon.socket);
    let output = cli_as_nobody(&setpriv, &daemon.socket, "", &["stats"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// SO_PEERCRED carries only the primary gid: an allowed supplementary group is found through
/// the caller's /proc status, on every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_in_an_allowed_supplementary_group_are_admitted() {
    if !require_root("acting as another uid") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--allow-gid", "4242"])
        .process()
        .await;
    open_to_everyone(dir.path(), &daemon.socket);
    for _ in 0..2 {
        let output = cli_as_nobody(&setpriv, &daemon.socket, "100,4242", &["stats"]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let output = cli_as_nobody(&setpriv, &daemon.socket, "100,4243", &["stats"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("uid 65534 may not use"), "{stderr}");
    let output = cli_as_nobody(&setpriv, &daemon.socket, "", &["stats"]);
    assert_eq!(output.status.code(), Some(2), "no groups at all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_group_is_applied() {
    if !require_root("chown to another group") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The group is applied at bind: the daemon can run in-process; the refusal below is an
    // exit status and stderr, the binary's.
    let daemon = DaemonOptions::new(dir.path())
        .args(["--socket-group", "65534"])
        .in_process()
        .await;
    let metadata = std::fs::metadata(&daemon.socket).unwrap();
    assert_eq!(metadata.gid(), 65534);
    assert_eq!(metadata.mode() & 0o777, 0o660);

    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(bin("tunecached"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--socket-group", "no-such-group-tunecache"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("does not exist"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_cleanly_when_no_client_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = DaemonOptions::new(dir.path())
        .args(["--exit-when-idle", "1"])
        .process()
        .await;
    let client = daemon.client().await;
    client
        .record(vec![entry(test_key("gemm", "idle"), "{}", 1.0, "t")])
        .await
        .unwrap();
    let status = daemon.wait_for_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}; log:\n{}", daemon.log());
    assert!(
        daemon.log().contains("--exit-when-idle"),
        "{}",
        daemon.log()
    );
    assert!(!daemon.socket.exists(), "socket removed as on SIGTERM");
    // What was recorded is durable: a restart has it.
    daemon.restart().await;
    let hits = daemon
        .client()
        .await
        .lookup(vec![test_key("gemm", "idle")])
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_autostarting_at_once_bring_up_exactly_one_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("auto").join("tunecache.sock");
    let clients: Vec<_> = (0..16)
        .map(|rank| {
            Command::new(bin("tunecache"))
                .args([
                    "put",
                    "--namespace",
                    "test",
                    "--op",
                    "gemm",
                    "--device",
                    "d",
                ])
                .arg("--problem")
                .arg(format!("rank-{rank}"))
                .args(["--config", "{}", "--time-us", "1"])
                .env("TUNECACHE_AUTOSTART", "1")
                .env("TUNECACHE_SOCKET", &socket)
                .env("TUNECACHE_DAEMON_BIN", bin("tunecached"))
                .env("TUNECACHE_STATE_DIR", dir.path().join("state"))
                .env_remove("TUNECACHE_EXIT_WHEN_IDLE")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for client in clients {
        let output = client.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "stored");
    }
    // Losers of the start race exit at once; what is left is one daemon.
    eventually_sync(Duration::from_secs(10), "losing daemons exiting", || {
        daemon_pids_on(&socket).len() <= 1
    })
    .await;
    let pids = daemon_pids_on(&socket);
    let log = std::fs::read_to_string(dir.path().join("auto/tunecached.log")).unwrap_or_default();
    assert_eq!(pids.len(), 1, "daemons: {pids:?}; log:\n{log}");
    let client = Client::connect(&socket).await.unwrap();
    assert_eq!(
        client.stats().await.unwrap().entries,
        16,
        "all ranks reached the one daemon"
    );

    let pid = nix::unistd::Pid::from_raw(pids[0]);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    eventually_sync(Duration::from_secs(20), "the daemon exiting", || {
        daemon_pids_on(&socket).is_empty()
    })
    .await;
}
