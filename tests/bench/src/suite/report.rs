//! Owns the suite's outputs: `results.json` (everything measured), `results.md` (the same
//! figures as Markdown tables) and `wall_vs_ranks.svg` (wall time against R for every system
//! of the matrix, one panel per filesystem, log-log, hand-written SVG).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use tunecache_bench::current::{bytes, ms, times};

use super::{PythonFloor, ScenarioRow, SuiteResults};

pub const JSON_NAME: &str = "results.json";
pub const MARKDOWN_NAME: &str = "results.md";
pub const PLOT_NAME: &str = "wall_vs_ranks.svg";

fn write(path: &Path, contents: &[u8]) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// Writes all three outputs into `out_dir`.
pub fn write_outputs(out_dir: &Path, results: &SuiteResults) -> Result<()> {
    write(
        &out_dir.join(JSON_NAME),
        serde_json::to_string_pretty(results)?.as_bytes(),
    )?;
    write(&out_dir.join(MARKDOWN_NAME), markdown(results).as_bytes())?;
    write(&out_dir.join(PLOT_NAME), plot(results).as_bytes())?;
    Ok(())
}

fn system_label(system: &str) -> &str {
    match system {
        "filelock-before" | "before" => "before",
        "filelock-after" | "after" => "after",
        "filelock-py-before" | "before-py" => "before-py",
        other => other,
    }
}

fn wall_text(row: &ScenarioRow) -> String {
    if row.timed_out {
        format!(
            "> {} (timed out, {}/{} ranks done)",
            ms(row.wall_ms),
            row.ranks_done,
            row.ranks
        )
    } else {
        ms(row.wall_ms)
    }
}

fn worst_text(row: &ScenarioRow, limit_ms: f64) -> String {
    if row.timed_out {
        format!("> {} (unfinished ranks)", ms(limit_ms))
    } else {
        ms(row.cache_ms_worst)
    }
}

