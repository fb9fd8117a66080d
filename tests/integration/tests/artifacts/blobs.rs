//! Artifacts against real daemons: blobs streamed in and out without being held in memory,
//! refused whole when their bytes, size, names or digests are wrong, never left partial by a
//! SIGKILL, shared across nodes through the shared directory (lazily, and verified), and
//! collected once no live entry names them.

use std::path::Path;
use std::time::Duration;

use tonic::Code;
use tunecache_client::{proto, Client};
use tunecache_integration::blobs::{self, Content};
use tunecache_integration::{
    cli, cli_as_nobody, entry, eventually, require_root, require_tool, shared_node, test_key,
    with_artifacts, TestDaemon, FACT_LIMIT,
};

const MIB: u64 = 1024 * 1024;

/// An entry of `problem` naming `artifacts`.
fn entry_naming(problem: &str, time_us: f64, artifacts: Vec<proto::Artifact>) -> proto::Entry {
    let entry = entry(
        test_key("matmul", problem),
        "{\"block\":128}",
        time_us,
        "test",
    );
    with_artifacts(entry, artifacts)
}

/// Files under the store's temporary directory and its blobs.
fn store_files(state_dir: &Path) -> (Vec<String>, Vec<String>) {
    let list = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(state_dir.join("artifacts").join(dir))
            .map(|listing| {
                listing
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    (list("tmp"), list("blobs"))
}

/// Record through the raw client: the status as the daemon sent it.
async fn record(
    client: &Client,
    entries: Vec<proto::Entry>,
) -> Result<proto::RecordResponse, tonic::Status> {
    client
        .raw()
        .record(proto::RecordRequest {
            entries,
            lease_id: String::new(),
        })
        .await
        .map(tonic::Response::into_inner)
}

fn bad_request_field(status: &tonic::Status) -> String {
    tonic_types::StatusExt::get_details_bad_request(status)
        .and_then(|details| details.field_violations.first().map(|v| v.field.clone()))
        .unwrap_or_else(|| panic!("no BadRequest detail on {status:?}"))
}

/// Writes `content` to a file at `path`, chunk by chunk.
fn write_file(path: &Path, content: Content) {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for chunk in content.chunks() {
        file.write_all(&chunk).unwrap();
    }
    file.flush().unwrap();
}

fn cli_ok(daemon: &TestDaemon, args: &[&str]) -> String {
    let output = cli(&daemon.socket, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "tunecache {args:?}: {stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const KEY_ARGS: [&str; 8] = [
    "--namespace",
    "bitblas",
    "--op",
    "matmul",
    "--device",
    "NVIDIA H200|sm_90",
    "--problem",
    "M=1,N=1024,K=1024,f16,nt",
];

#[tokio::test]
async fn a_100_mib_blob_round_trips_through_the_cli_without_being_held_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("node")).unwrap();
    let daemon = TestDaemon::process(&dir.path().join("node")).await;
    let idle_rss = daemon.rss_bytes();
    let content = Content::new(1, 100 * MIB);
    let source = dir.path().join("wrapper_compiled.so");
    write_file(&source, content);
    let artifact = format!("wrapper_compiled.so={}", source.display());
    let mut put = KEY_ARGS.to_vec();
    put.splice(0..0, ["put"]);
    put.extend([
        "--config",
        "{\"block\":[128,128,32]}",
        "--time-us",
        "41.5",
        "--artifact",
        &artifact,
    ]);
    cli_ok(&daemon, &put);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let out_arg = out.display().to_string();
    let mut get = KEY_ARGS.to_vec();
    get.splice(0..0, ["get"]);
    get.extend(["--artifacts-to", &out_arg]);
    let shown = cli_ok(&daemon, &get);
    assert!(shown.contains("wrapper_compiled.so"), "{shown}");
    // Byte for byte.
    let written = std::fs::read(out.join("wrapper_compiled.so")).unwrap();
    assert_eq!(written.len() as u64, content.size);
    assert!(
        written == std::fs::read(&source).unwrap(),
        "the bytes differ"
    );
    drop(written);
    // A second upload of the same bytes is answered from its first chunk.
    let client = daemon.client().await;
    assert!(
        blobs::put(&client, content)
            .await
            .expect("PutArtifact again")
            .already_held
    );
    let stats = daemon.stats().await;
    assert_eq!(
        (
            stats.artifact_blobs_held,
            stats.artifact_bytes_held,
            stats.artifact_uploads,
            stats.artifact_uploads_already_held,
            stats.artifact_fetches_local,
            stats.artifact_bytes_served
        ),
        (1, 100 * MIB, 1, 1, 1, 100 * MIB)
    );
    let peak_rise = daemon.peak_rss_bytes().saturating_sub(idle_rss);
    eprintln!(
        "round trip of 100 MiB: peak RSS rose {} KiB over idle",
        peak_rise / 1024
    );
    assert!(peak_rise < 32 * MIB, "peak RSS rose {peak_rise} bytes");
}

/// An allowed user who is not an administrator fills the store with blobs of entries it
/// records: it is refused RESOURCE_EXHAUSTED naming the store's flag once the store is full,
/// and the blobs of the other users' live entries stay and are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_filling_the_store_is_refused_and_live_entries_keep_their_blobs() {
    if !require_root("acting as uid 65534") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    std::fs::create_dir(&node).unwrap();
    let daemon = TestDaemon::builder(&node)
        .args([
            "--allow-uid",
            "65534",
            "--artifact-store-mib",
            "8",
            "--artifact-unreferenced-mib-per-uid",
            "8",
            // One uid's share is past the store here: this test is of the store's bound
            // (artifact_quotas.rs has the share's).
            "--artifact-store-mib-per-uid",
            "16",
        ])
        .process()
        .await;
    use std::os::unix::fs::PermissionsExt;
    for open in [dir.path(), node.as_path()] {
        std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let client = daemon.client().await;
    let live = Content::new(30, 2 * MIB);
    blobs::put(&client, live).await.unwrap();
    client
        .record(vec![entry_naming(
            "live",
            1.0,
            vec![live.artifact("kernel.so")],
        )])
        .await
        .unwrap();
    let mut refused = None;
    let mut refusals = 0;
    for i in 0..4 {
        let file = dir.path().join(format!("attack-{i}.so"));
        write_file(&file, Content::new(40 + i, 3 * MIB));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let artifact = format!("attack.so={}", file.display());
        let problem = format!("attack-{i}");
        let output = cli_as_nobody(
            &setpriv,
            &daemon.socket,
            "",
            &[
                "put",
                "--namespace",
                "test",
                "--op",
                "matmul",
                "--device",
                "test-device",
                "--problem",
                &problem,
                "--config",
                "{}",
                "--time-us",
                "1",
                "--artifact",
                &artifact,
            ],
        );
        if !output.status.success() {
            refusals += 1;
            refused.get_or_insert((i, String::from_utf8_lossy(&output.stderr).into_owned()));
        }
    }
    assert_eq!(refusals, 2, "the third and fourth uploads are refused");
    let (at, stderr) = refused.expect("the store fills");
    assert_eq!(
        at, 2,
        "2 MiB live + 3 + 3 fit in 8 MiB, the third 3 MiB does not"
    );
    assert!(
        stderr.contains("ResourceExhausted") || stderr.contains("RESOURCE_EXHAUSTED"),
        "{stderr}"
    );
    assert!(stderr.contains("--artifact-store-mib"), "{stderr}");
    let got = blobs::get_digest(&client, &live.digest(), 0)
        .await
        .expect("the live blob");
    assert_eq!(got.0, live.digest());
    let stats = daemon.stats().await;
    assert_eq!(stats.artifact_bytes_over_store_limit, 2 * 3 * MIB);
    // Logged once, with the uid.
    let log = daemon.log();
    assert_eq!(
        log.matches("refused an upload over --artifact-store-mib")
            .count(),
        1,
        "{log}"
    );
}

#[tokio::test]
async fn bad_uploads_and_records_are_refused_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path())
        .args(["--max-artifact-bytes", "4194304"])
        .in_process()
        .await;
    let client = daemon.client().await;
    let content = Content::new(2, 3 * MIB + 17);

    // A digest the bytes do not have.
    let wrong = Content::new(3, content.size).digest();
    let refused = blobs::put_raw(&client, &wrong, content.size, content.chunks())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(bad_request_field(&refused), "sha256");
    assert!(
        refused.message().contains(&content.digest()),
        "{}",
        refused.message()
    );

    // A short stream, and one longer than it said.
    let short = blobs::put_raw(
        &client,
        &content.digest(),
        content.size,
        content.chunks().take(2),
    )
    .await
    .unwrap_err();
    assert_eq!(
        (short.code(), bad_request_field(&short)),
        (Code::InvalidArgument, "size".into())
    );
    assert!(short.message().contains("short"), "{}", short.message());
    let long = blobs::put_raw(
        &client,
        &content.digest(),
        content.size - 1,
        content.chunks(),
    )
    .await
    .unwrap_err();
    assert_eq!(
        (long.code(), bad_request_field(&long)),
        (Code::InvalidArgument, "size".into())
    );

    // A size over --max-artifact-bytes, from the first chunk.
    let over = blobs::put_raw(&client, &content.digest(), 4 * MIB + 1, std::iter::empty())
        .await
        .unwrap_err();
    assert_eq!(over.code(), Code::ResourceExhausted);
    assert!(
        over.message().contains("--max-artifact-bytes"),
        "{}",
        over.message()
    );
    let quota = tonic_types::StatusExt::get_details_quota_failure(&over).expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "--max-artifact-bytes");
    // A digest that is not one.
    let not_hex = blobs::put_raw(&client, &"G".repeat(64), 1, std::iter::once(vec![1]))
        .await
        .unwrap_err();
    assert_eq!(bad_request_field(&not_hex), "sha256");

    let stats = daemon.stats().await;
    assert_eq!(
        (stats.artifact_blobs_held, stats.artifact_bytes_held),
        (0, 0)
    );
    assert_eq!(stats.artifact_uploads_refused, 5);
    assert_eq!(stats.artifact_bytes_over_blob_limit, 4 * MIB + 1);
    assert_eq!(store_files(&daemon.state_dir), (vec![], vec![]));

    // Records: bad names and a duplicate are INVALID_ARGUMENT naming the artifact; a digest
    // the node lacks is FAILED_PRECONDITION naming the entry and the digest. Each batch starts
    // with a good entry, and nothing of any batch is applied.
    blobs::put(&client, content).await.expect("PutArtifact");
    let good = entry_naming("good", 1.0, vec![content.artifact("kernel.so")]);
    let long_name = "n".repeat(129);
    for (artifacts, field) in [
        (
            vec![content.artifact("../x")],
            "entries[1].result.artifacts[0].name",
        ),
        (
            vec![content.artifact(&long_name)],
            "entries[1].result.artifacts[0].name",
        ),
        (
            vec![content.artifact("")],
            "entries[1].result.artifacts[0].name",
        ),
        (
            vec![content.artifact("a.so"), content.artifact("a.so")],
            "entries[1].result.artifacts[1].name",
        ),
    ] {
        let refused = record(
            &client,
            vec![good.clone(), entry_naming("bad", 1.0, artifacts)],
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{field}");
        assert_eq!(bad_request_field(&refused), field);
    }
    let absent = Content::new(4, 10).artifact("other.so");
    let refused = record(
        &client,
        vec![
            good.clone(),
            entry_naming("lacks", 1.0, vec![absent.clone()]),
        ],
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("entries[1].result.artifacts[0]"),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains(&absent.sha256),
        "{}",
        refused.message()
    );
    let mut wrong_size = content.artifact("kernel.so");
    wrong_size.size += 1;
    let refused = record(
        &client,
        vec![good.clone(), entry_naming("size", 1.0, vec![wrong_size])],
    )
    .await
    .unwrap_err();
    assert_eq!(
        bad_request_field(&refused),
        "entries[1].result.artifacts[0].size"
    );
    assert!(client
        .lookup(vec![test_key("matmul", "good")])
        .await
        .unwrap()
        .is_empty());
    let stats = daemon.stats().await;
    assert_eq!((stats.entries, stats.artifact_records_refused), (0, 2));
    // The good entry alone is stored.
    assert_eq!(client.record(vec![good]).await.unwrap().stored, 1);
    assert_eq!(
        store_files(&daemon.state_dir),
        (vec![], vec![content.digest()])
    );

    // GetArtifact: a digest nothing names is NOT_FOUND, naming it.
    let missing = Content::new(5, 1).digest();
    let not_found = blobs::get_digest(&client, &missing, 100).await.unwrap_err();
    assert_eq!(not_found.code(), Code::NotFound);
    assert!(not_found.message().contains(&missing));
    assert_eq!(
        blobs::missing(&client, &[missing.clone(), content.digest()]).await,
        vec![missing]
    );
}

