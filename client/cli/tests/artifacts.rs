//! Owns the CLI's artifact tests against the real daemon (issue 36): `put --artifact NAME=PATH`
//! uploads each file and Records the result naming it, `get` shows the artifacts and
//! `get --artifacts-to DIR` writes them, verified, and a name the contract refuses is refused
//! before anything is stored. The daemon is `tunecached` next to the CLI in the target
//! directory (or in `$TUNECACHE_BIN_DIR`); without it the tests are skipped, except under CI.

use std::process::{Command, Output};

use serde_json::Value;

mod common;
use common::{start_daemon, Daemon};

/// The CLI against `daemon`, reading in no view.
fn cli(daemon: &Daemon, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tunecache"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(args)
        .env("TUNECACHE_VIEW", "")
        .output()
        .expect("run tunecache")
}

/// The CLI's stdout, after asserting it succeeded.
fn cli_ok(daemon: &Daemon, args: &[&str]) -> String {
    let output = cli(daemon, args);
    assert!(
        output.status.success(),
        "tunecache {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const KEY: [&str; 8] = [
    "--namespace",
    "clitest",
    "--op",
    "kernel",
    "--device",
    "cpu|clitest",
    "--problem",
    "p1",
];

fn with_key<'a>(command: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![command];
    args.extend(KEY);
    args.extend(extra);
    args
}

#[test]
fn put_uploads_artifacts_and_get_writes_them_verified() {
    let Some(daemon) = start_daemon("artifacts") else {
        return;
    };
    let files = daemon.dir.join("built");
    std::fs::create_dir_all(&files).unwrap();
    // More than one chunk (1 MiB), and an empty file.
    let kernel: Vec<u8> = (0..(1 << 20) + 4097).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(files.join("k.cubin"), &kernel).unwrap();
    std::fs::write(files.join("empty"), b"").unwrap();
    let kernel_arg = format!("kernel.cubin={}", files.join("k.cubin").display());
    let empty_arg = format!("notes.txt={}", files.join("empty").display());

    // A name the contract refuses stops the command before anything is uploaded or stored.
    let bad_arg = format!("../escape={}", files.join("k.cubin").display());
    let refused = cli(
        &daemon,
        &with_key(
            "put",
            &[
                "--config",
                r#"{"b":1}"#,
                "--time-us",
                "5",
                "--artifact",
                &bad_arg,
            ],
        ),
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("../escape"), "{stderr}");
    assert!(
        !cli(&daemon, &with_key("get", &[])).status.success(),
        "nothing was stored"
    );

    let put = cli_ok(
        &daemon,
        &with_key(
            "put",
            &[
                "--config",
                r#"{"b":1}"#,
                "--time-us",
                "5",
                "--artifact",
                &kernel_arg,
                "--artifact",
                &empty_arg,
            ],
        ),
    );
    assert_eq!(put.trim(), "stored");

    let mut args = vec!["--json"];
    args.extend(with_key("get", &[]));
    let hit: Value = serde_json::from_str(&cli_ok(&daemon, &args)).expect("get --json");
    let artifacts = hit["result"]["artifacts"].as_array().expect("artifacts");
    // In name order, as the daemon keeps them.
    let names: Vec<&str> = artifacts
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kernel.cubin", "notes.txt"]);
    assert_eq!(artifacts[0]["size"], kernel.len() as u64);
    assert_eq!(artifacts[1]["size"], 0);
    assert_eq!(artifacts[0]["sha256"].as_str().unwrap().len(), 64);
    let text = cli_ok(&daemon, &with_key("get", &[]));
    assert!(text.contains("artifacts: kernel.cubin"), "{text}");

    let out = daemon.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let out_arg = out.display().to_string();
    let mut args = vec!["--json"];
    args.extend(with_key("get", &["--artifacts-to", &out_arg]));
    let fetched: Value = serde_json::from_str(&cli_ok(&daemon, &args)).expect("get --json");
    assert_eq!(
        fetched["written"].as_array().map(Vec::len),
        Some(2),
        "{fetched}"
    );
    assert_eq!(std::fs::read(out.join("kernel.cubin")).unwrap(), kernel);
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"");
    // Only the files: no temporary file is left behind.
    let mut left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["kernel.cubin", "notes.txt"]);

    // A directory that does not exist yet is made, as `mkdir -p` would.
    let missing = daemon.dir.join("no-such-dir/below");
    let missing_arg = missing.display().to_string();
    assert!(
        cli(&daemon, &with_key("get", &["--artifacts-to", &missing_arg]))
            .status
            .success()
    );
    assert!(missing.join("kernel.cubin").is_file());
}

/// The Rust client's own calls against the same daemon: an upload from a reader, a stream into
/// any writer, StatArtifacts, and an upload whose digest is not its content's.
#[test]
fn the_client_streams_blobs_from_readers_into_writers() {
    let Some(daemon) = start_daemon("artifacts-client") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let client = tunecache_client::Client::connect(&daemon.socket)
            .await
            .expect("connect");
        let content: Vec<u8> = (0..3 * (1 << 20) / 2).map(|i| (i % 253) as u8).collect();
        let stored = client
            .put_artifact_reader(std::io::Cursor::new(content.clone()))
            .await
            .expect("upload from a reader");
        assert_eq!(stored.size, content.len() as u64);
        assert!(!stored.already_held);

        let mut back = Vec::new();
        let size = client
            .get_artifact(&stored.sha256, &mut back)
            .await
            .expect("GetArtifact");
        assert_eq!(size, content.len() as u64);
        assert_eq!(back, content);

        let never = "0".repeat(64);
        let missing = client
            .stat_artifacts(vec![stored.sha256.clone(), never.clone()])
            .await
            .expect("StatArtifacts");
        assert_eq!(missing, std::slice::from_ref(&never));
        // A digest that is not one is refused before it is sent.
        assert!(matches!(
            client.stat_artifacts(vec!["ABC".into()]).await,
            Err(tunecache_client::ClientError::Artifact(_))
        ));

        // Bytes that do not hash to the digest announced: the daemon refuses them.
        let file = std::fs::File::open(daemon.dir.join("daemon.log")).expect("a file");
        let length = file.metadata().expect("metadata").len();
        let refused = client
            .put_artifact_with_digest(&never, length, file)
            .await
            .expect_err("a wrong digest");
        match refused {
            tunecache_client::ClientError::Rpc(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}")
            }
            other => panic!("{other}"),
        }
        assert_eq!(
            client
                .stat_artifacts(vec![never])
                .await
                .expect("stat")
                .len(),
            1
        );
    });
}
