//! `tunecache bundle`: a bundle's manifest shown (`inspect`), its parts and signer checked
//! (`verify`), and two sets of entries compared (`diff`, a bundle or what the daemon serves
//! on either side). Writing one is `bundle_export`'s. Only `export` and a `live` side connect
//! to the daemon.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Value};
use tunecache_bundle::{fingerprint, read_verifying_key, Bundle, BundleError, Verified};
use tunecache_client::proto;

use crate::bundle_export::{export, ExportArgs};
use crate::entry_output::{entry_json, entry_line, key_json, key_line};
use crate::{BundleCommand, Daemon};

/// The side of a diff that is what the daemon serves now.
const LIVE: &str = "live";

pub async fn run(command: BundleCommand, daemon: &Daemon, as_json: bool) -> anyhow::Result<()> {
    match command {
        BundleCommand::Export {
            out,
            namespace,
            device,
            op,
            sign_key,
        } => {
            let args = ExportArgs {
                out,
                namespaces: namespace,
                device,
                op,
                sign_key,
            };
            export(&daemon.connect().await?, args, as_json).await
        }
        BundleCommand::Inspect { file } => inspect(&file, as_json),
        BundleCommand::Verify { file, trust_key } => verify(&file, &trust_key, as_json),
        BundleCommand::Diff { a, b } => diff(&a, &b, daemon, as_json).await,
    }
}

/// Opens a bundle, its errors said as the daemon says them: `bundle FILE: <why>`.
fn open(file: &Path) -> anyhow::Result<Bundle> {
    Bundle::open(file).with_context(|| format!("bundle {}", file.display()))
}

/// Every part streamed and checked, and the entries decoded and checked.
fn check_parts(bundle: &Bundle) -> Result<Verified, BundleError> {
    let verified = bundle.verify_parts()?;
    bundle.entries()?;
    Ok(verified)
}

fn signer_text(bundle: &Bundle) -> String {
    bundle
        .signer()
        .map_or_else(|| "unsigned".to_owned(), fingerprint)
}

/// `bundle inspect`: the manifest, then whether every part matches; exits 1 when one does not.
fn inspect(file: &Path, as_json: bool) -> anyhow::Result<()> {
    let bundle = open(file)?;
    let checked = check_parts(&bundle);
    let manifest = bundle.manifest();
    let bytes = std::fs::metadata(file)
        .with_context(|| format!("bundle {}", file.display()))?
        .len();
    let artifact_bytes: u64 = manifest.artifacts.iter().map(|a| a.size).sum();
    if as_json {
        println!(
            "{}",
            json!({
                "path": file.display().to_string(),
                "format": manifest.format,
                "version": manifest.version,
                "created_unix_s": manifest.created_unix_s,
                "entries": manifest.entries.count,
                "artifacts": manifest.artifacts.len(),
                "artifact_bytes": artifact_bytes,
                "bytes": bytes,
                "namespaces": manifest.namespaces,
                "devices": manifest.devices,
                "signer": bundle.signer().map(fingerprint),
                "verified": checked.is_ok(),
                "error": checked.as_ref().err().map(ToString::to_string),
                "manifest": manifest,
            })
        );
    } else {
        println!("bundle {}", file.display());
        println!("format: {} version {}", manifest.format, manifest.version);
        println!("created: {} (unix seconds)", manifest.created_unix_s);
        println!(
            "entries: {} ({} bytes, {} stored)",
            manifest.entries.count, manifest.entries.content_len, manifest.entries.stored_len
        );
        println!(
            "artifacts: {} ({artifact_bytes} bytes)",
            manifest.artifacts.len()
        );
        for artifact in &manifest.artifacts {
            println!(
                "  {} {} bytes ({} stored)",
                artifact.sha256, artifact.size, artifact.stored_len
            );
        }
        println!("bytes: {bytes}");
        println!("namespaces: {}", manifest.namespaces.join(", "));
        println!("devices: {}", manifest.devices.join(", "));
        println!("signer: {}", signer_text(&bundle));
        match &checked {
            Ok(_) => println!("digests: every part matches"),
            Err(error) => println!("digests: FAILED: {error}"),
        }
    }
    if checked.is_err() {
        std::process::exit(1);
    }
    Ok(())
}