/// Kills the daemon at random points of 20 uploads of 200 MiB blobs (mid-write, and just after
/// the upload was answered, around its rename), restarting it each time: no partial blob is
/// left, every acknowledged blob verifies, and no entry names a blob the node cannot serve.
#[tokio::test]
async fn sigkill_mid_upload_never_leaves_a_partial_blob() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = TestDaemon::process(dir.path()).await;
    let mut acknowledged: Vec<proto::Artifact> = Vec::new();
    let mut verified = std::collections::HashSet::new();
    let mut seed = 0x5eed_u64;
    for round in 0..20u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let content = Content::new(1000 + round, 200 * MIB);
        let digest = content.digest();
        let client = daemon.client().await;
        // Where to kill: after this many bytes reached the temporary file, or (every fourth
        // round) right after the upload's answer.
        let after_answer = round % 4 == 3;
        let kill_at = (seed >> 11) % content.size;
        let upload = tokio::spawn({
            let client = client.clone();
            let digest = digest.clone();
            async move { blobs::put_raw(&client, &digest, content.size, content.chunks()).await }
        });
        let tmp = daemon.state_dir.join("artifacts/tmp");
        let answered = loop {
            if upload.is_finished() {
                break true;
            }
            let written: u64 = std::fs::read_dir(&tmp)
                .map(|l| {
                    l.filter_map(|e| e.ok()?.metadata().ok())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0);
            if !after_answer && written >= kill_at {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        daemon.kill();
        let outcome = upload.await.unwrap();
        if answered {
            if let Ok(put) = outcome {
                assert!(!put.already_held);
                acknowledged.push(proto::Artifact {
                    name: "k.so".into(),
                    sha256: digest,
                    size: content.size,
                });
            }
        }
        daemon.restart().await;
        let client = daemon.client().await;
        // Record the acknowledged ones: the daemon must accept them (it holds them).
        if let Some(last) = acknowledged.last() {
            client
                .record(vec![entry_naming(
                    &format!("r{round}"),
                    1.0,
                    vec![last.clone()],
                )])
                .await
                .expect("a Record naming an acknowledged blob");
        }
        let (tmp_files, blob_files) = store_files(&daemon.state_dir);
        assert!(tmp_files.is_empty(), "round {round}: {tmp_files:?} left");
        // Each blob is read back whole once, the round it appears (earlier ones were).
        for name in blob_files
            .iter()
            .filter(|name| verified.insert((*name).clone()))
        {
            let bytes_digest = blobs::get_digest(&client, name, 0)
                .await
                .expect("a held blob is served");
            assert_eq!(&bytes_digest.0, name, "round {round}");
        }
        let digests: Vec<String> = acknowledged.iter().map(|a| a.sha256.clone()).collect();
        assert!(
            blobs::missing(&client, &digests).await.is_empty(),
            "round {round}"
        );
    }
    eprintln!(
        "{} of 20 uploads were acknowledged before their SIGKILL",
        acknowledged.len()
    );
    assert!(
        acknowledged.len() >= 5,
        "the after-answer rounds are acknowledged"
    );
}

#[tokio::test]
async fn a_second_node_gets_the_blob_from_the_shared_directory_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "node-a", 3600, &[])
        .in_process()
        .await;
    let b = shared_node(&dir.path().join("b"), &shared, "node-b", 3600, &[])
        .in_process()
        .await;
    let (ca, cb) = (a.client().await, b.client().await);
    let content = Content::new(7, 5 * MIB + 3);
    blobs::put(&ca, content).await.unwrap();
    ca.record(vec![entry_naming(
        "shared",
        2.0,
        vec![content.artifact("mod.tar")],
    )])
    .await
    .unwrap();
    ca.snapshot().await.expect("a publishes");
    let blob_file = own_blob_dir(&shared).join(content.digest());
    assert_eq!(std::fs::metadata(&blob_file).unwrap().len(), content.size);
    cb.snapshot().await.expect("b loads");
    hit_names_and_nothing_was_read(&b, "shared", vec![content.artifact("mod.tar")]).await;
    assert_eq!(
        blobs::missing(&cb, &[content.digest()]).await,
        vec![content.digest()]
    );
    let got = blobs::get_digest(&cb, &content.digest(), 0)
        .await
        .expect("GetArtifact on b");
    assert_eq!(got, (content.digest(), content.size));
    let after = b.stats().await;
    assert_eq!(
        (
            after.artifact_fetches_shared_dir,
            after.artifact_bytes_read_from_tiers,
            after.artifact_blobs_held
        ),
        (1, content.size, 1)
    );

    // A blob replaced in the shared directory with other bytes is refused, counted, and
    // never served.
    let other = Content::new(8, MIB);
    blobs::put(&ca, other).await.unwrap();
    ca.record(vec![entry_naming(
        "tampered",
        2.0,
        vec![other.artifact("x.so")],
    )])
    .await
    .unwrap();
    ca.snapshot().await.unwrap();
    let tampered = own_blob_dir(&shared).join(other.digest());
    let mut bytes = other.bytes();
    bytes[12345] ^= 1;
    let aside = own_blob_dir(&shared).join(".replacement");
    std::fs::write(&aside, &bytes).unwrap();
    std::fs::rename(&aside, &tampered).unwrap();
    cb.snapshot().await.unwrap();
    let refused = blobs::get_digest(&cb, &other.digest(), 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    let stats = b.stats().await;
    assert_eq!(
        (stats.artifact_digest_failures, stats.artifact_blobs_held),
        (1, 1)
    );
}

