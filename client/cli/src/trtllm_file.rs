//! `tunecache import` and `tunecache export`: TensorRT-LLM's tuning-cache file
//! (TLLM_AUTOTUNER_CACHE_PATH) read into the cache, and the cache written back as that file,
//! with the entries either side could not take reported as skipped.

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::{proto, Client};
use tunecache_trtllm as trtllm;

fn skipped_json(skipped: &[trtllm::SkippedEntry]) -> Vec<Value> {
    skipped
        .iter()
        .map(|s| json!({"section": s.section, "key": s.key, "reason": s.reason}))
        .collect()
}

fn print_skipped(skipped: &[trtllm::SkippedEntry]) {
    for entry in skipped {
        let key = if entry.key.is_empty() {
            "(whole section)"
        } else {
            entry.key.as_str()
        };
        eprintln!("skipped [{}] {key}: {}", entry.section, entry.reason);
    }
}

fn skipped_for(entry: &proto::Entry, reason: String) -> trtllm::SkippedEntry {
    let key = entry.key.as_ref();
    trtllm::SkippedEntry {
        section: key
            .and_then(|key| key.rank)
            .map_or_else(|| "shared".to_owned(), |rank| format!("rank_{rank}")),
        key: key.map(|key| key.problem.clone()).unwrap_or_default(),
        reason,
    }
}

/// Imports every valid entry; exits non-zero only when the file is not a cache or nothing in it
/// could be stored.
pub async fn import_trtllm(
    client: &Client,
    device: Option<String>,
    file: &std::path::Path,
    as_json: bool,
) -> anyhow::Result<()> {
    let text = trtllm::read_existing(file)?
        .with_context(|| format!("{} does not exist", file.display()))?;
    let outcome = trtllm::import_with(&text, &trtllm::ImportOptions { device })
        .with_context(|| format!("reading {}", file.display()))?;
    // One bad entry never costs the others: the client sets each refused entry aside and
    // splits a batch over the daemon's message size (tunecache_client::record).
    let kept = client
        .record_keeping_valid(outcome.entries)
        .await
        .context("record")?;
    let mut skipped = outcome.skipped;
    skipped.extend(kept.refused.iter().map(|refused| {
        skipped_for(
            &refused.entry,
            format!("daemon refused it: {}", refused.status.message()),
        )
    }));
    let accepted = kept.stored + kept.unchanged;
    if as_json {
        println!(
            "{}",
            json!({"imported": accepted, "stored": kept.stored, "unchanged": kept.unchanged,
                   "skipped": skipped_json(&skipped)})
        );
    } else {
        print_skipped(&skipped);
        println!(
            "imported {accepted} entries ({} stored, {} unchanged), skipped {}",
            kept.stored,
            kept.unchanged,
            skipped.len()
        );
    }
    if accepted == 0 && !skipped.is_empty() {
        anyhow::bail!("no entry of {} could be stored", file.display());
    }
    Ok(())
}

/// The distinct `Key.device`s of `entries`, sorted.
fn devices_of(entries: &[proto::Entry]) -> Vec<String> {
    let devices: std::collections::BTreeSet<&str> = entries
        .iter()
        .filter_map(|entry| entry.key.as_ref())
        .map(|key| key.device.as_str())
        .collect();
    devices.into_iter().map(str::to_owned).collect()
}

pub struct ExportArgs {
    pub device: Option<String>,
    pub world_size: Option<u32>,
    pub lock_timeout: std::time::Duration,
}

pub async fn export_trtllm(
    client: &Client,
    args: ExportArgs,
    file: &std::path::Path,
    as_json: bool,
) -> anyhow::Result<()> {
    let entries = client
        .scan(trtllm::NAMESPACE, args.device.as_deref().unwrap_or(""))
        .await?;
    let devices = devices_of(&entries);
    if args.device.is_none() && devices.len() > 1 {
        anyhow::bail!(
            "the cache holds {} entries of {} devices ({}); a file holds one device's tactics: \
             choose one with --device",
            trtllm::NAMESPACE,
            devices.len(),
            devices
                .iter()
                .map(|device| format!("{device:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let metadata = match (trtllm::TrtllmMetadata::from_entries(&entries), &args.device) {
        (Some(metadata), _) => metadata,
        (None, Some(device)) => trtllm::TrtllmMetadata::for_device(device)?,
        (None, None) if entries.is_empty() => {
            anyhow::bail!("no {} entries in the cache to export", trtllm::NAMESPACE)
        }
        (None, None) => anyhow::bail!(
            "the entries carry no TensorRT-LLM metadata (they were not imported); name the device \
             with --device \"<device name>|sm_<major><minor>|trtllm <version>\""
        ),
    };
    let export_device = args
        .device
        .clone()
        .or_else(|| devices.first().cloned())
        .unwrap_or_else(|| metadata.device_fingerprint());

    // Under the writers' lock: keep what ranks saved to the file that the cache lacks, then
    // replace the file by rename, as their writers do.
    let _lock = trtllm::WriterLock::acquire(file, args.lock_timeout)?;
    let mut merge = trtllm::FileMerge::default();
    let mut all_entries = entries;
    if let Some(text) = trtllm::read_existing(file)? {
        match trtllm::import_with(&text, &trtllm::ImportOptions::default()) {
            Ok(existing) => {
                merge = trtllm::merge_file_entries(&mut all_entries, existing, &export_device);
            }
            Err(error) => eprintln!(
                "tunecache: replacing {}, which is not a readable cache ({error})",
                file.display()
            ),
        }
    }
    let trtllm::FileMerge {
        kept_from_file,
        replaced_device,
    } = merge;
    let options = trtllm::ExportOptions {
        empty_rank_sections: (0..args.world_size.unwrap_or(0)).collect(),
    };
    let outcome = trtllm::export(&all_entries, &metadata, &options)?;
    trtllm::write_atomically(file, outcome.json_text.as_bytes())?;
    if as_json {
        let skipped = skipped_json(&outcome.skipped);
        println!(
            "{}",
            json!({"exported": outcome.exported, "kept_from_file": kept_from_file,
                   "device": export_device, "replaced_device": replaced_device, "skipped": skipped})
        );
    } else {
        print_skipped(&outcome.skipped);
        if let Some(old) = &replaced_device {
            eprintln!(
                "tunecache: {} held entries of device {old:?}; replaced",
                file.display()
            );
        }
        println!(
            "exported {} entries of {export_device:?} to {} ({kept_from_file} kept from the file), skipped {}",
            outcome.exported,
            file.display(),
            outcome.skipped.len()
        );
    }
    Ok(())
}
