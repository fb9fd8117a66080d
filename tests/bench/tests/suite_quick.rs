//! End-to-end check of `tunecache-bench suite --quick` through the real binaries (daemon,
//! rank processes, slowfs when /dev/fuse exists, the Python client when its venv exists):
//! every output file is written and every expected row is present with finite numbers, and
//! the results render as the BENCHMARKS.md tables (`tunecache-bench report --table`).
//! With the client's venv present the Python ranks run too (`--python`), and every rank of every
//! system must load the shared entries and its own, no more. No timing assertions: the quick suite judges nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The daemon and slowfs belong to other packages, which `cargo test -p tunecache-bench`
/// does not build: build them into the same target directory (a no-op when up to date).
fn build_other_binaries() {
    if std::env::var_os("TUNECACHE_BIN_DIR").is_some() {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.args([
        "build",
        "--bins",
        "-p",
        "tunecache-server",
        "-p",
        "tunecache-slowfs",
    ]);
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let status = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build");
    assert!(status.success(), "building tunecached and slowfs failed");
}

fn number(value: &Value, field: &str) -> f64 {
    let number = value
        .get(field)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{field} missing or not a number in {value}"));
    assert!(number.is_finite(), "{field} is not finite in {value}");
    number
}

fn array<'a>(value: &'a Value, field: &str) -> &'a Vec<Value> {
    value
        .get(field)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{field} missing or not an array"))
}

fn check_outputs(out: &Path, python: bool) {
    let text = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let results: Value = serde_json::from_str(&text).expect("results.json is JSON");
    let settings = &results["settings"];
    let ranks = array(settings, "ranks");
    let filesystems = array(settings, "filesystems").len();
    let skipped = array(settings, "filesystems_skipped").len();
    if Path::new("/dev/fuse").exists() {
        assert_eq!(skipped, 0, "slowfs skipped: {settings}");
    }
    let scenarios = array(&results, "scenarios");
    let systems = array(settings, "systems").len();
    assert_eq!(systems, if python { 5 } else { 3 }, "{settings}");
    assert_eq!(
        scenarios.len(),
        (filesystems - skipped) * ranks.len() * systems,
        "one row per filesystem x R x system"
    );
    for row in scenarios {
        for field in [
            "wall_ms",
            "cache_ms_median",
            "cache_ms_worst",
            "load_ms_median",
            "save_ms_median",
            "bytes_written",
        ] {
            number(row, field);
        }
        assert!(number(row, "wall_ms") > 0.0, "{row}");
        assert!(number(row, "bytes_written") > 0.0, "nothing written: {row}");
        assert_eq!(row["failures"], 0, "{row}");
        assert_eq!(row["timed_out"], false, "{row}");
        assert_eq!(row["ranks_done"], row["ranks"], "{row}");
        assert!(number(row, "entries_loaded_min") > 0.0, "{row}");
        if row["system"] == "tunecache" || row["system"] == "tunecache-py" {
            assert!(row["snapshot"].is_object(), "{row}");
            assert!(row["snapshot"]["final_snapshot_error"].is_null(), "{row}");
        }
    }
    let mut expected = vec!["filelock-before", "filelock-after", "tunecache"];
    if python {
        expected.extend(["filelock-py-before", "tunecache-py"]);
    }
    for system in expected {
        assert!(
            scenarios.iter().any(|row| row["system"] == system),
            "no {system} rows"
        );
    }
    if python {
        let python_floor = &results["python_floor"];
        let by_ranks = array(python_floor, "by_ranks");
        assert_eq!(by_ranks.len(), ranks.len(), "{python_floor}");
        for parse in by_ranks {
            for field in ["scan_parse_ms", "scan_view_ms", "file_parse_ms"] {
                assert!(number(parse, field) > 0.0, "{field}: {parse}");
            }
            assert!(number(parse, "scan_bytes") > 0.0, "{parse}");
            assert_eq!(parse["file_entries"], settings["existing"], "{parse}");
        }
        // Every rank, Rust or Python, file or daemon, loads the shared entries and its own:
        // what rank 0's Scan holds (one fewer for a rank without a remainder entry), plus at
        // most the new shared entries of ranks that saved before it loaded.
        let new_shared =
            (number(settings, "new_entries") * number(settings, "shared_fraction")).round();
        for row in scenarios {
            let parse = by_ranks
                .iter()
                .find(|parse| parse["ranks"] == row["ranks"])
                .expect("python floor for every R");
            let view = number(parse, "view_entries");
            let (fewest, most) = (
                number(row, "entries_loaded_min"),
                number(row, "entries_loaded_max"),
            );
            assert!(
                view - 1.0 <= fewest && most <= view + new_shared,
                "{row}: loaded {fewest}..{most}, expected {}..{}",
                view - 1.0,
                view + new_shared
            );
        }
    } else {
        assert!(results["python_floor"].is_null());
    }
    let floor = &results["floor"];
    number(floor, "parse_ms_median");
    assert_eq!(array(floor, "floor_ms_by_ranks").len(), ranks.len());

    let micro = &results["micro"];
    let lookup = &micro["lookup"];
    for latency in [&lookup["single_key"], &lookup["batch_1000"]] {
        assert!(number(latency, "samples") > 0.0);
        number(latency, "p50_us");
        number(latency, "p99_us");
    }
    let throughput = array(lookup, "throughput");
    assert_eq!(throughput.len(), 6, "1/8/32 clients x single key/batch");
    for row in throughput {
        assert!(number(row, "keys_per_s") > 0.0, "{row}");
    }
    let python = &micro["python_scan"];
    if python["skipped"].is_null() {
        assert!(number(python, "runs") > 0.0);
        number(python, "median_ms");
    } else {
        eprintln!("python scan skipped: {}", python["skipped"]);
    }
    let snapshots = array(micro, "snapshots");
    assert_eq!(snapshots.len(), 2);
    for scale in snapshots {
        for field in [
            "file_bytes",
            "write_ms",
            "write_peak_rss_mib",
            "load_ms",
            "load_peak_rss_mib",
            "rss_per_100k_mib",
        ] {
            number(scale, field);
        }
    }
    let pickups = array(micro, "peer_pickup");
    assert!(!pickups.is_empty());
    for pickup in pickups {
        assert_eq!(pickup["missed"], 0, "{pickup}");
        number(pickup, "median_ms");
    }

    let markdown = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    for heading in [
        "## Scenario matrix",
        "## Parse floor",
        "## Lookup",
        "## Snapshots",
    ] {
        assert!(markdown.contains(heading), "results.md lacks {heading}");
    }
    let svg = std::fs::read_to_string(out.join("wall_vs_ranks.svg")).expect("plot");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("polyline"));
}

