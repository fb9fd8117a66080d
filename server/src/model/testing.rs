//! The keys, results and Forget scopes the unit tests of every part build their cases from,
//! written once (namespace `ns`, device `dev`), so that no test module keeps a copy of its
//! own. Compiled for tests only.

use super::entry::{CacheKey, TunedResult};
// Built beside the Forget rules' own tests, which may not import this module (no import loop
// inside a part).
pub(crate) use super::forget::tests::{key as key_in, scope};

/// The shared key of `problem` under op `op`.
pub(crate) fn key(problem: &str) -> CacheKey {
    key_in("op", problem, None)
}

/// A result measured at `time_us`, recorded at 1 ms, naming no artifact.
pub(crate) fn result(time_us: f64) -> TunedResult {
    TunedResult {
        config: "{}".into(),
        time_us,
        tuned_by: "t".into(),
        tuned_at_unix_ms: 1,
        forget_epoch: 0,
        artifacts: Default::default(),
    }
}
