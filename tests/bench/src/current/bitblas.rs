//! The tables of a `bitblas.json` (`tunecache-bench bitblas`): each mode of the BitBLAS load
//! benchmark (the drop-in on a cold and on a warm node, stock BitBLAS from a local directory,
//! from per-rank copies of it and from the slow shared directory) with its wall, the runtime
//! modules its ranks ended with and the bytes the daemon served; then the goals.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use super::format::{bytes, goals_table, num, text, uint};

fn what(mode: &str) -> String {
    match mode {
        "dropin" => "drop-in, a node holding none of the files (fetched from the daemon into the node's store)".to_owned(),
        "dropin-warm" => "drop-in, the node's store holding the files already".to_owned(),
        "local" => "stock BitBLAS, every rank loading one database directory on local disk".to_owned(),
        "local-copies" => "stock BitBLAS, each rank loading its own copy of it (hard links)".to_owned(),
        slow if slow.starts_with("slowfs-") => format!(
            "stock BitBLAS, the database on the slow shared filesystem (slowfs, {} per operation)",
            &slow["slowfs-".len()..]
        ),
        other => other.to_owned(),
    }
}

pub(super) fn bitblas(results: &Value) -> Result<String> {
    let modes = results
        .get("modes")
        .and_then(Value::as_array)
        .context("no modes in bitblas.json")?;
    let (ops, ranks) = (uint(results, "ops"), uint(results, "ranks"));
    let file_bytes = (num(results, "file_mib") * 1024.0 * 1024.0) as u64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{ranks} rank processes load a database of {ops} operators ({} of files each) at once.\n",
        bytes(file_bytes)
    );
    let _ = writeln!(
        out,
        "| mode | runs | wall: median (range) | rank load, median | runtime modules loaded (fewest in a rank) | daemon served, median |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for mode in modes {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} s ({:.2} to {:.2}) | {:.2} s | {} of {} ({}/{ops}) | {} |",
            what(text(mode, "mode")),
            uint(mode, "runs"),
            num(mode, "wall_s_median"),
            num(mode, "wall_s_min"),
            num(mode, "wall_s_max"),
            num(mode, "load_s_median"),
            uint(mode, "with_rt_mod_total"),
            uint(mode, "rt_mods_wanted"),
            uint(mode, "with_rt_mod_min"),
            bytes(num(mode, "daemon_bytes_served_median") as u64),
        );
    }
    out.push_str(&goals_table(results, "goal (drop-in on a cold node)"));
    Ok(out)
}
