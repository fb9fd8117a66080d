//! The daemon's own representation of cache keys and results, and their conversions to and
//! from the wire types of `tunecache.v1`.
//!
//! `CacheKey` orders by (namespace, op, device, problem, rank), so a sorted map keeps each
//! namespace contiguous (cheap Scan filters) and iterates in the same order on every node
//! (deterministic snapshot bytes).

use tunecache_proto::v1;

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

impl CacheKey {
    /// Approximate bytes this key occupies in the journal; used to decide when to compact.
    pub fn encoded_len_estimate(&self) -> usize {
        self.namespace.len() + self.op.len() + self.device.len() + self.problem.len() + 16
    }

    /// The smallest key of a namespace: where a Scan of that namespace starts.
    pub fn namespace_start(namespace: &str) -> CacheKey {
        CacheKey {
            namespace: namespace.to_owned(),
            op: String::new(),
            device: String::new(),
            problem: String::new(),
            rank: None,
        }
    }
}

impl TunedResult {
    pub fn encoded_len_estimate(&self) -> usize {
        self.config.len() + self.tuned_by.len() + 24
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
