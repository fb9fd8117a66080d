//! Journal faults against the real daemon: compaction under file-descriptor exhaustion with
//! SIGKILL and SIGTERM (no acknowledged Record may be lost), a damaged journal on a full disk,
//! and damage at the tail of the journal that is kept as a copy rather than truncated away.
//!
//! The fd limit is real (`prlimit --pid` on the running daemon), the full disk is a real tmpfs
//! (root only), crashes are real signals. The kill-loop soak is `#[ignore]`:
//!     cargo test -p tunecache-integration --test daemon -- --ignored journal_faults::soak --nocapture
//! (`TUNECACHE_SOAK_KILLS`, default 50, sets the number of SIGKILLs).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::Code;
use tunecache_client::{Client, ClientError};
use tunecache_integration::{
    entry, require_root, require_tool, test_key, wait, DaemonOptions, TestDaemon,
};

/// The NOFILE limit the daemon runs under while the load runs.
const NOFILE_LIMIT: u32 = 64;
/// Connections opened and dropped at once to keep the daemon's descriptor table full.
const CHURNERS: u64 = 96;
/// About the size of config that made compaction run every few Records in the report.
const BIG_CONFIG_BYTES: usize = 60 * 1024;
/// Time the acknowledged entries are recorded with: first big (slow), then small (fast),
/// so every key leaves a dead 60 KB frame behind and the journal is compacted often.
const SLOW_US: f64 = 100.0;
const FAST_US: f64 = 1.0;

