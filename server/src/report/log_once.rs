//! Logging a repeated event once per cause: each limit hit, refusal or fallback is counted
//! every time (in Stats) and logged the first time its cause (a uid, a pid, a view) is seen.

use std::collections::HashSet;
use std::sync::Mutex;

/// Most distinct causes remembered by a `LogOnce`; past that, new causes are counted in
/// Stats but not logged, so a flood of distinct pids cannot grow the set without bound.
const MAX_LOGGED_CAUSES: usize = 4096;

/// Remembers which causes were logged, so each limit hit is logged once per cause (a uid, a
/// pid, an errno) and counted every time.
#[derive(Default)]
pub struct LogOnce {
    logged: Mutex<HashSet<String>>,
}

impl LogOnce {
    /// True the first time `cause` is seen.
    pub fn first(&self, cause: impl Into<String>) -> bool {
        let Ok(mut logged) = self.logged.lock() else {
            // A panic elsewhere while holding the lock: log rather than stay silent.
            return true;
        };
        if logged.len() >= MAX_LOGGED_CAUSES {
            return false;
        }
        logged.insert(cause.into())
    }
}
