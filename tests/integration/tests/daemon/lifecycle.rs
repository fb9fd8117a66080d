//! Lifecycle through the CLI (docs/lifecycle.md): `tunecache du` shows each group and its
//! last-use ages, `tunecache prune --dry-run` lists exactly the keys `prune` then expires, a
//! pruned key misses until a Record revives it, and Prune is an administrator's act.
//!
//! Old entries are made by a daemon whose wall clock runs 40 days behind (libfaketime,
//! required: the test fails without it): a Record is a use, so its entries were last used 40
//! days ago. The real-time daemon that follows on the same state directory keeps everything
//! (`--retain-days 0`), so only the prune expires them.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

use serde_json::Value;
use tunecache_client::{proto, Client};
use tunecache_integration::{
    cli, cli_as_nobody, entry, key_in, require_root, require_tool, DaemonOptions, Faketime,
    TestDaemon, TEST_DEVICE,
};

const CONFIG: &str = r#"{"block":[128,64,1]}"#;

/// The keys the daemon in the past records: three of namespace `test` (one a rank's own) and
/// one of `other`.
fn old_keys() -> Vec<proto::Key> {
    vec![
        key_in("test", "gemm", "old-0", None),
        key_in("test", "gemm", "old-1", None),
        key_in("test", "gemm", "old-2", Some(1)),
        key_in("other", "conv", "old-3", None),
    ]
}

/// The keys recorded today, one per namespace: no prune of 30 unused days touches them.
fn fresh_keys() -> Vec<proto::Key> {
    vec![
        key_in("test", "gemm", "fresh-0", None),
        key_in("other", "conv", "fresh-1", None),
    ]
}

async fn record(client: &Client, keys: &[proto::Key]) {
    let entries = keys
        .iter()
        .map(|key| entry(key.clone(), CONFIG, 12.5, "lifecycle-test"))
        .collect();
    let recorded = client.record(entries).await.expect("Record");
    assert_eq!(recorded.stored as usize, keys.len(), "{recorded:?}");
}

/// Which of `keys` are hits now.
async fn hits(client: &Client, keys: &[proto::Key]) -> BTreeSet<String> {
    let found = client.lookup(keys.to_vec()).await.expect("Lookup");
    found
        .iter()
        .filter_map(|hit| hit.key.as_ref())
        .map(|key| key.problem.clone())
        .collect()
}

fn problems(keys: &[proto::Key]) -> BTreeSet<String> {
    keys.iter().map(|key| key.problem.clone()).collect()
}

