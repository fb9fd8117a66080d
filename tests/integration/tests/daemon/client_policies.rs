//! The client policies every client shares (issue 35), against the real daemon: the split lease
//! (`begin_tune`, `finish_tune`, `abandon`: a failed Record gives the lease up except past its
//! deadline), `record_keeping_valid` (a refused entry is set aside, a batch over the daemon's
//! message size is halved), the structured detail a size refusal carries over the wire, and
//! replay (issue 52: a miss at once, never a wait nor a lease, whatever the caller asked).

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use tonic_types::StatusExt;
use tunecache_client::{
    record::is_message_too_large, ClientError, LeaseAfterFailure, Mode, RankOutcome,
    ResolveOptions, TuneStart,
};
use tunecache_integration::{entry, test_key, DaemonOptions, TestDaemon};
use tunecache_proto::limits::{ERROR_DOMAIN, MAX_MESSAGE_BYTES_FLAG, MESSAGE_TOO_LARGE_REASON};
use tunecache_proto::v1;

fn result(config: &str, time_us: f64) -> v1::Result {
    entry(test_key("x", "x"), config, time_us, "client_policies")
        .result
        .expect("result")
}

fn tune_options() -> ResolveOptions {
    ResolveOptions {
        wait: Duration::ZERO,
        can_tune: true,
        lease: Duration::from_secs(120),
    }
}

