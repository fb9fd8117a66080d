//! `tunecache bundle export`: the entries the daemon serves (a Scan per namespace, in the
//! client's view), filtered, and every artifact they name, fetched by GetArtifact into
//! temporary files beside the destination (one chunk in memory at a time), written as one
//! bundle by a temporary file and a rename, so that FILE is never seen half written.

use std::collections::BTreeSet;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;
use tunecache_bundle::{fingerprint, read_signing_key, write_bundle, WriteOptions, Written};
use tunecache_client::{proto, Client};

/// What `bundle export` writes.
pub struct ExportArgs {
    pub out: PathBuf,
    pub namespaces: Vec<String>,
    pub device: Option<String>,
    pub op: Option<String>,
    pub sign_key: Option<PathBuf>,
}

/// zstd's level for every part: quick, and artifacts (compiled kernels) gain little from more.
const ZSTD_LEVEL: i32 = 3;

/// The bundle's creation time: `$SOURCE_DATE_EPOCH` when set (reproducible builds' variable),
/// else now.
fn created_unix_s() -> anyhow::Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(text) if !text.is_empty() => text
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={text:?} is not a number of seconds")),
        _ => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs())),
    }
}

/// The entries to export: one Scan per namespace (every namespace when none is named), of the
/// device when one is named, then only those of the op.
async fn select(client: &Client, args: &ExportArgs) -> anyhow::Result<Vec<proto::Entry>> {
    let mut namespaces: BTreeSet<String> = args.namespaces.iter().cloned().collect();
    if namespaces.is_empty() {
        namespaces.insert(String::new());
    }
    let mut entries = Vec::new();
    for namespace in namespaces {
        let filter = proto::ScanRequest {
            namespace,
            device: args.device.clone().unwrap_or_default(),
            rank: None,
            // scan_with fills in the client's view.
            view: String::new(),
        };
        entries.extend(client.scan_with(filter).await.context("Scan")?);
    }
    if let Some(op) = &args.op {
        entries.retain(|entry| entry.key.as_ref().is_some_and(|key| &key.op == op));
    }
    Ok(entries)
}

/// Fetches every artifact the entries name into `dir`, each as a file named by its digest.
async fn fetch_artifacts(
    client: &Client,
    entries: &[proto::Entry],
    dir: &Path,
) -> anyhow::Result<()> {
    let digests: BTreeSet<&str> = entries
        .iter()
        .filter_map(|entry| entry.result.as_ref())
        .flat_map(|result| &result.artifacts)
        .map(|artifact| artifact.sha256.as_str())
        .collect();
    for sha256 in digests {
        // The digest becomes a file name: only one spelled as the contract says.
        tunecache_proto::artifact::check_digest(sha256)
            .map_err(|refusal| anyhow::anyhow!("artifact digest {sha256:?}: {refusal}"))?;
        let path = dir.join(sha256);
        let mut file = tokio::fs::File::create(&path)
            .await
            .with_context(|| format!("creating {}", path.display()))?;
        client
            .get_artifact(sha256, &mut file)
            .await
            .with_context(|| format!("fetching artifact {sha256}"))?;
        tokio::io::AsyncWriteExt::flush(&mut file)
            .await
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Writes the bundle into a temporary file in `out`'s directory, reading each artifact from
/// `blobs`, and renames it over `out` once it is whole and synced.
fn write_file(
    out: &Path,
    entries: Vec<proto::Entry>,
    blobs: &Path,
    options: &WriteOptions,
) -> anyhow::Result<Written> {
    let dir = destination_dir(out);
    let temporary = tempfile::Builder::new()
        .prefix(".tunecache-bundle-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let mut open = |artifact: &proto::Artifact| -> std::io::Result<Box<dyn Read>> {
        let file = std::fs::File::open(blobs.join(&artifact.sha256))?;
        Ok(Box::new(BufReader::with_capacity(1 << 20, file)))
    };
    let mut writer = BufWriter::with_capacity(1 << 20, temporary.as_file());
    let written = write_bundle(&mut writer, entries, &mut open, options)
        .with_context(|| format!("writing {}", out.display()))?;
    writer.flush().context("writing the bundle")?;
    drop(writer);
    // A bundle holds no secret (its signature proves who made it): readable like any file.
    use std::os::unix::fs::PermissionsExt;
    let file = temporary.as_file();
    file.set_permissions(std::fs::Permissions::from_mode(0o644))
        .context("setting the bundle's mode")?;
    file.sync_all().context("syncing the bundle")?;
    temporary
        .persist(out)
        .with_context(|| format!("renaming the bundle to {}", out.display()))?;
    Ok(written)
}

/// The directory a file is written in: its parent, or the current one for a bare name.
fn destination_dir(out: &Path) -> &Path {
    match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// `bundle export`.
pub async fn export(client: &Client, args: ExportArgs, as_json: bool) -> anyhow::Result<()> {
    // The key first: a refused key fails the command before any Scan.
    let signing_key = match &args.sign_key {
        Some(path) => Some(read_signing_key(path)?),
        None => None,
    };
    let options = WriteOptions {
        created_unix_s: created_unix_s()?,
        signing_key,
        zstd_level: ZSTD_LEVEL,
    };
    let entries = select(client, &args).await?;
    let blobs = tempfile::Builder::new()
        .prefix(".tunecache-bundle-blobs-")
        .tempdir_in(destination_dir(&args.out))
        .context("creating a directory for the artifacts")?;
    fetch_artifacts(client, &entries, blobs.path()).await?;
    let out = args.out.clone();
    let blobs_dir = blobs.path().to_path_buf();
    let written = tokio::task::spawn_blocking(move || {
        write_file(&out, entries, &blobs_dir, &options).map(|written| (written, options))
    })
    .await
    .context("writing the bundle")??;
    let (written, options) = written;
    let signer = options
        .signing_key
        .map(|key| fingerprint(&key.verifying_key()));
    print_written(&args.out, &written, signer.as_deref(), as_json);
    Ok(())
}

fn print_written(out: &Path, written: &Written, signer: Option<&str>, as_json: bool) {
    if as_json {
        println!(
            "{}",
            json!({
                "path": out.display().to_string(),
                "entries": written.entries,
                "artifacts": written.artifacts,
                "artifact_bytes": written.artifact_bytes,
                "bytes": written.bytes,
                "namespaces": written.manifest.namespaces,
                "signer": signer,
            })
        );
        return;
    }
    println!(
        "wrote {}: {} entries, {} artifacts ({} bytes), {} bytes in all, {}",
        out.display(),
        written.entries,
        written.artifacts,
        written.artifact_bytes,
        written.bytes,
        signer.map_or_else(
            || "unsigned".to_owned(),
            |signer| format!("signed by {signer}")
        )
    );
}