#[tokio::test]
async fn a_held_blob_changed_on_disk_after_it_was_served_is_hashed_again_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path()).in_process().await;
    let client = daemon.client().await;
    let content = Content::new(31, 3 * MIB + 17);
    blobs::put(&client, content).await.unwrap();
    client
        .record(vec![entry_naming(
            "served",
            1.0,
            vec![content.artifact("k.so")],
        )])
        .await
        .unwrap();
    // Served twice: the first serve hashes the file whole and stamps it, the second skips
    // the hash (the stamp matches).
    for _ in 0..2 {
        let got = blobs::get_digest(&client, &content.digest(), 0)
            .await
            .unwrap();
        assert_eq!(got, (content.digest(), content.size));
    }
    // The same length, one byte flipped, written in place: the inode stays, its change time
    // does not, so the next serve hashes it again and ends DATA_LOSS instead of passing it on.
    let path = daemon
        .state_dir
        .join("artifacts/blobs")
        .join(content.digest());
    let mut bytes = content.bytes();
    bytes[MIB as usize + 5] ^= 0x40;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut file| std::io::Write::write_all(&mut file, &bytes))
        .unwrap();
    let refused = blobs::get_digest(&client, &content.digest(), 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::DataLoss, "{refused:?}");
    let stats = daemon.stats().await;
    assert_eq!(
        (stats.artifact_digest_failures, stats.artifact_blobs_held),
        (1, 0)
    );
    assert!(!path.exists(), "the changed blob is dropped from the store");
}

