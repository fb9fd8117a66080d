//! The tables of `python-client.json`: the Python package's cost per process, its Scan
//! against the floor, and cold start of Python ranks, the current binding beside the
//! grpcio package it replaced.

use std::fmt::Write as _;

use anyhow::Result;
use serde_json::Value;

use super::format::{array, bytes, grouped, ms, num, text, times, uint, verdict};
use super::suite::{ratio, Matrix};

/// The package of today in these tables, and the grpcio package it replaced.
pub(super) const PY_BINDING: &str = "tunecache-py";
pub(super) const PY_GRPCIO: &str = "tunecache-py-grpcio";

pub(super) fn client_label(client: &str) -> &str {
    match client {
        PY_BINDING => "binding (tunecache-client)",
        PY_GRPCIO => "grpcio package (before)",
        other => other,
    }
}

pub(super) fn python_process(source: &Value) -> Result<String> {
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

pub(super) fn python_scan(source: &Value) -> Result<String> {
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

pub(super) fn python_cold_start(source: &Value) -> Result<String> {
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
