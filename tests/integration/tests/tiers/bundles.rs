//! The bundle tier (issue 52, docs/bundles.md) against real daemons: what a replaying node
//! serves (exactly the bundle, on every node, with its blobs, no lease, no tuner, misses
//! listed), what it refuses at start (a flipped byte anywhere, an unsigned or foreign bundle
//! while trust keys are given), and a bundle merged by the usual rule without `--replay`.
//! The bundles are written here with the format's own writer (`tunecache-bundle`); the CLI's
//! export has its own tests.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tunecache_bundle::ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePublicKey};
use tunecache_bundle::{SigningKey, WriteOptions};
use tunecache_client::proto;
use tunecache_integration::blobs::{get_digest, Content};
use tunecache_integration::daemon::TestDaemon;
use tunecache_integration::redis::{free_port, Redis};
use tunecache_integration::{cli, entry, key_in, with_artifacts};

/// The two blobs the staging entries name.
const BLOBS: [Content; 2] = [
    Content {
        seed: 11,
        size: 300_000,
    },
    Content {
        seed: 12,
        size: 5_000,
    },
];

/// What staging tuned: 200 entries in two namespaces, the first two naming a blob each.
fn staging_entries() -> Vec<proto::Entry> {
    (0..200)
        .map(|n| {
            let namespace = if n % 2 == 0 { "trtllm" } else { "triton" };
            let key = key_in(namespace, "gemm", &format!("m={n}"), None);
            let tuned = entry(
                key,
                &format!("{{\"tactic\":{n}}}"),
                10.0 + n as f64,
                "staging",
            );
            match BLOBS.get(n) {
                Some(blob) => with_artifacts(tuned, vec![blob.artifact("kernel.cubin")]),
                None => tuned,
            }
        })
        .collect()
}

/// A reader of a blob's content, made chunk by chunk.
struct ContentReader {
    chunks: Box<dyn Iterator<Item = Vec<u8>> + Send>,
    current: std::io::Cursor<Vec<u8>>,
}

impl Read for ContentReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.current.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            match self.chunks.next() {
                Some(chunk) => self.current = std::io::Cursor::new(chunk),
                None => return Ok(0),
            }
        }
    }
}

fn content_of(digest: &str, blobs: &[Content]) -> std::io::Result<Box<dyn Read>> {
    let blob = blobs
        .iter()
        .find(|blob| blob.digest() == digest)
        .ok_or_else(|| std::io::Error::other(format!("no blob {digest}")))?;
    Ok(Box::new(ContentReader {
        chunks: Box::new(blob.chunks()),
        current: std::io::Cursor::new(Vec::new()),
    }))
}

/// Writes `entries` and `blobs` as a bundle at `path`, signed by `key` when given.
fn write_bundle(
    path: &Path,
    entries: Vec<proto::Entry>,
    blobs: &[Content],
    key: Option<&SigningKey>,
) {
    let file = std::fs::File::create(path).expect("create the bundle");
    let options = WriteOptions {
        created_unix_s: 1_700_000_000,
        signing_key: key.cloned(),
        zstd_level: 3,
    };
    tunecache_bundle::write_bundle(
        std::io::BufWriter::new(file),
        entries,
        &mut |artifact| content_of(&artifact.sha256, blobs),
        &options,
    )
    .expect("write the bundle");
}

fn signing_key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// `key`'s public half as a PEM file in `dir`.
fn public_pem(dir: &Path, name: &str, key: &SigningKey) -> PathBuf {
    let path = dir.join(name);
    let pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("encode the public key");
    std::fs::write(&path, pem).expect("write the public key");
    path
}

fn bundle_flags(bundle: &Path, trusted: &Path) -> Vec<String> {
    vec![
        "--bundle".into(),
        bundle.display().to_string(),
        "--bundle-trust-key".into(),
        trusted.display().to_string(),
    ]
}

/// Every entry a Scan answers, in key order.
async fn scan_all(daemon: &TestDaemon, view: &str) -> Vec<proto::Entry> {
    let mut stream = daemon
        .client()
        .await
        .raw()
        .scan(proto::ScanRequest {
            view: view.to_owned(),
            ..Default::default()
        })
        .await
        .expect("Scan")
        .into_inner();
    let mut entries = Vec::new();
    while let Some(chunk) = stream.message().await.expect("Scan chunk") {
        entries.extend(chunk.entries);
    }
    entries
}

