//! `tunecache import inductor DIR` and `tunecache export inductor DIR`: PyTorch Inductor's
//! autotune cache directory (`TORCHINDUCTOR_CACHE_DIR`: the GEMM choice timings of
//! `DIR/cache/<system_hash>` and the kernels' `DIR/<dir>/<name>.best_config`) read into the
//! cache, and the cache written back into such a directory, merged into the timing files already
//! there. The mapping is `tunecache-inductor`'s, the one the Python drop-in uses.

use std::path::Path;

use anyhow::Context;
use serde_json::json;
use tunecache_client::Client;
use tunecache_inductor as inductor;

use crate::store_report::{self, Skipped};

fn skipped_of(files: Vec<inductor::SkippedFile>) -> Vec<Skipped> {
    files
        .into_iter()
        .map(|file| Skipped {
            path: file.path,
            reason: file.reason,
        })
        .collect()
}

/// Imports every timing group and best config Inductor would serve; exits non-zero only when
/// `dir` cannot be read or nothing in it could be stored.
pub async fn import(client: &Client, dir: &Path, as_json: bool) -> anyhow::Result<()> {
    let outcome =
        inductor::import_cache_dir(dir, "tunecache import inductor", store_report::now_ms())
            .with_context(|| format!("reading {}", dir.display()))?;
    let mut skipped = skipped_of(outcome.skipped);
    let kept = store_report::record(client, outcome.entries, &mut skipped).await?;
    store_report::print(
        as_json,
        json!({"timing_files": outcome.timing_files, "timings": outcome.timings,
               "best_configs": outcome.best_configs,
               "stored": kept.stored, "unchanged": kept.unchanged}),
        format!(
            "imported {} timing groups of {} system files and {} best configs ({} stored, {} unchanged), skipped {}",
            outcome.timings,
            outcome.timing_files,
            outcome.best_configs,
            kept.stored,
            kept.unchanged,
            skipped.len()
        ),
        &skipped,
    );
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
    let skipped = skipped_of(outcome.skipped);
    store_report::print(
        as_json,
        json!({"timings": outcome.timings, "systems": outcome.systems,
               "best_configs": outcome.best_configs}),
        format!(
            "exported {} timing groups of {} systems and {} best configs to {}, skipped {}",
            outcome.timings,
            outcome.systems.len(),
            outcome.best_configs,
            dir.display(),
            skipped.len()
        ),
        &skipped,
    );
    Ok(())
}
