//! The tiers below the node's store (the shared directory, Redis): what a tier must do to
//! supply a blob ([`BlobSource`]), and the one fetch per digest that every GetArtifact of a
//! missing blob waits on. A tier's bytes are trusted only once they hash to the digest a
//! held entry names; a tier whose bytes do not is counted and the next one asked.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::TierResult;

use super::index::Refusal;
use super::ArtifactError;
use super::{add, disk::Partial, put::refusal_error, Artifacts};

/// How long one fetch from the tiers may run, whoever waits on it.
const FETCH_LIMIT: Duration = Duration::from_secs(300);

/// Which tier supplied a blob (counted per tier in Stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    SharedDir,
    Cluster,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Tier::SharedDir => "the shared directory",
            Tier::Cluster => "Redis",
        }
    }
}

/// What a tier's fetch answers: `Ok(Some(partial))` with the bytes written into it,
/// `Ok(None)` when the tier does not have the blob, `Err` when it could not tell.
pub type FetchFuture = Pin<Box<dyn Future<Output = TierResult<Option<Partial>>> + Send>>;

/// A tier that can supply blobs by digest.
pub trait BlobSource: Send + Sync {
    fn tier(&self) -> Tier;
    /// Writes blob `digest` of `size` bytes into `into` (no more than `size` bytes: a tier
    /// holding more is wrong, and the digest check refuses it).
    fn fetch(&self, digest: String, size: u64, into: Partial) -> FetchFuture;
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
        let Some(size) = crate::sync::lock(&self.index).named_size(digest) else {
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
        for source in self.sources() {
            let dir = self.dir.clone();
            let partial = match Self::blocking("creating a blob", move || dir.partial()).await {
                Ok(partial) => partial,
                Err(error) => return FetchEnd::Unavailable(error.to_string()),
            };
            let tier = source.tier();
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
                    Tier::SharedDir => &self.counters.fetches_shared_dir,
                    Tier::Cluster => &self.counters.fetches_cluster,
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
