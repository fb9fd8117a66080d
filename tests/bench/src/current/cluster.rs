//! The tables of the multi-daemon runs: `cluster.json` (bytes moved per new entry, reach,
//! joins), `multinode.json` (rendered by `multinode` itself) and `segments.json` (shared-
//! directory passes by segment count and owner mix).

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::format::{array, grouped, num, seconds, text, uint, verdict};

pub(super) fn cluster(results: &Value) -> Result<String> {
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

pub(super) fn multinode(results: &Value) -> Result<String> {
    let results: crate::multinode::MultiNodeResults =
        serde_json::from_value(results.clone()).context("multinode.json")?;
    Ok(crate::multinode::markdown(&results))
}

pub(super) fn segments(rows: &Value) -> Result<String> {
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
