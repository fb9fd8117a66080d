//! `tunecache import flashinfer ROOT` and `tunecache export flashinfer ROOT [--env HASH]`:
//! FlashInfer's managed autotune store (`autotune_v2`, `ROOT/v2/<env_hash>/`) read into the cache,
//! every environment of it, and the cache written back as that store, byte for byte what
//! FlashInfer's own `publish` writes, with `manifest.json`. The mapping is `tunecache-flashinfer`'s,
//! the one the Python drop-in uses.

use std::path::Path;

use serde_json::json;
use tunecache_client::Client;
use tunecache_flashinfer as flashinfer;

use crate::store_report::{self, Skipped};

fn skipped_of(files: Vec<flashinfer::SkippedFile>) -> Vec<Skipped> {
    files
        .into_iter()
        .map(|file| Skipped {
            path: file.path,
            reason: file.reason,
        })
        .collect()
}

/// Imports every entry file their `lookup` would serve; exits non-zero only when `ROOT/v2`
/// cannot be read or nothing in it could be stored.
pub async fn import(client: &Client, root: &Path, as_json: bool) -> anyhow::Result<()> {
    let outcome =
        flashinfer::import_store(root, "tunecache import flashinfer", store_report::now_ms())
            .map_err(anyhow::Error::msg)?;
    let mut skipped = skipped_of(outcome.skipped);
    let kept = store_report::record(client, outcome.entries, &mut skipped).await?;
    store_report::print(
        as_json,
        json!({"imported": outcome.files, "environments": outcome.environments,
               "stored": kept.stored, "unchanged": kept.unchanged}),
        format!(
            "imported {} entries of {} environments ({} stored, {} unchanged, op units included), skipped {}",
            outcome.files,
            outcome.environments,
            kept.stored,
            kept.unchanged,
            skipped.len()
        ),
        &skipped,
    );
    if kept.stored + kept.unchanged == 0 && !skipped.is_empty() {
        anyhow::bail!("no entry of {} could be stored", root.display());
    }
    Ok(())
}

/// Writes the cache's FlashInfer entries (of environment `env` only, when given) under `root`.
pub async fn export(
    client: &Client,
    root: &Path,
    env: Option<&str>,
    as_json: bool,
) -> anyhow::Result<()> {
    let entries = client.scan(flashinfer::NAMESPACE, "").await?;
    let outcome = flashinfer::export_store(root, &entries, env).map_err(anyhow::Error::msg)?;
    let skipped = skipped_of(outcome.skipped);
    store_report::print(
        as_json,
        json!({"exported": outcome.exported, "environments": outcome.environments}),
        format!(
            "exported {} entries of {} environments to {}, skipped {}",
            outcome.exported,
            outcome.environments.len(),
            root.display(),
            skipped.len()
        ),
        &skipped,
    );
    if outcome.exported == 0 && env.is_some() {
        anyhow::bail!(
            "no {} entries of environment {:?}",
            flashinfer::NAMESPACE,
            env.unwrap_or_default()
        );
    }
    Ok(())
}
