//! `TierError`: how a remote tier (the shared directory, Redis) failed, typed by kind. Its
//! `Display` is the one text Stats' last-error fields and the log lines show. No call answers
//! a tier's error as such (a tier's failure is counted, logged, or becomes the artifact store's
//! answer), so no status mapping exists for it.

use std::path::PathBuf;
use std::time::Duration;

/// A tier's failure.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// A file operation, with the path it was on.
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A command Redis failed (or a connection that broke under it).
    #[error("{0}")]
    Redis(#[from] redis::RedisError),

    /// No answer in time (within `after`, where the text names it).
    #[error("{what}: no answer{}", within(after))]
    TimedOut {
        what: String,
        after: Option<Duration>,
    },

    /// The tier cannot be asked now (not connected, its worker gone), or did not answer
    /// within a wait of its own wording.
    #[error("{0}")]
    Unavailable(String),

    /// What the tier holds is refused: damaged, not in the form a daemon writes, or not
    /// proven to come from a trusted writer.
    #[error("{0}")]
    Refused(String),

    /// A value over a limit of this node's.
    #[error("{what} of {size} bytes is over the limit of {limit}")]
    TooLarge { what: String, size: u64, limit: u64 },

    /// A setting the tier cannot work with (a prefix, a password file).
    #[error("{0}")]
    Config(String),

    /// Another failure, with what was being done.
    #[error("{what}: {source}")]
    During {
        what: String,
        #[source]
        source: Box<TierError>,
    },
}

fn within(after: &Option<Duration>) -> String {
    after.map_or_else(String::new, |after| format!(" within {after:?}"))
}

/// A tier's result.
pub type TierResult<T> = std::result::Result<T, TierError>;

impl TierError {
    /// Refused data: `why` says what is wrong with it.
    pub fn refused(why: impl Into<String>) -> TierError {
        TierError::Refused(why.into())
    }

    /// Refused data, from an error that says why (a check's, a parser's).
    pub fn refused_by(error: impl std::fmt::Display) -> TierError {
        TierError::Refused(error.to_string())
    }

    /// The tier cannot be asked now: `why`.
    pub fn unavailable(why: impl Into<String>) -> TierError {
        TierError::Unavailable(why.into())
    }

    /// No answer to `what` (a wait of the caller's own).
    pub fn no_answer(what: impl Into<String>) -> TierError {
        TierError::TimedOut {
            what: what.into(),
            after: None,
        }
    }

    /// No answer to `what` within `after`.
    pub fn timed_out(what: impl Into<String>, after: Duration) -> TierError {
        TierError::TimedOut {
            what: what.into(),
            after: Some(after),
        }
    }

    /// A file operation that failed on `path`.
    pub fn io(
        context: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        TierError::Io {
            context: context.into(),
            path: path.into(),
            source,
        }
    }

    /// This failure, while doing `what` ("`what`: `self`").
    pub fn during(self, what: impl Into<String>) -> TierError {
        TierError::During {
            what: what.into(),
            source: Box::new(self),
        }
    }

    /// The failure under any `During` layers.
    pub fn root(&self) -> &TierError {
        match self {
            TierError::During { source, .. } => source.root(),
            other => other,
        }
    }
}

/// Two failures are equal when they are of one kind and read the same (the tests compare
/// results; `io::Error` and `RedisError` have no equality of their own).
impl PartialEq for TierError {
    fn eq(&self, other: &TierError) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

impl From<tokio::task::JoinError> for TierError {
    /// A blocking step that panicked or was cancelled.
    fn from(error: tokio::task::JoinError) -> Self {
        TierError::Unavailable(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_the_one_stats_and_the_log_show() {
        let refused = TierError::refused("t: not 16 or 32 hex digits");
        assert_eq!(refused.to_string(), "t: not 16 or 32 hex digits");
        let timed = TierError::timed_out("XREAD", Duration::from_secs(2));
        assert_eq!(timed.to_string(), "XREAD: no answer within 2s");
        assert_eq!(
            TierError::no_answer("XREAD").to_string(),
            "XREAD: no answer"
        );
        let io = TierError::io(
            "opening blob",
            "/x/y",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(io.to_string(), "opening blob /x/y: entity not found");
        let during = TierError::refused("bad").during("reading the checkpoint");
        assert_eq!(during.to_string(), "reading the checkpoint: bad");
        assert!(matches!(during.root(), TierError::Refused(_)));
    }
}