#[tokio::test]
async fn blobs_no_live_entry_names_are_collected_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::builder(dir.path())
        .args(["--artifact-grace-secs", "1"])
        .in_process()
        .await;
    let client = daemon.client().await;
    let kept = Content::new(20, 4096);
    blobs::put(&client, kept).await.unwrap();
    client
        .record(vec![
            entry_naming("one", 1.0, vec![kept.artifact("k.so")]),
            entry_naming("two", 1.0, vec![kept.artifact("k.so")]),
        ])
        .await
        .unwrap();
    // An upload no Record names goes after the grace period.
    let collected = |content: Content| {
        let client = client.clone();
        async move { blobs::missing(&client, &[content.digest()]).await.len() == 1 }
    };
    let unnamed = Content::new(21, 4096);
    blobs::put(&client, unnamed).await.unwrap();
    eventually(FACT_LIMIT, "the unnamed upload is collected", || {
        collected(unnamed)
    })
    .await;
    assert!(!collected(kept).await, "a blob two live entries name stays");
    // One of its two entries forgotten: it stays. A probe collected after the Forget shows a
    // collection pass ran past the grace period since.
    forget(&client, "one").await;
    let probe = Content::new(22, 4096);
    blobs::put(&client, probe).await.unwrap();
    eventually(FACT_LIMIT, "the probe is collected", || collected(probe)).await;
    assert!(!collected(kept).await, "a blob one live entry names stays");
    forget(&client, "two").await;
    eventually(
        FACT_LIMIT,
        "the blob is collected once no entry names it",
        || collected(kept),
    )
    .await;
    let stats = daemon.stats().await;
    assert_eq!(
        (stats.artifact_collections, stats.artifact_blobs_held),
        (3, 0)
    );
    assert_eq!(store_files(&daemon.state_dir), (vec![], vec![]));
}

