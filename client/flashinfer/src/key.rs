//! The parts of a FlashInfer `file_key`, `str((custom_op, runner_class_name, nearest_profile,
//! extras))` (their `ProfilingCacheKey.file_key`): the custom op, the runner, and the op unit,
//! the same tuple without the runner, which a tuning takes its lease on (see the crate doc).

use tunecache_trtllm::pyliteral;

use crate::DEFAULT_OP;

/// What a file_key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileKey {
    /// `Key.op`: the custom op, or [`DEFAULT_OP`] for a key that does not parse.
    pub op: String,
    /// The runner's class name; None for a key that does not parse.
    pub runner: Option<String>,
    /// The op unit's problem: `str((custom_op, nearest_profile, extras))`, the key with its
    /// runner element taken out; the key itself when it does not parse (its own unit).
    pub unit: String,
}

impl FileKey {
    /// The parts of `file_key`. A key that is not a tuple of two `repr()` strings and more is
    /// kept whole: op [`DEFAULT_OP`], its own unit.
    pub fn parse(file_key: &str) -> FileKey {
        Self::split(file_key).unwrap_or_else(|| FileKey {
            op: DEFAULT_OP.to_owned(),
            runner: None,
            unit: file_key.to_owned(),
        })
    }

    fn split(file_key: &str) -> Option<FileKey> {
        let after_paren = file_key.strip_prefix('(')?;
        let (op, after_op) = pyliteral::repr_str(after_paren).ok()?;
        let op_end = file_key.len() - after_op.len();
        let runner_text = after_op.strip_prefix(", ")?;
        let (runner, rest) = pyliteral::repr_str(runner_text).ok()?;
        // `str()` of a tuple separates elements with ", "; the runner is never the last one.
        if !rest.starts_with(", ") || op.is_empty() {
            return None;
        }
        Some(FileKey {
            op,
            runner: Some(runner),
            unit: format!("{}{rest}", &file_key[..op_end]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_is_the_key_without_its_runner() {
        let key = FileKey::parse(
            "('fp8_gemm', 'CutlassRunner', ((8, 4096), (4096, 4096)), (torch.bfloat16,))",
        );
        assert_eq!(key.op, "fp8_gemm");
        assert_eq!(key.runner.as_deref(), Some("CutlassRunner"));
        assert_eq!(
            key.unit,
            "('fp8_gemm', ((8, 4096), (4096, 4096)), (torch.bfloat16,))"
        );
        // Every runner of one op at one profile has the same unit.
        let other =
            FileKey::parse("('fp8_gemm', \"It's\", ((8, 4096), (4096, 4096)), (torch.bfloat16,))");
        assert_eq!(other.unit, key.unit);
        assert_eq!(other.runner.as_deref(), Some("It's"));
    }

    #[test]
    fn a_key_that_does_not_parse_is_its_own_unit() {
        for text in [
            "not a tuple",
            "('op',)",
            "('op', 'Runner')",
            "('', 'R', (), ())",
            "(1, 'R', (), ())",
        ] {
            let key = FileKey::parse(text);
            assert_eq!(
                (key.op.as_str(), key.runner, key.unit.as_str()),
                (DEFAULT_OP, None, text),
                "{text}"
            );
        }
    }
}