async fn small_limit_daemon(dir: &std::path::Path) -> TestDaemon {
    DaemonOptions::new(dir)
        .args(["--max-message-bytes", "65536"])
        .in_process()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_refusal_names_its_flag_in_an_error_info() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = small_limit_daemon(dir.path()).await;
    let client = daemon.client().await;
    let entries: Vec<v1::Entry> = (0..100)
        .map(|i| {
            let config = format!("{{\"pad\": \"{}\"}}", "p".repeat(1000));
            entry(test_key("size", &i.to_string()), &config, 1.0, "t")
        })
        .collect();
    let Err(ClientError::Rpc(status)) = client.record(entries).await else {
        panic!("a 100 KB Record passed a 64 KiB limit");
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("--max-message-bytes 65536"),
        "{status:?}"
    );
    let info = status
        .get_details_error_info()
        .expect("an ErrorInfo detail");
    assert_eq!(info.reason, MESSAGE_TOO_LARGE_REASON);
    assert_eq!(info.domain, ERROR_DOMAIN);
    assert_eq!(info.metadata["flag"], MAX_MESSAGE_BYTES_FLAG);
    assert_eq!(info.metadata["limit_bytes"], "65536");
    assert!(is_message_too_large(&status));
    let quota = status.get_details_quota_failure().expect("a QuotaFailure");
    assert_eq!(quota.violations[0].subject, MAX_MESSAGE_BYTES_FLAG);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_keeping_valid_stores_every_valid_entry() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = small_limit_daemon(dir.path()).await;
    let client = daemon.client().await;
    // 1,300 entries of about 1 KB: two batches of the client's 1,000 and 300, each many times
    // the daemon's 64 KiB. Entry 10's problem is over the daemon's 4 KiB (INVALID_ARGUMENT
    // names it); entry 1,200 is valid but over 64 KiB as a message of its own.
    let entries: Vec<v1::Entry> = (0..1300)
        .map(|i| {
            let (problem, config) = match i {
                10 => ("q".repeat(5000), "{}".to_owned()),
                1200 => (
                    "r".repeat(3000),
                    format!("{{\"t\": \"{}\"}}", "t".repeat(63_000)),
                ),
                _ => (i.to_string(), format!("{{\"t\": \"{i:01000}\"}}")),
            };
            entry(test_key("keep", &problem), &config, 1.0, "t")
        })
        .collect();
    let kept = client.record_keeping_valid(entries).await.expect("record");
    assert_eq!((kept.stored, kept.unchanged), (1298, 0));
    let refused: Vec<usize> = kept.refused.iter().map(|refused| refused.index).collect();
    assert_eq!(refused, [10, 1200]);
    assert_eq!(kept.refused[0].status.code(), tonic::Code::InvalidArgument);
    assert!(kept.refused[0].status.message().contains("key.problem"));
    assert!(is_message_too_large(&kept.refused[1].status));
    assert_eq!(client.scan("test", "").await.unwrap().len(), 1298);
    // Sent again: every one is there already.
    let again: Vec<v1::Entry> = (0..5)
        .map(|i| {
            let config = format!("{{\"t\": \"{i:01000}\"}}");
            entry(test_key("keep", &i.to_string()), &config, 1.0, "t")
        })
        .collect();
    let kept = client.record_keeping_valid(again).await.expect("record");
    assert_eq!((kept.stored, kept.unchanged, kept.refused.len()), (0, 5, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_tune_completes_the_lease_and_abandon_hands_it_on() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;
    let key = test_key("lease", "finished");
    let TuneStart::Tune(lease) = client
        .begin_tune(key.clone(), tune_options())
        .await
        .unwrap()
    else {
        panic!("a fresh key is this caller's to tune");
    };
    assert_eq!(lease.key(), &key);
    client
        .finish_tune(lease, result("{\"tile\": 64}", 5.0))
        .await
        .expect("recorded");
    let stats = client.stats().await.unwrap();
    assert_eq!((stats.leases_active, stats.leases_given_up), (0, 0));
    let TuneStart::Hit(hit) = client.begin_tune(key, tune_options()).await.unwrap() else {
        panic!("the finished result is a hit");
    };
    assert_eq!(hit.config, "{\"tile\": 64}");

    let key = test_key("lease", "abandoned");
    let TuneStart::Tune(lease) = client
        .begin_tune(key.clone(), tune_options())
        .await
        .unwrap()
    else {
        panic!("a fresh key is this caller's to tune");
    };
    client.abandon(lease).await.expect("given up");
    let stats = client.stats().await.unwrap();
    assert_eq!((stats.leases_active, stats.leases_given_up), (0, 1));
    // The next caller is told to tune at once.
    assert!(matches!(
        client.begin_tune(key, tune_options()).await.unwrap(),
        TuneStart::Tune(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_answers_a_miss_at_once_and_never_takes_a_lease_whatever_it_asked() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let tuner = daemon.client().await;
    let replayer = daemon.client().await.in_mode(Mode::Replay);
    assert_eq!(replayer.mode(), Mode::Replay);
    // What a tuning rank asks: wait long, tune if nobody else does.
    let asked = ResolveOptions {
        wait: Duration::from_secs(30),
        can_tune: true,
        lease: Duration::from_secs(120),
    };
    let held = test_key("replay", "held");
    let TuneStart::Tune(lease) = tuner
        .begin_tune(held.clone(), tune_options())
        .await
        .unwrap()
    else {
        panic!("a fresh key is this caller's to tune");
    };
    // Another caller tunes it: a tuning caller would wait up to 30 s for its result.
    let started = Instant::now();
    let start = replayer.begin_tune(held.clone(), asked).await.unwrap();
    assert!(matches!(start, TuneStart::Miss(_)), "{start:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // Nobody tunes it: a tuning caller would get the lease; the rank flow never tunes.
    let free = test_key("replay", "free");
    let outcome = replayer
        .get_or_tune(free.clone(), asked, || async {
            Err::<v1::Result, _>("replay ran the tuner")
        })
        .await;
    assert!(matches!(outcome, RankOutcome::Fallback(_)), "{outcome:?}");
    let stats = tuner.stats().await.unwrap();
    assert_eq!((stats.leases_granted, stats.waiters), (1, 0), "{stats:?}");
    assert!(matches!(
        tuner.begin_tune(free, tune_options()).await.unwrap(),
        TuneStart::Tune(_)
    ));

    // A hit is served.
    tuner
        .finish_tune(lease, result("{\"tile\": 128}", 4.0))
        .await
        .expect("recorded");
    let TuneStart::Hit(hit) = replayer.begin_tune(held, asked).await.unwrap() else {
        panic!("the recorded result is a replay hit");
    };
    assert_eq!(hit.config, "{\"tile\": 128}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_result_gives_the_lease_up() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let client = daemon.client().await;
    let TuneStart::Tune(lease) = client
        .begin_tune(test_key("lease", "refused"), tune_options())
        .await
        .unwrap()
    else {
        panic!("a fresh key is this caller's to tune");
    };
    let failed = client
        .finish_tune(lease, result("not json {", 5.0))
        .await
        .expect_err("the daemon refuses a config that is not JSON");
    assert!(failed.refused(), "{:?}", failed.error);
    assert!(
        matches!(failed.lease, LeaseAfterFailure::GivenUp),
        "{:?}",
        failed.lease
    );
    let stats = client.stats().await.unwrap();
    assert_eq!((stats.leases_active, stats.leases_given_up), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_past_its_deadline_keeps_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::process(dir.path()).await;
    let timeout = Duration::from_millis(400);
    let client = daemon.client().await.with_timeout(timeout);
    let TuneStart::Tune(lease) = client
        .begin_tune(test_key("lease", "late"), tune_options())
        .await
        .unwrap()
    else {
        panic!("a fresh key is this caller's to tune");
    };
    // The daemon hangs while the rank tunes: its Record runs past the deadline.
    tunecache_integration::stop_process(daemon.pid());
    let started = Instant::now();
    let finished = client
        .finish_tune(lease, result("{\"tile\": 64}", 5.0))
        .await;
    let took = started.elapsed();
    kill(daemon.pid(), Signal::SIGCONT).unwrap();
    let failed = finished.expect_err("the daemon was stopped");
    assert!(!failed.refused());
    // Kept: no second call to a daemon that did not answer (it would block as long again).
    assert!(
        matches!(failed.lease, LeaseAfterFailure::Kept),
        "{:?}",
        failed.lease
    );
    assert!(took < 2 * timeout, "{took:?}");
    let stats = daemon.client().await.stats().await.unwrap();
    assert_eq!(stats.leases_given_up, 0);
}
