//! Blobs from the tiers below the node's store (the shared directory, Redis): what a tier
//! must do to supply a blob ([`BlobSource`], the fetching side of a tier, which the store is
//! opened with and asks in `crate::tiers::TIER_ORDER`), and the one fetch per digest that
//! every GetArtifact of a missing blob waits on. A tier's bytes are trusted only once they
//! hash to the digest a held entry names; a tier whose bytes do not is counted and the next
//! one asked.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::TierResult;
use crate::tiers::TierKind;

use super::index::Refusal;
use super::ArtifactError;
use super::{add, disk::Partial, put::refusal_error, Artifacts};

/// How long one fetch from the tiers may run, whoever waits on it.
const FETCH_LIMIT: Duration = Duration::from_secs(300);

/// What a tier's fetch answers: `Ok(Some(partial))` with the bytes written into it,
/// `Ok(None)` when the tier does not have the blob, `Err` when it could not tell.
pub type FetchFuture = Pin<Box<dyn Future<Output = TierResult<Option<Partial>>> + Send>>;

/// A tier's fetching side: supplies blobs by digest.
pub trait BlobSource: Send + Sync {
    fn kind(&self) -> TierKind;
    /// Writes blob `digest` of `size` bytes into `into` (no more than `size` bytes: a tier
    /// holding more is wrong, and the digest check refuses it).
    fn fetch(&self, digest: String, size: u64, into: Partial) -> FetchFuture;
    /// The size of blob `digest` when this tier vouches for it although no entry in the
    /// cache names it: a bundle's blob, which a replaying daemon's answers name while a
    /// better live result may hold the key. `None` (the default): only what the cache
    /// names is fetched.
    fn vouches(&self, digest: &str) -> Option<u64> {
        let _ = digest;
        None
    }
}

/// How a fetch ended, as its waiters see it.
#[derive(Clone, Debug)]
pub(super) enum FetchEnd {
    Held,
    /// What each tier answered.
    NotFound(String),
    Unavailable(String),
    /// No room in the store (`--artifact-store-mib`) for it.
    Refused(Refusal),
}

pub(super) type FlightReceiver = watch::Receiver<Option<FetchEnd>>;

impl Artifacts {
    /// Makes sure the node holds `digest`, fetching it from the tiers if a held entry names
    /// it, waiting at most `wait`; a blob it cannot get is counted as a GetArtifact miss.
    pub(super) async fn ensure_held(
        self: &Arc<Self>,
        digest: &str,
        wait: Duration,
    ) -> Result<(), ArtifactError> {
        let held = self.fetch_if_named(digest, wait).await;
        if matches!(
            held,
            Err(ArtifactError::NotFound { .. } | ArtifactError::Unavailable { .. })
        ) {
            add(&self.counters.fetches_missing, 1);
        }
        held
    }

    /// `ensure_held` without counting a miss: the descriptor handoff, whose miss is counted by
    /// the GetArtifact its client falls back to.
    pub(super) async fn fetch_if_named(
        self: &Arc<Self>,
        digest: &str,
        wait: Duration,
    ) -> Result<(), ArtifactError> {
        if crate::sync::lock(&self.index).blob(digest).is_some() {
            return Ok(());
        }
        let named = crate::sync::lock(&self.index).named_size(digest);
        let vouched = || {
            self.sources
                .iter()
                .find_map(|source| source.vouches(digest))
        };
        let Some(size) = named.or_else(vouched) else {
            return Err(ArtifactError::NotFound {
                digest: digest.to_owned(),
                reason: "no entry on this node names it, so no tier was asked".to_owned(),
            });
        };
        let mut flight = self.flight(digest, size);
        let ended = tokio::time::timeout(wait, flight.wait_for(Option::is_some)).await;
        let end = match ended {
            Ok(Ok(end)) => end.clone(),
            Ok(Err(_)) => Some(FetchEnd::Unavailable("the fetch stopped".into())),
            Err(_) => {
                return Err(ArtifactError::Unavailable {
                    digest: digest.to_owned(),
                    reason: format!(
                        "no tier supplied it within {} ms (wait_ms); the fetch goes on",
                        wait.as_millis()
                    ),
                });
            }
        };
        match end {
            Some(FetchEnd::Held) => Ok(()),
            Some(FetchEnd::Refused(refusal)) => Err(refusal_error(refusal)),
            Some(FetchEnd::NotFound(answers)) => Err(ArtifactError::NotFound {
                digest: digest.to_owned(),
                reason: format!("no tier could give a blob with this digest: {answers}"),
            }),
            None => Err(ArtifactError::Unavailable {
                digest: digest.to_owned(),
                reason: "the fetch ended without an answer".to_owned(),
            }),
            Some(FetchEnd::Unavailable(reason)) => Err(ArtifactError::Unavailable {
                digest: digest.to_owned(),
                reason,
            }),
        }
    }