/// Where this test process's daemons (its uid) link their blobs in the shared directory.
fn own_blob_dir(shared: &Path) -> std::path::PathBuf {
    shared
        .join("v2/artifacts")
        .join(nix::unistd::geteuid().to_string())
}

/// `problem` is a hit on `node` naming `artifacts`, and nothing of any blob was read there.
async fn hit_names_and_nothing_was_read(
    node: &TestDaemon,
    problem: &str,
    artifacts: Vec<proto::Artifact>,
) {
    let hits = node
        .client()
        .await
        .lookup(vec![test_key("matmul", problem)])
        .await
        .unwrap();
    assert_eq!(hits[0].result.as_ref().unwrap().artifacts, artifacts);
    let stats = node.stats().await;
    assert_eq!(
        (
            stats.artifact_blobs_held,
            stats.artifact_bytes_read_from_tiers
        ),
        (0, 0)
    );
}

/// Nodes a and b (in-process) on the Redis tier at `redis`, connected.
async fn redis_pair(
    dir: &Path,
    redis: &tunecache_integration::redis::Redis,
    flags: &[&str],
) -> (TestDaemon, TestDaemon) {
    use tunecache_integration::redis::{cluster_node, wait_connected};
    let a = cluster_node(dir, "a", &redis.url(), flags)
        .in_process()
        .await;
    let b = cluster_node(dir, "b", &redis.url(), flags)
        .in_process()
        .await;
    wait_connected(&a).await;
    wait_connected(&b).await;
    (a, b)
}

async fn forget(client: &Client, problem: &str) {
    let key = test_key("matmul", problem);
    let hit = client.lookup(vec![key.clone()]).await.unwrap();
    let forgotten = client
        .forget(proto::ForgetRequest {
            namespace: key.namespace,
            op: key.op,
            device: key.device,
            problem: key.problem,
            rank: key.rank,
            only_if: hit[0].result.clone(),
        })
        .await
        .unwrap();
    assert_eq!(forgotten, 1);
}

