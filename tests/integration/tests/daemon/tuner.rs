//! The node's tuner worker behind Resolve, on the CPU backend (CI has no GPU): a miss is
//! measured once on the node and shared; the worker can die without taking the daemon.
//! Finding the worker among the daemon's children and reading the daemon's log need the daemon
//! as a process; the other tests run it in-process.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use tonic::Code;
use tunecache_client::{key, proto, Client, ClientError, Resolution, ResolveOptions};
use tunecache_integration::{
    child_pids, eventually, eventually_some, DaemonOptions, Kind, TestDaemon,
};

fn gemm(size: u32) -> String {
    format!(r#"{{"m":{size},"n":{size},"k":{size},"dtype":"f32","layout":"nn"}}"#)
}

/// A daemon of `kind` whose tuner measures on the CPU stand-in, also on a machine with a GPU.
async fn cpu_tuner_daemon(dir: &std::path::Path, kind: Kind) -> TestDaemon {
    DaemonOptions::new(dir)
        .args(["--tuner-backend", "cpu"])
        .start(kind)
        .await
}

fn waiting(can_tune: bool) -> ResolveOptions {
    ResolveOptions {
        wait: Duration::from_secs(120),
        can_tune,
        lease: Duration::ZERO,
    }
}

async fn cpu_fingerprint(client: &Client) -> String {
    let devices = client.devices().await.unwrap();
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0].backend, "cpu");
    assert!(
        devices[0].fingerprint.starts_with("cpu|"),
        "{}",
        devices[0].fingerprint
    );
    devices[0].fingerprint.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_backend_fills_a_miss_once_for_every_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = cpu_tuner_daemon(dir.path(), Kind::InProcess).await;
    let client = daemon.client().await;
    let device = cpu_fingerprint(&client).await;
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.tuner_backend, "cpu");
    // Stats says the measurements come from the CPU stand-in.
    let state = &stats.tuner_state;
    assert!(
        state.starts_with("running; ") && state.contains("CPU stand-in"),
        "{state}"
    );

    // 8 concurrent Resolves of one fresh problem: one job, one result for all.
    let k = key("tunecache", "gemm", &device, &gemm(48), None);
    let mut callers = Vec::new();
    for _ in 0..8 {
        let client = Client::connect(&daemon.socket).await.unwrap();
        let k = k.clone();
        callers.push(tokio::spawn(async move {
            client.resolve(k, waiting(true)).await.unwrap()
        }));
    }
    let mut results = Vec::new();
    for caller in callers {
        match caller.await.unwrap() {
            Resolution::Hit(result) => results.push(result),
            other => panic!("expected the tuner's result, got {other:?}"),
        }
    }
    assert!(results.iter().all(|r| r == &results[0]));
    let config: serde_json::Value = serde_json::from_str(&results[0].config).unwrap();
    assert_eq!(config["backend"], "cpu");
    assert!(
        config["stats"]["repeats"].as_u64().unwrap() >= 1,
        "{config}"
    );
    // time_us is the measured median; the JSON text of it may parse back 1 ulp away.
    let median_us = config["stats"]["median_us"].as_f64().unwrap();
    assert!(
        (median_us - results[0].time_us).abs() <= 1e-9 * results[0].time_us,
        "{median_us} vs {}",
        results[0].time_us
    );
    assert!(results[0].time_us > 0.0);
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.tuner_jobs_done, 1);
    assert_eq!(stats.leases_granted, 0, "no rank was asked to tune");

    // The same problem spelled differently is the same key: a hit with no new job.
    let respelled = key(
        "tunecache",
        "gemm",
        &device,
        r#"{"layout":"nn","dtype":"f32","k":48,"n":48,"m":48}"#,
        None,
    );
    assert_eq!(
        client.resolve(respelled, waiting(true)).await.unwrap(),
        Resolution::Hit(results[0].clone())
    );
    assert_eq!(client.stats().await.unwrap().tuner_jobs_done, 1);

    // A GPU key on this CPU-only node is not tuned here: it follows the lease path.
    let gpu_key = key(
        "tunecache",
        "gemm",
        "NVIDIA H200|sm_90|cuda 12.8",
        &gemm(48),
        None,
    );
    let resolution = client.resolve(gpu_key, waiting(true)).await.unwrap();
    assert!(
        matches!(resolution, Resolution::TuneHere(_)),
        "{resolution:?}"
    );
}

async fn wait_for_new_worker(
    daemon: &TestDaemon,
    not: Option<nix::unistd::Pid>,
) -> nix::unistd::Pid {
    eventually_some(Duration::from_secs(30), "a tuner worker process", || {
        child_pids(daemon.pid())
            .into_iter()
            .find(|p| Some(*p) != not)
    })
    .await
}

