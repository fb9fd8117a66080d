//! What the framework-store bridges (`import`/`export` of `flashinfer` and `inductor`) say of
//! their work, said one way: the files and entries they left out (a line each on stderr, or a
//! JSON list) with the daemon's refusals of an import's entries among them, and the summary (one
//! line, or one JSON object that also lists what was left out).

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::{Client, KeptRecord};
use tunecache_proto::v1;

/// A file, group or entry left out, and why.
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// Records `entries`, each one the daemon refuses set aside in `skipped` (named by its key's
/// problem): one bad entry never costs the others.
pub async fn record(
    client: &Client,
    entries: Vec<v1::Entry>,
    skipped: &mut Vec<Skipped>,
) -> anyhow::Result<KeptRecord> {
    let kept = client
        .record_keeping_valid(entries)
        .await
        .context("record")?;
    skipped.extend(kept.refused.iter().map(|refused| {
        Skipped {
            path: refused
                .entry
                .key
                .as_ref()
                .map(|key| key.problem.clone())
                .unwrap_or_default(),
            reason: format!("daemon refused it: {}", refused.status.message()),
        }
    }));
    Ok(kept)
}

/// Prints the summary: `summary` with `"skipped"` added under `--json`, else a line per
/// skipped item on stderr, then `line`.
pub fn print(as_json: bool, mut summary: Value, line: String, skipped: &[Skipped]) {
    if as_json {
        summary["skipped"] = skipped
            .iter()
            .map(|s| json!({"path": s.path, "reason": s.reason}))
            .collect();
        println!("{summary}");
    } else {
        for file in skipped {
            eprintln!("skipped {}: {}", file.path, file.reason);
        }
        println!("{line}");
    }
}

/// Milliseconds since the Unix epoch: an imported entry's tuned_at.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}