/// Two nodes on the Redis tier alone: the entry is a hit on the second, nothing of its blob
/// is read there until GetArtifact, which fetches it from Redis; a blob over
/// --cluster-max-artifact-bytes stays out of Redis while its entry is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_gets_the_blob_from_redis_only_when_asked() {
    use tunecache_integration::redis::{free_port, wait_for_hit, Redis};
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let flags = [
        "--cluster-max-artifact-bytes",
        "4194304",
        "--artifact-grace-secs",
        "2",
    ];
    let (a, b) = redis_pair(dir.path(), &redis, &flags).await;
    let (ca, cb) = (a.client().await, b.client().await);
    let small = Content::new(50, 3 * MIB + 5);
    let large = Content::new(51, 5 * MIB);
    blobs::put(&ca, small).await.unwrap();
    blobs::put(&ca, large).await.unwrap();
    ca.record(vec![
        entry_naming("redis-small", 1.0, vec![small.artifact("k.so")]),
        entry_naming("redis-large", 1.0, vec![large.artifact("k.so")]),
    ])
    .await
    .unwrap();
    for problem in ["redis-small", "redis-large"] {
        wait_for_hit(
            &b,
            &test_key("matmul", problem),
            None,
            tunecache_integration::FACT_LIMIT,
        )
        .await;
    }
    hit_names_and_nothing_was_read(&b, "redis-small", vec![small.artifact("k.so")]).await;
    let blob_keys = redis.keys_matching("*b:{s*");
    assert_eq!(
        blob_keys.len(),
        1,
        "only the small blob is in Redis: {blob_keys:?}"
    );
    assert_eq!(
        a.stats().await.artifact_bytes_over_cluster_limit,
        large.size
    );
    let got = blobs::get_digest(&cb, &small.digest(), 0)
        .await
        .expect("from Redis");
    assert_eq!(got, (small.digest(), small.size));
    let after = b.stats().await;
    assert_eq!(
        (
            after.artifact_fetches_cluster,
            after.artifact_bytes_read_from_tiers
        ),
        (1, small.size)
    );
    // The large one is in no tier b can reach.
    let refused = blobs::get_digest(&cb, &large.digest(), 2000)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");

    // Lost from Redis (an eviction, a careless writer): the node that holds it writes it again.
    redis.cli(&["DEL", &blob_keys[0]]);
    eventually(FACT_LIMIT, "the lost blob is written again", || {
        let keys = redis.keys_matching("*b:{s*");
        async move { keys.len() == 1 }
    })
    .await;

    // Forgotten on every node: the blob goes from both nodes and from Redis after the grace
    // period (its TTL is no longer renewed by any node).
    forget(&ca, "redis-small").await;
    eventually(FACT_LIMIT, "the blob is gone from Redis", || {
        let keys = redis.keys_matching("*b:{s*");
        async move { keys.is_empty() }
    })
    .await;
    for (node, client) in [("a", &ca), ("b", &cb)] {
        let client = client.clone();
        eventually(
            FACT_LIMIT,
            &format!("the blob is collected on {node}"),
            || {
                let client = client.clone();
                async move { blobs::missing(&client, &[small.digest()]).await.len() == 1 }
            },
        )
        .await;
    }
}

/// Both tiers: a blob replaced in the shared directory with other bytes is refused when
/// fetched, counted, and taken from Redis instead; the bad bytes are never served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_shared_blob_is_refused_and_fetched_from_redis() {
    use tunecache_integration::redis::{free_port, wait_for_hit, Redis};
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let shared_arg = shared.display().to_string();
    let flags = ["--shared-dir", &shared_arg, "--snapshot-interval", "3600"];
    let (a, b) = redis_pair(dir.path(), &redis, &flags).await;
    let (ca, cb) = (a.client().await, b.client().await);
    let content = Content::new(60, 2 * MIB + 1);
    blobs::put(&ca, content).await.unwrap();
    ca.record(vec![entry_naming(
        "both",
        1.0,
        vec![content.artifact("k.so")],
    )])
    .await
    .unwrap();
    ca.snapshot().await.unwrap();
    wait_for_hit(
        &b,
        &test_key("matmul", "both"),
        None,
        tunecache_integration::FACT_LIMIT,
    )
    .await;
    let in_shared = own_blob_dir(&shared).join(content.digest());
    let mut bytes = std::fs::read(&in_shared).unwrap();
    bytes[7] ^= 0x80;
    let aside = own_blob_dir(&shared).join(".replacement");
    std::fs::write(&aside, &bytes).unwrap();
    std::fs::rename(&aside, &in_shared).unwrap();
    let got = blobs::get_digest(&cb, &content.digest(), 0)
        .await
        .expect("from Redis");
    assert_eq!(got, (content.digest(), content.size));
    let stats = b.stats().await;
    assert_eq!(
        (
            stats.artifact_digest_failures,
            stats.artifact_fetches_shared_dir,
            stats.artifact_fetches_cluster
        ),
        (1, 0, 1)
    );
}

