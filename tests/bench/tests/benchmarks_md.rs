//! BENCHMARKS.md's tables are the rendering of the raw outputs they name: `tunecache-bench
//! report --check` finds no table that differs from its source (a hand edit of a figure, or a
//! rerun whose output was committed without `tunecache-bench report`, fails here).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn benchmarks_md_tables_match_their_sources() {
    let markdown = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../BENCHMARKS.md");
    let output = Command::new(env!("CARGO_BIN_EXE_tunecache-bench"))
        .args(["report", "--check"])
        .arg(&markdown)
        .output()
        .expect("run tunecache-bench report --check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Every question of the report has a generated table; only multinode may lack its source.
    for kind in [
        "single-node",
        "shared-filesystem",
        "cluster",
        "segments",
        "data-path",
        "python-ranks",
        "memory",
        "views",
        "artifacts",
    ] {
        assert!(
            stderr.contains(&format!("{kind} <- ")),
            "no {kind} table in BENCHMARKS.md: {stderr}"
        );
    }
    for line in stderr
        .lines()
        .filter(|line| line.contains("source missing"))
    {
        assert!(line.starts_with("multinode <- "), "{line}");
    }
}
