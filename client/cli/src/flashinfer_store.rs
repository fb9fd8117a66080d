//! `tunecache import flashinfer ROOT` and `tunecache export flashinfer ROOT [--env HASH]`:
//! FlashInfer's managed autotune store (`autotune_v2`, `ROOT/v2/<env_hash>/`) read into the cache,
//! every environment of it, and the cache written back as that store, byte for byte what
//! FlashInfer's own `publish` writes, with `manifest.json`. The mapping is `tunecache-flashinfer`'s,
//! the one the Python drop-in uses.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::Client;
use tunecache_flashinfer as flashinfer;

fn skipped_json(skipped: &[flashinfer::SkippedFile]) -> Vec<Value> {
    skipped
        .iter()
        .map(|s| json!({"path": s.path, "reason": s.reason}))
        .collect()
}

fn print_skipped(skipped: &[flashinfer::SkippedFile]) {
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

/// Imports every entry file their `lookup` would serve; exits non-zero only when `ROOT/v2`
/// cannot be read or nothing in it could be stored.
pub async fn import(client: &Client, root: &Path, as_json: bool) -> anyhow::Result<()> {
    let outcome = flashinfer::import_store(root, "tunecache import flashinfer", now_ms())
        .map_err(anyhow::Error::msg)?;
    let kept = client
        .record_keeping_valid(outcome.entries)
        .await
        .context("record")?;
    let mut skipped = outcome.skipped;
    skipped.extend(kept.refused.iter().map(|refused| {
        flashinfer::SkippedFile {
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
            json!({"imported": outcome.files, "environments": outcome.environments,
                   "stored": kept.stored, "unchanged": kept.unchanged,
                   "skipped": skipped_json(&skipped)})
        );
    } else {
        print_skipped(&skipped);
        println!(
            "imported {} entries of {} environments ({} stored, {} unchanged, op units included), skipped {}",
            outcome.files,
            outcome.environments,
            kept.stored,
            kept.unchanged,
            skipped.len()
        );
    }
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
    if as_json {
        println!(
            "{}",
            json!({"exported": outcome.exported, "environments": outcome.environments,
                   "skipped": skipped_json(&outcome.skipped)})
        );
    } else {
        print_skipped(&outcome.skipped);
        println!(
            "exported {} entries of {} environments to {}, skipped {}",
            outcome.exported,
            outcome.environments.len(),
            root.display(),
            outcome.skipped.len()
        );
    }
    if outcome.exported == 0 && env.is_some() {
        anyhow::bail!(
            "no {} entries of environment {:?}",
            flashinfer::NAMESPACE,
            env.unwrap_or_default()
        );
    }
    Ok(())
}