/// The Markdown tables.
pub fn markdown(results: &SuiteResults) -> String {
    let mut out = String::new();
    let settings = &results.settings;
    let machine = &results.machine;
    let _ = writeln!(out, "# tunecache benchmark results\n");
    let _ = writeln!(out, "Command: `{}`  ", machine.command);
    let _ = writeln!(
        out,
        "Machine: {} cores ({}), {:.1} GiB, kernel {}, {} build. Suite took {:.0} s.\n",
        machine.nproc,
        machine.cpu_model,
        machine.mem_total_gib,
        machine.kernel,
        machine.build_profile,
        results.duration_s
    );
    let _ = writeln!(
        out,
        "Scenario: S = {} existing entries, E = {} new entries per rank ({:.0} % shared), \
         time limit {:.0} s per run, slowfs with {} worker threads.\n",
        settings.existing,
        settings.new_entries,
        settings.shared_fraction * 100.0,
        settings.run_limit_s,
        settings.slowfs_threads
    );
    for skipped in &settings.filesystems_skipped {
        let _ = writeln!(out, "Skipped filesystem: {skipped}\n");
    }
    let limit_ms = settings.run_limit_s * 1e3;
    if !results.scenarios.is_empty() {
        let _ = writeln!(out, "## Scenario matrix\n");
        let _ = writeln!(
            out,
            "| filesystem | R | system | wall (all ranks done) | rank cache time median | worst | load median | save median | bytes to shared fs | saves | failures |"
        );
        let _ = writeln!(out, "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|");
        for row in &results.scenarios {
            let saves = row
                .saves_by_outcome
                .iter()
                .map(|(outcome, count)| format!("{outcome}: {count}"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.filesystem,
                row.ranks,
                system_label(&row.system),
                wall_text(row),
                ms(row.cache_ms_median),
                worst_text(row, limit_ms),
                ms(row.load_ms_median),
                ms(row.save_ms_median),
                bytes(row.bytes_written),
                saves,
                row.failures
            );
        }
        let _ = writeln!(out);
        let snapshot_rows: Vec<&ScenarioRow> = results
            .scenarios
            .iter()
            .filter(|row| row.snapshot.is_some())
            .collect();
        if !snapshot_rows.is_empty() {
            let _ = writeln!(out, "### tunecache daemon's shared-filesystem writes\n");
            let _ = writeln!(
                out,
                "| filesystem | R | snapshots written | snapshot file | final Snapshot RPC (daemon / caller) |"
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|");
            for row in snapshot_rows {
                if let Some(snapshot) = &row.snapshot {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {} | {} | {} / {}{} |",
                        row.filesystem,
                        row.ranks,
                        snapshot.snapshots_written,
                        bytes(snapshot.snapshot_file_bytes),
                        ms(snapshot.final_snapshot_ms),
                        ms(snapshot.final_snapshot_call_ms),
                        snapshot
                            .final_snapshot_error
                            .as_deref()
                            .map(|error| format!(" (error: {error})"))
                            .unwrap_or_default()
                    );
                }
            }
            let _ = writeln!(out);
        }
    }
    if let Some(floor) = &results.floor {
        let _ = writeln!(out, "## Parse floor\n");
        let _ = writeln!(
            out,
            "Parsing the {}-entry cache file ({}) once: median {}. Floor = parse x R / {} cores:\n",
            floor.existing,
            bytes(floor.file_bytes),
            ms(floor.parse_ms_median),
            floor.cores
        );
        let _ = writeln!(
            out,
            "| R | floor | tunecache wall (local) | tunecache / floor |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---:|");
        for (ranks, floor_ms) in &floor.floor_ms_by_ranks {
            let tunecache = results.scenarios.iter().find(|row| {
                row.system == "tunecache" && row.filesystem == "local" && row.ranks == *ranks
            });
            let (wall, ratio) = tunecache
                .map(|row| (ms(row.wall_ms), format!("{:.1}x", row.wall_ms / floor_ms)))
                .unwrap_or_else(|| ("-".into(), "-".into()));
            let _ = writeln!(out, "| {ranks} | {} | {wall} | {ratio} |", ms(*floor_ms));
        }
        let _ = writeln!(out);
    }
    if let Some(python_floor) = &results.python_floor {
        python_section(&mut out, results, python_floor);
    }
    if let Some(micro) = &results.micro {
        let lookup = &micro.lookup;
        let _ = writeln!(
            out,
            "## Lookup ({} entries in the cache)\n",
            lookup.entries_in_cache
        );
        let _ = writeln!(out, "| call | samples | p50 | p99 | max |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for (name, latency) in [
            ("single key", &lookup.single_key),
            ("1,000-key batch", &lookup.batch_1000),
        ] {
            let _ = writeln!(
                out,
                "| {name} | {} | {:.0} µs | {:.0} µs | {:.0} µs |",
                latency.samples, latency.p50_us, latency.p99_us, latency.max_us
            );
        }
        let _ = writeln!(out, "\n| clients | keys per call | keys/s |");
        let _ = writeln!(out, "|---:|---:|---:|");
        for row in &lookup.throughput {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} |",
                row.clients, row.keys_per_call, row.keys_per_s
            );
        }
        let python = &micro.python_scan;
        let _ = writeln!(out, "\n## Python grpcio scan\n");
        match &python.skipped {
            Some(why) => {
                let _ = writeln!(out, "Skipped: {why}\n");
            }
            None => {
                let _ = writeln!(
                    out,
                    "Scan of {} entries, {} runs: median {}, min {}, max {}.\n",
                    python.entries,
                    python.runs,
                    ms(python.median_ms),
                    ms(python.min_ms),
                    ms(python.max_ms)
                );
            }
        }
        let _ = writeln!(out, "## Snapshots and memory\n");
        let _ = writeln!(
            out,
            "| entries | file | write (daemon / call) | writer peak RSS during write | load (spawn to all entries) | loader peak RSS | RSS empty / loaded | RSS per 100k | record via gRPC |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for scale in &micro.snapshots {
            let _ = writeln!(
                out,
                "| {} | {} | {} / {} | {:.0} MiB | {} | {:.0} MiB | {:.0} / {:.0} MiB | {:.1} MiB | {} |",
                scale.entries,
                bytes(scale.file_bytes),
                ms(scale.write_ms),
                ms(scale.write_call_ms),
                scale.write_peak_rss_mib,
                ms(scale.load_ms),
                scale.load_peak_rss_mib,
                scale.rss_empty_mib,
                scale.rss_loaded_mib,
                scale.rss_per_100k_mib,
                ms(scale.record_ms)
            );
        }
        let _ = writeln!(out, "\n## Peer pickup (record on A, Lookup on B sees it)\n");
        let _ = writeln!(
            out,
            "| filesystem | interval | samples | median | max | missed |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
        for pickup in &micro.peer_pickup {
            let _ = writeln!(
                out,
                "| {} | {} s | {} | {} | {} | {} |",
                pickup.filesystem,
                pickup.snapshot_interval_s,
                pickup.samples_ms.len(),
                ms(pickup.median_ms),
                ms(pickup.max_ms),
                pickup.missed
            );
        }
    }
    out
}

const PANEL_WIDTH: f64 = 300.0;
const PANEL_HEIGHT: f64 = 260.0;
const MARGIN_LEFT: f64 = 60.0;
const MARGIN_TOP: f64 = 50.0;
const MARGIN_BOTTOM: f64 = 50.0;
const PANEL_GAP: f64 = 40.0;

