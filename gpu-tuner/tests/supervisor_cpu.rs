//! The supervisor driving the real `tunecache-tuner` worker binary with the cpu backend:
//! tuning, worker deaths mid-job, timeouts, a full queue, and bad input.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tunecache_proto::tuner::BackendChoice;
use tunecache_server::tuner::{SubmitError, Supervisor, SupervisorConfig, TunerHandle};

const SMALL_GEMM: &str = r#"{"m":64,"n":48,"k":80,"dtype":"f32","layout":"nn"}"#;
/// A billion multiply-adds per run and dozens of runs per job, even in release builds: in
/// flight when killed, and far beyond the short job timeout.
const BIG_GEMM: &str = r#"{"m":1024,"n":1024,"k":1024,"dtype":"f32","layout":"nt"}"#;

fn config(job_timeout: Duration, queue_capacity: usize) -> SupervisorConfig {
    SupervisorConfig {
        worker_path: PathBuf::from(env!("CARGO_BIN_EXE_tunecache-tuner")),
        backend: BackendChoice::Cpu,
        job_timeout,
        queue_capacity,
        device: None,
        worker_args: Vec::new(),
    }
}

async fn start_cpu() -> TunerHandle {
    Supervisor::start(config(Duration::from_secs(120), 4))
        .await
        .expect("the cpu worker starts")
}

fn fingerprint(tuner: &TunerHandle) -> String {
    tuner.devices()[0].fingerprint.clone()
}

/// Polls `condition` for up to 30 s.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the supervisor logs (it logs each line of its workers' stderr with the worker's pid),
/// captured from every test in this binary; see [`worker_took_a_job`].
static LOG: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures the process's tracing output into [`LOG`] (once per test binary).
fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .try_init();
    });
}

/// Whether worker `pid` has taken a job: it logs "tuning" when it reads one, before it
/// measures anything (so the job is in flight on it, not queued).
fn worker_took_a_job(pid: u32) -> bool {
    let marker = format!("pid=Some({pid})");
    let log = LOG.lock().unwrap_or_else(|e| e.into_inner());
    String::from_utf8_lossy(&log)
        .lines()
        .any(|line| line.contains(&marker) && line.contains("tuning job_id="))
}

fn sigkill(pid: u32) {
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill the worker");
}