/// Waits until worker `pid` has the job: the daemon logs the worker's stderr with its pid,
/// and the worker logs "tuning" when it takes a job, before it measures anything.
async fn wait_until_tuning(daemon: &TestDaemon, pid: nix::unistd::Pid) {
    let marker = format!("pid=Some({pid})");
    eventually(Duration::from_secs(30), "the worker taking the job", || {
        let log = daemon.log();
        let taken = log
            .lines()
            .any(|line| line.contains(&marker) && line.contains("tuning job_id="));
        let finished = log
            .lines()
            .any(|line| line.contains(&marker) && line.contains(" tuned "));
        assert!(
            !finished,
            "the job finished before the worker was killed:\n{log}"
        );
        async move { taken }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_restarted_and_the_job_retried_then_failed_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = cpu_tuner_daemon(dir.path(), Kind::Process).await;
    let client = daemon.client().await;
    let device = cpu_fingerprint(&client).await;

    // Big enough that the job is still running when the worker is killed.
    let k = key("tunecache", "gemm", &device, &gemm(384), None);
    let waiter = tokio::spawn({
        let client = client.clone();
        let k = k.clone();
        async move { client.resolve(k, waiting(false)).await.unwrap() }
    });
    let first = wait_for_new_worker(&daemon, None).await;
    wait_until_tuning(&daemon, first).await;
    kill(first, Signal::SIGKILL).unwrap();
    // The supervisor restarts the worker and retries the job once; kill that try too.
    let second = wait_for_new_worker(&daemon, Some(first)).await;
    wait_until_tuning(&daemon, second).await;
    kill(second, Signal::SIGKILL).unwrap();

    match waiter.await.unwrap() {
        Resolution::Miss(reason) => {
            assert!(reason.contains("tuner"), "{reason}");
            // Retried once on a fresh worker, then failed naming the death of both tries.
            assert!(reason.contains("died twice on this job"), "{reason}");
            assert!(reason.contains(&format!("pid {second}")), "{reason}");
        }
        other => panic!("expected a miss naming the worker's death, got {other:?}"),
    }
    let stats = client.stats().await.unwrap();
    assert!(
        stats.tuner_restarts >= 1,
        "restarts: {}",
        stats.tuner_restarts
    );
    assert_eq!(stats.tuner_jobs_failed, 1);

    // The worker comes back (a second restart) and tunes again; the daemon was unharmed.
    let small = key("tunecache", "gemm", &device, &gemm(16), None);
    let resolution = client.resolve(small, waiting(false)).await.unwrap();
    assert!(matches!(resolution, Resolution::Hit(_)), "{resolution:?}");
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.tuner_restarts, 2);
    assert_eq!(stats.tuner_jobs_done, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_worker_binary_leaves_tuning_off_and_the_daemon_serving() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-tunecache-tuner");
    let options = DaemonOptions::new(dir.path()).args(["--tuner", missing.to_str().unwrap()]);
    let daemon = options.process().await;
    let client = daemon.client().await;

    let stats = client.stats().await.unwrap();
    assert_eq!(stats.tuner_backend, "off");
    assert!(
        stats.tuner_state.starts_with("off"),
        "{}",
        stats.tuner_state
    );
    assert!(client.devices().await.unwrap().is_empty());
    assert!(daemon.log().contains("tuning off"), "{}", daemon.log());

    // Misses of the tuner's namespace now follow the lease path.
    let k = key("tunecache", "gemm", "cpu|any|x86_64", &gemm(32), None);
    let resolution = client.resolve(k, waiting(true)).await.unwrap();
    assert!(
        matches!(resolution, Resolution::TuneHere(_)),
        "{resolution:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_problem_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = cpu_tuner_daemon(dir.path(), Kind::InProcess).await;
    let client = daemon.client().await;
    let device = cpu_fingerprint(&client).await;

    for (problem, field) in [
        (r#"{"m":-1,"n":8,"k":8,"dtype":"f32","layout":"nn"}"#, "m"),
        (
            r#"{"m":8,"n":8,"k":8,"dtype":"f64","layout":"nn"}"#,
            "dtype",
        ),
        (
            r#"{"m":8,"n":8,"k":8,"dtype":"f32","layout":"xx"}"#,
            "layout",
        ),
        ("not json", ""),
    ] {
        let k = key("tunecache", "gemm", &device, problem, None);
        let error = client.resolve(k.clone(), waiting(true)).await.unwrap_err();
        let ClientError::Rpc(status) = error else {
            panic!("{error}")
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{problem}");
        assert!(
            status.message().starts_with("key.problem"),
            "{}",
            status.message()
        );
        assert!(status.message().contains(field), "{}", status.message());

        let entry = proto::Entry {
            key: Some(k),
            result: Some(proto::Result {
                config: "{}".into(),
                time_us: 1.0,
                tuned_by: "t".into(),
                tuned_at_unix_ms: 0,
                forget_epoch: 0,
                artifacts: Default::default(),
            }),
        };
        let error = client.record(vec![entry]).await.unwrap_err();
        assert!(
            error.to_string().starts_with("entries[0].key.problem"),
            "{error}"
        );
    }
    assert_eq!(client.stats().await.unwrap().tuner_jobs_done, 0);
}
