//! The table of a `bundles.json` (`tunecache-bench bundles`): each figure of the bundles
//! benchmark (export and start-up of the entries case and the artifacts case, the replayed
//! miss against the hit) with its median and range over the rounds, and the bound on
//! peak RSS where it sets one.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use super::format::{num, text, uint, verdict};

fn figure(value: f64, unit: &str) -> String {
    match unit {
        "ms" => super::format::ms(value),
        "us" => super::format::micros(value),
        "bytes" => super::format::bytes(value as u64),
        _ => format!("{value:.1} {unit}"),
    }
}

pub(super) fn bundles(results: &Value) -> Result<String> {
    let figures = results
        .get("figures")
        .and_then(Value::as_array)
        .context("no figures in bundles.json")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| case | figure | rounds | median (range) | goal | verdict |\n|---|---|---:|---:|---|---|"
    );
    for row in figures {
        let unit = text(row, "unit");
        let goal = row.get("goal_max").and_then(Value::as_f64);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} ({} to {}) | {} | {} |",
            text(row, "case"),
            text(row, "what"),
            uint(row, "rounds"),
            figure(num(row, "median"), unit),
            figure(num(row, "min"), unit),
            figure(num(row, "max"), unit),
            goal.map(|goal| format!("< {goal:.0} {unit} every round"))
                .unwrap_or_default(),
            row.get("met")
                .and_then(Value::as_bool)
                .map(verdict)
                .unwrap_or(""),
        );
    }
    Ok(out)
}