#[tokio::test]
async fn cpu_worker_tunes_a_small_gemm_and_reports_stats() {
    let tuner = start_cpu().await;
    assert_eq!(tuner.backend(), "cpu");
    assert_eq!(tuner.state(), "running");
    let devices = tuner.devices();
    assert_eq!(devices.len(), 1);
    assert!(
        devices[0].fingerprint.starts_with("cpu|"),
        "{:?}",
        devices[0]
    );
    assert!(devices[0].fingerprint.ends_with(std::env::consts::ARCH));
    assert!(tuner.note().contains("CPU stand-in"), "{}", tuner.note());

    let started = Instant::now();
    let reply = tuner
        .submit("gemm", SMALL_GEMM, &fingerprint(&tuner))
        .expect("accepted")
        .await
        .expect("answered");
    let job_wall_us = started.elapsed().as_secs_f64() * 1e6;
    let result = reply.expect("tuned");
    let config: serde_json::Value = serde_json::from_str(&result.config).expect("config is JSON");
    let stats = &config["stats"];
    assert_eq!(stats["backend"], "cpu");
    assert_eq!(stats["median_us"].as_f64(), Some(result.time_us));

    // The samples: between the policy's least and most rounds (5 and 100, MeasureConfig's
    // defaults), no more than the measurement's rounds, of 1 to 100 runs each.
    let repeats = stats["repeats"].as_u64().unwrap();
    let runs = stats["runs_per_sample"].as_u64().unwrap();
    let rounds = config["timing"]["rounds"].as_u64().unwrap();
    assert!((5..=100).contains(&repeats), "{repeats} samples: {config}");
    assert!(repeats <= rounds, "{repeats} samples in {rounds} rounds");
    assert!((1..=100).contains(&runs), "{runs} runs per sample");
    // The timed runs happened inside the job: the winner's runs alone, each at least its
    // fastest sample's mean, fit in the job's wall-clock time (a time in the wrong unit, or
    // one that counts more than the run, does not).
    let min_us = stats["min_us"].as_f64().unwrap();
    assert!(min_us > 0.0, "{config}");
    let timed_us = (repeats * runs) as f64 * min_us;
    assert!(
        timed_us < job_wall_us,
        "{repeats} x {runs} runs of at least {min_us} us = {timed_us} us in a job of {job_wall_us} us"
    );
    // Plausible for the known work: 64x48x80 multiply-adds per run on one core. Faster than
    // 1 TFLOP/s is not a measurement of it; slower than 1 MFLOP/s is not a CPU doing it.
    let flops = 2.0 * 64.0 * 48.0 * 80.0;
    let gflops = flops / (result.time_us * 1e3);
    assert!(
        (0.001..1000.0).contains(&gflops),
        "{gflops} GFLOP/s from a median of {} us",
        result.time_us
    );
    let reported = config["gflops"].as_f64().unwrap();
    assert!(
        (reported - gflops).abs() <= 1e-9 * gflops,
        "{reported} vs {gflops}"
    );
    // The winner is the fastest verified candidate listed, with its own figures.
    let candidates = config["candidates"].as_array().expect("candidates");
    assert_eq!(candidates.len(), 6, "one report per tactic: {config}");
    let fastest = candidates
        .iter()
        .filter(|c| c.get("error").is_none())
        .filter(|c| c["median_us"].is_f64())
        .min_by(|a, b| {
            let time = |c: &serde_json::Value| c["median_us"].as_f64().unwrap();
            time(a).total_cmp(&time(b))
        })
        .expect("a measured candidate");
    assert_eq!(fastest["name"], config["candidate"], "{config}");
    assert_eq!(fastest["tactic"], config["tactic"], "{config}");
    assert_eq!(fastest["median_us"].as_f64(), Some(result.time_us));
    assert_eq!(fastest["repeats"].as_u64(), Some(repeats));
    for block in ["mc", "nc", "kc"] {
        assert!(config["tactic"][block].as_u64().unwrap() > 0);
    }
    assert!(config["note"]
        .as_str()
        .unwrap()
        .contains("not a GPU measurement"));
    assert!(
        result.tuned_by.starts_with("tunecache-tuner/cpu@"),
        "{}",
        result.tuned_by
    );
    assert!(result.tuned_at_unix_ms > 0);

    let counters = tuner.counters();
    assert_eq!(
        (
            counters.jobs_done.load(Relaxed),
            counters.jobs_failed.load(Relaxed),
            counters.queue_depth.load(Relaxed),
            counters.restarts.load(Relaxed)
        ),
        (1, 0, 0, 0)
    );
    tuner.shutdown().await;
    assert_eq!(tuner.backend(), "off");
    assert!(tuner.state().starts_with("off: "));
}

