//! The bundle tier (issue 52, docs/bundles.md): the files staging exported and signed,
//! served read-only (`--bundle FILE`, repeatable).
//!
//! Each bundle is verified whole at start, on a blocking thread: every part against its
//! digest, the signature against `--bundle-trust-key` when keys are given, and every entry
//! checked exactly as a learned result is (a bundle is untrusted input like a segment or
//! Redis). One that fails stops the start, naming the file, the part and the reason. Its
//! entries then enter the cache as one more source, merged by the usual rule (never
//! republished: every node has the bundle). On a daemon started with `--replay` they also
//! answer their keys whatever the cache holds (`views::replay`, which gets `entry_map`).
//!
//! Its blobs stay in the file: a rank that asks for one (GetArtifact, the handoff) has it
//! fetched from the bundle into the store like any tier's ([`BundleBlobs`], first in
//! `tiers::TIER_ORDER`: a local file). As a tier it publishes nothing and keeps no resume
//! point: the `Tier` trait's defaults.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tunecache_bundle::{Bundle, BundleError};

use crate::artifacts::tiers::FetchFuture;
use crate::artifacts::{BlobSource, Partial};
use crate::error::TierError;
use crate::model::entry::{CacheKey, TunedResult};
use crate::tiers::{Tier, TierHealth, TierKind};
use crate::wire::stored::{EntryMap, StoredEntry};
use crate::Error;

/// What `--bundle`, `--bundle-trust-key` and `--replay` say.
#[derive(Clone, Debug, Default)]
pub struct BundleSettings {
    pub files: Vec<PathBuf>,
    pub trust_keys: Vec<PathBuf>,
    pub replay: bool,
}

/// Why a bundle stops the start: the file, and the part and reason.
fn refused(file: &Path, reason: impl ToString) -> Error {
    Error::BundleRefused {
        file: file.to_owned(),
        reason: reason.to_string(),
    }
}

/// The node's bundles, verified: their entries (merged across bundles by the usual rule)
/// and where each blob lies.
pub struct Bundles {
    files: Vec<Arc<Bundle>>,
    /// Each blob's bundle (its place in `files`) and size.
    blobs: HashMap<String, (usize, u64)>,
    entries: Arc<EntryMap>,
}

