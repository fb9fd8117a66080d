//! What the tier refuses of what it reads from Redis, counted and told: values no client
//! could send (checked in `values`), counted per source in Stats and logged once per source;
//! and the keys found holding the wrong type (`SET <prefix>forgets:{f} "not a hash"`): each
//! is named once in the log and listed in Stats, and the tier goes on without it, never
//! reconnecting over it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most characters of a refused value's name that a log line shows.
const SHOWN: usize = 120;

/// Where a value was read from: each is counted on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// A shard stream's announcement.
    Stream,
    /// An entry hash (bootstrap, reading a shard again) or a script's reply with its fields.
    Entries,
    /// The tombstone hash or the forget stream.
    Tombstones,
}

impl ReadFrom {
    fn name(self) -> &'static str {
        match self {
            ReadFrom::Stream => "a shard stream",
            ReadFrom::Entries => "an entry hash",
            ReadFrom::Tombstones => "the tombstones",
        }
    }
}

crate::report::stats_registry! {
    /// Refusals per source, and the once-per-source log.
    #[derive(Default)]
    pub struct Refusals {
        pub stream: AtomicU64 as cluster_refused_stream => counter(
            95,
            "Announcements read from Redis streams that no client could send, refused.",
        ),
        pub entries: AtomicU64 as cluster_refused_entries => counter(
            96,
            "Entries read from Redis hashes or script replies that no client could send, refused.",
        ),
        pub tombstones: AtomicU64 as cluster_refused_tombstones
            => counter(97, "Tombstones read from Redis that no Forget could make, refused."),
        logged: crate::report::LogOnce => internal,
    }
}

impl Refusals {
    /// Counts one refused value of `from`; logs the first of each source, naming what (cut
    /// short: a hostile value may be megabytes) and why.
    pub fn refuse(&self, from: ReadFrom, what: &str, why: impl std::fmt::Display) {
        let counter = match from {
            ReadFrom::Stream => &self.stream,
            ReadFrom::Entries => &self.entries,
            ReadFrom::Tombstones => &self.tombstones,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if self.logged.first(from.name()) {
            tracing::warn!(
                source = from.name(),
                value = %shown(what),
                reason = %shown(&why.to_string()),
                "cluster tier: refused a value read from redis that no client could send; \
                 dropped alone (logged once per source; Stats cluster_refused_*)"
            );
        }
    }
}

/// At most `SHOWN` characters of `text`, and how long it was.
pub fn shown(text: &str) -> String {
    if text.len() <= SHOWN {
        return text.to_owned();
    }
    let mut end = SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

/// Most wrong-typed keys listed; more are counted.
const MAX_WRONG_TYPED: usize = 1024;

/// Keys found holding another type than the tier's layout says.
#[derive(Default)]
pub struct WrongTypes {
    keys: Mutex<BTreeSet<String>>,
    /// Every key found (each named in the log the first time only).
    pub found: AtomicU64,
    logged: crate::report::LogOnce,
}

impl WrongTypes {
    /// `key` holds the wrong type: named in the log the first time, listed in Stats.
    pub fn found(&self, key: &str) {
        let mut keys = crate::sync::lock(&self.keys);
        if keys.contains(key) {
            return;
        }
        self.found.fetch_add(1, Ordering::Relaxed);
        if keys.len() < MAX_WRONG_TYPED {
            keys.insert(key.to_owned());
        }
        drop(keys);
        if self.logged.first(key) {
            tracing::warn!(
                key = %shown(key),
                "cluster tier: a key in redis holds the wrong type; going on without it \
                 (delete or repair it; Stats cluster_wrong_type_keys)"
            );
        }
    }

    /// `key` read as its type again (repaired, deleted): true if it was listed.
    pub fn fixed(&self, key: &str) -> bool {
        let removed = crate::sync::lock(&self.keys).remove(key);
        if removed {
            tracing::info!(key = %shown(key), "cluster tier: a key that held the wrong type reads again");
        }
        removed
    }

    pub fn is_empty(&self) -> bool {
        crate::sync::lock(&self.keys).is_empty()
    }

    /// The listed keys for Stats, at most eight named.
    pub fn describe(&self) -> String {
        let keys = crate::sync::lock(&self.keys);
        let mut named: Vec<String> = keys.iter().take(8).map(|k| shown(k)).collect();
        if keys.len() > 8 {
            named.push(format!("and {} more", keys.len() - 8));
        }
        named.join(", ")
    }
}

/// Whether a command failed because a key holds the wrong type (Redis's `WRONGTYPE`, also
/// from inside a script, or a script's own check).
pub fn is_wrong_type(error: &redis::RedisError) -> bool {
    error.code() == Some("WRONGTYPE")
}

/// Which of `keys` a wrong-type error names (the scripts' own checks name the key); the first
/// when it names none (a plain `WRONGTYPE` names no key).
pub fn wrong_typed_key<'a>(error: &redis::RedisError, keys: &[&'a str]) -> &'a str {
    let text = error.to_string();
    keys.iter()
        .copied()
        .filter(|key| text.contains(key))
        .max_by_key(|key| key.len())
        .or_else(|| keys.first().copied())
        .unwrap_or_default()
}
