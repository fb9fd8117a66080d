//! `tunecache import inductor DIR` and `tunecache export inductor DIR`: PyTorch Inductor's
//! autotune cache directory (`TORCHINDUCTOR_CACHE_DIR`: the GEMM choice timings of
//! `DIR/cache/<system_hash>` and the kernels' `DIR/<dir>/<name>.best_config`) read into the
//! cache, and the cache written back into such a directory, merged into the timing files already
//! there. The mapping is `tunecache-inductor`'s, the one the Python drop-in uses.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::Client;
use tunecache_inductor as inductor;

fn skipped_json(skipped: &[inductor::SkippedFile]) -> Vec<Value> {
    skipped
        .iter()
        .map(|s| json!({"path": s.path, "reason": s.reason}))
        .collect()
}

fn print_skipped(skipped: &[inductor::SkippedFile]) {
    for file in skipped {
        eprintln!("skipped {}: {}", file.path, file.reason);
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// Imports every timing group and best config Inductor would serve; exits non-zero only when
/// `dir` cannot be read or nothing in it could be stored.
pub async fn import(client: &Client, dir: &Path, as_json: bool) -> anyhow::Result<()> {
    let outcome = inductor::import_cache_dir(dir, "tunecache import inductor", now_ms())
        .with_context(|| format!("reading {}", dir.display()))?;
    let kept = client
        .record_keeping_valid(outcome.entries)
        .await
        .context("record")?;
    let mut skipped = outcome.skipped;
    skipped.extend(kept.refused.iter().map(|refused| {
        inductor::SkippedFile {
            path: refused
                .entry
                .key
                .as_ref()
                .map(|key| key.problem.clone())
                .unwrap_or_default(),
            reason: format!("daemon refused it: {}", refused.status.message()),
        }
    }));
    if as_json {
        println!(
            "{}",
            json!({"timing_files": outcome.timing_files, "timings": outcome.timings,
                   "best_configs": outcome.best_configs,
                   "stored": kept.stored, "unchanged": kept.unchanged,
                   "skipped": skipped_json(&skipped)})
        );
    } else {
        print_skipped(&skipped);
        println!(
            "imported {} timing groups of {} system files and {} best configs ({} stored, {} unchanged), skipped {}",
            outcome.timings,
            outcome.timing_files,
            outcome.best_configs,
            kept.stored,
            kept.unchanged,
            skipped.len()
        );
    }
    if kept.stored + kept.unchanged == 0 && !skipped.is_empty() {
        anyhow::bail!("no entry of {} could be stored", dir.display());
    }
    Ok(())
}

/// Writes the cache's Inductor entries (timing groups and best configs) under `dir`.
pub async fn export(client: &Client, dir: &Path, as_json: bool) -> anyhow::Result<()> {
    let mut entries = client.scan(inductor::NAMESPACE, "").await?;
    entries.extend(client.scan(inductor::BEST_CONFIG_NAMESPACE, "").await?);
    let outcome = inductor::export_cache_dir(dir, &entries)?;
    if as_json {
        println!(
            "{}",
            json!({"timings": outcome.timings, "systems": outcome.systems,
                   "best_configs": outcome.best_configs,
                   "skipped": skipped_json(&outcome.skipped)})
        );
    } else {
        print_skipped(&outcome.skipped);
        println!(
            "exported {} timing groups of {} systems and {} best configs to {}, skipped {}",
            outcome.timings,
            outcome.systems.len(),
            outcome.best_configs,
            dir.display(),
            outcome.skipped.len()
        );
    }
    Ok(())
}
