//! Owns the tables of BENCHMARKS.md: each one is rendered from the raw output of the run that
//! measured it (a `suite` results.json, a `micro` JSON, `cluster.json`, `multinode.json`,
//! `segments.json`), so the report is regenerated, never hand-copied.
//!
//! A table sits between two marker comments that name its kind and its source file (relative
//! to the Markdown file):
//!
//! ```text
//! <!-- report:begin single-node docs/bench/current/suite/results.json -->
//! ...generated...
//! <!-- report:end -->
//! ```
//!
//! [`update`] rewrites every such block from its source; [`check`] says which blocks differ.
//! A block whose source file does not exist is left as it is (reported, not an error): its
//! figures were recorded before the run's raw output was kept.
//!
//! Sources are read as untyped JSON so that the output of older suite versions (other system
//! names, fields added since) still renders.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

const BEGIN: &str = "<!-- report:begin ";
const END: &str = "<!-- report:end -->";

/// The kinds of table, with the source each reads.
pub const KINDS: [(&str, &str); 14] = [
    (
        "single-node",
        "suite results.json: the local-disk rows of the matrix",
    ),
    (
        "shared-filesystem",
        "suite results.json: the slowfs rows of the matrix",
    ),
    ("peer-pickup", "suite results.json: micro.peer_pickup"),
    ("cluster", "cluster.json (`tunecache-bench cluster`)"),
    ("multinode", "multinode.json (`tunecache-bench multinode`)"),
    ("segments", "segments.json (`tunecache-bench segments`)"),
    (
        "data-path",
        "micro JSON (`micro --only lookup,pyscan,memory`)",
    ),
    ("transport", "micro JSON (`micro --only transport`)"),
    ("python-ranks", "suite results.json with the Python systems"),
    (
        "python-process",
        "python-client.json (`tunecache-bench python-client`): per process",
    ),
    (
        "python-scan",
        "python-client.json: the Scan against its floor",
    ),
    (
        "python-cold-start",
        "python-client.json: cold start of Python ranks",
    ),
    (
        "memory",
        "micro JSON (`micro --only memory`) or a suite results.json",
    ),
    ("views", "micro JSON (`micro --only views`)"),
];

/// Milliseconds the way every table writes them.
pub fn ms(value: f64) -> String {
    if value >= 10_000.0 {
        format!("{:.1} s", value / 1e3)
    } else if value >= 100.0 {
        format!("{value:.0} ms")
    } else if value >= 1.0 {
        format!("{value:.1} ms")
    } else {
        format!("{value:.2} ms")
    }
}

/// Bytes in binary units.
pub fn bytes(value: u64) -> String {
    let value = value as f64;
    if value >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", value / (1024.0 * 1024.0))
    } else if value >= 1024.0 {
        format!("{:.0} KiB", value / 1024.0)
    } else {
        format!("{value:.0} B")
    }
}

/// A ratio with two decimals below 10, one above.
pub fn times(ratio: f64) -> String {
    if ratio < 10.0 {
        format!("{ratio:.2}x")
    } else {
        format!("{ratio:.1}x")
    }
}

/// An integer with thousands separators.
fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

fn num(value: &Value, key: &str) -> f64 {
    value.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn uint(value: &Value, key: &str) -> u64 {
    value.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn array<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The matrix's system names, old and new spellings alike.
fn system(row: &Value) -> &str {
    match text(row, "system") {
        "filelock-before" => "before",
        "filelock-after" => "after",
        "filelock-py-before" => "before-py",
        other => other,
    }
}

/// One scenario row of a suite run.
struct Matrix<'a> {
    rows: &'a [Value],
    limit_ms: f64,
}

impl<'a> Matrix<'a> {
    fn of(results: &'a Value) -> Self {
        let limit_s = results
            .pointer("/settings/run_limit_s")
            .and_then(Value::as_f64)
            .unwrap_or(120.0);
        Matrix {
            rows: array(results, "scenarios"),
            limit_ms: limit_s * 1e3,
        }
    }

    fn find(&self, name: &str, filesystem: &str, ranks: u64) -> Option<&'a Value> {
        self.rows.iter().find(|row| {
            system(row) == name
                && text(row, "filesystem") == filesystem
                && uint(row, "ranks") == ranks
        })
    }

    /// (filesystem, R) in run order.
    fn cells(&self, keep: impl Fn(&str) -> bool) -> Vec<(String, u64)> {
        let mut cells: Vec<(String, u64)> = Vec::new();
        for row in self.rows {
            let cell = (text(row, "filesystem").to_owned(), uint(row, "ranks"));
            if keep(&cell.0) && !cells.contains(&cell) {
                cells.push(cell);
            }
        }
        cells
    }

    fn wall(row: Option<&Value>) -> String {
        match row {
            None => "-".to_owned(),
            Some(row) if row.get("timed_out").and_then(Value::as_bool) == Some(true) => format!(
                "> {} (timed out, {}/{} done)",
                ms(num(row, "wall_ms")),
                uint(row, "ranks_done"),
                uint(row, "ranks")
            ),
            Some(row) => ms(num(row, "wall_ms")),
        }
    }

    fn worst(&self, row: Option<&Value>) -> String {
        match row {
            None => "-".to_owned(),
            Some(row) if row.get("timed_out").and_then(Value::as_bool) == Some(true) => {
                format!("> {}", ms(self.limit_ms))
            }
            Some(row) => ms(num(row, "cache_ms_worst")),
        }
    }
}