/// A valid JSON config of about `bytes` bytes.
fn json_config(bytes: usize) -> String {
    format!(r#"{{"pad":"{}"}}"#, "x".repeat(bytes))
}

/// Best acknowledged time per problem name. A key acknowledged at time t must come back
/// after a restart with a time no worse than t (the merge rule keeps the faster one).
#[derive(Default)]
struct Ledger {
    acked: Mutex<HashMap<String, f64>>,
    records_acked: AtomicU64,
    records_refused: AtomicU64,
}

impl Ledger {
    fn acknowledge(&self, problem: &str, time_us: f64) {
        self.records_acked.fetch_add(1, Ordering::Relaxed);
        let mut acked = self.acked.lock().unwrap();
        let best = acked.entry(problem.to_owned()).or_insert(time_us);
        *best = best.min(time_us);
    }

    fn keys(&self) -> usize {
        self.acked.lock().unwrap().len()
    }
}

fn prlimit_nofile(daemon: &TestDaemon, limit: u32) {
    let prlimit = require_tool("prlimit", None).expect("prlimit (util-linux) is needed");
    let status = Command::new(prlimit)
        .arg("--pid")
        .arg(daemon.pid().as_raw().to_string())
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --pid failed: {status}");
}

/// Whether the daemon holds a descriptor to a journal file that no longer has a name:
/// appends through it are lost. Shown in failure messages to say what went wrong.
fn holds_unlinked_journal(daemon: &TestDaemon) -> bool {
    let fds = format!("/proc/{}/fd", daemon.pid().as_raw());
    std::fs::read_dir(fds).is_ok_and(|entries| {
        entries.filter_map(|e| e.ok()).any(|e| {
            std::fs::read_link(e.path()).is_ok_and(|target| {
                let target = target.to_string_lossy();
                target.contains("/journal") && target.ends_with("(deleted)")
            })
        })
    })
}

/// Records with connection churn against a daemon held at `NOFILE_LIMIT` descriptors, for
/// `duration`. Writers keep the connection they opened first; churners open and drop raw
/// connections so the daemon's descriptor table stays full and turns over all the time.
async fn load_under_fd_pressure(
    daemon: &TestDaemon,
    ledger: &Arc<Ledger>,
    round: usize,
    duration: Duration,
) -> bool {
    let writers: Vec<Client> = {
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(daemon.client().await);
        }
        clients
    };
    prlimit_nofile(daemon, NOFILE_LIMIT);
    let stop = Arc::new(AtomicBool::new(false));
    let mut churners = Vec::new();
    // Enough connections, held long enough, that the daemon's table stays full even with
    // back-off on accept errors: a compaction must sometimes find no descriptor free.
    for c in 0..CHURNERS {
        let socket = daemon.socket.clone();
        let stop = stop.clone();
        churners.push(tokio::spawn(async move {
            let mut hold_ms = 5 + c * 37 % 300;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(Ok(stream)) = tokio::time::timeout(
                    Duration::from_millis(500),
                    tokio::net::UnixStream::connect(&socket),
                )
                .await
                {
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    drop(stream);
                }
                hold_ms = 5 + (hold_ms * 53 + c) % 300;
            }
        }));
    }
    let big = json_config(BIG_CONFIG_BYTES);
    let mut writer_tasks = Vec::new();
    for (w, client) in writers.into_iter().enumerate() {
        let client = client.with_timeout(Duration::from_secs(10));
        let ledger = ledger.clone();
        let stop = stop.clone();
        let big = big.clone();
        writer_tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let problem = format!("r{round}-w{w}-{i}");
                i += 1;
                for (config, time_us) in [(big.as_str(), SLOW_US), ("{}", FAST_US)] {
                    let record = entry(test_key("gemm", &problem), config, time_us, "fd");
                    match client.record(vec![record]).await {
                        Ok(_) => ledger.acknowledge(&problem, time_us),
                        Err(_) => {
                            ledger.records_refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    let acked_before = ledger.records_acked.load(Ordering::Relaxed);
    let deadline = Instant::now() + duration;
    let mut saw_unlinked = false;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        saw_unlinked |= holds_unlinked_journal(daemon);
    }
    stop.store(true, Ordering::Relaxed);
    for task in writer_tasks {
        task.await.unwrap();
    }
    for task in churners {
        task.await.unwrap();
    }
    saw_unlinked |= holds_unlinked_journal(daemon);
    assert!(
        ledger.records_acked.load(Ordering::Relaxed) > acked_before,
        "no Record was acknowledged under load; log tail:\n{}",
        tail(&daemon.log(), 20)
    );
    saw_unlinked
}

/// Looks every acknowledged key up; returns the problems missing or worse than acknowledged.
async fn lost_keys(daemon: &TestDaemon, ledger: &Ledger) -> Vec<String> {
    let client = daemon.client().await.with_timeout(Duration::from_secs(30));
    let acked: Vec<(String, f64)> = ledger
        .acked
        .lock()
        .unwrap()
        .iter()
        .map(|(k, t)| (k.clone(), *t))
        .collect();
    let mut lost = Vec::new();
    for chunk in acked.chunks(200) {
        let keys = chunk.iter().map(|(p, _)| test_key("gemm", p)).collect();
        let hits = client.lookup(keys).await.expect("lookup after restart");
        let found: HashMap<String, f64> = hits
            .into_iter()
            .map(|e| (e.key.unwrap().problem, e.result.unwrap().time_us))
            .collect();
        for (problem, time_us) in chunk {
            if found.get(problem).is_none_or(|stored| stored > time_us) {
                lost.push(problem.clone());
            }
        }
    }
    lost
}

fn assert_none_lost(lost: &[String], ledger: &Ledger, context: &str, unlinked: bool, log: &str) {
    assert!(
        lost.is_empty(),
        "{context}: {} of {} acknowledged keys lost (e.g. {:?}); the daemon was seen appending \
         to an unlinked journal: {unlinked}; log tail:\n{}",
        lost.len(),
        ledger.keys(),
        &lost[..lost.len().min(5)],
        tail(log, 40)
    );
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compaction_under_fd_exhaustion_loses_nothing_across_sigkill_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = TestDaemon::process(dir.path()).await;
    let ledger = Arc::new(Ledger::default());

    let unlinked = load_under_fd_pressure(&daemon, &ledger, 0, Duration::from_secs(20)).await;
    let stats = daemon.client().await.stats().await.unwrap();
    assert!(
        stats.journal_compactions > 0,
        "the load did not compact the journal: the test exercises nothing"
    );
    // The descriptor table was really full: accept(2) failed for want of a descriptor.
    assert!(
        stats.accept_errors > 0,
        "the daemon never ran out of descriptors: the test exercises nothing ({stats:?})"
    );
    daemon.kill();
    daemon.restart().await;
    let lost = lost_keys(&daemon, &ledger).await;
    assert_none_lost(&lost, &ledger, "after SIGKILL", unlinked, &daemon.log());

    let unlinked = load_under_fd_pressure(&daemon, &ledger, 1, Duration::from_secs(20)).await;
    let (status, _) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "SIGTERM exit: {status}");
    daemon.restart().await;
    let lost = lost_keys(&daemon, &ledger).await;
    assert_none_lost(&lost, &ledger, "after SIGTERM", unlinked, &daemon.log());
    eprintln!(
        "acknowledged keys {} ({} Records acknowledged, {} refused), lost 0",
        ledger.keys(),
        ledger.records_acked.load(Ordering::Relaxed),
        ledger.records_refused.load(Ordering::Relaxed)
    );
}

/// What a kill loop did.
#[derive(Debug, Default)]
struct KillLoopReport {
    kills: usize,
    /// Acknowledged keys looked up after the restarts, summed over the restarts.
    keys_checked: usize,
    /// Distinct acknowledged keys at the end.
    keys: usize,
    records_acked: u64,
    records_refused: u64,
    compactions: u64,
    compaction_failures: u64,
}

/// The kill loop: compaction and fd pressure together, SIGKILL every round, every
/// acknowledged key checked after each restart.
async fn kill_loop(kills: usize, round_time: Duration) -> KillLoopReport {
    let dir = tempfile::tempdir().unwrap();
    let policies = ["batch", "always", "never"];
    let ledger = Arc::new(Ledger::default());
    let mut report = KillLoopReport::default();
    for round in 0..kills {
        let policy = policies[round % policies.len()];
        let mut daemon = DaemonOptions::new(dir.path())
            .args(["--fsync", policy])
            .process()
            .await;
        let unlinked = load_under_fd_pressure(&daemon, &ledger, round, round_time).await;
        let stats = daemon.client().await.stats().await.unwrap();
        report.compactions += stats.journal_compactions;
        report.compaction_failures += stats.journal_compaction_failures;
        daemon.kill();
        report.kills += 1;
        daemon.restart().await;
        let lost = lost_keys(&daemon, &ledger).await;
        let context = format!("kill {} of {kills} (--fsync {policy})", round + 1);
        assert_none_lost(&lost, &ledger, &context, unlinked, &daemon.log());
        report.keys_checked += ledger.keys();
        eprintln!(
            "{context}: {} acknowledged keys present; this run {} compactions, {} failed",
            ledger.keys(),
            stats.journal_compactions,
            stats.journal_compaction_failures
        );
        daemon.kill();
    }
    report.keys = ledger.keys();
    report.records_acked = ledger.records_acked.load(Ordering::Relaxed);
    report.records_refused = ledger.records_refused.load(Ordering::Relaxed);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_loop_short() {
    let report = kill_loop(3, Duration::from_secs(3)).await;
    assert!(report.compactions > 0, "no compaction ran: {report:?}");
    eprintln!("kill loop: {report:?}, lost 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "soak: about 50 SIGKILLs, several minutes"]
async fn soak_kill_loop() {
    let kills = std::env::var("TUNECACHE_SOAK_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let report = kill_loop(kills, Duration::from_secs(3)).await;
    assert!(report.compactions > 0, "no compaction ran: {report:?}");
    eprintln!("SOAK: {report:?}, lost 0");
}

// ---------------------------------------------------------------------------------------
// Damage at start-up.

fn corrupt_copies(state_dir: &Path) -> Vec<PathBuf> {
    let mut copies: Vec<PathBuf> = std::fs::read_dir(state_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("journal.corrupt."))
        })
        .collect();
    copies.sort();
    copies
}

async fn record_numbered(daemon: &TestDaemon, count: usize, config_bytes: usize) {
    let client = daemon.client().await;
    let config = json_config(config_bytes);
    for i in 0..count {
        let e = entry(test_key("gemm", &format!("p{i}")), &config, 1.0, "t");
        client.record(vec![e]).await.expect("record");
    }
}

async fn has_key(daemon: &TestDaemon, problem: &str) -> bool {
    let keys = vec![test_key("gemm", problem)];
    !daemon.client().await.lookup(keys).await.unwrap().is_empty()
}

async fn present(daemon: &TestDaemon, count: usize) -> usize {
    let keys = (0..count)
        .map(|i| test_key("gemm", &format!("p{i}")))
        .collect();
    daemon.client().await.lookup(keys).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_zero_journal_is_kept_as_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let zeros = vec![0u8; 33 * 1024];
    std::fs::write(state.join("journal"), &zeros).unwrap();

    let mut daemon = TestDaemon::process(dir.path()).await;
    let copies = corrupt_copies(&state);
    assert_eq!(
        copies.len(),
        1,
        "an all-zero journal must be kept as a copy, not truncated away; log:\n{}",
        daemon.log()
    );
    assert_eq!(std::fs::read(&copies[0]).unwrap(), zeros);
    assert!(daemon.log().contains("damaged"), "log:\n{}", daemon.log());

    // The journal works again and holds nothing but what is recorded now.
    record_numbered(&daemon, 3, 10).await;
    daemon.kill();
    daemon.restart().await;
    assert_eq!(present(&daemon, 3).await, 3);
    assert_eq!(
        corrupt_copies(&state).len(),
        1,
        "no new damage after restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_the_last_good_frame_is_kept_as_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = TestDaemon::process(dir.path()).await;
    record_numbered(&daemon, 5, 100).await;
    daemon.terminate(Duration::from_secs(30));
    let journal = daemon.state_dir.join("journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    // Not a torn frame: no frame magic, just bytes no write of ours produces.
    bytes.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x80));
    std::fs::write(&journal, &bytes).unwrap();

    daemon.restart().await;
    assert_eq!(present(&daemon, 5).await, 5);
    let copies = corrupt_copies(&daemon.state_dir);
    assert_eq!(
        copies.len(),
        1,
        "damage at the tail must be kept as a copy; log:\n{}",
        daemon.log()
    );
    assert_eq!(std::fs::read(&copies[0]).unwrap(), bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_deleted_under_the_daemon_is_put_back_before_the_next_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = TestDaemon::process(dir.path()).await;
    record_numbered(&daemon, 3, 10).await;
    std::fs::remove_file(daemon.state_dir.join("journal")).unwrap();

    // The next Record finds the journal gone, rewrites it from memory, then acknowledges.
    let client = daemon.client().await;
    let late = entry(test_key("gemm", "after-delete"), "{}", 1.0, "t");
    client
        .record(vec![late])
        .await
        .expect("record after the delete");
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.journal_unwritable_episodes, 1, "{stats:?}");
    assert_eq!(stats.journal_unwritable, "", "{stats:?}");

    daemon.kill();
    daemon.restart().await;
    assert_eq!(present(&daemon, 3).await, 3, "log:\n{}", daemon.log());
    assert!(
        has_key(&daemon, "after-delete").await,
        "log:\n{}",
        daemon.log()
    );
}

/// A tmpfs mounted for one test, detached however the test ends.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount tmpfs on {}", path.display());
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .stderr(Stdio::null())
            .status();
    }
}

/// Fills the filesystem holding `dir` until a write fails with ENOSPC.
fn fill_disk(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    let block = vec![0xa5u8; 4096];
    loop {
        if let Err(error) = file.write_all(&block).and_then(|()| file.sync_data()) {
            assert_eq!(error.raw_os_error(), Some(nix::libc::ENOSPC), "{error}");
            return filler;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_journal_on_a_full_disk_still_starts() {
    if !require_root("a_damaged_journal_on_a_full_disk_still_starts (mounts a tmpfs)") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _tmpfs = Tmpfs::mount(&state, "4m");
    let mut daemon = TestDaemon::process(dir.path()).await;
    record_numbered(&daemon, 40, 8 * 1024).await;
    daemon.terminate(Duration::from_secs(30));

    // Damage one frame in the middle, then fill the disk.
    let journal = state.join("journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 64] {
        *byte ^= 0x5a;
    }
    std::fs::write(&journal, &bytes).unwrap();
    let filler = fill_disk(&state);

    daemon.restart().await;
    let log = daemon.log();
    assert!(log.contains("damaged"), "log:\n{log}");
    let survivors = present(&daemon, 40).await;
    assert!(
        (38..40).contains(&survivors),
        "expected all but the damaged frame's entries, got {survivors}; log:\n{log}"
    );
    // With no space the journal cannot take a Record: a clear UNAVAILABLE, nothing applied.
    let client = daemon.client().await;
    let big = entry(
        test_key("gemm", "on-full-disk"),
        &json_config(BIG_CONFIG_BYTES),
        1.0,
        "t",
    );
    match client.record(vec![big.clone()]).await {
        Err(ClientError::Rpc(status)) => {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert!(status.message().contains("journal"), "{status:?}");
        }
        other => panic!("a Record on a full disk must be refused, got {other:?}"),
    }
    assert!(client
        .lookup(vec![test_key("gemm", "on-full-disk")])
        .await
        .unwrap()
        .is_empty());

    // Space comes back: Records are accepted again and survive a restart.
    std::fs::remove_file(&filler).unwrap();
    client
        .record(vec![big])
        .await
        .expect("record after freeing space");
    daemon.kill();
    daemon.restart().await;
    assert_eq!(present(&daemon, 40).await, survivors);
    assert!(
        has_key(&daemon, "on-full-disk").await,
        "log:\n{}",
        daemon.log()
    );
    eprintln!("{}", tail(&daemon.log(), 30));
}

/// A restarted daemon answers at once while it opens (issue 50, finding 7): its state
/// directory is on a FUSE mount whose server is stopped, so locking and replaying it hang,
/// as on a stalled disk. Meanwhile every TuneCache call is answered UNAVAILABLE with what it
/// is doing and a RetryInfo, and health says NOT_SERVING; the Rust client, which retries on
/// that answer within its deadline, gets the entries acknowledged before SIGKILL once the
/// mount answers again. (Before: the socket was bound and nobody answered it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarting_daemon_answers_unavailable_while_it_opens_never_a_silent_socket() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    use tonic_types::StatusExt;
    use tunecache_client::proto::tune_cache_client::TuneCacheClient;
    use tunecache_integration::TestMount;

    if !require_root("a stopped FUSE mount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let mount_point = dir.path().join("mnt");
    // Declared after `dir`: unmounted before the temp dir is removed.
    let mount = TestMount::bindfs(&backing, &mount_point);
    let mut daemon = DaemonOptions::new(dir.path())
        .state_dir(&mount_point.join("state"))
        .process()
        .await;
    let keys: Vec<_> = (0..20)
        .map(|i| test_key("gemm", &format!("before-kill-{i}")))
        .collect();
    let entries = keys
        .iter()
        .map(|key| entry(key.clone(), r#"{"block":[64,1,1]}"#, 3.0, "rank"))
        .collect();
    daemon.client().await.record(entries).await.unwrap();
    daemon.kill();
    let socket = dir.path().join("tunecache.sock");

    mount.signal_server(nix::sys::signal::Signal::SIGSTOP);
    let while_opening = async {
        // The first answer on the new socket (the old one, left by SIGKILL, refuses).
        let status = wait(Duration::from_secs(60), "an answer on the socket")
            .until_some_async(|| async {
                let channel = tunecache_client::connect_channel(&socket).await.ok()?;
                let mut raw = TuneCacheClient::new(channel.clone());
                let mut request = tonic::Request::new(tunecache_client::proto::StatsRequest {});
                request.set_timeout(Duration::from_secs(5));
                let started = Instant::now();
                let answer = raw.stats(request).await;
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "Stats took {:?} on an opening daemon",
                    started.elapsed()
                );
                match answer {
                    Err(status) => Some((status, channel)),
                    Ok(stats) => panic!("served while its state directory hangs: {stats:?}"),
                }
            })
            .await;
        let (status, channel) = status;
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.message().starts_with("opening") || status.message().starts_with("replaying"),
            "{status:?}"
        );
        assert!(
            status.get_details_retry_info().is_some(),
            "no RetryInfo: {status:?}"
        );
        let health = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "tunecache.v1.TuneCache".to_owned(),
            })
            .await
            .expect("health answers while the daemon opens")
            .into_inner();
        assert_eq!(health.status(), ServingStatus::NotServing);
        // A client call made now waits (retrying) and gets its answer once the mount answers.
        let client = Client::connect(&socket)
            .await
            .unwrap()
            .with_timeout(Duration::from_secs(120));
        let lookup = tokio::spawn({
            let keys = keys.clone();
            async move { client.lookup(keys).await }
        });
        mount.signal_server(nix::sys::signal::Signal::SIGCONT);
        let hits = lookup
            .await
            .unwrap()
            .expect("the retried Lookup is answered");
        assert_eq!(
            hits.len(),
            keys.len(),
            "acknowledged before SIGKILL: {hits:?}"
        );
    };
    tokio::join!(daemon.restart(), while_opening);
    assert!(
        daemon.log().contains("journal replayed"),
        "{}",
        daemon.log()
    );
}
