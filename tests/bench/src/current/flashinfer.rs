//! The tables of a `flashinfer.json` (`tunecache-bench flashinfer`): each mode of the FlashInfer
//! autotune_v2 benchmark (one rank alone, stock on a local directory cold and warm and on the slow
//! shared directory, the drop-in cold and warm) with its wall, the profiles its ranks ran and
//! whether they served one tactic; then the goals.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use super::format::{goals_table, num, text, uint};

fn what(mode: &str) -> String {
    match mode {
        "one-rank" => "one rank alone, stock, local directory".to_owned(),
        "stock-local" => "stock, every rank on one local directory".to_owned(),
        "stock-warm" => "stock, warm (the directory holding every key)".to_owned(),
        "dropin-cold" => "drop-in, cold (a daemon holding none of the keys)".to_owned(),
        "dropin-warm" => "drop-in, warm (the daemon holding every key)".to_owned(),
        slow if slow.starts_with("slowfs-") => format!(
            "stock, the store on the slow shared filesystem (slowfs, {} per operation)",
            &slow["slowfs-".len()..]
        ),
        other => other.to_owned(),
    }
}

pub(super) fn flashinfer(results: &Value) -> Result<String> {
    let modes = results
        .get("modes")
        .and_then(Value::as_array)
        .context("no modes in flashinfer.json")?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} rank processes (one for \"one rank alone\") tune {} keys with a stand-in profile of {} ms each.\n",
        uint(results, "ranks"),
        uint(results, "keys"),
        num(results, "profile_ms"),
    );
    let _ = writeln!(
        out,
        "| mode | runs | wall: median (range) | rank, median | profiles run, median | one tactic on every rank |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---|");
    for mode in modes {
        let agreeing = mode.get("ranks_agreeing").and_then(Value::as_bool) == Some(true);
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} s ({:.2} to {:.2}) | {:.2} s | {:.0} | {} |",
            what(text(mode, "mode")),
            uint(mode, "runs"),
            num(mode, "wall_s_median"),
            num(mode, "wall_s_min"),
            num(mode, "wall_s_max"),
            num(mode, "rank_s_median"),
            num(mode, "profiles_median"),
            if agreeing { "yes" } else { "no" },
        );
    }
    out.push_str(&goals_table(results, "goal"));
    Ok(out)
}