#[tokio::test]
async fn sigkill_mid_job_restarts_the_worker_retries_once_then_fails_naming_the_death() {
    capture_logs();
    let tuner = start_cpu().await;
    let device = fingerprint(&tuner);
    let first_pid = tuner.worker_pid().expect("a worker pid");
    let reply = tuner.submit("gemm", BIG_GEMM, &device).expect("accepted");
    eventually("the first worker taking the job", || {
        worker_took_a_job(first_pid)
    })
    .await;
    assert_eq!(
        tuner.counters().queue_depth.load(Relaxed),
        1,
        "the big job should be in flight"
    );
    sigkill(first_pid);

    // The supervisor restarts the worker and runs the same job again on it.
    eventually("a restarted worker", || {
        tuner.worker_pid().is_some_and(|pid| pid != first_pid) && tuner.state() == "running"
    })
    .await;
    assert_eq!(tuner.counters().restarts.load(Relaxed), 1);
    let second_pid = tuner.worker_pid().expect("a worker pid");
    eventually("the second worker taking the retried job", || {
        worker_took_a_job(second_pid)
    })
    .await;
    assert_eq!(
        tuner.counters().queue_depth.load(Relaxed),
        1,
        "the job should be retried, not answered"
    );
    sigkill(second_pid);

    let error = reply
        .await
        .expect("answered")
        .expect_err("the job dies twice");
    assert!(error.contains("died twice on this job"), "{error}");
    assert!(error.contains("SIGKILL"), "{error}");
    assert!(error.contains(&format!("pid {second_pid}")), "{error}");
    eventually("a third worker", || {
        tuner.worker_pid().is_some_and(|pid| pid != second_pid) && tuner.state() == "running"
    })
    .await;
    let counters = tuner.counters();
    assert_eq!(
        (
            counters.restarts.load(Relaxed),
            counters.jobs_failed.load(Relaxed),
            counters.queue_depth.load(Relaxed)
        ),
        (2, 1, 0)
    );

    // The node keeps tuning after the deaths.
    let result = tuner
        .submit("gemm", SMALL_GEMM, &device)
        .expect("accepted")
        .await
        .expect("answered");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn a_worker_killed_while_idle_is_restarted() {
    let tuner = start_cpu().await;
    let first_pid = tuner.worker_pid().expect("a worker pid");
    sigkill(first_pid);
    eventually("a restarted worker", || {
        tuner.worker_pid().is_some_and(|pid| pid != first_pid) && tuner.state() == "running"
    })
    .await;
    assert_eq!(tuner.counters().restarts.load(Relaxed), 1);
    let result = tuner
        .submit("gemm", SMALL_GEMM, &fingerprint(&tuner))
        .expect("accepted")
        .await
        .expect("answered");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn a_job_past_its_timeout_kills_the_worker_and_fails_with_a_reason() {
    let tuner = Supervisor::start(config(Duration::from_millis(1500), 4))
        .await
        .expect("starts");
    let first_pid = tuner.worker_pid().expect("a worker pid");
    let error = tuner
        .submit("gemm", BIG_GEMM, &fingerprint(&tuner))
        .expect("accepted")
        .await
        .expect("answered")
        .expect_err("times out");
    assert!(error.contains("timed out"), "{error}");
    eventually("a restarted worker", || {
        tuner.worker_pid().is_some_and(|pid| pid != first_pid) && tuner.state() == "running"
    })
    .await;
    let counters = tuner.counters();
    assert_eq!(
        (
            counters.restarts.load(Relaxed),
            counters.jobs_failed.load(Relaxed)
        ),
        (1, 1)
    );
}

#[tokio::test]
async fn a_full_queue_refuses_jobs() {
    let tuner = Supervisor::start(config(Duration::from_secs(120), 1))
        .await
        .expect("starts");
    let device = fingerprint(&tuner);
    let _running = tuner.submit("gemm", BIG_GEMM, &device).expect("runs");
    // The queue holds one job: until the worker has taken the big one, the next is refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    let _waiting = loop {
        match tuner.submit("gemm", SMALL_GEMM, &device) {
            Ok(waiting) => break waiting,
            Err(SubmitError::QueueFull { capacity: 1 }) => {
                assert!(
                    Instant::now() < deadline,
                    "the worker never took the big job"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(
        tuner.submit("gemm", SMALL_GEMM, &device).err(),
        Some(SubmitError::QueueFull { capacity: 1 })
    );
    assert_eq!(tuner.counters().queue_depth.load(Relaxed), 2);
    let pid = tuner.worker_pid().expect("a worker pid");
    drop(tuner);
    // Dropping the last handle kills the worker.
    eventually("the worker to be killed", || {
        kill(Pid::from_raw(pid as i32), None).is_err()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|stat| stat.contains(") Z "))
                .unwrap_or(true)
    })
    .await;
}

#[tokio::test]
async fn a_missing_worker_binary_is_a_start_error() {
    let mut config = config(Duration::from_secs(5), 4);
    config.worker_path = PathBuf::from("/nonexistent/tunecache-tuner");
    let error = Supervisor::start(config).await.expect_err("no binary");
    let message = error.to_string();
    assert!(
        message.contains("/nonexistent/tunecache-tuner"),
        "{message}"
    );

    let off = TunerHandle::off(message.clone());
    assert_eq!(off.backend(), "off");
    assert_eq!(off.state(), format!("off: {message}"));
    assert!(matches!(
        off.submit("gemm", SMALL_GEMM, "cpu|x|y"),
        Err(SubmitError::Off(_))
    ));
}

#[tokio::test]
async fn bad_problems_and_foreign_devices_are_refused() {
    let tuner = start_cpu().await;
    let device = fingerprint(&tuner);

    // The daemon canonicalises a problem once, before it gets here (`validate::key`), and
    // the supervisor does not parse it again. One that gets here malformed anyway fails its
    // job in the worker, with the reason, and the worker lives on.
    for (op, problem, reason) in [
        (
            "gemm",
            r#"{"m":64,"n":0,"k":8,"dtype":"f32","layout":"nn"}"#,
            "field `n` is invalid",
        ),
        ("gemm", "not json", "not valid JSON"),
        ("conv", "{}", "unknown op \"conv\""),
    ] {
        let error = tuner
            .submit(op, problem, &device)
            .expect("accepted")
            .await
            .expect("answered")
            .expect_err("a malformed problem fails");
        assert!(error.contains(reason), "{op} {problem}: {error}");
    }
    match tuner.submit("gemm", SMALL_GEMM, "NVIDIA H200|sm_90|cuda 12.8") {
        Err(SubmitError::NoDevice { available, .. }) => assert_eq!(available, vec![device.clone()]),
        other => panic!("expected NoDevice, got {other:?}"),
    }

    // Valid but untunable here: the worker answers with an error, not a death.
    let error = tuner
        .submit(
            "gemm",
            r#"{"m":64,"n":64,"k":64,"dtype":"f16","layout":"nn"}"#,
            &device,
        )
        .expect("accepted")
        .await
        .expect("answered")
        .expect_err("f16 on cpu");
    assert!(error.contains("f32 only"), "{error}");
    let counters = tuner.counters();
    assert_eq!(
        (
            counters.jobs_failed.load(Relaxed),
            counters.restarts.load(Relaxed)
        ),
        (4, 0)
    );
}

#[tokio::test]
async fn auto_picks_cuda_only_when_the_driver_loads_and_cuda_without_one_is_a_start_error() {
    let driver = tunecache_gpu_tuner::backend::cuda::driver_library_present();
    let mut auto = config(Duration::from_secs(5), 4);
    auto.backend = BackendChoice::Auto;
    let tuner = Supervisor::start(auto).await.expect("auto always starts");
    if driver {
        // With a driver but no device, auto still falls back; with one, it is cuda.
        assert!(["cuda", "cpu"].contains(&tuner.backend().as_str()));
    } else {
        assert_eq!(tuner.backend(), "cpu");
        assert!(tuner.note().contains("libcuda.so.1"), "{}", tuner.note());
        let mut cuda = config(Duration::from_secs(5), 4);
        cuda.backend = BackendChoice::Cuda;
        let error = Supervisor::start(cuda)
            .await
            .expect_err("no driver here")
            .to_string();
        assert!(error.contains("libcuda.so.1"), "{error}");
    }
}

/// A cpu worker whose named tactics fail as `faults` says (the worker's hidden
/// `--inject-fault NAME=KIND`).
async fn start_faulty(job_timeout: Duration, faults: &[&str]) -> TunerHandle {
    let mut config = config(job_timeout, 4);
    for fault in faults {
        config.worker_args.push("--inject-fault".to_string());
        config.worker_args.push(fault.to_string());
    }
    Supervisor::start(config)
        .await
        .expect("the cpu worker starts")
}

/// Tunes SMALL_GEMM and returns the result's config.
async fn tune_small(tuner: &TunerHandle) -> Result<serde_json::Value, String> {
    let result = tuner
        .submit("gemm", SMALL_GEMM, &fingerprint(tuner))
        .expect("accepted")
        .await
        .expect("answered")?;
    Ok(serde_json::from_str(&result.config).expect("config is JSON"))
}

fn entry<'a>(config: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    config["candidates"]
        .as_array()
        .expect("a candidate list")
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed in {config}"))
}

#[tokio::test]
async fn a_candidate_that_kills_the_worker_is_excluded_and_the_job_finishes_with_the_rest() {
    let tuner = start_faulty(Duration::from_secs(120), &["64x64x64=abort"]).await;
    let first_pid = tuner.worker_pid().expect("a worker pid");
    let config = tune_small(&tuner)
        .await
        .expect("tuned without the aborting tactic");
    assert_ne!(config["candidate"], "64x64x64");
    let why = entry(&config, "64x64x64")["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(why.contains("excluded"), "{why}");
    assert!(why.contains("SIGABRT"), "{why}");
    assert!(
        why.contains("aborting in candidate 64x64x64"),
        "the stderr tail: {why}"
    );
    // The others were measured: the job finished with the best of the rest.
    let measured = config["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["median_us"].is_f64())
        .count();
    assert_eq!(measured, 5, "{config}");
    assert!(tuner.worker_pid().is_some_and(|pid| pid != first_pid));
    let counters = tuner.counters();
    assert_eq!(
        (
            counters.restarts.load(Relaxed),
            counters.jobs_done.load(Relaxed),
            counters.jobs_failed.load(Relaxed)
        ),
        (1, 1, 0)
    );

    // The next job succeeds too (its fresh worker dies once more on the same tactic, since
    // exclusions belong to a job, and is restarted).
    let config = tune_small(&tuner).await.expect("the next job succeeds");
    assert_ne!(config["candidate"], "64x64x64");
    assert_eq!(tuner.counters().restarts.load(Relaxed), 2);
}

#[tokio::test]
async fn a_poisoned_context_and_a_crash_in_two_candidates_cost_only_those_two() {
    let tuner = start_faulty(
        Duration::from_secs(120),
        &["32x32x64=poison", "128x128x128=abort", "64x128x128=wrong"],
    )
    .await;
    let config = tune_small(&tuner)
        .await
        .expect("tuned with the other tactics");
    let poisoned = entry(&config, "32x32x64")["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(poisoned.contains("status 70"), "{poisoned}");
    assert!(poisoned.contains("sticky CUDA error"), "{poisoned}");
    let aborted = entry(&config, "128x128x128")["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(aborted.contains("SIGABRT"), "{aborted}");
    // The fastest-but-wrong tactic was timed (it is the fastest by far) but did not win.
    let wrong = entry(&config, "64x128x128");
    assert!(wrong["median_us"].is_f64(), "{wrong}");
    assert!(
        wrong["error"]
            .as_str()
            .unwrap()
            .contains("failed verification"),
        "{wrong}"
    );
    let winner = config["candidate"].as_str().unwrap();
    assert!(
        ["64x64x64", "128x256x256", "256x64x512"].contains(&winner),
        "{winner}"
    );
    assert_eq!(tuner.counters().restarts.load(Relaxed), 2);
}

#[tokio::test]
async fn a_job_whose_candidates_keep_killing_workers_fails_after_the_limit_naming_them() {
    let faults = [
        "32x32x64=abort",
        "64x64x64=abort",
        "64x128x128=abort",
        "128x128x128=abort",
        "128x256x256=abort",
    ];
    let tuner = start_faulty(Duration::from_secs(120), &faults).await;
    let error = tune_small(&tuner).await.expect_err("too many deaths");
    let limit = tunecache_server::tuner::MAX_DEATHS_PER_JOB;
    assert!(error.contains(&format!("died {limit} times")), "{error}");
    assert!(
        error.contains("candidates excluded for killing it: 32x32x64, 64x64x64, 64x128x128"),
        "{error}"
    );
    let counters = tuner.counters();
    assert_eq!(counters.jobs_failed.load(Relaxed), 1);
    eventually("a fresh worker after the last death", || {
        tuner.counters().restarts.load(Relaxed) == u64::from(limit) && tuner.state() == "running"
    })
    .await;
}

#[tokio::test]
async fn a_hanging_candidate_hits_the_job_timeout_and_is_named() {
    let tuner = start_faulty(Duration::from_millis(2500), &["64x64x64=hang"]).await;
    let first_pid = tuner.worker_pid().expect("a worker pid");
    let error = tune_small(&tuner).await.expect_err("times out");
    assert!(error.contains("timed out"), "{error}");
    assert!(
        error.contains("while running candidate \"64x64x64\""),
        "{error}"
    );
    eventually("a restarted worker", || {
        tuner.worker_pid().is_some_and(|pid| pid != first_pid) && tuner.state() == "running"
    })
    .await;
}

#[tokio::test]
async fn fault_injection_is_refused_outside_the_cpu_backend() {
    let mut config = config(Duration::from_secs(5), 4);
    config.backend = BackendChoice::Auto;
    config.worker_args = vec!["--inject-fault".into(), "x=abort".into()];
    let error = Supervisor::start(config)
        .await
        .expect_err("refused")
        .to_string();
    assert!(error.contains("cpu backend only"), "{error}");
}