/// Cross-node single-flight of an artifact-bearing entry: while a rank on node a holds the
/// lease on a key, a rank on node b asking for it waits (one lease in the cluster); a's Record
/// naming an uploaded blob ends b's wait with that entry, and b then fetches the blob, from
/// Redis, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_another_node_gets_the_artifact_entry_of_the_lease_holder_and_then_its_blobs() {
    use tunecache_client::tuning::TuneStart;
    use tunecache_client::{Resolution, ResolveOptions};
    use tunecache_integration::redis::{free_port, Redis};
    if Redis::server().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(dir.path(), free_port(), &[]);
    let (a, b) = redis_pair(dir.path(), &redis, &[]).await;
    let (ca, cb) = (a.client().await, b.client().await);
    let problem = "single-flight-artifact";
    let key = test_key("matmul", problem);
    let options = ResolveOptions {
        wait: tunecache_integration::FACT_LIMIT,
        can_tune: true,
        lease: Duration::from_secs(60),
    };

    // A rank on a takes the lease.
    let lease = match ca.begin_tune(key.clone(), options).await.unwrap() {
        TuneStart::Tune(lease) => lease,
        other => panic!("the first Resolve in the cluster tunes, got {other:?}"),
    };
    // A rank on b asks while a holds it: it waits on a's cluster lease instead of tuning.
    let waiting = {
        let (cb, key) = (cb.clone(), key.clone());
        tokio::spawn(async move { cb.resolve(key, options).await })
    };
    // (Or until it answered, which the assertion below refuses.)
    eventually(FACT_LIMIT, "b's Resolve waits on a's cluster lease", || {
        let (b, waiting) = (&b, &waiting);
        async move {
            let stats = b.stats().await;
            waiting.is_finished()
                || (stats.cluster_leases_held_elsewhere >= 1 && stats.waiters == 1)
        }
    })
    .await;
    assert!(
        !waiting.is_finished(),
        "b's Resolve answered before a's Record"
    );
    let (sa, sb) = (a.stats().await, b.stats().await);
    assert_eq!(
        (
            sa.leases_granted,
            sa.cluster_leases_acquired,
            sb.leases_granted,
            sb.cluster_leases_acquired
        ),
        (1, 1, 0, 0),
        "exactly one lease in the cluster, a's"
    );

    // a uploads the blob and records the entry naming it under its lease.
    let content = Content::new(70, 3 * MIB + 11);
    let source = dir.path().join("kernel.cubin");
    write_file(&source, content);
    let stored = ca.put_artifact(&source).await.expect("PutArtifact on a");
    assert_eq!(
        (stored.sha256.as_str(), stored.size),
        (content.digest().as_str(), content.size)
    );
    let artifact = stored.named("kernel.cubin").unwrap();
    let result = entry_naming(problem, 3.5, vec![artifact.clone()])
        .result
        .unwrap();
    ca.finish_tune(lease, result.clone())
        .await
        .expect("a's Record under its lease");

    // b's wait ends with a's entry, naming the blob; nothing of it was read on b yet.
    let answered = tokio::time::timeout(tunecache_integration::FACT_LIMIT, waiting)
        .await
        .expect("b's Resolve answers once a records")
        .unwrap()
        .expect("b's Resolve");
    let Resolution::Hit(hit) = answered else {
        panic!("b's waiting Resolve gets a's result, got {answered:?}");
    };
    assert_eq!(
        (hit.config.as_str(), hit.time_us, &hit.artifacts),
        (result.config.as_str(), result.time_us, &vec![artifact])
    );
    let before = b.stats().await;
    assert_eq!(
        (
            before.waits_satisfied,
            before.leases_granted,
            before.artifact_fetches_cluster,
            before.artifact_blobs_held,
            before.artifact_bytes_read_from_tiers
        ),
        (1, 0, 0, 0, 0)
    );

    // b fetches the blob: from Redis, the bytes a uploaded.
    let out = dir.path().join("out-b");
    std::fs::create_dir(&out).unwrap();
    let hit_entry = proto::Entry {
        key: Some(key),
        result: Some(hit),
    };
    let written = cb
        .fetch_artifacts(&hit_entry, &out)
        .await
        .expect("b fetches the blob");
    assert_eq!(written, vec![out.join("kernel.cubin")]);
    assert!(
        std::fs::read(&written[0]).unwrap() == std::fs::read(&source).unwrap(),
        "the bytes b wrote differ from a's"
    );
    let after = b.stats().await;
    assert_eq!(
        (
            after.artifact_fetches_cluster,
            after.artifact_fetches_shared_dir,
            after.artifact_bytes_read_from_tiers,
            after.artifact_blobs_held
        ),
        (1, 0, content.size, 1)
    );
}