fn said(output: &Output) -> String {
    format!(
        "status {}; stdout: {}; stderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs the CLI, which must succeed, and returns its stdout.
fn cli_ok(socket: &Path, args: &[&str]) -> String {
    let output = cli(socket, args);
    assert!(
        output.status.success(),
        "tunecache {args:?}: {}",
        said(&output)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn cli_json(socket: &Path, args: &[&str]) -> Value {
    let mut with_json = vec!["--json"];
    with_json.extend_from_slice(args);
    let stdout = cli_ok(socket, &with_json);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
}

/// The keys of a `prune --json` answer, as (namespace, op, device, problem, rank).
fn pruned_keys(answer: &Value) -> BTreeSet<(String, String, String, String, Option<u64>)> {
    let keys = answer["keys"].as_array().expect("keys");
    keys.iter()
        .map(|key| {
            let text = |field: &str| key[field].as_str().expect(field).to_owned();
            (
                text("namespace"),
                text("op"),
                text("device"),
                text("problem"),
                key["rank"].as_u64(),
            )
        })
        .collect()
}

fn as_tuples(keys: &[proto::Key]) -> BTreeSet<(String, String, String, String, Option<u64>)> {
    keys.iter()
        .map(|key| {
            (
                key.namespace.clone(),
                key.op.clone(),
                key.device.clone(),
                key.problem.clone(),
                key.rank.map(u64::from),
            )
        })
        .collect()
}

/// The `by_age` counts of a `du --json` group (or total), in bucket order.
fn ages(figures: &Value) -> Vec<u64> {
    ["today", "1-7d", "7-30d", "30-90d", "older"]
        .iter()
        .map(|label| figures["by_age"][*label].as_u64().expect(label))
        .collect()
}

fn group<'a>(usage: &'a Value, name: &str) -> &'a Value {
    let groups = usage["groups"].as_array().expect("groups");
    groups
        .iter()
        .find(|group| group["name"] == name)
        .unwrap_or_else(|| panic!("no group {name}: {usage}"))
}

/// A daemon 40 days in the past records the old keys; a real-time one on the same state
/// directory records the fresh ones. `du` puts each in its bucket; the dry run and the prune
/// name exactly the old keys; they miss afterwards, the fresh ones stay, and a Record revives
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn du_shows_ages_and_prune_expires_exactly_what_its_dry_run_listed() {
    let dir = tempfile::tempdir().unwrap();
    let mut past = DaemonOptions::new(dir.path())
        .args(["--tuner", "off"])
        .faketime(Faketime::days_ago(40))
        .process()
        .await;
    let today = past.client().await.usage("").await.expect("Usage").today;
    let real_today = (tunecache_proto::unix_now_ms() / 86_400_000) as u32;
    assert!(
        real_today.saturating_sub(today) >= 39,
        "the daemon's clock runs 40 days behind (its day {today}, today {real_today}): is \
         libfaketime working?"
    );
    record(&past.client().await, &old_keys()).await;
    past.stop().await;
    drop(past);

    let daemon = DaemonOptions::new(dir.path())
        .args(["--tuner", "off", "--retain-days", "0"])
        .process()
        .await;
    let client = daemon.client().await;
    record(&client, &fresh_keys()).await;
    let socket = &daemon.socket;

    // du: the fresh entries today, the old ones 30-90 days ago, per namespace and in total.
    let usage = cli_json(socket, &["du"]);
    assert_eq!(usage["by"], "namespace");
    assert_eq!(usage["retain_days"], 0, "{usage}");
    assert_eq!(usage["max_entries"], 10_000_000, "{usage}");
    assert_eq!(group(&usage, "test")["entries"], 4, "{usage}");
    assert_eq!(ages(group(&usage, "test")), [1, 0, 0, 3, 0], "{usage}");
    assert_eq!(ages(group(&usage, "other")), [1, 0, 0, 1, 0], "{usage}");
    assert_eq!(ages(&usage["total"]), [2, 0, 0, 4, 0], "{usage}");
    assert!(group(&usage, "test")["entry_bytes"].as_u64() > Some(0));
    let by_op = cli_json(socket, &["du", "--by", "op"]);
    assert_eq!(ages(group(&by_op, "gemm")), [1, 0, 0, 3, 0], "{by_op}");
    let by_device = cli_json(socket, &["du", "--by", "device"]);
    assert_eq!(ages(group(&by_device, TEST_DEVICE)), [2, 0, 0, 4, 0]);
    let text = cli_ok(socket, &["du"]);
    for line in [
        "namespace other: 2 entries",
        "namespace test: 4 entries",
        "total (2 groups",
        "entries are kept however long unused (--retain-days 0)",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    // The test group's bars: the fullest bucket (30-90 d, 3) fills the width; today's one
    // entry a third of it.
    let bars: Vec<(&str, usize, &str)> = text
        .lines()
        .skip_while(|line| !line.starts_with("namespace test"))
        .skip(1)
        .take(5)
        .map(|line| {
            let mut parts = line.split_whitespace();
            let label = parts.next().unwrap_or_default();
            let rest: Vec<&str> = parts.collect();
            let count = rest.last().copied().unwrap_or_default();
            let bar = if rest.len() == 2 { rest[0].len() } else { 0 };
            (label, bar, count)
        })
        .collect();
    assert_eq!(
        bars,
        [
            ("today", 13, "1"),
            ("1-7d", 0, "0"),
            ("7-30d", 0, "0"),
            ("30-90d", 40, "3"),
            ("older", 0, "0"),
        ],
        "{text}"
    );

    // The dry run lists the old keys, all of them and only them, and expires nothing.
    let dry = cli_json(socket, &["prune", "--unused-for", "30", "--dry-run"]);
    assert_eq!(pruned_keys(&dry), as_tuples(&old_keys()), "{dry}");
    assert_eq!(dry["count"], 4, "{dry}");
    let dry_text = cli_ok(socket, &["prune", "--unused-for", "30", "--dry-run"]);
    assert!(
        dry_text.contains("test/gemm [test-device] old-2 (rank 1)")
            && dry_text.contains("other/conv [test-device] old-3 (shared)")
            && !dry_text.contains("fresh")
            && dry_text.contains("would expire 4 entries unused for more than 30 days"),
        "{dry_text}"
    );
    // A dry run expires nothing, and neither it nor `du` is a use. (A Lookup would be: it
    // would make the old entries used today, so the check is `du`'s.)
    let usage = cli_json(socket, &["du"]);
    assert_eq!(ages(&usage["total"]), [2, 0, 0, 4, 0], "{usage}");
    // Not unused for 40 days: nothing.
    let none = cli_json(socket, &["prune", "--unused-for", "40", "--dry-run"]);
    assert_eq!(none["count"], 0, "{none}");

    // The prune expires the same keys.
    let pruned = cli_json(socket, &["prune", "--unused-for", "30"]);
    assert_eq!(pruned_keys(&pruned), pruned_keys(&dry), "{pruned}");
    assert_eq!(pruned["count"], 4, "{pruned}");
    assert_eq!(pruned["dry_run"], false, "{pruned}");
    let all: Vec<proto::Key> = old_keys().into_iter().chain(fresh_keys()).collect();
    assert_eq!(hits(&client, &all).await, problems(&fresh_keys()));
    let usage = cli_json(socket, &["du"]);
    assert_eq!(ages(&usage["total"]), [2, 0, 0, 0, 0], "{usage}");
    let again = cli_json(socket, &["prune", "--unused-for", "30", "--dry-run"]);
    assert_eq!(again["count"], 0, "nothing is left to prune: {again}");

    // A Record revives a pruned key, as a use of today.
    let revived = old_keys()[0].clone();
    record(&client, std::slice::from_ref(&revived)).await;
    let expected: BTreeSet<String> = problems(&fresh_keys())
        .into_iter()
        .chain([revived.problem.clone()])
        .collect();
    assert_eq!(hits(&client, &all).await, expected);
    let usage = cli_json(socket, &["du"]);
    assert_eq!(ages(&usage["total"]), [3, 0, 0, 0, 0], "{usage}");
}

/// Lets uid 65534 reach the socket through the file system.
fn open_to_everyone(dir: &Path, socket: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// A caller allowed to use the daemon but no administrator gets PERMISSION_DENIED from Prune,
/// dry run or not; the CLI prints the daemon's message and exits non-zero; nothing expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_from_a_non_admin_is_refused() {
    if !require_root("acting as uid 65534") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let daemon: TestDaemon = DaemonOptions::new(dir.path())
        .args(["--tuner", "off", "--allow-uid", "65534"])
        .in_process()
        .await;
    open_to_everyone(dir.path(), &daemon.socket);
    let client = daemon.client().await;
    let keys = fresh_keys();
    record(&client, &keys).await;

    for dry_run in [true, false] {
        let mut args = vec!["prune", "--unused-for", "0"];
        if dry_run {
            args.push("--dry-run");
        }
        let output = cli_as_nobody(&setpriv, &daemon.socket, "", &args);
        let text = said(&output);
        assert!(!output.status.success(), "a non-admin's prune: {text}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("PermissionDenied"), "{text}");
        assert!(
            stderr.contains("--admin-uid"),
            "the daemon's message: {text}"
        );
    }
    // An administrator's prune of entries used today (0 days unused is not more than 0)
    // expires nothing either, and the entries are all there.
    let admin = cli_json(&daemon.socket, &["prune", "--unused-for", "0"]);
    assert_eq!(admin["count"], 0, "{admin}");
    assert_eq!(hits(&client, &keys).await, problems(&keys));
}
