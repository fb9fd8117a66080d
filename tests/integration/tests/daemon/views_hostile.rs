//! Job views against a hostile neighbour (issue 39, findings 2 to 4): another allowed,
//! non-admin user (uid 65534, through `setpriv`) on the same node cannot evict a job's pins,
//! read or pin inside its view, grow views without bound, or list them; view names that look
//! like others in a listing are refused, and a view name that is not UTF-8 is the caller's
//! INVALID_ARGUMENT on every method that takes one. Finding 1 (eviction cost at the cap) is
//! the views rules' unit test and the `views-hostile` benchmark.

use std::path::Path;
use std::process::Command;

use prost::Message;
use serde_json::Value;
use tonic_types::StatusExt;
use tunecache_client::proto;
use tunecache_integration::raw_grpc::raw_unary;
use tunecache_integration::{
    bin, entry, require_root, require_tool, test_key, DaemonOptions, TestDaemon,
};

const NOBODY: &str = "65534";

/// `tunecache-test-views` as uid/gid 65534 on `socket`: its JSON line.
fn as_nobody(setpriv: &Path, socket: &Path, args: &[&str]) -> Value {
    let output = Command::new(setpriv)
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .arg(bin("tunecache-test-views"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run tunecache-test-views as uid 65534");
    assert!(
        output.status.success(),
        "as uid 65534 {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON line")
}

/// Records `config` at `time_us` for problems `p<from>` .. `p<to-1>`.
async fn record(daemon: &TestDaemon, range: std::ops::Range<usize>, config: &str, time_us: f64) {
    let entries: Vec<proto::Entry> = range
        .map(|i| {
            entry(
                test_key("gemm", &format!("p{i}")),
                &format!("{config:?}"),
                time_us,
                "test",
            )
        })
        .collect();
    for chunk in entries.chunks(1000) {
        daemon
            .client()
            .await
            .record(chunk.to_vec())
            .await
            .expect("Record");
    }
}

/// The configs a Lookup of `p0` .. `p<keys-1>` in `view` answers, as this (root) process.
async fn configs_in(daemon: &TestDaemon, view: &str, keys: usize) -> Vec<String> {
    let request = proto::LookupRequest {
        keys: (0..keys)
            .map(|i| test_key("gemm", &format!("p{i}")))
            .collect(),
        view: view.to_owned(),
    };
    let hits = daemon
        .client()
        .await
        .raw()
        .lookup(request)
        .await
        .expect("Lookup")
        .into_inner()
        .hits;
    hits.into_iter()
        .map(|hit| unquoted(&hit.result.unwrap_or_default().config))
        .collect()
}

fn hit_configs(answer: &Value) -> Vec<String> {
    answer["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|hit| unquoted(hit[1].as_str().expect("a config")))
        .collect()
}

/// A config recorded as a JSON string (`"old"`), as the text inside.
fn unquoted(config: &str) -> String {
    serde_json::from_str(config).expect("a JSON string")
}

async fn hostile_daemon(dir: &Path, extra: &[&str]) -> Option<(TestDaemon, std::path::PathBuf)> {
    if !require_root("acting as uid 65534") {
        return None;
    }
    let setpriv = require_tool("setpriv", None)?;
    let mut args = vec!["--tuner", "off", "--allow-uid", NOBODY];
    args.extend_from_slice(extra);
    let daemon = DaemonOptions::new(dir).args(args).in_process().await;
    // The daemon's own access check (--allow-uid) is what is tested, not the file modes.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    Some((daemon, setpriv))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_can_neither_evict_a_jobs_pins_nor_read_or_pin_in_its_view() {
    let dir = tempfile::tempdir().unwrap();
    let Some((daemon, setpriv)) = hostile_daemon(dir.path(), &["--max-view-pins", "1000"]).await
    else {
        return;
    };
    record(&daemon, 0..1200, "old", 20.0).await;
    // The job (this process, root) pins 200 keys in job-A.
    assert_eq!(configs_in(&daemon, "job-A", 200).await, vec!["old"; 200]);
    // The attacker pins 1,000 keys in a view of its own: the node's cap holds, and nothing
    // of the job's is dropped for it.
    let attack = as_nobody(
        &setpriv,
        &daemon.socket,
        &["read", "--view", "attack", "--keys", "1000"],
    );
    assert_eq!(hit_configs(&attack).len(), 1000);
    let stats = daemon.client().await.stats().await.unwrap();
    assert!(stats.view_pins <= 1000, "{}", stats.view_pins);
    assert_eq!(
        stats.view_pins_evicted, 0,
        "no uid's pins dropped for another's"
    );
    // Better results for the job's keys: its view still answers its first ones, 200 of 200.
    record(&daemon, 0..200, "new", 10.0).await;
    assert_eq!(configs_in(&daemon, "job-A", 200).await, vec!["old"; 200]);
    // The attacker reading "job-A" reads a view of its own: the new results, not the job's
    // pins; and it pins nothing in the job's view.
    let inside = as_nobody(
        &setpriv,
        &daemon.socket,
        &["read", "--view", "job-A", "--keys", "200"],
    );
    assert_eq!(hit_configs(&inside), vec!["new"; 200]);
    let views = daemon.client().await.list_views().await.unwrap();
    let shown: Vec<(String, u32)> = views.iter().map(|v| (v.name.clone(), v.uid)).collect();
    assert!(shown.contains(&("job-A".to_owned(), 0)), "{shown:?}");
    assert!(shown.contains(&("job-A".to_owned(), 65534)), "{shown:?}");
    let job = views
        .iter()
        .find(|v| (v.name.as_str(), v.uid) == ("job-A", 0))
        .unwrap();
    assert_eq!(job.pins, 200);
    // The attacker lists its own views only; an administrator (root) lists every uid's.
    let listed = as_nobody(&setpriv, &daemon.socket, &["list"]);
    let uids: Vec<u64> = listed["views"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["uid"].as_u64().unwrap())
        .collect();
    assert!(
        !uids.is_empty() && uids.iter().all(|&uid| uid == 65534),
        "{listed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_views_count_toward_a_users_view_cap_and_listing_is_paged() {
    let dir = tempfile::tempdir().unwrap();
    let Some((daemon, setpriv)) = hostile_daemon(dir.path(), &["--max-views-per-uid", "100"]).await
    else {
        return;
    };
    record(&daemon, 0..10, "held", 20.0).await;
    assert_eq!(configs_in(&daemon, "job-A", 10).await, vec!["held"; 10]);
    // 500 Lookups of a missing key, each in a new view: each makes an empty view.
    let made = as_nobody(
        &setpriv,
        &daemon.socket,
        &[
            "views",
            "--prefix",
            "empty",
            "--count",
            "500",
            "--problem",
            "missing",
        ],
    );
    assert_eq!(made["hits"], 0);
    let stats = daemon.client().await.stats().await.unwrap();
    assert_eq!(stats.max_views_per_uid, 100);
    assert_eq!(
        stats.views_active, 101,
        "the attacker's 100 and the job's one"
    );
    assert_eq!(stats.views_evicted, 400);
    // The job's view (another uid) kept its pins.
    assert_eq!(configs_in(&daemon, "job-A", 10).await, vec!["held"; 10]);
    let job = daemon.client().await.list_views().await.unwrap();
    assert_eq!(job.len(), 101, "the client pages through all of them");
    // ListViews is paged: pages of 30 cover the 101 views once each.
    let mut raw = daemon.client().await.raw();
    let (mut seen, mut after, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = raw
            .list_views(proto::ListViewsRequest { limit: 30, after })
            .await
            .unwrap()
            .into_inner();
        assert!(page.views.len() <= 30);
        seen.extend(page.views.into_iter().map(|v| (v.uid, v.name)));
        pages += 1;
        if page.next.is_empty() {
            break;
        }
        after = page.next;
    }
    assert_eq!(pages, 4);
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((seen.len(), unique.len()), (101, 101));
}

/// A message of `fields` (field number, raw bytes) as length-delimited protobuf fields.
fn message(fields: &[(u32, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (field, bytes) in fields {
        prost::encoding::encode_key(*field, prost::encoding::WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(bytes.len() as u64, &mut out);
        out.extend_from_slice(bytes);
    }
    out
}

fn refused_field(status: &tonic::Status) -> String {
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    status
        .get_details_bad_request()
        .unwrap_or_else(|| panic!("no BadRequest: {status:?}"))
        .field_violations[0]
        .field
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alike_view_names_and_names_that_are_not_utf8_are_invalid_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = DaemonOptions::new(dir.path())
        .args(["--tuner", "off"])
        .in_process()
        .await;
    let mut raw = daemon.client().await.raw();
    for spoof in [
        "slurm-42.0\u{200b}",
        "slurm-\u{202e}0.24",
        "slurm-42.0\u{2028}",
        "slurm 42.0",
    ] {
        let status = raw
            .lookup(proto::LookupRequest {
                keys: vec![test_key("gemm", "p0")],
                view: spoof.to_owned(),
            })
            .await
            .unwrap_err();
        assert_eq!(refused_field(&status), "view", "{spoof:?}");
    }
    let not_utf8: &[u8] = b"slurm-42\xff";
    let key_bytes = test_key("gemm", "p0").encode_to_vec();
    let channel = tunecache_client::connect_channel(&daemon.socket)
        .await
        .expect("a channel");
    let lookup = message(&[(1, &key_bytes), (2, not_utf8)]);
    let scan = message(&[(1, b"test"), (4, not_utf8)]);
    let resolve = message(&[(1, &key_bytes), (5, not_utf8)]);
    let end_view = message(&[(1, not_utf8)]);
    for (method, body) in [
        ("/tunecache.v1.TuneCache/Lookup", lookup),
        ("/tunecache.v1.TuneCache/Scan", scan),
        ("/tunecache.v1.TuneCache/Resolve", resolve),
        ("/tunecache.v1.TuneCache/EndView", end_view),
    ] {
        let status = raw_unary(channel.clone(), method, body).await.unwrap_err();
        let field = refused_field(&status);
        assert!(field == "view" || field == "name", "{method}: {field}");
    }
}
