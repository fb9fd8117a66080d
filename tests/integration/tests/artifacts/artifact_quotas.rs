//! The artifact store's bounds against real daemons and real uids: the blobs a uid's live
//! entries name are charged to that uid (`--artifact-store-mib-per-uid`), so one uid that
//! fills its share is refused while another still uploads and fetches; blobs fetched from a
//! tier stay within `--artifact-store-mib`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use tonic::Code;
use tunecache_integration::blobs::{self, Content};
use tunecache_integration::{
    bin, entry, require_root, require_tool, shared_node, test_key, with_artifacts, TestDaemon,
};

const MIB: u64 = 1024 * 1024;
/// The attacker and the bystander of issue 50: allowed uids, neither an administrator.
const ATTACKER: u32 = 65534;
const BYSTANDER: u32 = 4332;

/// The CLI on `socket` as `uid` (no groups).
fn cli_as(setpriv: &Path, uid: u32, socket: &Path, args: &[&str]) -> Output {
    Command::new(setpriv)
        .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string()])
        .args(["--clear-groups", "--"])
        .arg(bin("tunecache"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

/// `tunecache put` of problem `problem` naming the file `path` as `k.so`, as `uid`.
fn put_as(setpriv: &Path, uid: u32, socket: &Path, problem: &str, path: &Path) -> Output {
    let artifact = format!("k.so={}", path.display());
    cli_as(
        setpriv,
        uid,
        socket,
        &[
            "put",
            "--namespace",
            "test",
            "--op",
            "matmul",
            "--device",
            "test-device",
            "--problem",
            problem,
            "--config",
            "{}",
            "--time-us",
            "1",
            "--artifact",
            &artifact,
        ],
    )
}

/// Writes `content` to `path`, readable by every uid.
fn write_readable(path: &Path, content: Content) {
    std::fs::write(path, content.bytes()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Issue 50, finding 4: with `--artifact-store-mib 64` and the default share (a quarter, as
/// other uids are allowed), the attacker's entries name four 4 MiB blobs and its fifth and
/// sixth uploads are refused RESOURCE_EXHAUSTED naming `--artifact-store-mib-per-uid`; the
/// bystander still uploads, records and fetches, its own blobs and the attacker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_past_its_share_is_refused_while_another_uid_still_uploads_and_fetches() {
    if !require_root("acting as other uids") {
        return;
    }
    let Some(setpriv) = require_tool("setpriv", None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    std::fs::create_dir(&node).unwrap();
    let allowed = format!("{ATTACKER},{BYSTANDER}");
    let daemon = TestDaemon::builder(&node)
        .args(["--allow-uid", &allowed, "--artifact-store-mib", "64"])
        .process()
        .await;
    for open in [dir.path(), node.as_path()] {
        std::fs::set_permissions(open, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for socket in [
        daemon.socket.clone(),
        tunecache_proto::handoff::socket_path(&daemon.socket),
    ] {
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    }

    let mut refusals = Vec::new();
    for i in 0..6u64 {
        let file = dir.path().join(format!("attack-{i}.so"));
        write_readable(&file, Content::new(500 + i, 4 * MIB));
        let output = put_as(
            &setpriv,
            ATTACKER,
            &daemon.socket,
            &format!("attack-{i}"),
            &file,
        );
        if !output.status.success() {
            refusals.push((i, String::from_utf8_lossy(&output.stderr).into_owned()));
        }
    }
    let refused_at: Vec<u64> = refusals.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        refused_at,
        [4, 5],
        "four 4 MiB blobs fill a 16 MiB share: {refusals:?}"
    );
    for (_, stderr) in &refusals {
        assert!(
            stderr.contains("ResourceExhausted") || stderr.contains("RESOURCE_EXHAUSTED"),
            "{stderr}"
        );
        assert!(stderr.contains("--artifact-store-mib-per-uid"), "{stderr}");
    }

    // The bystander is not held to the attacker's share: it uploads and records two blobs
    // and fetches one of its own and one of the attacker's.
    let out = dir.path().join("bystander-out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::chown(&out, Some(BYSTANDER), Some(BYSTANDER)).unwrap();
    let own = Content::new(600, 4 * MIB);
    for (i, content) in [own, Content::new(601, 4 * MIB)].into_iter().enumerate() {
        let file = dir.path().join(format!("bystander-{i}.so"));
        write_readable(&file, content);
        let output = put_as(
            &setpriv,
            BYSTANDER,
            &daemon.socket,
            &format!("b-{i}"),
            &file,
        );
        assert!(
            output.status.success(),
            "the bystander's upload {i}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for (problem, content) in [("b-0", own), ("attack-0", Content::new(500, 4 * MIB))] {
        let to = out.join(problem);
        std::fs::create_dir(&to).unwrap();
        std::os::unix::fs::chown(&to, Some(BYSTANDER), Some(BYSTANDER)).unwrap();
        let to_arg = to.display().to_string();
        let output = cli_as(
            &setpriv,
            BYSTANDER,
            &daemon.socket,
            &[
                "get",
                "--namespace",
                "test",
                "--op",
                "matmul",
                "--device",
                "test-device",
                "--problem",
                problem,
                "--artifacts-to",
                &to_arg,
            ],
        );
        assert!(
            output.status.success(),
            "the bystander's fetch of {problem}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            std::fs::read(to.join("k.so")).unwrap() == content.bytes(),
            "the bytes of {problem} differ"
        );
    }

    let stats = daemon.stats().await;
    assert_eq!(
        (
            stats.artifact_store_bytes_per_uid,
            stats.artifact_bytes_over_uid_store_limit,
            stats.artifact_bytes_over_store_limit,
            stats.artifact_blobs_held,
        ),
        (16 * MIB, 2 * 4 * MIB, 0, 6)
    );
    // Logged once, naming the uid.
    let log = daemon.log();
    let logged: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("refused an upload over --artifact-store-mib-per-uid"))
        .collect();
    assert_eq!(logged.len(), 1, "{log}");
    assert!(logged[0].contains(&format!("uid={ATTACKER}")), "{log}");

    // A Forget of one of its entries ends that entry's charge (the Forget starts a collection
    // scan at once): the attacker uploads again.
    let forgot = cli_as(
        &setpriv,
        ATTACKER,
        &daemon.socket,
        &[
            "forget",
            "--namespace",
            "test",
            "--op",
            "matmul",
            "--device",
            "test-device",
            "--problem",
            "attack-0",
            "--only-if-config",
            "{}",
            "--only-if-time-us",
            "1",
        ],
    );
    assert!(
        forgot.status.success(),
        "{}",
        String::from_utf8_lossy(&forgot.stderr)
    );
    let again = dir.path().join("attack-again.so");
    write_readable(&again, Content::new(510, 4 * MIB));
    tunecache_integration::eventually(
        tunecache_integration::FACT_LIMIT,
        "the attacker's Forget frees its share",
        || async {
            let output = put_as(&setpriv, ATTACKER, &daemon.socket, "attack-again", &again);
            output.status.success()
        },
    )
    .await;
}

/// A node whose entries (from the shared directory) name more than its store holds fetches
/// blobs until the store is full and then refuses, RESOURCE_EXHAUSTED naming
/// `--artifact-store-mib`: every blob it holds is named by a live entry, so none may go.
#[tokio::test]
async fn blobs_fetched_from_a_tier_stay_within_the_store_bound() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let a = shared_node(&dir.path().join("a"), &shared, "node-a", 3600, &[])
        .in_process()
        .await;
    let b = shared_node(
        &dir.path().join("b"),
        &shared,
        "node-b",
        3600,
        &["--artifact-store-mib", "8"],
    )
    .in_process()
    .await;
    let (ca, cb) = (a.client().await, b.client().await);
    let contents: Vec<Content> = (0..3).map(|i| Content::new(700 + i, 3 * MIB)).collect();
    for (i, content) in contents.iter().enumerate() {
        blobs::put(&ca, *content).await.unwrap();
        ca.record(vec![with_artifacts(
            entry(test_key("matmul", &format!("tier-{i}")), "{}", 1.0, "test"),
            vec![content.artifact("k.so")],
        )])
        .await
        .unwrap();
    }
    ca.snapshot().await.expect("a publishes");
    cb.snapshot().await.expect("b loads");
    for content in &contents[..2] {
        let got = blobs::get_digest(&cb, &content.digest(), 0)
            .await
            .expect("fits in b's store");
        assert_eq!(got, (content.digest(), content.size));
    }
    let refused = blobs::get_digest(&cb, &contents[2].digest(), 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--artifact-store-mib"),
        "{refused:?}"
    );
    let stats = b.stats().await;
    assert_eq!(
        (
            stats.artifact_bytes_held,
            stats.artifact_fetches_shared_dir,
            stats.artifact_fetches_over_store_limit
        ),
        (6 * MIB, 2, 1)
    );
    assert!(stats.artifact_bytes_held <= stats.artifact_store_bytes);
}