fn timed_out(row: &Value) -> bool {
    row.get("timed_out").and_then(Value::as_bool) == Some(true)
}

/// "a / b", with "> " when the numerator timed out; "-" when either row is missing.
fn ratio(numerator: Option<&Value>, denominator: Option<&Value>) -> String {
    match (numerator, denominator) {
        (Some(top), Some(bottom)) if num(bottom, "wall_ms") > 0.0 => format!(
            "{}{}",
            if timed_out(top) { "> " } else { "" },
            times(num(top, "wall_ms") / num(bottom, "wall_ms"))
        ),
        _ => "-".to_owned(),
    }
}

fn bytes_of(row: Option<&Value>) -> String {
    row.map(|row| bytes(uint(row, "bytes_written")))
        .unwrap_or_else(|| "-".to_owned())
}

fn single_node(results: &Value) -> Result<String> {
    let matrix = Matrix::of(results);
    let floors: Vec<(u64, f64)> = results
        .pointer("/floor/floor_ms_by_ranks")
        .and_then(Value::as_array)
        .map(|pairs| {
            pairs
                .iter()
                .filter_map(|pair| Some((pair.get(0)?.as_u64()?, pair.get(1)?.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    let cells = matrix.cells(|filesystem| filesystem == "local");
    if cells.is_empty() {
        bail!("no local-disk rows in the matrix");
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| R | before: wall | after: wall | tunecache: wall | tunecache rank: median / worst | before / tunecache | after / tunecache | parse floor | tunecache / floor | bytes written: before / tunecache |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (filesystem, ranks) in cells {
        let before = matrix.find("before", &filesystem, ranks);
        let after = matrix.find("after", &filesystem, ranks);
        let tunecache = matrix.find("tunecache", &filesystem, ranks);
        let floor = floors.iter().find(|(r, _)| *r == ranks).map(|(_, f)| *f);
        let _ = writeln!(
            out,
            "| {ranks} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} / {} |",
            Matrix::wall(before),
            Matrix::wall(after),
            Matrix::wall(tunecache),
            tunecache
                .map(|row| ms(num(row, "cache_ms_median")))
                .unwrap_or_else(|| "-".into()),
            matrix.worst(tunecache),
            ratio(before, tunecache),
            ratio(after, tunecache),
            floor.map(ms).unwrap_or_else(|| "-".into()),
            match (tunecache, floor) {
                (Some(row), Some(floor)) => times(num(row, "wall_ms") / floor),
                _ => "-".into(),
            },
            bytes_of(before),
            bytes_of(tunecache),
        );
    }
    Ok(out)
}

fn shared_filesystem(results: &Value) -> Result<String> {
    let matrix = Matrix::of(results);
    let cells = matrix.cells(|filesystem| filesystem != "local");
    if cells.is_empty() {
        bail!("no slowfs rows in the matrix");
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| filesystem | R | before: wall | after: wall | tunecache: wall | worst rank: before / tunecache | before / tunecache | after / tunecache | bytes written: before / after / tunecache |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (filesystem, ranks) in cells {
        let before = matrix.find("before", &filesystem, ranks);
        let after = matrix.find("after", &filesystem, ranks);
        let tunecache = matrix.find("tunecache", &filesystem, ranks);
        let _ = writeln!(
            out,
            "| {filesystem} | {ranks} | {} | {} | {} | {} / {} | {} | {} | {} / {} / {} |",
            Matrix::wall(before),
            Matrix::wall(after),
            Matrix::wall(tunecache),
            matrix.worst(before),
            matrix.worst(tunecache),
            ratio(before, tunecache),
            ratio(after, tunecache),
            bytes_of(before),
            bytes_of(after),
            bytes_of(tunecache),
        );
    }
    Ok(out)
}

fn peer_pickup(results: &Value) -> Result<String> {
    let pickups = results
        .pointer("/micro/peer_pickup")
        .and_then(Value::as_array)
        .context("no micro.peer_pickup in the results")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| filesystem | snapshot interval | samples | median | max | missed |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for pickup in pickups {
        let _ = writeln!(
            out,
            "| {} | {} s | {} | {} | {} | {} |",
            text(pickup, "filesystem"),
            uint(pickup, "snapshot_interval_s"),
            array(pickup, "samples_ms").len(),
            ms(num(pickup, "median_ms")),
            ms(num(pickup, "max_ms")),
            uint(pickup, "missed")
        );
    }
    Ok(out)
}

fn seconds(value: Option<f64>) -> String {
    value
        .filter(|value| value.is_finite())
        .map(|value| format!("{:.2} s", value / 1e3))
        .unwrap_or_else(|| "–".to_owned())
}

fn cluster(results: &Value) -> Result<String> {
    let rows = array(results, "rows");
    if rows.is_empty() {
        bail!("no rows in cluster.json");
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| format | filesystem | N | one new entry: bytes read / written, all daemons | shared-dir file bytes read / written | target <= N x 64 KiB | reaches every node | quiet after | idle interval: bytes read | fresh node joins |"
    );
    let _ = writeln!(out, "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|");
    for row in rows {
        let nodes = uint(row, "nodes");
        let read = uint(row, "new_entry_bytes_read");
        let file_bytes = match (
            row.get("new_entry_file_bytes_read").and_then(Value::as_u64),
            row.get("new_entry_file_bytes_written")
                .and_then(Value::as_u64),
        ) {
            (Some(read), Some(written)) => format!("{} B / {} B", grouped(read), grouped(written)),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {nodes} | {} B / {} B | {file_bytes} | {} | {} | {} | {} B | {} |",
            uint(row, "format"),
            text(row, "filesystem"),
            grouped(read),
            grouped(uint(row, "new_entry_bytes_written")),
            verdict(read <= nodes * 64 * 1024),
            seconds(row.get("propagation_ms").and_then(Value::as_f64)),
            seconds(row.get("settle_ms").and_then(Value::as_f64)),
            grouped(uint(row, "idle_bytes_read")),
            seconds(row.get("join_ms").and_then(Value::as_f64)),
        );
    }
    Ok(out)
}

fn multinode(results: &Value) -> Result<String> {
    let results: crate::multinode::MultiNodeResults =
        serde_json::from_value(results.clone()).context("multinode.json")?;
    Ok(crate::multinode::markdown(&results))
}

fn segments(rows: &Value) -> Result<String> {
    let rows = rows.as_array().context("segments.json is not a list")?;
    // The daemon under test is the last binary given; earlier ones are comparisons.
    let last = rows
        .last()
        .map(|row| text(row, "binary"))
        .context("no rows in segments.json")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| owners | segments | first pass | later passes | target: a pass < 1 s |"
    );
    let _ = writeln!(out, "|---|---:|---:|---|---|");
    for row in rows.iter().filter(|row| text(row, "binary") == last) {
        let count = uint(row, "segments");
        let owners = match text(row, "mix") {
            "OwnName" => "all under the daemon's own name".to_owned(),
            "OneOtherNode" => "one other node".to_owned(),
            "ManyNodes" => format!("{} other nodes, 10 each", grouped(count.div_ceil(10))),
            other => other.to_owned(),
        };
        let later: Vec<Option<f64>> = array(row, "later_passes_s")
            .iter()
            .map(Value::as_f64)
            .collect();
        let met = !later.is_empty() && later.iter().all(|pass| pass.is_some_and(|s| s < 1.0));
        let _ = writeln!(
            out,
            "| {owners} | {} | {:.2} s | {} | {} |",
            grouped(count),
            num(row, "first_pass_s"),
            later
                .iter()
                .map(|pass| pass
                    .map(|s| format!("{s:.3} s"))
                    .unwrap_or_else(|| "no answer".to_owned()))
                .collect::<Vec<_>>()
                .join(", "),
            verdict(met)
        );
    }
    Ok(out)
}

fn data_path(micro: &Value) -> Result<String> {
    let lookup = micro.get("lookup").context("no lookup in the micro JSON")?;
    let single = lookup.get("single_key").context("no lookup.single_key")?;
    let batch = lookup.get("batch_1000").context("no lookup.batch_1000")?;
    let mut out = String::new();
    let _ = writeln!(out, "| figure | measured | target | verdict |");
    let _ = writeln!(out, "|---|---:|---:|---|");
    let _ = writeln!(
        out,
        "| single-key Lookup p50 / p99 ({} entries in the cache) | {:.1} / {:.1} µs | | |",
        grouped(uint(lookup, "entries_in_cache")),
        num(single, "p50_us"),
        num(single, "p99_us")
    );
    if let Some(echo) = lookup.get("echo") {
        let over = num(single, "p50_us") / num(echo, "p50_us");
        let _ = writeln!(
            out,
            "| single-key Lookup p50 / echo p50 (bare health Check) | {:.1} / {:.1} µs = {} | <= 1.3x | {} |",
            num(single, "p50_us"),
            num(echo, "p50_us"),
            times(over),
            verdict(over <= 1.3)
        );
    }
    let batch_p50 = num(batch, "p50_us");
    let _ = writeln!(
        out,
        "| 1,000-key Lookup p50 / p99 | {:.0} / {:.0} µs | < 2,000 µs | {} |",
        batch_p50,
        num(batch, "p99_us"),
        verdict(batch_p50 < 2000.0)
    );
    for row in array(lookup, "throughput") {
        let (clients, keys) = (uint(row, "clients"), uint(row, "keys_per_call"));
        let per_s = num(row, "keys_per_s");
        let (target, judged) = if clients == 32 && keys == 1 {
            (">= 50,000", verdict(per_s >= 50_000.0))
        } else {
            ("", "")
        };
        let _ = writeln!(
            out,
            "| throughput, {clients} clients x {keys} keys per call | {} keys/s | {target} | {judged} |",
            grouped(per_s.round() as u64)
        );
    }
    if let Some(scan) = micro.get("python_scan") {
        if let Some(why) = scan.get("skipped").and_then(Value::as_str) {
            let _ = writeln!(out, "| Python grpcio Scan | skipped: {why} | | |");
        } else {
            let median = num(scan, "median_ms");
            let _ = writeln!(
                out,
                "| Python grpcio Scan of {} entries ({}), median of {} | {:.2} ms | < 20 ms | {} |",
                grouped(uint(scan, "entries")),
                bytes(uint(scan, "wire_bytes")),
                uint(scan, "runs"),
                median,
                verdict(median < 20.0)
            );
            let (parse, echo) = (num(scan, "parse_ms"), num(scan, "echo_ms"));
            if parse.is_finite() && echo.is_finite() {
                let over = median / (parse + echo);
                let _ = writeln!(
                    out,
                    "| Python Scan / (Python parse of the same bytes + one echo) | {:.2} / ({:.2} + {:.2}) ms = {} | <= 1.5x | {} |",
                    median,
                    parse,
                    echo,
                    times(over),
                    verdict(over <= 1.5)
                );
            }
        }
    }
    Ok(out)
}

fn transport(micro: &Value) -> Result<String> {
    let variants = micro
        .pointer("/transport/variants")
        .and_then(Value::as_array)
        .context("no transport.variants in the micro JSON")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| variant | echo µs | Lookup µs | Lookup/echo | 1,000-key ms | CPU per 1,000-key call: daemon + client ms | Record µs | 32 clients k/s | py Scan ms | py parse+echo ms | Scan/floor |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for variant in variants {
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} + {:.2} | {:.1} | {:.1} | {:.2} | {:.2} + {:.2} | {:.2} |",
            text(variant, "name"),
            num(variant, "echo_p50_us"),
            num(variant, "lookup_p50_us"),
            num(variant, "lookup_over_echo"),
            num(variant, "batch_1000_p50_us") / 1e3,
            num(variant, "batch_daemon_cpu_us") / 1e3,
            num(variant, "batch_client_cpu_us") / 1e3,
            num(variant, "record_p50_us"),
            num(variant, "lookups_per_s_32") / 1e3,
            num(variant, "python_scan_ms"),
            num(variant, "python_parse_ms"),
            num(variant, "python_echo_ms"),
            num(variant, "python_scan_over_floor"),
        );
    }
    Ok(out)
}

fn python_ranks(results: &Value) -> Result<String> {
    let matrix = Matrix::of(results);
    let floor = results
        .get("python_floor")
        .filter(|floor| !floor.is_null())
        .context("no python_floor: run the suite with --python")?;
    let cores = num(floor, "cores");
    let by_ranks = array(floor, "by_ranks");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| filesystem | R | before (Rust ranks) | before-py | tunecache (Rust ranks) | tunecache-py | before / tunecache-py | before-py / tunecache-py | floor (parse + build) = R x t / cores | tunecache-py / floor | target <= 1.5x |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for (filesystem, ranks) in matrix.cells(|_| true) {
        let Some(python) = matrix.find("tunecache-py", &filesystem, ranks) else {
            continue;
        };
        let before = matrix.find("before", &filesystem, ranks);
        let before_py = matrix.find("before-py", &filesystem, ranks);
        let floor = by_ranks
            .iter()
            .find(|parse| uint(parse, "ranks") == ranks)
            .map(|parse| num(parse, "scan_view_ms"));
        let (floor_text, over, judged) = match floor {
            Some(per_rank) => {
                let floor_ms = ranks as f64 * per_rank / cores;
                let over = num(python, "wall_ms") / floor_ms;
                (
                    format!("{ranks} x {} / {cores} = {}", ms(per_rank), ms(floor_ms)),
                    times(over),
                    verdict(over <= 1.5),
                )
            }
            None => ("-".to_owned(), "-".to_owned(), ""),
        };
        let _ = writeln!(
            out,
            "| {filesystem} | {ranks} | {} | {} | {} | {} | {} | {} | {floor_text} | {over} | {judged} |",
            Matrix::wall(before),
            Matrix::wall(before_py),
            Matrix::wall(matrix.find("tunecache", &filesystem, ranks)),
            Matrix::wall(Some(python)),
            ratio(before, Some(python)),
            ratio(before_py, Some(python)),
        );
    }
    Ok(out)
}

/// The package of today in these tables, and the grpcio package it replaced.
const PY_BINDING: &str = "tunecache-py";
const PY_GRPCIO: &str = "tunecache-py-grpcio";

fn client_label(client: &str) -> &str {
    match client {
        PY_BINDING => "binding (tunecache-client)",
        PY_GRPCIO => "grpcio package (before)",
        other => other,
    }
}

fn python_process(source: &Value) -> Result<String> {
    let rows = array(source, "process");
    anyhow::ensure!(!rows.is_empty(), "no per-process figures");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| process | client | import CPU | first call CPU (Client + one Lookup) | import + first call | target <= 1 ms | background threads | target <= 1 | RSS added |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---|---:|---|---:|");
    for row in rows {
        let client = text(row, "client");
        let total = num(row, "cpu_ms");
        let background = uint(row, "threads").saturating_sub(1);
        let (judged, threads_judged) = if client == PY_BINDING {
            (verdict(total <= 1.0), verdict(background <= 1))
        } else {
            ("", "")
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {judged} | {background} | {threads_judged} | {:.1} MiB |",
            match text(row, "mode") {
                "preloaded" => "framework modules already loaded",
                _ => "fresh interpreter",
            },
            client_label(client),
            ms(num(row, "import_cpu_ms")),
            ms(num(row, "first_call_cpu_ms")),
            ms(total),
            num(row, "rss_added_mib"),
        );
    }
    Ok(out)
}

fn python_scan(source: &Value) -> Result<String> {
    let rows = array(source, "scan");
    anyhow::ensure!(!rows.is_empty(), "no Scan figures");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| client | entries (bytes) | Scan, median of runs (min-max) | floor = build + one round trip | Scan / floor | target <= 1.5x | health Check echo |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---|---:|");
    for row in rows {
        let client = text(row, "client");
        let (scan, build, echo) = (
            num(row, "scan_ms"),
            num(row, "build_ms"),
            num(row, "echo_ms"),
        );
        let over = scan / (build + echo);
        let judged = if client == PY_BINDING {
            verdict(over <= 1.5)
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "| {} | {} ({}) | {} ({}-{}) | {} + {} = {} | {} | {judged} | {} |",
            client_label(client),
            grouped(uint(row, "entries")),
            bytes(uint(row, "wire_bytes")),
            ms(scan),
            ms(num(row, "scan_min_ms")),
            ms(num(row, "scan_max_ms")),
            ms(build),
            ms(echo),
            ms(build + echo),
            times(over),
            ms(num(row, "health_echo_ms")),
        );
    }
    Ok(out)
}

fn python_cold_start(source: &Value) -> Result<String> {
    let systems = array(source, "cold_start");
    let cell = |name: &str, ranks: u64| -> Option<&Value> {
        systems
            .iter()
            .find(|pair| pair.get(0).and_then(Value::as_str) == Some(name))
            .and_then(|pair| pair.get(1))
            .and_then(Value::as_array)?
            .iter()
            .find(|cell| uint(cell, "ranks") == ranks)
            .and_then(|cell| cell.get("median"))
    };
    let floor = |client: &str, ranks: u64| -> Option<f64> {
        array(source, "floors")
            .iter()
            .find(|pair| pair.get(0).and_then(Value::as_str) == Some(client))
            .and_then(|pair| pair.get(1))
            .and_then(Value::as_array)?
            .iter()
            .find(|parse| uint(parse, "ranks") == ranks)
            .map(|parse| num(parse, "scan_view_ms"))
    };
    let cores = num(source, "cores");
    let mut ranks: Vec<u64> = systems
        .iter()
        .filter_map(|pair| pair.get(1).and_then(Value::as_array))
        .flatten()
        .map(|cell| uint(cell, "ranks"))
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| R | client | before (Rust ranks) | before-py | tunecache-py | before / tunecache-py | target | before-py / tunecache-py | floor = R x (parse + build) / cores | tunecache-py / floor | target <= 1.2x |"
    );
    let _ = writeln!(out, "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|");
    for &r in &ranks {
        let before = cell("before", r);
        let before_py = cell("before-py", r);
        for client in [PY_GRPCIO, PY_BINDING] {
            let Some(python) = cell(client, r) else {
                continue;
            };
            let speedup = before
                .map(|before| num(before, "wall_ms") / num(python, "wall_ms"))
                .unwrap_or(f64::NAN);
            let wanted = if r >= 128 { 20.0 } else { 10.0 };
            let (floor_text, over_text, over_verdict) = match floor(client, r) {
                Some(per_rank) => {
                    let floor_ms = r as f64 * per_rank / cores;
                    let over = num(python, "wall_ms") / floor_ms;
                    (
                        format!("{r} x {} / {cores} = {}", ms(per_rank), ms(floor_ms)),
                        times(over),
                        if client == PY_BINDING {
                            verdict(over <= 1.2)
                        } else {
                            ""
                        },
                    )
                }
                None => ("-".to_owned(), "-".to_owned(), ""),
            };
            let _ = writeln!(
                out,
                "| {r} | {} | {} | {} | {} | {} | {} | {} | {floor_text} | {over_text} | {over_verdict} |",
                client_label(client),
                Matrix::wall(before),
                Matrix::wall(before_py),
                Matrix::wall(Some(python)),
                times(speedup),
                if client == PY_BINDING {
                    format!(">= {wanted:.0}x: {}", verdict(speedup >= wanted))
                } else {
                    String::new()
                },
                ratio(before_py, Some(python)),
            );
        }
    }
    Ok(out)
}

fn memory(source: &Value) -> Result<String> {
    let scales = source
        .get("memory")
        .or_else(|| source.pointer("/micro/snapshots"))
        .and_then(Value::as_array)
        .context("no memory (micro JSON) or micro.snapshots (suite results)")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| entries | RSS empty / loaded | RSS per entry / encoded entry | target <= 2.5x | snapshot file | write (daemon / call) | writer peak RSS while writing | load (spawn to all entries) | loader peak / steady RSS | load peak / writer steady | target <= 1.5x | Record of all entries via gRPC |"
    );
    let _ = writeln!(
        out,
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|"
    );
    for scale in scales {
        let entries = num(scale, "entries");
        let (empty, loaded) = (num(scale, "rss_empty_mib"), num(scale, "rss_loaded_mib"));
        let per_entry = (loaded - empty) * 1024.0 * 1024.0 / entries;
        let encoded = num(scale, "entry_encoded_bytes");
        let peak = num(scale, "load_peak_rss_mib");
        let (per_entry_text, per_entry_verdict) = if encoded.is_finite() {
            (
                format!(
                    "{per_entry:.0} B / {encoded:.0} B = {}",
                    times(per_entry / encoded)
                ),
                verdict(per_entry / encoded <= 2.5),
            )
        } else {
            (format!("{per_entry:.0} B"), "")
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} / {:.0} MiB | {per_entry_text} | {per_entry_verdict} | {} | {} / {} | {:.0} MiB | {} | {:.0} / {:.0} MiB | {} | {} | {} |",
            grouped(entries as u64),
            empty,
            loaded,
            bytes(uint(scale, "file_bytes")),
            ms(num(scale, "write_ms")),
            ms(num(scale, "write_call_ms")),
            num(scale, "write_peak_rss_mib"),
            ms(num(scale, "load_ms")),
            peak,
            num(scale, "load_rss_after_mib"),
            times(peak / loaded),
            verdict(peak / loaded <= 1.5),
            ms(num(scale, "record_ms")),
        );
    }
    Ok(out)
}

/// Microseconds, as ms from 1 ms up.
fn micros(value: f64) -> String {
    if value >= 1_000.0 {
        ms(value / 1e3)
    } else {
        format!("{value:.1} µs")
    }
}

/// The bound of issue 27: a Scan of 100k entries in a view costs at most 1.5x without one.
const VIEW_SCAN_ENTRIES: u64 = 100_000;
const VIEW_SCAN_BOUND: f64 = 1.5;

fn views(micro: &Value) -> Result<String> {
    let views = micro.get("views").context("no views in the micro JSON")?;
    let reads = array(views, "reads");
    if reads.is_empty() {
        bail!("no views.reads in the micro JSON");
    }
    let load = |key: &str| {
        array(views, key)
            .first()
            .and_then(Value::as_f64)
            .map_or_else(|| "–".to_owned(), |load| format!("{load:.1}"))
    };
    let redis = views
        .get("redis_version")
        .and_then(Value::as_str)
        .and_then(|version| {
            let mut words = version.split_whitespace();
            words.find_map(|word| word.strip_prefix("v="))
        })
        .map_or_else(
            || "no redis-server".to_owned(),
            |v| format!("redis-server {v}"),
        );
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} entries in each daemon; the cases of a read interleaved call by call, \
         each call timed by the Rust client. Redis tier: two daemons on {redis}, \
         the cluster flags at their defaults but `--cluster-url` and `--cluster-prefix`. \
         `nproc` = {}, {} build; load average {} at the start, {} at the end.\n",
        grouped(uint(views, "entries_in_cache")),
        views
            .pointer("/machine/nproc")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        views
            .pointer("/machine/build_profile")
            .and_then(Value::as_str)
            .unwrap_or("?"),
        load("load_average_start"),
        load("load_average_end"),
    );
    let _ = writeln!(
        out,
        "| tier | read | case | calls | p50 | p99 | p50 / no view | daemon CPU per call | pins made (of which fallbacks) | target | verdict |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|");
    for read in reads {
        let entries = uint(read, "entries");
        let redis = text(read, "tier") == "redis";
        let tier = if redis { "Redis tier" } else { "one node" };
        let what = match (text(read, "read"), entries) {
            ("lookup", 1) => "Lookup, 1 key".to_owned(),
            ("lookup", keys) => format!("Lookup, {} keys", grouped(keys)),
            (_, entries) => format!("Scan, {} entries", grouped(entries)),
        };
        for case in array(read, "cases") {
            let id = text(case, "case");
            let label = match id {
                "no-view" => "no view",
                "later" => "in a view, later reads",
                "first" => "first read of a view (pins)",
                "first-elsewhere" => "first read here of a view the other node pinned",
                other => other,
            };
            let latency = case.get("latency").unwrap_or(&Value::Null);
            let over = num(case, "p50_over_no_view");
            let (target, judged) = if id != "no-view"
                && text(read, "read") == "scan"
                && entries >= VIEW_SCAN_ENTRIES
            {
                (
                    format!("<= {VIEW_SCAN_BOUND}x"),
                    verdict(over <= VIEW_SCAN_BOUND),
                )
            } else {
                (String::new(), "")
            };
            let cpu = match case.get("redis_cpu_us").and_then(Value::as_f64) {
                Some(redis) => format!(
                    "{} + Redis {}",
                    micros(num(case, "daemon_cpu_us")),
                    micros(redis)
                ),
                None => micros(num(case, "daemon_cpu_us")),
            };
            let pins = if redis {
                format!(
                    "{} ({})",
                    grouped(uint(case, "pins_made")),
                    grouped(uint(case, "pin_fallbacks"))
                )
            } else {
                grouped(uint(case, "pins_made"))
            };
            let _ = writeln!(
                out,
                "| {tier} | {what} | {label} | {} | {} | {} | {} | {cpu} | {pins} | {target} | {judged} |",
                grouped(uint(read, "calls")),
                micros(num(latency, "p50_us")),
                micros(num(latency, "p99_us")),
                times(over),
            );
        }
    }
    for skipped in array(views, "skipped").iter().filter_map(Value::as_str) {
        let _ = writeln!(out, "\nSkipped: {skipped}");
    }
    Ok(out)
}

