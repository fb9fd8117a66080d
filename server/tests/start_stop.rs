//! Fifty starts and stops of the daemon inside this process, each serving reads and writes
//! in and out of a job view, a lease and its Record, a Scan and the shared directory: after
//! each stop, `server::run` has returned only when every task it or any part started has
//! ended, and after all of them no task of the runtime, no thread of the daemon's and no
//! file descriptor is left over. (Alone in its test binary: descriptors are per process.)

use std::time::{Duration, Instant};

use clap::Parser;
use tokio::sync::oneshot;
use tunecache_client::{proto, Client, ResolveOptions};
use tunecache_server::{server, Config};

const ROUNDS: usize = 50;

fn entry(key: proto::Key, config: &str, time_us: f64) -> proto::Entry {
    proto::Entry {
        key: Some(key),
        result: Some(proto::Result {
            config: config.to_owned(),
            time_us,
            tuned_by: "start-stop-test".to_owned(),
            tuned_at_unix_ms: 1_700_000_000_000,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// Threads of this process named as the daemon names its own (`tunecache-*`).
fn daemon_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("tunecache-"))
        .collect()
}

/// Reads and writes in and out of a view, a lease and its Record, a Scan, a segment.
async fn use_daemon(socket_path: &std::path::Path, round: usize) {
    let client = Client::connect(socket_path).await.expect("connect");
    let key = |problem: &str| tunecache_client::key("test", "gemm", "dev0", problem, None);
    client
        .record(vec![entry(key("known"), r#"{"t":1}"#, 10.0)])
        .await
        .expect("record");
    let viewed = client.clone().in_view(format!("job-{round}"));
    assert_eq!(
        viewed
            .lookup(vec![key("known")])
            .await
            .expect("lookup")
            .len(),
        1
    );
    // A lease in the view (its watch is a task) and its Record (the view's pin from the feed).
    let fresh = key(&format!("fresh-{round}"));
    let resolution = viewed
        .resolve(
            fresh.clone(),
            ResolveOptions {
                can_tune: true,
                ..Default::default()
            },
        )
        .await
        .expect("resolve");
    let tunecache_client::Resolution::TuneHere(lease) = resolution else {
        panic!("a fresh key hands out a lease: {resolution:?}");
    };
    viewed
        .record_with_lease(vec![entry(fresh, r#"{"t":2}"#, 5.0)], lease.lease_id)
        .await
        .expect("record under the lease");
    assert!(!viewed.scan("test", "").await.expect("scan").is_empty());
    client
        .snapshot()
        .await
        .expect("a segment in the shared directory");
    drop((client, viewed));
}

/// One daemon's life: start, serve a little of everything, stop; `run` must return.
async fn one_round(dir: &std::path::Path, round: usize) {
    let socket_path = dir.join(format!("round-{round}.sock"));
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).expect("shared dir");
    let config = Config::parse_from([
        "tunecached".as_ref(),
        "--socket".as_ref(),
        socket_path.as_os_str(),
        "--state-dir".as_ref(),
        dir.join("state").as_os_str(),
        "--shared-dir".as_ref(),
        shared.as_os_str(),
        "--tuner".as_ref(),
        "off".as_ref(),
    ]);
    let socket = server::bind(&config).expect("bind the socket");
    // The client runs on a runtime of its own, on another thread, so that the tasks of this
    // runtime are the daemon's alone; and `run` is awaited here, not spawned, so that no
    // task of the test's own is counted either. The daemon stops once the client is done.
    let (done, served) = oneshot::channel();
    std::thread::spawn(move || {
        let client_runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the client's runtime");
        client_runtime.block_on(use_daemon(&socket_path, round));
        let _ = done.send(());
    });
    let stopped = async {
        served.await.expect("the client thread finished");
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        server::run(config, socket, stopped),
    )
    .await
    .expect("the daemon serves and stops within 60 s")
    .expect("the daemon stopped without error");
}

#[test]
fn fifty_starts_and_stops_leave_no_task_thread_or_fd_behind() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    runtime.block_on(async {
        // One round first, so that what lives for the process (the tracing dispatcher, the
        // key interner, the runtime's blocking threads) exists before the baseline.
        one_round(dir.path(), 0).await;
        let metrics = tokio::runtime::Handle::current().metrics();
        let settle = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !done() {
                assert!(Instant::now() < deadline, "not within 20 s: {what}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let tasks_before = metrics.num_alive_tasks();
        let fds_before = open_fds();
        for round in 1..=ROUNDS {
            one_round(dir.path(), round).await;
            // `run` returned: every task a part started has ended (`server::run` waited for
            // them). A connection's own task inside tonic may take a moment longer to be
            // reaped after its client went away; a task left running stays and fails this.
            settle(
                &format!("round {round}: no task alive after server::run returned"),
                &|| metrics.num_alive_tasks() == tasks_before,
            );
        }
        settle("the daemon's threads end", &|| daemon_threads().is_empty());
        settle("the daemon's descriptors close", &|| {
            open_fds() <= fds_before
        });
    });
}