async fn resolve(daemon: &TestDaemon, key: proto::Key, view: &str) -> proto::ResolveResponse {
    daemon
        .client()
        .await
        .raw()
        .resolve(proto::ResolveRequest {
            key: Some(key),
            wait_ms: 30_000,
            can_tune: true,
            view: view.to_owned(),
            ..Default::default()
        })
        .await
        .expect("Resolve")
        .into_inner()
}

/// `entries` in a bundle's order (by key), as a Scan answers them.
fn sorted(mut entries: Vec<proto::Entry>) -> Vec<proto::Entry> {
    entries.sort_by(|a, b| match (&a.key, &b.key) {
        (Some(a), Some(b)) => tunecache_bundle::format::key_order(a, b),
        (a, b) => a.is_some().cmp(&b.is_some()),
    });
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaying_nodes_serve_exactly_the_bundle_take_no_lease_and_list_what_it_lacks() {
    let Some(_) = Redis::server() else {
        panic!("redis-server is required (.ci/run installs it)");
    };
    let dir = tempfile::tempdir().unwrap();
    let staging = signing_key(7);
    let bundle = dir.path().join("staging.tcb");
    write_bundle(&bundle, staging_entries(), &BLOBS, Some(&staging));
    let trusted = public_pem(dir.path(), "staging.pub", &staging);
    let redis = Redis::start(&dir.path().join("redis"), free_port(), &[]);

    // Three fresh nodes, two of them sharing Redis.
    let mut nodes = Vec::new();
    for n in 0..3 {
        let node_dir = dir.path().join(format!("node{n}"));
        std::fs::create_dir_all(&node_dir).unwrap();
        let mut flags = bundle_flags(&bundle, &trusted);
        flags.push("--replay".into());
        if n < 2 {
            flags.extend(["--cluster-url".to_owned(), redis.url()]);
        }
        nodes.push(
            TestDaemon::builder(&node_dir)
                .args(flags)
                .in_process()
                .await,
        );
    }

    let expected = sorted(staging_entries());
    for (n, node) in nodes.iter().enumerate() {
        // What every rank of every node reads: the bundle, byte for byte.
        assert_eq!(
            sorted(scan_all(node, "").await),
            expected,
            "node {n}, no view"
        );
        assert_eq!(
            sorted(scan_all(node, "job-1").await),
            expected,
            "node {n}, in a view"
        );
        for blob in BLOBS {
            let (digest, len) = get_digest(&node.client().await, &blob.digest(), 10_000)
                .await
                .unwrap_or_else(|status| panic!("node {n}: blob {}: {status:?}", blob.digest()));
            assert_eq!((digest, len), (blob.digest(), blob.size), "node {n}");
        }
        let stats = node.stats().await;
        assert_eq!(
            (stats.bundles_loaded, stats.bundle_entries),
            (1, 200),
            "node {n}"
        );
        assert_eq!(stats.replay_bundled_entries, 200, "node {n}");
    }

    // A better Record of a bundled key merges into the cache, but the key still answers
    // the bundle's result.
    let bundled_key = key_in("trtllm", "gemm", "m=4", None);
    let better = entry(bundled_key.clone(), "{\"tactic\":999}", 0.5, "production");
    let recorded = nodes[0]
        .client()
        .await
        .record(vec![better])
        .await
        .expect("Record");
    assert_eq!(recorded.stored, 1, "the better result enters the cache");
    let bundled = expected
        .iter()
        .find(|entry| entry.key.as_ref() == Some(&bundled_key))
        .and_then(|entry| entry.result.clone());
    for (n, node) in nodes.iter().enumerate() {
        let answer = resolve(node, bundled_key.clone(), "job-2").await;
        assert_eq!(
            answer.outcome,
            Some(proto::resolve_response::Outcome::Hit(
                bundled.clone().unwrap()
            )),
            "node {n}"
        );
        let hits = node
            .client()
            .await
            .lookup(vec![bundled_key.clone()])
            .await
            .expect("Lookup");
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].result, bundled, "node {n}");
    }

    // A key in no bundle: answered at once, never a lease, listed in its view.
    let unknown = key_in("trtllm", "gemm", "m=100000", None);
    let started = Instant::now();
    let answer = resolve(&nodes[1], unknown.clone(), "job-3").await;
    let took = started.elapsed();
    assert_eq!(
        answer.outcome,
        Some(proto::resolve_response::Outcome::Miss(proto::Miss {
            reason: "replay: not in any bundle".into()
        }))
    );
    assert!(
        took < Duration::from_millis(50),
        "a replay miss took {took:?}"
    );
    let misses = nodes[1]
        .client()
        .await
        .raw()
        .list_misses(proto::ListMissesRequest {
            view: "job-3".into(),
        })
        .await
        .expect("ListMisses")
        .into_inner();
    assert_eq!(misses.views.len(), 1, "{misses:?}");
    assert_eq!(misses.views[0].view, "job-3");
    let listed: Vec<_> = misses.views[0]
        .keys
        .iter()
        .map(|missed| missed.key.clone())
        .collect();
    assert_eq!(listed, vec![Some(unknown)]);

    // The CLI lists the same, with its view; and what the node serves is the bundle.
    let socket = nodes[1].socket.clone();
    let bundle_arg = bundle.display().to_string();
    let listed = tokio::task::spawn_blocking(move || {
        let misses = cli(&socket, &["--json", "misses"]);
        let diff = cli(
            &socket,
            &[
                "--json",
                "--view",
                "job-4",
                "bundle",
                "diff",
                "live",
                &bundle_arg,
            ],
        );
        (misses, diff)
    })
    .await
    .unwrap();
    let (misses, diff) = listed;
    assert!(misses.status.success(), "{misses:?}");
    let misses: serde_json::Value = serde_json::from_slice(&misses.stdout).expect("misses --json");
    let text = misses.to_string();
    assert!(
        text.contains("job-3") && text.contains("m=100000"),
        "{text}"
    );
    assert!(
        diff.status.success(),
        "diff live against the bundle it serves: {diff:?}"
    );
    let diff: serde_json::Value = serde_json::from_slice(&diff.stdout).expect("diff --json");
    for side in ["only_in_a", "only_in_b", "different"] {
        assert_eq!(diff[side], serde_json::json!([]), "{side}: {diff}");
    }

    for (n, node) in nodes.iter().enumerate() {
        let stats = node.stats().await;
        assert_eq!(stats.leases_granted, 0, "node {n}: a lease was granted");
        assert_eq!(
            stats.tuner_jobs_done + stats.tuner_jobs_failed,
            0,
            "node {n}: a tuner ran"
        );
    }
    assert_eq!(nodes[1].stats().await.replay_misses, 1);
}

