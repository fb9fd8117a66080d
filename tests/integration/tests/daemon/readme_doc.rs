//! README.md's CLI quick start stays true: its ```sh block runs as written, in bash, from a
//! directory where `./target/release/tunecache` is the CLI just built, against a real daemon
//! named by `TUNECACHE_SOCKET` (in-process), and each command's output is checked.

use std::process::Command;

use tunecache_integration::{bin, sh_blocks, TestDaemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_cli_quick_start_works() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = readme
        .split("## Quick start with the CLI")
        .nth(1)
        .expect("README has a CLI quick start");
    let block = sh_blocks(section)
        .into_iter()
        .next()
        .expect("an sh block in the quick start");
    assert!(
        block.contains("alias tc=./target/release/tunecache"),
        "{block}"
    );

    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::in_process(dir.path()).await;
    let release = dir.path().join("checkout/target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(bin("tunecache"), release.join("tunecache")).unwrap();
    // The file the quick start puts beside a result.
    let kernel = b"a compiled kernel, as the quick start's ./build/matmul.cubin".repeat(1000);
    std::fs::create_dir_all(dir.path().join("checkout/build")).unwrap();
    std::fs::write(dir.path().join("checkout/build/matmul.cubin"), &kernel).unwrap();

    // Each command's output after a marker line, so every one is checked on its own.
    let mut script = String::from("set -euo pipefail\nshopt -s expand_aliases\n");
    // One command per line once continuation lines are joined.
    for (index, line) in block.replace("\\\n", " ").lines().enumerate() {
        script.push_str(&format!("echo '=== {index}'\n{line}\n"));
    }
    let output = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path().join("checkout"))
        .env("TUNECACHE_SOCKET", &daemon.socket)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the quick start failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        "stored",
        r#"bitblas/matmul [NVIDIA H200|sm_90] M=1,N=1024,K=1024,f16,nt (shared): {"block":[128,128,32]} in 41.500 us"#,
        r#""problem":"M=1,N=1024,K=1024,f16,nt""#,
        "tune here: lease ",
        "cpu|",
        "entries      2 (lookups 2: 2 hits, 0 misses; 2 records)",
        "artifacts: kernel.cubin",
    ] {
        assert!(
            stdout.contains(expected),
            "`{expected}` missing from the quick start's output:\n{stdout}"
        );
    }
    // `get --artifacts-to ./kernels` wrote the file, byte for byte.
    let fetched = std::fs::read(dir.path().join("checkout/kernels/kernel.cubin")).unwrap();
    assert!(
        fetched == kernel,
        "the fetched kernel differs from the one put"
    );
}