/// Renders one table of `kind` from a parsed source.
pub fn render(kind: &str, source: &Value) -> Result<String> {
    match kind {
        "single-node" => single_node(source),
        "shared-filesystem" => shared_filesystem(source),
        "peer-pickup" => peer_pickup(source),
        "cluster" => cluster(source),
        "multinode" => multinode(source),
        "segments" => segments(source),
        "data-path" => data_path(source),
        "transport" => transport(source),
        "python-ranks" => python_ranks(source),
        "python-process" => python_process(source),
        "python-scan" => python_scan(source),
        "python-cold-start" => python_cold_start(source),
        "memory" => memory(source),
        "views" => views(source),
        other => bail!(
            "unknown table kind {other:?}; known: {}",
            KINDS.map(|(kind, _)| kind).join(", ")
        ),
    }
}

/// Reads a source file: one JSON document, or JSON lines (one row each, as `cluster-v1.jsonl`)
/// read as `{"rows": [...]}`.
pub fn read_source(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match serde_json::from_str(&text) {
        Ok(value) => Ok(value),
        Err(_) => {
            let rows = text
                .lines()
                .filter(|line| !line.trim().is_empty())
                .map(serde_json::from_str)
                .collect::<Result<Vec<Value>, _>>()
                .with_context(|| format!("parsing {}", path.display()))?;
            Ok(serde_json::json!({ "rows": rows }))
        }
    }
}