/// Starts `tunecached` with `flags` and returns how it ended and its log, within a minute.
fn start_refused(dir: &Path, flags: &[String]) -> (std::process::ExitStatus, String) {
    let log = dir.join("daemon.log");
    let mut child = std::process::Command::new(tunecache_integration::bin("tunecached"))
        .arg("--socket")
        .arg(dir.join("tunecache.sock"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(flags)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("daemon.err")).unwrap())
        .spawn()
        .expect("start tunecached");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tunecached with a bad bundle is still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default()
        + &std::fs::read_to_string(dir.join("daemon.err")).unwrap_or_default();
    (status, text)
}

#[test]
fn a_bundle_with_a_flipped_byte_or_an_untrusted_signer_stops_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let staging = signing_key(7);
    let good = dir.path().join("good.tcb");
    write_bundle(&good, staging_entries(), &BLOBS, Some(&staging));
    let trusted = public_pem(dir.path(), "staging.pub", &staging);
    let bytes = std::fs::read(&good).unwrap();

    // One byte flipped: in the header, the entries, a blob, the manifest and the trailer.
    let len = bytes.len();
    for at in [0, 20, len / 2, len - 300, len - 1] {
        let flipped = dir.path().join(format!("flipped-{at}.tcb"));
        let mut copy = bytes.clone();
        copy[at] ^= 0x01;
        std::fs::write(&flipped, copy).unwrap();
        let run = dir.path().join(format!("run-{at}"));
        std::fs::create_dir_all(&run).unwrap();
        let (status, log) = start_refused(&run, &bundle_flags(&flipped, &trusted));
        assert!(!status.success(), "byte {at} flipped: the daemon started");
        assert!(
            log.contains(&flipped.display().to_string()),
            "byte {at} flipped: the refusal does not name the file:\n{log}"
        );
    }

    // Unsigned, or signed by another key, while a trust key is given.
    let unsigned = dir.path().join("unsigned.tcb");
    write_bundle(&unsigned, staging_entries(), &BLOBS, None);
    let foreign = dir.path().join("foreign.tcb");
    write_bundle(&foreign, staging_entries(), &BLOBS, Some(&signing_key(9)));
    // Signed by the trusted key, whole, but holding an entry no Record could make: its
    // entries are checked as any learned result is.
    let mut entries = staging_entries();
    entries[3].result.as_mut().unwrap().config = "not json".into();
    let invalid = dir.path().join("invalid.tcb");
    write_bundle(&invalid, entries, &BLOBS, Some(&staging));
    for (name, bundle, says) in [
        ("unsigned", &unsigned, "unsigned"),
        ("foreign", &foreign, "not"),
        ("invalid", &invalid, "config"),
    ] {
        let run = dir.path().join(format!("run-{name}"));
        std::fs::create_dir_all(&run).unwrap();
        let (status, log) = start_refused(&run, &bundle_flags(bundle, &trusted));
        assert!(!status.success(), "a {name} bundle was served");
        let refusal = log
            .lines()
            .find(|line| line.contains(&bundle.display().to_string()))
            .unwrap_or_else(|| panic!("{name}: the refusal does not name the file:\n{log}"));
        assert!(refusal.contains(says), "{name}: {refusal}");
        eprintln!("{name}: {refusal}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replay_a_bundle_is_one_more_source_merged_by_the_usual_rule() {
    let dir = tempfile::tempdir().unwrap();
    let staging = signing_key(7);
    let bundle = dir.path().join("staging.tcb");
    write_bundle(&bundle, staging_entries(), &BLOBS, Some(&staging));
    let trusted = public_pem(dir.path(), "staging.pub", &staging);
    let node = TestDaemon::builder(dir.path())
        .args(bundle_flags(&bundle, &trusted))
        .in_process()
        .await;
    assert_eq!(sorted(scan_all(&node, "").await), sorted(staging_entries()));
    // A blob named by a bundled entry is served from the bundle when a rank asks.
    let (digest, _) = get_digest(&node.client().await, &BLOBS[0].digest(), 10_000)
        .await
        .expect("the bundle's blob");
    assert_eq!(digest, BLOBS[0].digest());
    assert_eq!(node.stats().await.artifact_fetches_bundle, 1);
    // And through the descriptor handoff, which a rank on the node takes first.
    let mut copy = Vec::new();
    let moved = node
        .client()
        .await
        .get_artifact(&BLOBS[1].digest(), &mut copy)
        .await
        .expect("the bundle's blob, handed");
    assert_eq!((moved, copy), (BLOBS[1].size, BLOBS[1].bytes()));
    let stats = node.stats().await;
    assert_eq!(
        (stats.artifact_fetches_bundle, stats.artifact_handoffs),
        (2, 1)
    );

    let bundled_key = key_in("triton", "gemm", "m=5", None);
    let better = entry(bundled_key.clone(), "{\"tactic\":1}", 0.5, "production");
    let worse = entry(
        key_in("triton", "gemm", "m=7", None),
        "{\"tactic\":1}",
        1e6,
        "production",
    );
    node.client()
        .await
        .record(vec![better.clone(), worse])
        .await
        .expect("Record");
    let hits = node
        .client()
        .await
        .lookup(vec![bundled_key, key_in("triton", "gemm", "m=7", None)])
        .await
        .expect("Lookup");
    assert_eq!(hits[0].result, better.result, "the better Record wins");
    assert_eq!(
        hits[1].result.as_ref().unwrap().time_us,
        17.0,
        "the bundle's better result stays"
    );
    // Without --replay a miss is an ordinary Resolve: this one is handed a lease.
    let answer = resolve(&node, key_in("triton", "gemm", "m=100000", None), "").await;
    assert!(
        matches!(
            answer.outcome,
            Some(proto::resolve_response::Outcome::TuneHere(_))
        ),
        "{answer:?}"
    );
}

/// `mib` MiB of content made from one 1 MiB block, stamped with `seed` and the block's
/// place, so that every blob differs and writing a GiB costs a memory copy per MiB.
fn write_blob(path: &Path, seed: u64, mib: usize) {
    use std::io::Write;
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut block: Vec<u8> = Vec::with_capacity(1 << 20);
    while block.len() < 1 << 20 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        block.extend_from_slice(&state.to_le_bytes());
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for place in 0..mib {
        block[..8].copy_from_slice(&seed.to_le_bytes());
        block[8..16].copy_from_slice(&(place as u64).to_le_bytes());
        file.write_all(&block).unwrap();
    }
    file.flush().unwrap();
}

/// The peak resident memory of the children this process has waited for (the CLI runs),
/// in bytes.
fn children_peak_rss_bytes() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        assert_eq!(
            libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()),
            0
        );
        usage.assume_init()
    };
    u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gib_of_artifacts_exports_and_starts_within_100_mb_of_an_idle_daemon() {
    const MIB: u64 = 1 << 20;
    const BLOBS: u64 = 4;
    const BLOB_MIB: usize = 256;
    let dir = tempfile::tempdir().unwrap();
    let idle_dir = dir.path().join("idle");
    std::fs::create_dir_all(&idle_dir).unwrap();
    let idle = TestDaemon::process(&idle_dir).await;
    let idle_rss = idle.peak_rss_bytes();

    // Staging: four blobs of 256 MiB, each named by an entry.
    let staging_dir = dir.path().join("staging");
    std::fs::create_dir_all(&staging_dir).unwrap();
    let staging = TestDaemon::process(&staging_dir).await;
    let client = staging.client().await;
    let mut entries = Vec::new();
    for n in 0..BLOBS {
        let path = dir.path().join(format!("blob-{n}"));
        write_blob(&path, n + 1, BLOB_MIB);
        let stored = client.put_artifact(&path).await.expect("PutArtifact");
        std::fs::remove_file(&path).unwrap();
        let artifact = proto::Artifact {
            name: "kernel.bin".into(),
            sha256: stored.sha256,
            size: stored.size,
        };
        let key = key_in("big", "gemm", &format!("m={n}"), None);
        entries.push(with_artifacts(
            entry(key, "{}", 1.0, "staging"),
            vec![artifact],
        ));
    }
    client.record(entries).await.expect("Record");

    let bundle = dir.path().join("big.tcb");
    let (socket, out) = (staging.socket.clone(), bundle.display().to_string());
    let export =
        tokio::task::spawn_blocking(move || cli(&socket, &["bundle", "export", "--out", &out]))
            .await
            .unwrap();
    assert!(export.status.success(), "{export:?}");
    let export_rss = children_peak_rss_bytes();
    let staging_rss = staging.peak_rss_bytes();

    // Production: starts on the bundle, verifying every byte of it.
    let production_dir = dir.path().join("production");
    std::fs::create_dir_all(&production_dir).unwrap();
    let production = TestDaemon::builder(&production_dir)
        .args([
            "--bundle".to_owned(),
            bundle.display().to_string(),
            "--replay".to_owned(),
        ])
        .process()
        .await;
    assert_eq!(production.stats().await.bundle_entries, BLOBS);
    let production_rss = production.peak_rss_bytes();

    let limit = idle_rss + 100 * MIB;
    let shown = |bytes: u64| format!("{:.1} MiB", bytes as f64 / MIB as f64);
    for (what, rss) in [
        ("the export (the CLI)", export_rss),
        ("the staging daemon (uploads and export)", staging_rss),
        ("the daemon starting on the bundle", production_rss),
    ] {
        eprintln!(
            "{what}: peak RSS {} (idle daemon {})",
            shown(rss),
            shown(idle_rss)
        );
        assert!(
            rss < limit,
            "{what}: peak RSS {} against an idle daemon's {}",
            shown(rss),
            shown(idle_rss)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaying_daemon_with_no_bundle_answers_from_its_cache_at_once_and_never_leases() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestDaemon::builder(dir.path())
        .arg("--replay")
        .in_process()
        .await;
    let cached = key_in("trtllm", "gemm", "m=1", None);
    let tuned = entry(cached.clone(), "{\"tactic\":1}", 3.0, "production");
    node.client()
        .await
        .record(vec![tuned.clone()])
        .await
        .expect("Record");
    let answer = resolve(&node, cached, "").await;
    assert_eq!(
        answer.outcome,
        Some(proto::resolve_response::Outcome::Hit(tuned.result.unwrap()))
    );
    let started = Instant::now();
    let answer = resolve(&node, key_in("trtllm", "gemm", "m=2", None), "").await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the miss waited"
    );
    assert_eq!(
        answer.outcome,
        Some(proto::resolve_response::Outcome::Miss(proto::Miss {
            reason: "replay: not in any bundle".into()
        }))
    );
    let stats = node.stats().await;
    assert_eq!((stats.leases_granted, stats.replay_misses), (0, 1));
}
