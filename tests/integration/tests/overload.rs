//! Overload and abuse against the real binary under real limits: descriptors exhausted by
//! idle sockets (prlimit), one process taking many leases, one uid opening many connections
//! (and another uid, through setpriv, still served), and a journal disk that hangs (a
//! SIGSTOPped bindfs mount) while Records keep coming.
//!
//! These tests need root, `prlimit` and `setpriv` (util-linux), and `bindfs` + `fuse3`;
//! like the other fault tests they fail, naming what is missing, under CI.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tonic::Code;
use tunecache_client::{proto, Client, ClientError, Resolution, ResolveOptions};
use tunecache_integration::{
    cli_as_nobody, entry, require_root, require_tool, test_key, wait, DaemonOptions, TestDaemon,
    TestMount,
};

/// Documented defaults (README "Limits"); the tests use them so they exercise what ships.
const DEFAULT_MAX_CONNECTIONS_PER_UID: usize = 512;
const DEFAULT_MAX_LEASES_PER_PID: usize = 256;

/// Sets another process's NOFILE limit with `prlimit`, as an operator would.
fn set_nofile(prlimit: &Path, pid: u32, limit: u64) {
    let status = Command::new(prlimit)
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --nofile={limit}:{limit} failed");
}

/// This process's hard NOFILE limit (raising it needs CAP_SYS_RESOURCE, which a container's
/// root may lack, so the tests work below it).
fn own_hard_nofile() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("Max open files in /proc/self/limits");
    let hard = line.split_whitespace().nth(4).expect("hard limit column");
    hard.parse().unwrap_or(u64::MAX)
}

/// Raises this process's soft NOFILE limit to its hard limit, for tests that hold hundreds of
/// sockets. Only ever raised, never lowered, so the tests running beside them only gain.
fn raise_own_soft_nofile() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process, with a valid rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
}

/// User plus system CPU time of `pid` so far, from /proc/<pid>/stat.
fn cpu_time(pid: Pid) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc stat");
    let after_name = stat.rsplit_once(')').expect("stat has a command name").1;
    // Fields after the name start at field 3 (state); utime and stime are fields 14 and 15.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let output = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    let per_second: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

fn open_fds(pid: Pid) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

/// Whether the daemon's journal writer thread (`tunecache-writer`) is blocked in a system call
/// other than futex, i.e. in the file system rather than waiting for work (it waits for work
/// on a futex), from /proc/<pid>/task/<tid>/syscall ("running" while it runs).
fn writer_blocked_in_io(pid: Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // comm holds 15 bytes of the name.
        if !comm.trim_end().starts_with("tunecache-write") {
            return false;
        }
        let syscall = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
        syscall
            .split_whitespace()
            .next()
            .and_then(|number| number.parse::<i64>().ok())
            .is_some_and(|number| number != libc::SYS_futex)
    })
}

fn answered_while_hung(round: usize, answer: impl std::fmt::Debug) -> ! {
    panic!("Record {round} answered while the disk hangs: {answer:?}")
}