    /// The fetch of `digest` in progress, started if there is none.
    fn flight(self: &Arc<Self>, digest: &str, size: u64) -> FlightReceiver {
        let mut fetches = crate::sync::lock(&self.fetches);
        if let Some(flight) = fetches.get(digest) {
            return flight.clone();
        }
        let (send, receive) = watch::channel(None);
        fetches.insert(digest.to_owned(), receive.clone());
        drop(fetches);
        let this = self.clone();
        let digest = digest.to_owned();
        self.tasks.spawn(async move {
            let end = match tokio::time::timeout(FETCH_LIMIT, this.fetch(&digest, size)).await {
                Ok(end) => end,
                Err(_) => FetchEnd::Unavailable(format!("the tiers took over {FETCH_LIMIT:?}")),
            };
            crate::sync::lock(&this.fetches).remove(&digest);
            let _ = send.send(Some(end));
        });
        receive
    }

    /// Asks each tier in turn; the first whose bytes hash to `digest` supplies it.
    async fn fetch(self: &Arc<Self>, digest: &str, size: u64) -> FetchEnd {
        // Held within the store's bound, as an upload is: room first, or no fetch.
        let _room = match self.reserve(None, digest, size).await {
            Ok(room) => room,
            Err(refusal) => return FetchEnd::Refused(refusal),
        };
        let mut unavailable = Vec::new();
        let mut answers = Vec::new();
        for source in &self.sources {
            let dir = self.dir.clone();
            let partial = match Self::blocking("creating a blob", move || dir.partial()).await {
                Ok(partial) => partial,
                Err(error) => return FetchEnd::Unavailable(error.to_string()),
            };
            let tier = source.kind();
            let partial = match source.fetch(digest.to_owned(), size, partial).await {
                Ok(Some(partial)) => partial,
                Ok(None) => {
                    answers.push(format!("{} has no copy", tier.name()));
                    continue;
                }
                Err(reason) => {
                    unavailable.push(format!("{tier:?}: {reason}"));
                    continue;
                }
            };
            add(&self.counters.bytes_read_from_tiers, partial.written);
            let received = partial.digest();
            if received != digest || partial.written != size {
                add(&self.counters.digest_failures, 1);
                if self.logged.first(format!("tier {tier:?} {digest}")) {
                    tracing::warn!(
                        ?tier,
                        digest,
                        received,
                        bytes = partial.written,
                        size,
                        "a tier's copy of a blob does not hash to its digest: refused, the \
                         next tier asked (logged once per tier and blob)"
                    );
                }
                answers.push(format!(
                    "{}'s copy does not hash to it (refused, artifact_digest_failures)",
                    tier.name()
                ));
                continue;
            }
            if crate::sync::lock(&self.index).is_deleting(digest) {
                return FetchEnd::Unavailable("an older copy is being removed".into());
            }
            let (dir, name) = (self.dir.clone(), digest.to_owned());
            if let Err(error) =
                Self::blocking("storing a blob", move || partial.finish(&dir, &name)).await
            {
                return FetchEnd::Unavailable(error.to_string());
            }
            crate::sync::lock(&self.index).insert(digest.to_owned(), size, None, self.now_ms());
            add(
                match tier {
                    TierKind::Bundle => &self.counters.fetches_bundle,
                    TierKind::SharedDir => &self.counters.fetches_shared_dir,
                    TierKind::Cluster => &self.counters.fetches_cluster,
                },
                1,
            );
            return FetchEnd::Held;
        }
        if unavailable.is_empty() {
            if answers.is_empty() {
                answers.push("this node has no tier below it".to_owned());
            }
            FetchEnd::NotFound(answers.join("; "))
        } else {
            FetchEnd::Unavailable(unavailable.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::artifacts::{ArtifactSettings, Limits};
    use crate::error::TierError;

    /// A tier holding some blobs, recording each time it is asked.
    struct Fake {
        tier: TierKind,
        holds: HashMap<String, Vec<u8>>,
        asked: Arc<Mutex<Vec<TierKind>>>,
    }

    impl BlobSource for Fake {
        fn kind(&self) -> TierKind {
            self.tier
        }

        fn fetch(&self, digest: String, _size: u64, mut into: Partial) -> FetchFuture {
            crate::sync::lock(&self.asked).push(self.tier);
            let held = self.holds.get(&digest).cloned();
            Box::pin(async move {
                let Some(bytes) = held else {
                    return Ok(None);
                };
                into.write(&bytes)
                    .map_err(|e| TierError::io("writing blob", digest, e))?;
                Ok(Some(into))
            })
        }
    }

    fn digest_of(bytes: &[u8]) -> String {
        crate::artifacts::disk::hex(&Sha256::digest(bytes))
    }

    #[tokio::test]
    async fn a_fetch_asks_the_tiers_in_the_declared_order_and_stops_at_the_first_holder() {
        let state = tempfile::tempdir().unwrap();
        let settings = ArtifactSettings {
            state_dir: state.path().to_path_buf(),
            limits: Limits {
                max_blob_bytes: 1 << 20,
                store_bytes: 1 << 24,
                store_bytes_per_uid: 1 << 22,
                unreferenced_bytes_per_uid: 1 << 22,
                grace_ms: 1_000,
            },
        };
        let tasks = crate::tasks::Tasks::new();
        let (both, redis_only) = (b"in both tiers".to_vec(), b"in redis only".to_vec());
        let asked = Arc::new(Mutex::new(Vec::new()));
        // Given against the declared order: Redis first.
        let sources: Vec<Arc<dyn BlobSource>> = vec![
            Arc::new(Fake {
                tier: TierKind::Cluster,
                holds: [
                    (digest_of(&both), both.clone()),
                    (digest_of(&redis_only), redis_only.clone()),
                ]
                .into(),
                asked: Arc::clone(&asked),
            }),
            Arc::new(Fake {
                tier: TierKind::SharedDir,
                holds: [(digest_of(&both), both.clone())].into(),
                asked: Arc::clone(&asked),
            }),
            Arc::new(Fake {
                tier: TierKind::Bundle,
                holds: Default::default(),
                asked: Arc::clone(&asked),
            }),
        ];
        let artifacts = Artifacts::open(&settings, sources, &tasks).unwrap();
        let order: Vec<TierKind> = artifacts.sources.iter().map(|s| s.kind()).collect();
        assert_eq!(order, crate::tiers::TIER_ORDER);

        let end = artifacts.fetch(&digest_of(&both), both.len() as u64).await;
        assert!(matches!(end, FetchEnd::Held), "{end:?}");
        assert_eq!(
            *crate::sync::lock(&asked),
            [TierKind::Bundle, TierKind::SharedDir]
        );

        crate::sync::lock(&asked).clear();
        let end = artifacts
            .fetch(&digest_of(&redis_only), redis_only.len() as u64)
            .await;
        assert!(matches!(end, FetchEnd::Held), "{end:?}");
        assert_eq!(
            *crate::sync::lock(&asked),
            [TierKind::Bundle, TierKind::SharedDir, TierKind::Cluster]
        );
        assert_eq!(
            artifacts
                .counters
                .fetches_shared_dir
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!(
            artifacts
                .counters
                .fetches_cluster
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }
}
