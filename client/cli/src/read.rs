//! The commands that read the cache: `get` (a key, and its files with `--artifacts-to`),
//! `scan`, `resolve` and `devices`.

use std::path::Path;

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_client::{proto, Client, TuneStart};

use crate::entry_output::{entry_json, entry_line};
use crate::KeyArgs;

/// `get`: prints the hit (after writing its files into `artifacts_to`), or exits 1 on a miss.
pub async fn get(
    client: &Client,
    key_args: &KeyArgs,
    artifacts_to: Option<&Path>,
    as_json: bool,
) -> anyhow::Result<()> {
    let hits = client.lookup(vec![key_args.to_key()]).await?;
    match hits.first() {
        Some(entry) => {
            // The files first: a failed fetch fails the command before it prints a hit
            // whose files are not there.
            let written = match artifacts_to {
                Some(dir) => {
                    // Made if missing, as `mkdir -p` would: a new directory is the usual ask.
                    tokio::fs::create_dir_all(dir)
                        .await
                        .with_context(|| format!("making {}", dir.display()))?;
                    client
                        .fetch_artifacts(entry, dir)
                        .await
                        .with_context(|| format!("fetching artifacts into {}", dir.display()))?
                }
                None => Vec::new(),
            };
            if as_json {
                let mut value = entry_json(entry);
                if artifacts_to.is_some() {
                    value["written"] = json!(written
                        .iter()
                        .map(|path| path.display().to_string())
                        .collect::<Vec<_>>());
                }
                println!("{value}");
            } else {
                println!("{}", entry_line(entry));
                for path in &written {
                    eprintln!("wrote {}", path.display());
                }
            }
        }
        None => {
            if as_json {
                println!("null");
            } else {
                eprintln!("miss");
            }
            std::process::exit(1);
        }
    }
    Ok(())
}

/// `scan`: every entry matching the filter, in this client's view.
pub async fn scan(
    client: &Client,
    namespace: String,
    device: String,
    rank: Option<u32>,
    as_json: bool,
) -> anyhow::Result<()> {
    let filter = proto::ScanRequest {
        namespace,
        device,
        rank,
        view: String::new(),
    };
    let entries = client.scan_with(filter).await?;
    if as_json {
        let list: Vec<Value> = entries.iter().map(entry_json).collect();
        println!("{}", Value::Array(list));
    } else {
        for entry in &entries {
            println!("{}", entry_line(entry));
        }
    }
    Ok(())
}

/// `devices`: the node's tuning devices and their fingerprints.
pub async fn devices(client: &Client, as_json: bool) -> anyhow::Result<()> {
    for device in client.devices().await? {
        if as_json {
            println!(
                "{}",
                json!({
                    "backend": device.backend,
                    "name": device.name,
                    "compute_capability": device.compute_capability,
                    "memory_bytes": device.memory_bytes,
                    "driver_version": device.driver_version,
                    "cuda_version": device.cuda_version,
                    "fingerprint": device.fingerprint,
                })
            );
        } else {
            println!(
                "{}\t{}\t{}",
                device.backend, device.fingerprint, device.name
            );
        }
    }
    Ok(())
}

/// `resolve`: what a rank would be told for the key.
pub async fn resolve(
    client: &Client,
    key: &KeyArgs,
    wait_ms: u64,
    can_tune: bool,
    lease_ms: u64,
    as_json: bool,
) -> anyhow::Result<()> {
    let options = tunecache_client::ResolveOptions {
        wait: std::time::Duration::from_millis(wait_ms),
        can_tune,
        lease: std::time::Duration::from_millis(lease_ms),
    };
    let start = client.begin_tune(key.to_key(), options).await?;
    print_resolution(&key.to_key(), &start, as_json);
    Ok(())
}

fn print_resolution(key: &proto::Key, start: &TuneStart, as_json: bool) {
    let value = match start {
        TuneStart::Hit(result) => {
            let entry = proto::Entry {
                key: Some(key.clone()),
                result: Some(result.clone()),
            };
            if !as_json {
                println!("hit: {}", entry_line(&entry));
                return;
            }
            json!({"outcome": "hit", "entry": entry_json(&entry)})
        }
        TuneStart::Tune(lease) => {
            if !as_json {
                println!(
                    "tune here: lease {} expires in {} ms; record with --lease-id",
                    lease.lease_id(),
                    lease.expires_in_ms()
                );
                return;
            }
            json!({"outcome": "tune_here", "lease_id": lease.lease_id(), "expires_in_ms": lease.expires_in_ms()})
        }
        TuneStart::Miss(reason) => {
            if !as_json {
                println!("miss: {reason}");
                return;
            }
            json!({"outcome": "miss", "reason": reason})
        }
    };
    println!("{value}");
}
