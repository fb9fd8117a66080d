//! Bundles against a real daemon (issue 52, test 1): `tunecache bundle export` of 200 entries
//! in two namespaces, two of them naming artifacts, is byte-identical when run twice; `inspect`
//! counts what it holds, `verify` passes it and fails it once a byte is flipped or when the
//! trusted key is another's; `diff` reports exactly the one entry two bundles differ in.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use tunecache_bundle::ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use tunecache_bundle::ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use tunecache_bundle::ed25519_dalek::SigningKey;
use tunecache_client::{proto, Client};
use tunecache_integration::blobs::Content;
use tunecache_integration::{bin, entry, key_in, with_artifacts, TestDaemon};

const ENTRIES: usize = 200;
/// The bundles' creation time: the same in every export, so that they can be byte-identical.
const SOURCE_DATE_EPOCH: &str = "1700000000";

/// `tunecache ARGS` against `daemon`, with a fixed creation time for exports, and in no view
/// whatever the environment says (a view would pin the first answers the test reads and hide
/// the better result it records later).
fn tunecache(daemon: &TestDaemon, args: &[&str]) -> Output {
    Command::new(bin("tunecache"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(args)
        .env("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)
        .env("TUNECACHE_VIEW", "")
        .output()
        .expect("run the tunecache CLI")
}

fn succeeds(daemon: &TestDaemon, args: &[&str]) -> String {
    let output = tunecache(daemon, args);
    assert!(
        output.status.success(),
        "tunecache {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

/// Uploads `content` through the client, as a tuner does before it Records.
async fn upload(client: &Client, content: Content, name: &str) -> proto::Artifact {
    let stored = client
        .put_artifact_reader(std::io::Cursor::new(content.bytes()))
        .await
        .expect("PutArtifact");
    stored.named(name).expect("a valid name")
}

/// Writes an Ed25519 key pair made from `seed`: the private key (chmod 600) and the public one.
fn key_pair(dir: &Path, name: &str, seed: u8) -> (String, String) {
    use std::os::unix::fs::PermissionsExt;
    let key = SigningKey::from_bytes(&[seed; 32]);
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub"));
    let pem = key.to_pkcs8_pem(LineEnding::LF).expect("PKCS#8 PEM");
    std::fs::write(&private, pem.as_bytes()).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .expect("SPKI PEM");
    std::fs::write(&public, pem).unwrap();
    (path_arg(&private), path_arg(&public))
}

/// A daemon in a new temporary directory (its state in `node/`), and a client of it.
async fn started() -> (tempfile::TempDir, TestDaemon, Client) {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    std::fs::create_dir(&node).unwrap();
    let daemon = TestDaemon::process(&node).await;
    let client = daemon.client().await;
    (dir, daemon, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_bundle_is_reproducible_verified_and_compared() {
    let (dir, daemon, client) = started().await;
    let kernel = upload(&client, Content::new(52, 300_000), "kernel.cubin").await;
    let module = upload(&client, Content::new(53, 4_096), "module.so").await;
    let mut entries: Vec<proto::Entry> = (0..ENTRIES)
        .map(|i| {
            let namespace = if i % 3 == 0 { "bitblas" } else { "trtllm" };
            let key = key_in(namespace, "gemm", &format!("m={i}"), None);
            entry(
                key,
                &format!("{{\"tactic\":{i}}}"),
                10.0 + i as f64,
                "staging",
            )
        })
        .collect();
    entries[0] = with_artifacts(entries[0].clone(), vec![kernel.clone()]);
    entries[1] = with_artifacts(entries[1].clone(), vec![kernel, module]);
    let recorded = client.record(entries.clone()).await.expect("Record");
    assert_eq!(recorded.stored, ENTRIES as u32);

    let a = path_arg(&dir.path().join("a.tcb"));
    let again = path_arg(&dir.path().join("again.tcb"));
    succeeds(&daemon, &["bundle", "export", "--out", &a]);
    succeeds(&daemon, &["bundle", "export", "--out", &again]);
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&again).unwrap(),
        "two exports of the same cache differ"
    );
    // Nothing left behind beside the bundles: the artifacts' and the bundle's temporary files
    // are gone.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.tcb", "again.tcb", "node"]);

    let shown: Value =
        serde_json::from_str(&succeeds(&daemon, &["bundle", "inspect", &a, "--json"]))
            .expect("inspect --json prints JSON");
    assert_eq!(shown["entries"], ENTRIES);
    assert_eq!(shown["artifacts"], 2);
    assert_eq!(shown["artifact_bytes"], 300_000 + 4_096);
    assert_eq!(
        shown["namespaces"],
        serde_json::json!(["bitblas", "trtllm"])
    );
    assert_eq!(shown["verified"], true);
    assert_eq!(shown["signer"], Value::Null);
    succeeds(&daemon, &["bundle", "verify", &a]);

    // One flipped byte in the middle of the file (an artifact's compressed bytes, or the
    // entries'): verify fails, naming the part.
    let mut bytes = std::fs::read(&a).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    let flipped = path_arg(&dir.path().join("flipped.tcb"));
    std::fs::write(&flipped, &bytes).unwrap();
    let output = tunecache(&daemon, &["bundle", "verify", &flipped]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("part \""), "{stderr}");
    let output = tunecache(&daemon, &["bundle", "inspect", &flipped]);
    assert_eq!(output.status.code(), Some(1));

    // A better result for one key: the next bundle differs from the first in that entry only.
    let better = entry(
        key_in("trtllm", "gemm", "m=7", None),
        "{\"tactic\":700}",
        1.5,
        "staging",
    );
    assert_eq!(client.record(vec![better]).await.unwrap().stored, 1);
    let b = path_arg(&dir.path().join("b.tcb"));
    succeeds(&daemon, &["bundle", "export", "--out", &b]);
    let output = tunecache(&daemon, &["bundle", "diff", &a, &b, "--json"]);
    assert_eq!(output.status.code(), Some(1), "the bundles differ");
    let found: Value = serde_json::from_slice(&output.stdout).expect("diff --json prints JSON");
    assert_eq!(found["only_in_a"], serde_json::json!([]));
    assert_eq!(found["only_in_b"], serde_json::json!([]));
    let different = found["different"].as_array().expect("a list");
    assert_eq!(different.len(), 1, "{found}");
    assert_eq!(different[0]["key"]["problem"], "m=7");
    assert_eq!(
        different[0]["fields"],
        serde_json::json!(["config", "time_us"])
    );
    // The second bundle is what the daemon serves now.
    succeeds(&daemon, &["bundle", "diff", &b, "live"]);

    // Signed: verified with the signer's key, refused with another's.
    let (private, public) = key_pair(dir.path(), "staging", 7);
    let (_, other) = key_pair(dir.path(), "other", 8);
    let signed = path_arg(&dir.path().join("signed.tcb"));
    succeeds(
        &daemon,
        &["bundle", "export", "--out", &signed, "--sign-key", &private],
    );
    succeeds(
        &daemon,
        &["bundle", "verify", &signed, "--trust-key", &public],
    );
    let output = tunecache(
        &daemon,
        &["bundle", "verify", &signed, "--trust-key", &other],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not by a trusted key"), "{stderr}");
    // An unsigned bundle is refused once keys are trusted.
    let output = tunecache(&daemon, &["bundle", "verify", &a, "--trust-key", &public]);
    assert_eq!(output.status.code(), Some(1));
}

/// Exports filtered by namespace and op hold only those entries, and `misses` against a
/// daemon that does not answer ListMisses yet says so instead of failing obscurely.
#[tokio::test]
async fn an_export_holds_only_the_entries_its_filter_selects() {
    let (dir, daemon, client) = started().await;
    let entries = vec![
        entry(key_in("trtllm", "gemm", "a", None), "{}", 1.0, "t"),
        entry(key_in("trtllm", "moe", "a", None), "{}", 1.0, "t"),
        entry(key_in("bitblas", "gemm", "a", Some(3)), "{}", 1.0, "t"),
        entry(key_in("flashinfer", "gemm", "a", None), "{}", 1.0, "t"),
    ];
    client.record(entries).await.expect("Record");
    let out = path_arg(&dir.path().join("some.tcb"));
    let args = [
        "bundle",
        "export",
        "--out",
        &out,
        "--namespace",
        "trtllm",
        "--namespace",
        "bitblas",
        "--op",
        "gemm",
        "--json",
    ];
    let written: Value = serde_json::from_str(&succeeds(&daemon, &args)).unwrap();
    assert_eq!(written["entries"], 2, "{written}");
    assert_eq!(
        written["namespaces"],
        serde_json::json!(["bitblas", "trtllm"])
    );
    let output = tunecache(&daemon, &["misses"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        assert!(
            stderr.contains("ListMisses"),
            "misses failed without naming the call: {stderr}"
        );
    }
}