#[test]
fn quick_suite_writes_every_row() {
    build_other_binaries();
    let out = tempfile::tempdir().expect("tempdir");
    let python_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../client/python");
    // The Python ranks need the client's venv (client/python/run_tests.sh makes it, and
    // tests/run-all.sh makes it before the tests); without it the quick suite runs the Rust
    // ranks only.
    let python = python_dir.join(".venv/bin/python").exists();
    if !python {
        eprintln!("no client/python/.venv: quick suite without the Python ranks");
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_tunecache-bench"));
    command
        .args(["suite", "--quick", "--out"])
        .arg(out.path())
        .arg("--python-dir")
        .arg(python_dir);
    if python {
        command.arg("--python");
    }
    let output = command.output().expect("run tunecache-bench suite --quick");
    assert!(
        output.status.success(),
        "suite failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    check_outputs(out.path(), python);
    check_report_tables(out.path(), python);
}

/// The quick run's results.json renders as the BENCHMARKS.md tables (`report --table`), with a
/// row per R of the matrix.
fn check_report_tables(out: &Path, python: bool) {
    let source = out.join("results.json");
    let mut kinds = vec!["single-node", "peer-pickup", "memory"];
    if Path::new("/dev/fuse").exists() {
        kinds.push("shared-filesystem");
    }
    if python {
        kinds.push("python-ranks");
    }
    for kind in kinds {
        let table = render_table(kind, &source);
        let rows = table.lines().filter(|line| line.starts_with("| ")).count();
        assert!(rows >= 2, "{kind}: no rows in\n{table}");
    }
}

/// `report --table KIND --source SOURCE`, which must succeed with no figure missing.
fn render_table(kind: &str, source: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tunecache-bench"))
        .args(["report", "--table", kind, "--source"])
        .arg(source)
        .output()
        .expect("run tunecache-bench report");
    assert!(
        output.status.success(),
        "report --table {kind}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8(output.stdout).expect("UTF-8 table");
    assert!(
        !table.contains("NaN"),
        "{kind}: a figure is missing in\n{table}"
    );
    table
}

/// `micro --only views --quick` answers every read of every case (each first read pinned
/// what it answered) and renders as the views table, a row per tier, read and case.
#[test]
fn quick_views_micro_renders() {
    build_other_binaries();
    let out = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_tunecache-bench"))
        .args(["micro", "--only", "views", "--quick"])
        .output()
        .expect("run tunecache-bench micro --only views --quick");
    assert!(
        output.status.success(),
        "micro --only views failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Value = serde_json::from_slice(&output.stdout).expect("micro JSON");
    let reads = array(&results["views"], "reads");
    let redis = array(&results["views"], "skipped").is_empty();
    assert_eq!(reads.len(), if redis { 8 } else { 4 }, "{results}");
    let mut rows = 0;
    for read in reads {
        let (entries, calls) = (number(read, "entries"), number(read, "calls"));
        for case in array(read, "cases") {
            rows += 1;
            number(&case["latency"], "p50_us");
            number(case, "daemon_cpu_us");
            let pins = number(case, "pins_made");
            match case["case"].as_str() {
                Some("no-view" | "later") => assert_eq!(pins, 0.0, "{read}"),
                _ => assert_eq!(pins, entries * calls, "every first read pins: {read}"),
            }
        }
    }
    let source = out.path().join("views.json");
    std::fs::write(&source, &output.stdout).expect("write views.json");
    let table = render_table("views", &source);
    let table_rows = table.lines().filter(|line| line.starts_with("| ")).count();
    assert_eq!(
        table_rows,
        rows + 1,
        "a row per case and the header:\n{table}"
    );
}