/// A client that has completed a call, so its connection is accepted and admitted.
async fn answering_client(socket: &Path) -> Result<Client, ClientError> {
    let client = Client::connect(socket)
        .await?
        .with_timeout(Duration::from_secs(5));
    client.stats().await?;
    Ok(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_past_the_fd_limit_are_reclaimed_without_spinning() {
    if !require_root("lowering the daemon's fd limit") {
        return;
    }
    let Some(prlimit) = require_tool("prlimit", None) else {
        return;
    };
    const DAEMON_FDS: u64 = 256;
    const IDLE_SOCKETS: usize = 300;
    let hard = own_hard_nofile();
    assert!(
        hard > 2 * IDLE_SOCKETS as u64,
        "this test needs {} fds",
        2 * IDLE_SOCKETS
    );
    // This process holds the idle sockets.
    raise_own_soft_nofile();
    // The daemon starts with a soft limit below its hard limit, as under a default login;
    // set in the daemon's process only, so the tests beside this one keep their limit.
    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .nofile(256, hard)
        .process()
        .await;
    let pid = daemon.pid();
    let at_start = daemon.client().await.stats().await.unwrap();
    assert_eq!(
        (at_start.nofile_soft_limit, at_start.nofile_hard_limit),
        (hard, hard),
        "the daemon raises its soft fd limit to the hard limit"
    );
    // The daemon raised its soft limit at start; the operator's limit now binds it.
    set_nofile(&prlimit, pid.as_raw() as u32, DAEMON_FDS);

    // Idle sockets that never send the HTTP/2 preface, more than the daemon has fds for. A
    // connect fails (EAGAIN) only when the listen backlog is full: retry briefly.
    let mut idle = Vec::with_capacity(IDLE_SOCKETS);
    let deadline = Instant::now() + Duration::from_secs(20);
    while idle.len() < IDLE_SOCKETS && Instant::now() < deadline {
        match tokio::net::UnixStream::connect(&daemon.socket).await {
            Ok(stream) => idle.push(stream),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    // The daemon accepts them until it runs out.
    // Asserted below, with what was open.
    wait(Duration::from_secs(5), "the daemon running out of fds")
        .try_until(|| open_fds(pid) as u64 >= DAEMON_FDS - 8)
        .await;
    let fds = open_fds(pid);
    assert!(
        fds as u64 >= DAEMON_FDS - 8,
        "the daemon should be out of fds ({fds} open of {DAEMON_FDS}, {} idle sockets)",
        idle.len()
    );

    // Out of fds, the daemon must back off rather than retry accept in a loop. It has
    // nothing else to do, so it should use next to no CPU (measured: 10 ms in 3 s; a spinning
    // accept loop took 820 ms in 3 s even on a machine with load 14 on 2 cores).
    let window = Duration::from_secs(3);
    let before = cpu_time(pid);
    tokio::time::sleep(window).await;
    let used = cpu_time(pid) - before;
    assert!(
        used < window / 10,
        "the daemon used {used:?} of CPU in {window:?} while out of fds: it spins on accept"
    );

    // The preface timeout reclaims the idle sockets; a new client gets answers.
    let started = Instant::now();
    let stats = loop {
        let attempt = tokio::time::timeout(Duration::from_secs(10), async {
            answering_client(&daemon.socket).await?.stats().await
        })
        .await;
        if let Ok(Ok(stats)) = attempt {
            break stats;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no answer within 60 s with {} idle sockets; log:\n{}",
            idle.len(),
            daemon.log()
        );
    };
    assert!(stats.preface_timeouts > 0, "{stats:?}");
    assert!(stats.accept_errors > 0, "{stats:?}");
    let log = daemon.log();
    assert_eq!(
        log.matches("accepting a connection failed").count(),
        1,
        "an accept error is logged once per cause:\n{log}"
    );
    assert_eq!(log.matches("sent no HTTP/2 preface").count(), 1, "{log}");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_holding_the_most_leases_is_refused_with_resource_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::process(dir.path()).await;
    let client = daemon.client().await;
    let options = ResolveOptions {
        wait: Duration::ZERO,
        can_tune: true,
        lease: Duration::from_secs(600),
    };
    let mut leases = Vec::new();
    for i in 0..DEFAULT_MAX_LEASES_PER_PID {
        let key = test_key("gemm", &format!("lease-{i}"));
        match client.resolve(key.clone(), options).await.unwrap() {
            Resolution::TuneHere(lease) => leases.push((key, lease)),
            other => panic!("lease {i}: expected TuneHere, got {other:?}"),
        }
    }
    // One more from the same process: refused, naming the limit. Twice, logged once.
    for attempt in 0..2 {
        let refused = client
            .resolve(test_key("gemm", &format!("over-{attempt}")), options)
            .await;
        match refused {
            Err(ClientError::Rpc(status)) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("--max-leases-per-pid 256"),
                    "{status:?}"
                );
            }
            other => panic!("lease over the cap: expected RESOURCE_EXHAUSTED, got {other:?}"),
        }
    }
    // Finishing a lease makes room for another.
    let (key, lease) = leases.pop().unwrap();
    client
        .record_with_lease(vec![entry(key, "{}", 1.0, "overload")], lease.lease_id)
        .await
        .unwrap();
    let again = client
        .resolve(test_key("gemm", "after-record"), options)
        .await
        .unwrap();
    assert!(matches!(again, Resolution::TuneHere(_)), "{again:?}");

    let stats = client.stats().await.unwrap();
    assert_eq!(stats.leases_refused_per_pid, 2);
    assert_eq!(stats.max_leases_per_pid, DEFAULT_MAX_LEASES_PER_PID as u64);
    let log = daemon.log();
    assert_eq!(log.matches("refused a lease").count(), 1, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_holding_the_most_connections_is_refused_and_other_uids_are_not() {
    if !require_root("acting as another uid") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    // This process holds the uid's connections.
    raise_own_soft_nofile();
    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--allow-uid", "65534"])
        .process()
        .await;
    // Let uid 65534 reach the socket through the file system.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();

    let mut held = Vec::with_capacity(DEFAULT_MAX_CONNECTIONS_PER_UID);
    for i in 0..DEFAULT_MAX_CONNECTIONS_PER_UID {
        let client = answering_client(&daemon.socket)
            .await
            .unwrap_or_else(|e| panic!("connection {i} of this uid: {e}"));
        held.push(client);
    }
    // This uid's next connections are closed (twice: logged once).
    for _ in 0..2 {
        let over =
            tokio::time::timeout(Duration::from_secs(10), answering_client(&daemon.socket)).await;
        assert!(
            !matches!(over, Ok(Ok(_))),
            "a connection over the per-uid cap was served"
        );
    }
    // Another uid is still served.
    let output = cli_as_nobody(&setpriv, &daemon.socket, "", &["stats"]);
    assert!(
        output.status.success(),
        "uid 65534 was not served: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Closing one connection gives its slot back.
    let stats = held[0].stats().await.unwrap();
    held.truncate(held.len() - 1);
    wait(
        Duration::from_secs(10),
        "the closed connection's slot coming back",
    )
    .every(Duration::from_millis(50))
    .until_async(|| async { answering_client(&daemon.socket).await.is_ok() })
    .await;
    // Each refused attempt may be a connect and a reconnect of the client's channel.
    assert!(stats.connections_refused_per_uid >= 2, "{stats:?}");
    assert_eq!(
        stats.max_connections_per_uid,
        DEFAULT_MAX_CONNECTIONS_PER_UID as u64
    );
    assert!(stats.connections_open >= DEFAULT_MAX_CONNECTIONS_PER_UID as u64);
    let log = daemon.log();
    assert_eq!(
        log.matches("closed a connection: this uid").count(),
        1,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_journal_disk_sheds_records_instead_of_queueing_them() {
    if !require_root("mounting a FUSE file system") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let mount_point = dir.path().join("mnt");
    // Declared after `dir`: unmounted before the temp dir is removed.
    let mount = TestMount::bindfs(&backing, &mount_point);
    let mut options = DaemonOptions::new(dir.path()).args(["--write-queue-mib", "1"]);
    options.state_dir = Some(mount_point.join("state"));
    let mut daemon = options.process().await;
    let client = daemon.client().await;

    // ~420 KiB per Record: the first blocks in the writer, two more fill the 1 MiB queue.
    let batch = |round: usize| -> Vec<proto::Entry> {
        let config = format!(r#"{{"pad":"{}"}}"#, "x".repeat(4000));
        (0..100)
            .map(|i| {
                entry(
                    test_key("gemm", &format!("hung-{round}-{i}")),
                    &config,
                    1.0,
                    "overload",
                )
            })
            .collect()
    };
    mount.signal_server(Signal::SIGSTOP);
    let mut queued = Vec::new();
    let mut shed = None;
    let recording = |round: usize| {
        let client = client.clone().with_timeout(Duration::from_secs(120));
        let entries = batch(round);
        tokio::spawn(async move { client.record(entries).await })
    };
    // The first Record cannot be refused (the queue is empty): it goes to the writer, which
    // blocks on the stopped disk with it.
    let first = recording(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !writer_blocked_in_io(daemon.pid()) {
        if first.is_finished() {
            answered_while_hung(0, first.await.unwrap());
        }
        assert!(
            Instant::now() < deadline,
            "the journal writer never blocked on the hung disk"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    queued.push((0, first));
    // Each further Record either takes room in the queue (write_queue_bytes grows: the writer
    // is stuck, so nothing leaves it) or is refused at once.
    let mut queue_bytes = client.stats().await.unwrap().write_queue_bytes;
    assert_eq!(queue_bytes, 0, "the writer took the first Record");
    for round in 1..20 {
        let call = recording(round);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if call.is_finished() {
                match call.await.unwrap() {
                    Err(ClientError::Rpc(status)) if status.code() == Code::ResourceExhausted => {
                        shed = Some((round, status));
                    }
                    other => answered_while_hung(round, other),
                }
                break;
            }
            let now = client.stats().await.unwrap().write_queue_bytes;
            if now > queue_bytes {
                queue_bytes = now;
                queued.push((round, call));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Record {round} was neither queued nor refused"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if shed.is_some() {
            break;
        }
    }
    let (shed_round, status) =
        shed.expect("no Record was refused while the journal disk hangs: the queue grows");
    assert!(
        status.message().contains("--write-queue-mib 1"),
        "{status:?}"
    );
    assert!(queued.len() >= 2, "{} Records queued", queued.len());
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.writes_shed, 1);
    assert!(stats.write_queue_bytes > 0, "{stats:?}");
    assert!(stats.write_queue_bytes <= stats.write_queue_limit_bytes);

    // The disk comes back: every queued Record is acknowledged; the shed one stored nothing.
    mount.signal_server(Signal::SIGCONT);
    for (round, call) in queued {
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.stored, 100, "Record {round}");
    }
    let shed_keys: Vec<_> = batch(shed_round)
        .into_iter()
        .map(|e| e.key.unwrap())
        .collect();
    assert!(client.lookup(shed_keys).await.unwrap().is_empty());
    let log = daemon.log();
    assert_eq!(log.matches("refused a Record").count(), 1, "{log}");
    daemon.terminate(Duration::from_secs(20));
    drop(mount);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tuner_queue_is_counted_and_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--tuner-backend", "cpu", "--tuner-queue", "1"])
        .process()
        .await;
    let client = daemon.client().await;
    let devices = client.devices().await.unwrap();
    let device = devices
        .first()
        .expect("the CPU stand-in device")
        .fingerprint
        .clone();
    // A burst of distinct problems for the node's tuner: one runs, one queues, the rest are
    // refused.
    let options = ResolveOptions {
        wait: Duration::from_secs(120),
        can_tune: false,
        lease: Duration::ZERO,
    };
    let calls: Vec<_> = (0..32)
        .map(|i| {
            let client = client.clone();
            let problem = format!(
                r#"{{"m":{n},"n":{n},"k":{n},"dtype":"f32","layout":"nn"}}"#,
                n = 128 + i
            );
            let key = tunecache_client::key("tunecache", "gemm", &device, &problem, None);
            tokio::spawn(async move { client.resolve(key, options).await })
        })
        .collect();
    let mut refused = 0;
    for call in calls {
        match call.await.unwrap() {
            Err(ClientError::Rpc(status)) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("tuner queue is full"),
                    "{status:?}"
                );
                refused += 1;
            }
            Ok(_) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(
        refused >= 2,
        "only {refused} of 32 Resolves refused with a queue of 1"
    );
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.tuner_queue_refusals, refused);
    let log = daemon.log();
    assert_eq!(log.matches("refused a Resolve").count(), 1, "{log}");
}