fn color(system: &str) -> &'static str {
    match system_label(system) {
        "before" => "#d62728",
        "after" => "#ff7f0e",
        "before-py" => "#8c564b",
        "tunecache-py" => "#2ca02c",
        _ => "#1f77b4",
    }
}

/// Wall time against R, log-log, one panel per filesystem; a timed-out run is drawn as an
/// open marker with an arrow at the limit.
pub fn plot(results: &SuiteResults) -> String {
    let filesystems: Vec<String> = {
        let mut seen: Vec<String> = Vec::new();
        for row in &results.scenarios {
            if !seen.contains(&row.filesystem) {
                seen.push(row.filesystem.clone());
            }
        }
        seen
    };
    let ranks = &results.settings.ranks;
    let walls: Vec<f64> = results
        .scenarios
        .iter()
        .map(|row| row.wall_ms.max(0.01))
        .collect();
    let y_min = walls
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(0.01);
    let y_max = walls.iter().copied().fold(0.0, f64::max).max(y_min * 10.0);
    let (log_y_min, log_y_max) = (y_min.log10().floor(), y_max.log10().ceil());
    let x_min = ranks.iter().copied().min().unwrap_or(1).max(1) as f64;
    let x_max = (ranks.iter().copied().max().unwrap_or(2) as f64).max(x_min * 2.0);
    let panels = filesystems.len().max(1) as f64;
    let width = MARGIN_LEFT + panels * (PANEL_WIDTH + PANEL_GAP) + 20.0;
    let height = MARGIN_TOP + PANEL_HEIGHT + MARGIN_BOTTOM + 30.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.0}" y="20" font-size="15" text-anchor="middle">Wall time until all R ranks are done (S = {}, E = {}; log-log; open marker = timed out)</text>"#,
        width / 2.0,
        results.settings.existing,
        results.settings.new_entries
    );
    for (panel, filesystem) in filesystems.iter().enumerate() {
        let left = MARGIN_LEFT + panel as f64 * (PANEL_WIDTH + PANEL_GAP);
        let top = MARGIN_TOP;
        let x_of = |r: f64| left + (r.ln() - x_min.ln()) / (x_max.ln() - x_min.ln()) * PANEL_WIDTH;
        let y_of = |ms: f64| {
            top + PANEL_HEIGHT
                - (ms.max(0.01).log10() - log_y_min) / (log_y_max - log_y_min) * PANEL_HEIGHT
        };
        let _ = writeln!(
            svg,
            r##"<rect x="{left:.1}" y="{top:.1}" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="#888"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{filesystem}</text>"#,
            left + PANEL_WIDTH / 2.0,
            top - 8.0
        );
        let mut decade = log_y_min;
        while decade <= log_y_max {
            let y = y_of(10f64.powf(decade));
            let label = ms(10f64.powf(decade));
            let _ = writeln!(
                svg,
                r##"<line x1="{left:.1}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
                left + PANEL_WIDTH,
                left - 4.0,
                y + 4.0
            );
            decade += 1.0;
        }
        for &r in ranks {
            let x = x_of(f64::from(r));
            let _ = writeln!(
                svg,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{r}</text>"#,
                top + PANEL_HEIGHT + 16.0
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">ranks (R)</text>"#,
            left + PANEL_WIDTH / 2.0,
            top + PANEL_HEIGHT + 34.0
        );
        for system in &results.settings.systems {
            let system = system.as_str();
            let rows: Vec<&ScenarioRow> = results
                .scenarios
                .iter()
                .filter(|row| &row.filesystem == filesystem && system_label(&row.system) == system)
                .collect();
            let points: Vec<String> = rows
                .iter()
                .map(|row| format!("{:.1},{:.1}", x_of(f64::from(row.ranks)), y_of(row.wall_ms)))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
                points.join(" "),
                color(system)
            );
            for row in rows {
                let (x, y) = (x_of(f64::from(row.ranks)), y_of(row.wall_ms));
                let fill = if row.timed_out {
                    "white"
                } else {
                    color(system)
                };
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{fill}" stroke="{}" stroke-width="2"><title>{} R={} {}: {}</title></circle>"#,
                    color(system),
                    filesystem,
                    row.ranks,
                    system,
                    wall_text(row)
                );
                if row.timed_out {
                    let _ = writeln!(
                        svg,
                        r#"<path d="M{x:.1},{:.1} l0,-14 m-4,5 l4,-5 l4,5" stroke="{}" fill="none" stroke-width="1.5"/>"#,
                        y - 5.0,
                        color(system)
                    );
                }
            }
        }
    }
    let legend_y = height - 12.0;
    for (index, system) in results.settings.systems.iter().enumerate() {
        let x = MARGIN_LEFT + index as f64 * 120.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{legend_y:.1}">{system}</text>"#,
            x + 24.0,
            legend_y - 4.0,
            legend_y - 4.0,
            color(system),
            x + 30.0
        );
    }
    let _ = writeln!(svg, "</svg>");
    svg
}