/// What happened to one marked block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub kind: String,
    pub source: PathBuf,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The block already matched its source.
    Unchanged,
    /// The block differed from its source (rewritten by [`update`]).
    Changed,
    /// The source file does not exist; the block was kept as it is.
    SourceMissing,
}

/// Regenerates every marked block of `markdown` (relative sources resolved against `base`).
/// Returns the new text and what happened to each block.
pub fn regenerate(markdown: &str, base: &Path) -> Result<(String, Vec<Block>)> {
    let mut out = String::with_capacity(markdown.len());
    let mut blocks = Vec::new();
    let mut lines = markdown.split_inclusive('\n');
    let mut line_no = 0;
    while let Some(line) = lines.next() {
        line_no += 1;
        out.push_str(line);
        let Some(spec) = line.trim().strip_prefix(BEGIN) else {
            continue;
        };
        let spec = spec.strip_suffix("-->").unwrap_or(spec);
        let mut words = spec.split_whitespace();
        let (Some(kind), Some(source), None) = (words.next(), words.next(), words.next()) else {
            bail!("line {line_no}: expected `{BEGIN}KIND SOURCE -->`");
        };
        let mut old = String::new();
        let mut closed = false;
        for inner in lines.by_ref() {
            line_no += 1;
            if inner.trim() == END {
                closed = true;
                let source_path = base.join(source);
                let outcome = if source_path.exists() {
                    // Blank lines around the table keep it a table in any Markdown renderer.
                    let table = format!(
                        "\n{}\n",
                        render(kind, &read_source(&source_path)?)
                            .with_context(|| format!("{kind} from {source}"))?
                    );
                    let outcome = if table == old {
                        Outcome::Unchanged
                    } else {
                        Outcome::Changed
                    };
                    out.push_str(&table);
                    outcome
                } else {
                    out.push_str(&old);
                    Outcome::SourceMissing
                };
                out.push_str(inner);
                blocks.push(Block {
                    kind: kind.to_owned(),
                    source: PathBuf::from(source),
                    outcome,
                });
                break;
            }
            old.push_str(inner);
        }
        if !closed {
            bail!("line {line_no}: `{BEGIN}{kind} {source} -->` has no `{END}`");
        }
    }
    Ok((out, blocks))
}

