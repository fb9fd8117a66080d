//! The tables read from a suite run's results.json: the scenario matrix on local disk and
//! on the slow shared filesystems, the peer pick-up times, and the Python ranks' rows
//! against their floor.

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::format::{array, bytes, ms, num, text, times, uint, verdict};

/// The matrix's system names, old and new spellings alike.
pub(super) fn system(row: &Value) -> &str {
    match text(row, "system") {
        "filelock-before" => "before",
        "filelock-after" => "after",
        "filelock-py-before" => "before-py",
        other => other,
    }
}

/// One scenario row of a suite run.
pub(super) struct Matrix<'a> {
    rows: &'a [Value],
    limit_ms: f64,
}

impl<'a> Matrix<'a> {
    pub(super) fn of(results: &'a Value) -> Self {
        let limit_s = results
            .pointer("/settings/run_limit_s")
            .and_then(Value::as_f64)
            .unwrap_or(120.0);
        Matrix {
            rows: array(results, "scenarios"),
            limit_ms: limit_s * 1e3,
        }
    }

    pub(super) fn find(&self, name: &str, filesystem: &str, ranks: u64) -> Option<&'a Value> {
        self.rows.iter().find(|row| {
            system(row) == name
                && text(row, "filesystem") == filesystem
                && uint(row, "ranks") == ranks
        })
    }

    /// (filesystem, R) in run order.
    pub(super) fn cells(&self, keep: impl Fn(&str) -> bool) -> Vec<(String, u64)> {
        let mut cells: Vec<(String, u64)> = Vec::new();
        for row in self.rows {
            let cell = (text(row, "filesystem").to_owned(), uint(row, "ranks"));
            if keep(&cell.0) && !cells.contains(&cell) {
                cells.push(cell);
            }
        }
        cells
    }

    pub(super) fn wall(row: Option<&Value>) -> String {
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

    pub(super) fn worst(&self, row: Option<&Value>) -> String {
        match row {
            None => "-".to_owned(),
            Some(row) if row.get("timed_out").and_then(Value::as_bool) == Some(true) => {
                format!("> {}", ms(self.limit_ms))
            }
            Some(row) => ms(num(row, "cache_ms_worst")),
        }
    }
}

pub(super) fn timed_out(row: &Value) -> bool {
    row.get("timed_out").and_then(Value::as_bool) == Some(true)
}

/// "a / b", with "> " when the numerator timed out; "-" when either row is missing.
pub(super) fn ratio(numerator: Option<&Value>, denominator: Option<&Value>) -> String {
    match (numerator, denominator) {
        (Some(top), Some(bottom)) if num(bottom, "wall_ms") > 0.0 => format!(
            "{}{}",
            if timed_out(top) { "> " } else { "" },
            times(num(top, "wall_ms") / num(bottom, "wall_ms"))
        ),
        _ => "-".to_owned(),
    }
}

pub(super) fn bytes_of(row: Option<&Value>) -> String {
    row.map(|row| bytes(uint(row, "bytes_written")))
        .unwrap_or_else(|| "-".to_owned())
}

pub(super) fn single_node(results: &Value) -> Result<String> {
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

pub(super) fn shared_filesystem(results: &Value) -> Result<String> {
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

pub(super) fn peer_pickup(results: &Value) -> Result<String> {
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

pub(super) fn python_ranks(results: &Value) -> Result<String> {
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
