//! The tables of an `inductor.json` (`tunecache-bench inductor`): each mode of the PyTorch
//! Inductor max-autotune benchmark (one rank alone, stock on one shared cache directory, stock
//! with `distributed_max_autotune_gemm`, the drop-in cold and warm) with its wall, the benchmark
//! rounds its ranks ran, on how many shapes they agreed and how many timing groups the
//! directory's file kept; a mode that did not run as named, with why; then the goals.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use super::format::{array, num, text, times, uint, verdict};

fn what(mode: &str) -> &str {
    match mode {
        "alone" => "one rank alone, stock",
        "stock" => "stock, every rank on one shared cache directory",
        "stock-distributed" => "stock with `distributed_max_autotune_gemm` (gloo process group)",
        "dropin-cold" => "drop-in, cold (a fresh daemon)",
        "dropin-warm" => "drop-in, warm (the same daemon, fresh ranks and directory)",
        other => other,
    }
}

fn measured(goal: &Value) -> String {
    if text(goal, "unit") == "rounds" {
        format!("{:.0} rounds", num(goal, "measured"))
    } else {
        times(num(goal, "measured"))
    }
}

pub(super) fn inductor(results: &Value) -> Result<String> {
    let modes = results
        .get("modes")
        .and_then(Value::as_array)
        .context("no modes in inductor.json")?;
    let shapes = array(results, "shapes");
    let listed: Vec<String> = shapes
        .iter()
        .map(|shape| {
            let sizes: Vec<String> = shape
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[])
                .iter()
                .map(|size| size.as_u64().unwrap_or(0).to_string())
                .collect();
            sizes.join("×")
        })
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} rank processes (one for \"one rank alone\") compile {} frozen Linears (in × out × batch: {}) \
         with `mode=\"max-autotune\"` on the CPU, from a cache directory holding their C++ kernels \
         (built beforehand by one stock rank in {:.0} s) but no GEMM timings.\n",
        uint(results, "ranks"),
        shapes.len(),
        listed.join(", "),
        num(results, "warm_up_s"),
    );
    let _ = writeln!(
        out,
        "| mode | runs | wall: median (range) | rank, median | benchmark rounds, median | shapes with one winner on every rank | timing groups the file kept |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    let mut not_run = Vec::new();
    for mode in modes {
        if let Some(reason) = mode.get("not_run").and_then(Value::as_str) {
            not_run.push((text(mode, "mode"), reason));
            continue;
        }
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} s ({:.2} to {:.2}) | {:.2} s | {:.0} | {} of {} | {:.0} of {} |",
            what(text(mode, "mode")),
            uint(mode, "runs"),
            num(mode, "wall_s_median"),
            num(mode, "wall_s_min"),
            num(mode, "wall_s_max"),
            num(mode, "rank_s_median"),
            num(mode, "rounds_median"),
            uint(mode, "shapes_agreeing_min"),
            uint(mode, "shapes"),
            num(mode, "kept_groups_median"),
            uint(mode, "shapes"),
        );
    }
    for (mode, reason) in not_run {
        let mut chars = reason.chars();
        let reason: String = chars
            .next()
            .map(|first| first.to_uppercase().chain(chars).collect())
            .unwrap_or_default();
        let _ = writeln!(out, "\nNot run: {}. {}.", what(mode), reason);
    }
    let goals = array(results, "goals");
    if !goals.is_empty() {
        out.push_str("\n| goal | measured | verdict |\n|---|---:|---|\n");
        for goal in goals {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                text(goal, "what"),
                measured(goal),
                verdict(goal.get("met").and_then(Value::as_bool).unwrap_or(false))
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_mode_not_run_is_said_below_the_table_and_goals_show_their_units() {
        let results = json!({
            "ranks": 8, "shapes": [[64, 32, 8], [96, 48, 8]], "warm_up_s": 50.2,
            "modes": [
                {"mode": "alone", "runs": 1, "wall_s_median": 6.0, "wall_s_min": 6.0, "wall_s_max": 6.0,
                 "rank_s_median": 6.0, "rounds_median": 2.0, "shapes": 2, "shapes_agreeing_min": 2,
                 "kept_groups_median": 2.0, "not_run": null},
                {"mode": "stock-distributed", "runs": 1, "not_run": "it distributed nothing"},
            ],
            "goals": [
                {"what": "cold", "measured": 1.5, "unit": "x", "at_most": 1.2, "met": false},
                {"what": "warm", "measured": 0.0, "unit": "rounds", "at_most": 0.0, "met": true},
            ],
        });
        let table = inductor(&results).unwrap();
        assert!(
            table.contains("(in × out × batch: 64×32×8, 96×48×8)"),
            "{table}"
        );
        assert!(table.contains("| one rank alone, stock | 1 | 6.00 s (6.00 to 6.00) | 6.00 s | 2 | 2 of 2 | 2 of 2 |"), "{table}");
        assert!(table.contains("Not run: stock with `distributed_max_autotune_gemm` (gloo process group). It distributed nothing."), "{table}");
        assert!(
            table.contains("| cold | 1.50x | **missed** |")
                && table.contains("| warm | 0 rounds | met |"),
            "{table}"
        );
    }
}
