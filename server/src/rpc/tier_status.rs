//! The one place a tier's failure (`error::TierError`) becomes a gRPC status: the tiers speak
//! no transport. What a caller may retry (Redis or the shared directory away, a blocking step
//! gone, no answer) is UNAVAILABLE or DEADLINE_EXCEEDED; what the tier holds and this node
//! refuses is DATA_LOSS; a value over a limit RESOURCE_EXHAUSTED; a setting
//! FAILED_PRECONDITION. The message is the error's text, the one Stats and the log show.

use tonic::{Code, Status};

use crate::error::TierError;

/// The code a caller sees for `error` (its innermost kind, under any context).
pub(crate) fn tier_code(error: &TierError) -> Code {
    match error.root() {
        TierError::Io { .. } | TierError::Redis(_) | TierError::Unavailable(_) => Code::Unavailable,
        TierError::TimedOut { .. } => Code::DeadlineExceeded,
        TierError::Refused(_) => Code::DataLoss,
        TierError::TooLarge { .. } => Code::ResourceExhausted,
        TierError::Config(_) => Code::FailedPrecondition,
        // `root` never answers a context layer.
        TierError::During { .. } => Code::Internal,
    }
}

impl From<TierError> for Status {
    fn from(error: TierError) -> Self {
        Status::new(tier_code(&error), error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_code_and_keeps_its_text() {
        let cases = [
            (
                TierError::unavailable("not connected to Redis"),
                Code::Unavailable,
            ),
            (
                TierError::no_answer("reading the streams"),
                Code::DeadlineExceeded,
            ),
            (
                TierError::refused("t: not 16 or 32 hex digits"),
                Code::DataLoss,
            ),
            (
                TierError::TooLarge {
                    what: "blob".into(),
                    size: 2,
                    limit: 1,
                },
                Code::ResourceExhausted,
            ),
            (
                TierError::Config("--cluster-prefix".into()),
                Code::FailedPrecondition,
            ),
            (
                TierError::refused("bad MAC").during("loading a checkpoint"),
                Code::DataLoss,
            ),
        ];
        for (error, code) in cases {
            let text = error.to_string();
            let status = Status::from(error);
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
    }
}