/// `bundle verify`: exits 0 only when every part matches and, with trusted keys, one of them
/// signed the bundle; otherwise says which part and why on stderr and exits 1.
fn verify(file: &Path, trust_keys: &[PathBuf], as_json: bool) -> anyhow::Result<()> {
    // A key that cannot be read is the caller's mistake (exit 2), not the bundle's.
    let trusted = trust_keys
        .iter()
        .map(|path| read_verifying_key(path))
        .collect::<Result<Vec<_>, _>>()?;
    let checked = Bundle::open(file).and_then(|bundle| {
        bundle.check_trust(&trusted)?;
        let verified = check_parts(&bundle)?;
        Ok((bundle, verified))
    });
    match checked {
        Ok((bundle, verified)) => {
            if as_json {
                println!(
                    "{}",
                    json!({
                        "path": file.display().to_string(),
                        "ok": true,
                        "parts": verified.parts,
                        "stored_bytes": verified.stored_bytes,
                        "content_bytes": verified.content_bytes,
                        "signer": bundle.signer().map(fingerprint),
                        "trusted": !trusted.is_empty(),
                    })
                );
            } else {
                let trust = if trusted.is_empty() {
                    ""
                } else {
                    ", a trusted key"
                };
                println!(
                    "bundle {}: ok: {} parts match their digests ({} bytes); {}{trust}",
                    file.display(),
                    verified.parts,
                    verified.content_bytes,
                    signer_text(&bundle),
                );
            }
            Ok(())
        }
        Err(error) => {
            if as_json {
                println!(
                    "{}",
                    json!({
                        "path": file.display().to_string(),
                        "ok": false,
                        "part": error.part_name(),
                        "error": error.to_string(),
                    })
                );
            }
            eprintln!("tunecache: bundle {}: {error}", file.display());
            std::process::exit(1);
        }
    }
}

/// The entries of one side of a diff: a bundle's, or with `live` every entry the daemon
/// serves (in the client's view).
async fn side(name: &str, daemon: &Daemon) -> anyhow::Result<Vec<proto::Entry>> {
    if name == LIVE {
        let client = daemon.connect().await?;
        let everything = proto::ScanRequest::default();
        return client.scan_with(everything).await.context("Scan");
    }
    let file = Path::new(name);
    open(file)?
        .entries()
        .with_context(|| format!("bundle {}", file.display()))
}

/// `bundle diff A B`: exits 1 when they differ, as diff(1) does.
async fn diff(a: &str, b: &str, daemon: &Daemon, as_json: bool) -> anyhow::Result<()> {
    let found = tunecache_bundle::diff::diff(side(a, daemon).await?, side(b, daemon).await?);
    if as_json {
        let different: Vec<Value> = found
            .different
            .iter()
            .map(|changed| {
                json!({
                    "key": changed.a.key.as_ref().map_or(Value::Null, key_json),
                    "fields": changed.fields,
                    "a": entry_json(&changed.a),
                    "b": entry_json(&changed.b),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "only_in_a": found.only_in_a.iter().map(entry_json).collect::<Vec<_>>(),
                "only_in_b": found.only_in_b.iter().map(entry_json).collect::<Vec<_>>(),
                "different": different,
            })
        );
    } else {
        for entry in &found.only_in_a {
            println!("only in {a}: {}", entry_line(entry));
        }
        for entry in &found.only_in_b {
            println!("only in {b}: {}", entry_line(entry));
        }
        for changed in &found.different {
            let key = changed
                .a
                .key
                .as_ref()
                .map_or_else(|| "(no key)".to_owned(), key_line);
            println!("different ({}): {key}", changed.fields.join(", "));
            println!("  {a}: {}", entry_line(&changed.a));
            println!("  {b}: {}", entry_line(&changed.b));
        }
        println!(
            "{} only in {a}, {} only in {b}, {} different",
            found.only_in_a.len(),
            found.only_in_b.len(),
            found.different.len()
        );
    }
    if !found.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
