//! Owns what replay ([`Mode::Replay`](crate::mode::Mode)) does to a Resolve, for every client of
//! this crate (the rank flow, the split lease, the Python binding and its drop-ins, the CLI): the
//! options it is sent with, whatever the caller asked (no wait, no lease, `replay: true`), and
//! the log of its misses, one warning per key per process, so that a job that replays a model
//! whose cache lacks a few keys says which, without a line per call. The daemon counts every miss
//! (ListMisses); this log is the rank's own view of them.
//!
//! The log is bounded: at most [`MAX_LOGGED_KEYS`] keys are remembered (as 64-bit hashes), and
//! past that one more line says that further misses go unlogged.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, TryLockError};
use std::time::Duration;

use tunecache_proto::v1;

use crate::ResolveOptions;

/// How many keys' misses a process logs; the daemon's ListMisses has the rest.
pub const MAX_LOGGED_KEYS: usize = 10_000;

/// The tracing target of the miss log (the Python binding forwards it to `logging`).
pub const LOG_TARGET: &str = "tunecache::replay";

/// `options` as a replayed Resolve sends them: the caller never waits and never takes a lease,
/// whatever it asked.
pub fn options(_asked: ResolveOptions) -> ResolveOptions {
    ResolveOptions {
        wait: Duration::ZERO,
        can_tune: false,
        lease: Duration::ZERO,
    }
}

/// The keys whose miss this process logged.
struct Logged {
    pid: u32,
    keys: HashSet<u64>,
    /// The line saying that further misses go unlogged was written.
    full: bool,
}

static LOGGED: Mutex<Option<Logged>> = Mutex::new(None);

/// What to log for a miss of `key` now, by the rule of [`remember`].
enum Line {
    First,
    Full,
    Nothing,
}

/// Whether `hash`'s miss is the first of this process, remembered in `logged` (bounded).
fn remember(logged: &mut Option<Logged>, hash: u64) -> Line {
    let pid = std::process::id();
    // A forked child logs its own misses.
    let state = match logged {
        Some(state) if state.pid == pid => state,
        _ => logged.insert(Logged {
            pid,
            keys: HashSet::new(),
            full: false,
        }),
    };
    if state.keys.contains(&hash) {
        return Line::Nothing;
    }
    if state.keys.len() < MAX_LOGGED_KEYS {
        state.keys.insert(hash);
        return Line::First;
    }
    if state.full {
        Line::Nothing
    } else {
        state.full = true;
        Line::Full
    }
}

fn key_hash(view: &str, key: &v1::Key) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    (
        view,
        &key.namespace,
        &key.op,
        &key.device,
        &key.problem,
        key.rank,
    )
        .hash(&mut hasher);
    hasher.finish()
}

/// A key as the logs name it: `namespace/op on 'device'[ rank N]: problem` (the problem cut at
/// 200 characters).
pub fn describe(key: &v1::Key) -> String {
    let rank = key
        .rank
        .map(|rank| format!(" rank {rank}"))
        .unwrap_or_default();
    let problem: String = key.problem.chars().take(200).collect();
    format!(
        "{}/{} on {:?}{rank}: {problem}",
        key.namespace, key.op, key.device
    )
}

/// Logs the replayed miss of `key` in `view` (tracing WARN, target [`LOG_TARGET`]) if it is the
/// first of this key in this process; answers whether a line was written.
pub fn log_miss(view: &str, key: &v1::Key, reason: &str) -> bool {
    let hash = key_hash(view, key);
    let line = match LOGGED.try_lock() {
        Ok(mut logged) => remember(&mut logged, hash),
        Err(TryLockError::Poisoned(poisoned)) => remember(&mut poisoned.into_inner(), hash),
        // Held by another thread for the few instructions of `remember`, or by a thread of the
        // parent that forked this process, where waiting would never end: a line too many is
        // the lesser harm.
        Err(TryLockError::WouldBlock) => Line::First,
    };
    let in_view = if view.is_empty() {
        String::new()
    } else {
        format!(" in view {view:?}")
    };
    match line {
        Line::First => tracing::warn!(
            target: LOG_TARGET,
            "tunecache replay: no cached result for {}{in_view} ({reason}); the framework's own \
             default is used. Logged once per key in this process",
            describe(key)
        ),
        Line::Full => tracing::warn!(
            target: LOG_TARGET,
            "tunecache replay: {MAX_LOGGED_KEYS} keys missed in this process; further misses are \
             not logged (the daemon's ListMisses lists every one)"
        ),
        Line::Nothing => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayed_options_never_wait_nor_tune() {
        let asked = ResolveOptions {
            wait: Duration::from_secs(60),
            can_tune: true,
            lease: Duration::from_secs(600),
        };
        let sent = options(asked);
        assert_eq!(sent.wait, Duration::ZERO);
        assert!(!sent.can_tune);
        assert_eq!(sent.lease, Duration::ZERO);
    }

    #[test]
    fn each_key_is_logged_once_and_the_log_is_bounded() {
        let mut logged = None;
        assert!(matches!(remember(&mut logged, 1), Line::First));
        assert!(matches!(remember(&mut logged, 1), Line::Nothing));
        for hash in 2..=MAX_LOGGED_KEYS as u64 {
            assert!(matches!(remember(&mut logged, hash), Line::First));
        }
        let past = MAX_LOGGED_KEYS as u64 + 1;
        assert!(matches!(remember(&mut logged, past), Line::Full));
        assert!(matches!(remember(&mut logged, past + 1), Line::Nothing));
        assert_eq!(logged.map(|state| state.keys.len()), Some(MAX_LOGGED_KEYS));
    }

    #[test]
    fn the_view_and_the_rank_tell_keys_apart() {
        let key = crate::key("n", "op", "dev", "p", None);
        let ranked = crate::key("n", "op", "dev", "p", Some(0));
        assert_ne!(key_hash("", &key), key_hash("job", &key));
        assert_ne!(key_hash("", &key), key_hash("", &ranked));
        assert_eq!(key_hash("job", &key), key_hash("job", &key.clone()));
    }
}