fn find_row<'a>(
    results: &'a SuiteResults,
    system: &str,
    filesystem: &str,
    ranks: u32,
) -> Option<&'a ScenarioRow> {
    results.scenarios.iter().find(|row| {
        system_label(&row.system) == system && row.filesystem == filesystem && row.ranks == ranks
    })
}

/// "a / b = ratio", or "-" when a row is missing; a timed-out numerator reads "> ...".
fn ratio_text(numerator: Option<&ScenarioRow>, denominator_ms: Option<f64>) -> String {
    match (numerator, denominator_ms) {
        (Some(row), Some(denominator)) if denominator > 0.0 => format!(
            "{}{} / {} = {}{}",
            if row.timed_out { "> " } else { "" },
            ms(row.wall_ms),
            ms(denominator),
            if row.timed_out { "> " } else { "" },
            times(row.wall_ms / denominator)
        ),
        _ => "-".to_owned(),
    }
}

/// The Python ranks: their floor per R and their cold start against the file-lock peers and
/// against that floor, with the arithmetic.
fn python_section(out: &mut String, results: &SuiteResults, floor: &PythonFloor) {
    let cores = floor.cores as f64;
    let _ = writeln!(out, "## Python ranks: cold start against the floor\n");
    let _ = writeln!(
        out,
        "Floor = R x (one rank's own parse of what it loads, one uncontended Python process, \
         median) / {} cores. A tunecache rank loads its Scan (shared + its own entries): \
         protobuf parse of those bytes, and that parse plus building its in-memory cache. A \
         file-lock rank loads the whole file: `json.loads`.\n",
        floor.cores
    );
    let _ = writeln!(
        out,
        "| R | Scan entries / bytes | protobuf parse | + build cache | floor (parse) | floor (parse + build) | file bytes | json.loads | file floor |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for parse in &floor.by_ranks {
        let r = f64::from(parse.ranks);
        let _ = writeln!(
            out,
            "| {} | {} / {} | {} | {} | {} x {} / {} = {} | {} | {} | {} | {} |",
            parse.ranks,
            parse.scan_entries,
            bytes(parse.scan_bytes as u64),
            ms(parse.scan_parse_ms),
            ms(parse.scan_view_ms),
            parse.ranks,
            ms(parse.scan_parse_ms),
            floor.cores,
            ms(r * parse.scan_parse_ms / cores),
            ms(r * parse.scan_view_ms / cores),
            bytes(parse.file_bytes as u64),
            ms(parse.file_parse_ms),
            ms(r * parse.file_parse_ms / cores),
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| filesystem | R | tunecache-py wall | before (Rust ranks) / tunecache-py | before-py / tunecache-py | tunecache-py / floor (parse) | tunecache-py / floor (parse + build) | tunecache (Rust ranks) wall |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut filesystems: Vec<&str> = Vec::new();
    for row in &results.scenarios {
        if !filesystems.contains(&row.filesystem.as_str()) {
            filesystems.push(&row.filesystem);
        }
    }
    for filesystem in filesystems {
        for parse in &floor.by_ranks {
            let Some(python) = find_row(results, "tunecache-py", filesystem, parse.ranks) else {
                continue;
            };
            let r = f64::from(parse.ranks);
            let floor_parse = r * parse.scan_parse_ms / cores;
            let floor_view = r * parse.scan_view_ms / cores;
            let _ = writeln!(
                out,
                "| {filesystem} | {} | {} | {} | {} | {} / {} = {} | {} / {} = {} | {} |",
                parse.ranks,
                wall_text(python),
                ratio_text(
                    find_row(results, "before", filesystem, parse.ranks),
                    Some(python.wall_ms)
                ),
                ratio_text(
                    find_row(results, "before-py", filesystem, parse.ranks),
                    Some(python.wall_ms)
                ),
                ms(python.wall_ms),
                ms(floor_parse),
                times(python.wall_ms / floor_parse),
                ms(python.wall_ms),
                ms(floor_view),
                times(python.wall_ms / floor_view),
                find_row(results, "tunecache", filesystem, parse.ranks)
                    .map(wall_text)
                    .unwrap_or_else(|| "-".to_owned()),
            );
        }
    }
    let _ = writeln!(out);
}