/// Blobs in the shared directory that no live entry names are collected there too: a
/// forgotten entry's blob goes after the grace period (renamed to the sweeping node's trash,
/// then deleted one sweep later), a blob a live entry names stays and is served on the other
/// node, a crashed publisher's temporary file goes, other names stay; and a blob recorded
/// again after its collection is linked in again by the node that publishes it.
#[tokio::test]
async fn shared_blobs_no_live_entry_names_are_collected_and_named_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    // Only b's grace period ends within the test, so b is the sweeper, and a (which published
    // the blobs) keeps them in its own store.
    let a = shared_node(
        &dir.path().join("a"),
        &shared,
        "node-a",
        3600,
        &["--artifact-grace-secs", "3600"],
    )
    .in_process()
    .await;
    let b = shared_node(
        &dir.path().join("b"),
        &shared,
        "node-b",
        3600,
        &["--artifact-grace-secs", "1"],
    )
    .in_process()
    .await;
    let (ca, cb) = (a.client().await, b.client().await);
    let kept = Content::new(40, 2 * MIB + 1);
    let gone = Content::new(41, MIB + 7);
    for content in [kept, gone] {
        blobs::put(&ca, content).await.unwrap();
    }
    ca.record(vec![
        entry_naming("kept", 1.0, vec![kept.artifact("k.so")]),
        entry_naming("gone", 1.0, vec![gone.artifact("g.so")]),
    ])
    .await
    .unwrap();
    ca.snapshot().await.expect("a publishes");
    let blob_dir = own_blob_dir(&shared);
    let (kept_file, gone_file) = (blob_dir.join(kept.digest()), blob_dir.join(gone.digest()));
    assert!(kept_file.is_file() && gone_file.is_file());
    // A crashed publisher's temporary file, and a name no sweep owns.
    let temp = blob_dir.join(format!(".{}.node-x.4242.tmp", gone.digest()));
    std::fs::write(&temp, b"partial").unwrap();
    let other = blob_dir.join("README");
    std::fs::write(&other, b"not a blob").unwrap();
    cb.snapshot().await.expect("b loads");

    forget(&ca, "gone").await;
    // After every pass, the blob a live entry names is in place: a sweep never takes it, not
    // even for the pass between its two steps.
    let pass = || async {
        for client in [&ca, &cb] {
            client.snapshot().await.expect("a pass");
            assert!(
                kept_file.is_file(),
                "a blob a live entry names was taken away"
            );
        }
    };
    let swept = || async {
        pass().await;
        !gone_file.exists() && !temp.exists()
    };
    eventually(FACT_LIMIT, "the forgotten entry's blob is collected", swept).await;
    // Collected: no trash left behind once the second step ran, and counted.
    eventually(FACT_LIMIT, "the trash is deleted", || async {
        pass().await;
        std::fs::read_dir(&blob_dir).unwrap().all(|item| {
            !item
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".trash")
        })
    })
    .await;
    assert_eq!(
        (
            a.stats().await.artifact_shared_dir_collections,
            b.stats().await.artifact_shared_dir_collections
        ),
        (0, 1),
        "one blob collected, once, by b"
    );
    assert!(kept_file.is_file(), "a blob a live entry names stays");
    assert!(other.is_file(), "a name no sweep owns stays");
    let got = blobs::get_digest(&cb, &kept.digest(), 0)
        .await
        .expect("b fetches the kept blob from the shared directory");
    assert_eq!(got, (kept.digest(), kept.size));
    assert_eq!(b.stats().await.artifact_fetches_shared_dir, 1);

    // Recorded again on a, which still holds it and believes it published it: its check after
    // the new segment is linked in finds the blob missing and links it in again.
    ca.record(vec![entry_naming(
        "again",
        1.0,
        vec![gone.artifact("g.so")],
    )])
    .await
    .unwrap();
    ca.snapshot().await.expect("a publishes again");
    assert_eq!(
        std::fs::metadata(&gone_file).map(|m| m.len()).ok(),
        Some(gone.size),
        "the blob a new segment names is in the shared directory again"
    );
    cb.snapshot().await.expect("b loads");
    let got = blobs::get_digest(&cb, &gone.digest(), 0)
        .await
        .expect("b fetches the blob recorded again");
    assert_eq!(got, (gone.digest(), gone.size));
}