impl Bundles {
    /// Opens and verifies every bundle `settings` names: `None` when it names none. Reads
    /// every byte of every file: run it on a blocking thread.
    pub fn open(settings: &BundleSettings) -> crate::Result<Option<Bundles>> {
        if settings.files.is_empty() {
            if settings.replay {
                tracing::warn!("--replay without --bundle: every key is answered at once from the cache as it is, never tuned");
            }
            return Ok(None);
        }
        let trusted = settings
            .trust_keys
            .iter()
            .map(|path| {
                tunecache_bundle::read_verifying_key(path)
                    .map_err(|why| refused(path, format!("--bundle-trust-key: {why}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut files = Vec::new();
        let mut blobs = HashMap::new();
        let mut entries = EntryMap::new();
        for path in &settings.files {
            let started = std::time::Instant::now();
            let bundle = open_one(path, &trusted)?;
            let index = files.len();
            let mut count = 0;
            for (key, result) in checked_entries(&bundle).map_err(|why| refused(path, why))? {
                count += 1;
                for artifact in result.artifacts.view().iter() {
                    blobs.insert(artifact.sha256.to_owned(), (index, artifact.size));
                }
                insert_merged(&mut entries, &key, &result);
            }
            tracing::info!(
                bundle = %path.display(),
                entries = count,
                blobs = bundle.manifest().artifacts.len(),
                signer = %bundle.signer().map_or_else(|| "unsigned".to_owned(), tunecache_bundle::fingerprint),
                verify_ms = started.elapsed().as_millis() as u64,
                "bundle verified"
            );
            files.push(Arc::new(bundle));
        }
        Ok(Some(Bundles {
            files,
            blobs,
            entries: Arc::new(entries),
        }))
    }

    /// The bundles' entries by key: what answers their keys on a replaying daemon.
    pub fn entry_map(&self) -> Arc<EntryMap> {
        Arc::clone(&self.entries)
    }

    /// The bundles' fetching side, for the artifact store.
    pub fn blob_source(self: &Arc<Self>) -> Arc<dyn BlobSource> {
        Arc::new(BundleBlobs(Arc::clone(self)))
    }
}

/// A bundle opened, trusted and verified part by part.
fn open_one(path: &Path, trusted: &[tunecache_bundle::VerifyingKey]) -> crate::Result<Bundle> {
    let bundle = Bundle::open(path).map_err(|why| refused(path, why))?;
    bundle
        .check_trust(trusted)
        .map_err(|why| refused(path, why))?;
    bundle.verify_parts().map_err(|why| refused(path, why))?;
    Ok(bundle)
}

/// A bundle's entries, each checked as a learned result is: all or nothing.
fn checked_entries(bundle: &Bundle) -> Result<Vec<(CacheKey, TunedResult)>, String> {
    let entries = bundle
        .entries()
        .map_err(|why: BundleError| why.to_string())?;
    entries
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let key = crate::model::validate::key(&format!("entries[{index}].key"), entry.key)
                .map_err(|why| format!("part \"entries\": {why}"))?;
            let result = entry
                .result
                .ok_or_else(|| format!("part \"entries\": entries[{index}].result: required"))?;
            let result =
                crate::model::validate::learned_result(&format!("entries[{index}].result"), result)
                    .map_err(|why| format!("part \"entries\": {why}"))?;
            Ok((key, result))
        })
        .collect()
}

/// Puts `key`'s `result` in `entries` if it beats what another bundle gave it: the merge
/// rule decides between bundles as everywhere.
fn insert_merged(entries: &mut EntryMap, key: &CacheKey, result: &TunedResult) {
    let incoming = StoredEntry::new(key, result);
    let current = entries.get(key).map(StoredEntry::result);
    if crate::model::merge::merge_views(current, incoming.result())
        == crate::model::merge::MergeOutcome::Replace
    {
        entries.insert(incoming);
    }
}

/// Entries merged per write: within the write queue's room, however large the bundle.
const MERGE_BATCH: usize = 4096;

/// Merges the bundles' entries into `store` as learned entries (never republished), in
/// batches; a Forget this node knows still removes what it removed.
pub async fn merge_into(bundles: &Bundles, store: &crate::store::Store) -> crate::Result<()> {
    let entries: Vec<StoredEntry> = bundles.entries.iter().cloned().collect();
    let (mut stored, total) = (0, entries.len());
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        let batch: Vec<StoredEntry> = entries.by_ref().take(MERGE_BATCH).collect();
        stored += store
            .apply_stored(
                batch,
                crate::model::entry::Origin::Learned,
                crate::store::Source::Bundle,
            )
            .await?
            .stored;
    }
    tracing::info!(entries = total, stored, "bundles merged into the cache");
    Ok(())
}

impl Tier for Bundles {
    fn kind(&self) -> TierKind {
        TierKind::Bundle
    }

    fn health(&self) -> TierHealth {
        TierHealth {
            name: "tunecache.bundles",
            poll: Duration::from_secs(60),
        }
    }

    /// Verified at start, read-only since: serving for the daemon's life.
    fn serving(&self) -> bool {
        true
    }
}

crate::report::stats_registry! {
    /// The bundle tier's Stats fields.
    impl FillStats for Bundles {
        fn fill_stats(bundles, stats) {}
        fields {
            bundles_loaded = bundles.files.len() as u64
                => gauge(141, "Bundles this daemon serves (--bundle), each verified at start."),
            bundle_entries = bundles.entries.len() as u64
                => gauge(142, "Entries of those bundles, merged into the cache at start."),
        }
    }
}

/// The bundles' blobs, read from their files on demand.
struct BundleBlobs(Arc<Bundles>);

impl BlobSource for BundleBlobs {
    fn kind(&self) -> TierKind {
        TierKind::Bundle
    }

    fn vouches(&self, digest: &str) -> Option<u64> {
        self.0.blobs.get(digest).map(|(_, size)| *size)
    }

    fn fetch(&self, digest: String, size: u64, mut into: Partial) -> FetchFuture {
        let Some(bundle) = self
            .0
            .blobs
            .get(&digest)
            .and_then(|(index, _)| self.0.files.get(*index))
            .cloned()
        else {
            return Box::pin(async { Ok(None) });
        };
        Box::pin(async move {
            let path = bundle.path().to_owned();
            tokio::task::spawn_blocking(move || -> Result<Option<Partial>, TierError> {
                let reader = bundle.open_artifact(&digest).map_err(|why| {
                    TierError::Refused(format!("{}: {why}", bundle.path().display()))
                })?;
                // A part holding more than its size is wrong: the digest check refuses it.
                let mut reader = std::io::Read::take(reader, size.saturating_add(1));
                into.copy_from(&mut reader).map_err(|e| {
                    TierError::io(format!("reading blob {digest} from bundle"), path, e)
                })?;
                Ok(Some(into))
            })
            .await?
        })
    }
}
