//! The daemon run inside the test's own runtime: `server::run` on a socket the test bound,
//! driven by the Rust client, and stopped by the test's shutdown future.

use std::time::Duration;

use clap::Parser;
use tokio::sync::oneshot;
use tunecache_client::{proto, Client};
use tunecache_server::{server, Config};

fn entry(key: proto::Key, config: &str, time_us: f64) -> proto::Entry {
    proto::Entry {
        key: Some(key),
        result: Some(proto::Result {
            config: config.to_owned(),
            time_us,
            tuned_by: "in-process-test".to_owned(),
            tuned_at_unix_ms: 1_700_000_000_000,
            forget_epoch: 0,
            artifacts: Default::default(),
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_lookup_scan_round_trip_then_clean_shutdown() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket_path = dir.path().join("tunecached.sock");
    let state_dir = dir.path().join("state");
    let config = Config::parse_from([
        "tunecached".as_ref(),
        "--socket".as_ref(),
        socket_path.as_os_str(),
        "--state-dir".as_ref(),
        state_dir.as_os_str(),
    ]);
    let socket = server::bind(&config).expect("bind the socket");
    assert_eq!(socket.path(), socket_path);
    let (stop, stopped) = oneshot::channel::<()>();
    let daemon = tokio::spawn(server::run(config, socket, async {
        let _ = stopped.await;
    }));

    let client = Client::connect(&socket_path).await.expect("connect");
    let key = tunecache_client::key("test", "gemm", "dev0", r#"{"m":64}"#, None);
    let other = tunecache_client::key("test", "gemm", "dev0", r#"{"m":128}"#, None);
    let recorded = client
        .record(vec![
            entry(key.clone(), r#"{"tile":"slow"}"#, 20.0),
            entry(other.clone(), r#"{"tile":8}"#, 5.0),
        ])
        .await
        .expect("record");
    assert_eq!(recorded.stored, 2, "{recorded:?}");
    // A faster result for the same key wins under the merge rule.
    let improved = client
        .record(vec![entry(key.clone(), r#"{"tile":"fast"}"#, 10.0)])
        .await
        .expect("record the faster result");
    assert_eq!(improved.stored, 1, "{improved:?}");

    let hits = client.lookup(vec![key.clone()]).await.expect("lookup");
    assert_eq!(hits.len(), 1);
    let result = hits[0].result.as_ref().expect("a result");
    assert_eq!(result.config, r#"{"tile":"fast"}"#);
    assert_eq!(result.time_us, 10.0);

    let scanned = client.scan("test", "dev0").await.expect("scan");
    let configs: Vec<&str> = scanned
        .iter()
        .filter_map(|e| e.result.as_ref().map(|r| r.config.as_str()))
        .collect();
    assert_eq!(configs.len(), 2, "{scanned:?}");
    assert!(
        configs.contains(&r#"{"tile":"fast"}"#) && configs.contains(&r#"{"tile":8}"#),
        "{configs:?}"
    );
    assert!(client.scan("other", "").await.expect("scan").is_empty());

    // Each owner fills its own Stats fields: one figure from each of them.
    let stats = client.stats().await.expect("stats");
    assert_eq!(
        stats.version,
        env!("CARGO_PKG_VERSION"),
        "service: {stats:?}"
    );
    assert_eq!(
        (stats.records, stats.lookups, stats.hits),
        (2, 1, 1),
        "requests: {stats:?}"
    );
    assert_eq!(
        (stats.entries, stats.entries_stored),
        (2, 3),
        "store: {stats:?}"
    );
    assert!(
        !stats.fsync_policy.is_empty() && stats.write_queue_limit_bytes > 0,
        "store: {stats:?}"
    );
    assert!(stats.max_leases_per_pid > 0, "coordinator: {stats:?}");
    assert!(
        !stats.tuner_backend.is_empty() && !stats.tuner_state.is_empty(),
        "tuner: {stats:?}"
    );
    assert!(
        stats.nofile_soft_limit > 0 && stats.connections_open >= 1,
        "connections: {stats:?}"
    );
    assert!(stats.shared_dir.is_empty(), "no --shared-dir: {stats:?}");
    assert_eq!(stats.cluster_state, "off", "no --cluster-url: {stats:?}");

    drop(client);
    stop.send(()).expect("the daemon is still running");
    tokio::time::timeout(Duration::from_secs(30), daemon)
        .await
        .expect("the daemon stops within 30 s")
        .expect("the daemon task did not panic")
        .expect("the daemon stopped without error");
    assert!(!socket_path.exists(), "the socket is removed at shutdown");
    assert!(state_dir.exists(), "the store was opened in the state dir");
}

/// The field a refusal's `google.rpc.BadRequest` detail names.
fn refused_field(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let violations = status
        .get_details_bad_request()
        .unwrap_or_else(|| panic!("no BadRequest detail: {status:?}"))
        .field_violations;
    assert_eq!(violations.len(), 1, "{violations:?}");
    violations[0].field.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_name_and_end_view_refusals_name_their_field_in_a_bad_request() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket_path = dir.path().join("tunecached.sock");
    let config = Config::parse_from([
        "tunecached".as_ref(),
        "--socket".as_ref(),
        socket_path.as_os_str(),
        "--state-dir".as_ref(),
        dir.path().join("state").as_os_str(),
        "--tuner".as_ref(),
        "off".as_ref(),
    ]);
    let socket = server::bind(&config).expect("bind the socket");
    let (stop, stopped) = oneshot::channel::<()>();
    let daemon = tokio::spawn(server::run(config, socket, async {
        let _ = stopped.await;
    }));
    let client = Client::connect(&socket_path).await.expect("connect");
    // A raw stub does not ask again while the daemon opens (UNAVAILABLE with a retry hint); the
    // client's Stats does, so the refusals below are the daemon's answers to the views.
    client.stats().await.expect("the daemon opens");
    let raw = client.raw();
    let key = tunecache_client::key("test", "gemm", "dev0", "p", None);
    let long = "v".repeat(257);

    let lookup = raw
        .clone()
        .lookup(proto::LookupRequest {
            keys: vec![key.clone()],
            view: long.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused_field(&lookup), "view");
    let mut scan_stream = raw.clone();
    let scan = scan_stream
        .scan(proto::ScanRequest {
            namespace: "test".into(),
            view: "job\u{7}".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused_field(&scan), "view");
    let resolve = raw
        .clone()
        .resolve(proto::ResolveRequest {
            key: Some(key),
            view: long,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused_field(&resolve), "view");
    let end = raw
        .clone()
        .end_view(proto::EndViewRequest {
            name: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused_field(&end), "name");

    stop.send(()).expect("the daemon is still running");
    daemon
        .await
        .expect("no panic")
        .expect("the daemon stopped without error");
}
