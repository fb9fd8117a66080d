//! Owns the client's mode (issue 52): `tune`, the default, where a Resolve may wait for another
//! caller's result and take the lease to tune a key itself; or `replay`, where a job serves only
//! what is cached, on any daemon: every Resolve is sent with `replay: true`, no wait and no
//! lease, a miss is answered at once (and the daemon lists it under the view, ListMisses), and
//! the caller uses its framework's own no-cache behaviour. What a replayed Resolve sends, and the
//! once-per-key log of its misses, are [`replay`](crate::replay)'s.
//!
//! The first source that is set wins, as for the view ([`view`](crate::view)), so that a
//! launcher can put every rank of one job in replay without a code change:
//!
//! 1. `TUNECACHE_MODE` (`tune` or `replay`, any case, blanks around it ignored); set but empty
//!    counts as unset;
//! 2. the caller's explicit mode (`Client::with_mode`, `Client::replay`,
//!    `tunecache.Client(mode=...)`);
//! 3. `tune`.
//!
//! Any other value is an error ([`UnknownMode`]), not a warning: a job meant to replay that
//! spelled it wrong would otherwise tune, take leases and wait, the very thing it asked not to.

/// The variable that names the mode.
pub const MODE_ENV: &str = "TUNECACHE_MODE";

/// How a client resolves keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Wait for another caller's result, or take the lease and tune.
    #[default]
    Tune,
    /// Serve only what is cached: never wait, never take a lease; a miss is answered at once.
    Replay,
}

/// A mode that is neither `tune` nor `replay`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name} is {value:?}; a mode is \"tune\" or \"replay\"")]
pub struct UnknownMode {
    /// Where it came from: `TUNECACHE_MODE`, or `mode` for the caller's own.
    pub source_name: String,
    pub value: String,
}

impl Mode {
    /// The mode's name, as `TUNECACHE_MODE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Tune => "tune",
            Mode::Replay => "replay",
        }
    }

    /// Reads a mode's name (any case, blanks around it ignored); `source_name` names it in the
    /// error.
    pub fn parse(value: &str, source_name: &str) -> Result<Mode, UnknownMode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "tune" => Ok(Mode::Tune),
            "replay" => Ok(Mode::Replay),
            _ => Err(UnknownMode {
                source_name: source_name.to_owned(),
                value: value.to_owned(),
            }),
        }
    }
}

/// The mode for a process whose environment `env` reads (`None`: unset), with `explicit` as the
/// last resort (see the module doc).
pub fn resolve_mode(
    env: impl Fn(&str) -> Option<String>,
    explicit: Option<&str>,
) -> Result<Mode, UnknownMode> {
    if let Some(value) = env(MODE_ENV).filter(|value| !value.trim().is_empty()) {
        return Mode::parse(&value, MODE_ENV);
    }
    match explicit.filter(|value| !value.trim().is_empty()) {
        Some(value) => Mode::parse(value, "mode"),
        None => Ok(Mode::Tune),
    }
}

/// [`resolve_mode`] on this process's environment. A variable that is not valid Unicode is an
/// unknown mode.
pub fn mode_from_env(explicit: Option<&str>) -> Result<Mode, UnknownMode> {
    resolve_mode(
        |name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(raw)) => Some(raw.to_string_lossy().into_owned()),
        },
        explicit,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(env: Option<&str>, explicit: Option<&str>) -> Result<Mode, UnknownMode> {
        resolve_mode(
            |name| env.filter(|_| name == MODE_ENV).map(str::to_owned),
            explicit,
        )
    }

    #[test]
    fn the_environment_wins_over_the_explicit_mode() {
        assert_eq!(resolved(Some("replay"), Some("tune")), Ok(Mode::Replay));
        assert_eq!(resolved(Some(" Tune "), Some("replay")), Ok(Mode::Tune));
    }

    #[test]
    fn unset_or_empty_falls_to_the_explicit_mode_then_tune() {
        assert_eq!(resolved(None, Some("replay")), Ok(Mode::Replay));
        assert_eq!(resolved(Some(""), Some("REPLAY")), Ok(Mode::Replay));
        assert_eq!(resolved(Some("  "), None), Ok(Mode::Tune));
        assert_eq!(resolved(None, None), Ok(Mode::Tune));
        assert_eq!(resolved(None, Some("")), Ok(Mode::Tune));
    }

    #[test]
    fn an_unknown_mode_is_an_error_naming_its_source() {
        let error = resolved(Some("replya"), Some("replay")).unwrap_err();
        assert_eq!(error.source_name, MODE_ENV);
        assert!(error.to_string().contains("\"replya\""), "{error}");
        let error = resolved(None, Some("serve")).unwrap_err();
        assert_eq!(error.source_name, "mode");
    }

    #[test]
    fn names_read_back() {
        for mode in [Mode::Tune, Mode::Replay] {
            assert_eq!(Mode::parse(mode.name(), "mode"), Ok(mode));
        }
    }
}
