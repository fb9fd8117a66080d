//! The daemon's own representation of cache keys and results, and their conversions to and
//! from the wire types of `tunecache.v1`.
//!
//! `CacheKey` orders by (namespace, op, device, problem, rank), so a sorted map keeps each
//! namespace contiguous (cheap Scan filters) and iterates in the same order on every node
//! (deterministic snapshot bytes).

use tunecache_proto::v1;

use crate::model::artifacts::{ArtifactList, ArtifactsView};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CacheKey {
    pub namespace: String,
    pub op: String,
    pub device: String,
    pub problem: String,
    /// `None`: shared by all ranks. `Some(n)`: rank n's own entry; a different key.
    pub rank: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TunedResult {
    /// JSON text, validated on the way in.
    pub config: String,
    pub time_us: f64,
    pub tuned_by: String,
    pub tuned_at_unix_ms: i64,
    /// The stamp of the newest Forget of this key the recording node knew (`model::forget`):
    /// the first thing the merge rule compares. Assigned by the daemon, never by a client.
    pub forget_epoch: u64,
    /// The files the tuner built, in their canonical form (`model::artifacts`).
    pub artifacts: ArtifactList,
}

/// Where an entry came from: the provenance the store and the journal keep per entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// This node's own contribution: a Record from its ranks or its tuner's result. Published
    /// to the shared directory.
    Own,
    /// Learned from another node (a snapshot file or segment); never republished.
    Learned,
}

/// A key borrowed from wherever it is held (a `CacheKey`, or a stored entry's bytes and
/// interned vocabulary). Orders exactly as `CacheKey` does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeyView<'a> {
    pub namespace: &'a str,
    pub op: &'a str,
    pub device: &'a str,
    pub problem: &'a str,
    pub rank: Option<u32>,
}

/// A result borrowed from wherever it is held; what the merge rule compares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResultView<'a> {
    pub config: &'a str,
    pub time_us: f64,
    pub tuned_by: &'a str,
    pub tuned_at_unix_ms: i64,
    pub forget_epoch: u64,
    pub artifacts: ArtifactsView<'a>,
}

impl<'a> KeyView<'a> {
    /// The smallest key of a namespace: where a Scan of that namespace starts.
    pub fn namespace_start(namespace: &'a str) -> KeyView<'a> {
        KeyView {
            namespace,
            op: "",
            device: "",
            problem: "",
            rank: None,
        }
    }

    /// The order of `CacheKey` (field by field, strings by bytes), for views.
    pub fn order(&self, other: &KeyView<'_>) -> std::cmp::Ordering {
        self.namespace
            .cmp(other.namespace)
            .then_with(|| self.op.cmp(other.op))
            .then_with(|| self.device.cmp(other.device))
            .then_with(|| self.problem.cmp(other.problem))
            .then_with(|| self.rank.cmp(&other.rank))
    }

    /// Approximate bytes this key occupies in the journal; used to decide when to compact
    /// and where to cut journal frames.
    pub fn encoded_len_estimate(&self) -> usize {
        self.namespace.len() + self.op.len() + self.device.len() + self.problem.len() + 16
    }

    pub fn to_key(&self) -> CacheKey {
        CacheKey {
            namespace: self.namespace.to_owned(),
            op: self.op.to_owned(),
            device: self.device.to_owned(),
            problem: self.problem.to_owned(),
            rank: self.rank,
        }
    }
}

impl ResultView<'_> {
    pub fn encoded_len_estimate(&self) -> usize {
        self.config.len() + self.tuned_by.len() + self.artifacts.encoded().len() + 24
    }

    pub fn to_result(&self) -> TunedResult {
        TunedResult {
            config: self.config.to_owned(),
            time_us: self.time_us,
            tuned_by: self.tuned_by.to_owned(),
            tuned_at_unix_ms: self.tuned_at_unix_ms,
            forget_epoch: self.forget_epoch,
            artifacts: self.artifacts.to_list(),
        }
    }
}

/// An ordered collection of entries that can be read as views: what a snapshot segment is
/// written from (the store's wire-form `EntryMap`, or a decoded `CacheMap`).
pub trait EntryViews {
    fn entry_count(&self) -> usize;
    /// The entries in key order.
    fn views(&self) -> Box<dyn Iterator<Item = (KeyView<'_>, ResultView<'_>)> + '_>;
}

/// For tests, which build entry maps from decoded entries.
#[cfg(any(test, feature = "test-support"))]
impl EntryViews for imbl::OrdMap<CacheKey, TunedResult> {
    fn entry_count(&self) -> usize {
        self.len()
    }

    fn views(&self) -> Box<dyn Iterator<Item = (KeyView<'_>, ResultView<'_>)> + '_> {
        Box::new(self.iter().map(|(key, result)| (key.view(), result.view())))
    }
}

impl CacheKey {
    pub fn view(&self) -> KeyView<'_> {
        KeyView {
            namespace: &self.namespace,
            op: &self.op,
            device: &self.device,
            problem: &self.problem,
            rank: self.rank,
        }
    }

    /// Approximate bytes this key occupies in the journal; used to decide when to compact.
    pub fn encoded_len_estimate(&self) -> usize {
        self.view().encoded_len_estimate()
    }
}

impl TunedResult {
    pub fn view(&self) -> ResultView<'_> {
        ResultView {
            config: &self.config,
            time_us: self.time_us,
            tuned_by: &self.tuned_by,
            tuned_at_unix_ms: self.tuned_at_unix_ms,
            forget_epoch: self.forget_epoch,
            artifacts: self.artifacts.view(),
        }
    }

    pub fn encoded_len_estimate(&self) -> usize {
        self.view().encoded_len_estimate()
    }
}

impl From<v1::Key> for CacheKey {
    fn from(key: v1::Key) -> Self {
        CacheKey {
            namespace: key.namespace,
            op: key.op,
            device: key.device,
            problem: key.problem,
            rank: key.rank,
        }
    }
}

impl From<CacheKey> for v1::Key {
    fn from(key: CacheKey) -> Self {
        v1::Key {
            namespace: key.namespace,
            op: key.op,
            device: key.device,
            problem: key.problem,
            rank: key.rank,
        }
    }
}

impl From<v1::Result> for TunedResult {
    fn from(result: v1::Result) -> Self {
        TunedResult {
            config: result.config,
            time_us: result.time_us,
            tuned_by: result.tuned_by,
            tuned_at_unix_ms: result.tuned_at_unix_ms,
            forget_epoch: result.forget_epoch,
            artifacts: ArtifactList::from_wire(result.artifacts),
        }
    }
}

impl From<TunedResult> for v1::Result {
    fn from(result: TunedResult) -> Self {
        v1::Result {
            config: result.config,
            time_us: result.time_us,
            tuned_by: result.tuned_by,
            tuned_at_unix_ms: result.tuned_at_unix_ms,
            forget_epoch: result.forget_epoch,
            artifacts: result.artifacts.view().to_wire(),
        }
    }
}

/// Builds the wire entry for a stored pair.
pub fn to_wire_entry(key: &CacheKey, result: &TunedResult) -> v1::Entry {
    v1::Entry {
        key: Some(key.clone().into()),
        result: Some(result.clone().into()),
    }
}

/// Milliseconds since the Unix epoch, for `tuned_at` defaults and snapshot times: the
/// contract's one clock, re-exported where the daemon's modules look for it.
pub use tunecache_proto::unix_now_ms;