fn base_of(path: &Path) -> &Path {
    path.parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Rewrites every marked block of the Markdown file at `path` from its source.
pub fn update(path: &Path) -> Result<Vec<Block>> {
    let markdown =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (text, blocks) = regenerate(&markdown, base_of(path))?;
    if text != markdown {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(blocks)
}

/// What [`update`] would do, without writing.
pub fn check(path: &Path) -> Result<Vec<Block>> {
    let markdown =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(regenerate(&markdown, base_of(path))?.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_rewritten_and_a_missing_source_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("pickup.json"),
            r#"{"micro": {"peer_pickup": [{"filesystem": "local", "snapshot_interval_s": 1,
                "samples_ms": [1.0, 2.0], "median_ms": 628.0, "max_ms": 630.0, "missed": 0}]}}"#,
        )
        .unwrap();
        let markdown =
            "# t\n<!-- report:begin peer-pickup pickup.json -->\nstale\n<!-- report:end -->\n\
                        <!-- report:begin multinode absent.json -->\nkept\n<!-- report:end -->\n";
        let (text, blocks) = regenerate(markdown, dir.path()).unwrap();
        assert!(
            text.contains("-->\n\n| filesystem |")
                && text.contains("| local | 1 s | 2 | 628 ms | 630 ms | 0 |\n\n<!-- report:end"),
            "{text}"
        );
        assert!(!text.contains("stale"));
        assert!(text.contains("\nkept\n"));
        assert_eq!(blocks[0].outcome, Outcome::Changed);
        assert_eq!(blocks[1].outcome, Outcome::SourceMissing);
        let (again, blocks) = regenerate(&text, dir.path()).unwrap();
        assert_eq!(again, text);
        assert_eq!(blocks[0].outcome, Outcome::Unchanged);
    }

    #[test]
    fn an_unclosed_block_is_an_error() {
        let error = regenerate("<!-- report:begin memory x.json -->\n", Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no `<!-- report:end -->`"), "{error}");
    }

    #[test]
    fn grouped_digits() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(381), "381");
        assert_eq!(grouped(24_003), "24,003");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }
}
