//! The table of an `artifacts.json` (`tunecache-bench artifacts`): `get_artifact` of one large
//! blob (handed as a descriptor, and streamed with the handoff off) against a plain
//! Unix-socket copy of the same bytes, R ranks fetching B small blobs (the same two ways)
//! against R processes reading the same files, and the ranks' `fetch_artifact_list` into a
//! directory against the same file reads; each with the goal where it states one.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde_json::Value;

use super::format::{bytes, grouped, ms, num, text, times, uint, verdict};

/// A series' median (written by `write`) and its range (`range`, without the unit).
fn spread(series: &Value, write: impl Fn(f64) -> String, range: impl Fn(f64) -> String) -> String {
    format!(
        "{} ({} to {})",
        write(num(series, "median")),
        range(num(series, "min")),
        range(num(series, "max"))
    )
}

fn mib_s(value: f64) -> String {
    format!("{value:.0} MiB/s")
}

fn whole(value: f64) -> String {
    format!("{value:.0}")
}

fn cpu(series: Option<&Value>) -> String {
    series
        .filter(|series| !series.is_null())
        .map(|series| ms(num(series, "median")))
        .unwrap_or_default()
}

pub(super) fn artifacts(results: &Value) -> Result<String> {
    let big = results.get("big").context("no big in artifacts.json")?;
    let ranks = results.get("ranks").context("no ranks in artifacts.json")?;
    let rounds = uint(results, "rounds");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| case | rounds | tunecache: median (range) | floor: median (range) | tunecache / floor | daemon CPU per round (median) | goal | verdict |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|---|");
    let ratio = num(big, "ratio");
    let goal = num(big, "goal_at_least");
    let _ = writeln!(
        out,
        "| `Client::get_artifact` of one {} blob held on the node into a sink (the Rust client, which takes it as a descriptor: the handoff), MiB/s; floor: a plain Unix-socket copy of {}, {} reads and writes | {rounds} | {} | {} | {:.0}% of the floor's throughput | {} | >= {:.0}% | {} |",
        bytes(uint(big, "bytes")),
        text(big, "floor_source"),
        bytes(uint(big, "copy_buffer_bytes")),
        spread(&big["get_mib_s"], mib_s, whole),
        spread(&big["floor_mib_s"], mib_s, whole),
        ratio * 100.0,
        cpu(big.get("get_daemon_cpu_ms")),
        goal * 100.0,
        verdict(ratio >= goal)
    );
    if let Some(stream) = big.get("stream_mib_s").filter(|s| !s.is_null()) {
        let _ = writeln!(
            out,
            "| the same call with the handoff off (`TUNECACHE_HANDOFF=0`): the GetArtifact stream itself, hashed by the client; against the same floor | {rounds} | {} | {} | {:.0}% of the floor's throughput | {} | none | |",
            spread(stream, mib_s, whole),
            spread(&big["floor_mib_s"], mib_s, whole),
            num(big, "stream_ratio") * 100.0,
            cpu(big.get("stream_daemon_cpu_ms")),
        );
    }
    let (count, blobs) = (uint(ranks, "ranks"), grouped(uint(ranks, "blobs")));
    let blob = bytes(uint(ranks, "blob_bytes"));
    let files = spread(&ranks["files_wall_ms"], ms, ms);
    let ratio = num(ranks, "ratio");
    let goal = num(ranks, "goal_at_most");
    let _ = writeln!(
        out,
        "| {count} rank processes x {blobs} blobs of {blob}, `get_artifact` into a sink (handed), wall; floor: {count} processes reading the same blobs' files from a local directory | {rounds} | {} | {files} | {} the floor's wall | {} | <= {} | {} |",
        spread(&ranks["get_wall_ms"], ms, ms),
        times(ratio),
        cpu(ranks.get("get_daemon_cpu_ms")),
        times(goal),
        verdict(ratio <= goal)
    );
    if let Some(stream) = ranks.get("stream_wall_ms").filter(|s| !s.is_null()) {
        let _ = writeln!(
            out,
            "| the same {count} ranks with the handoff off: every blob a GetArtifact stream; against the same floor | {rounds} | {} | {files} | {} the floor's wall | {} | none | |",
            spread(stream, ms, ms),
            times(num(ranks, "stream_ratio")),
            cpu(ranks.get("stream_daemon_cpu_ms")),
        );
    }
    if let Some(fetch) = ranks.get("fetch_wall_ms").filter(|fetch| !fetch.is_null()) {
        let _ = writeln!(
            out,
            "| the same {count} ranks, `fetch_artifact_list` into a directory of their own (each file copied from its handed descriptor, synced, renamed), wall; against the same floor | {rounds} | {} | {files} | {} the floor's wall | {} | none | |",
            spread(fetch, ms, ms),
            times(num(ranks, "fetch_ratio")),
            cpu(ranks.get("fetch_daemon_cpu_ms")),
        );
    }
    Ok(out)
}
