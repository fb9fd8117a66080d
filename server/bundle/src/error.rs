//! What can go wrong with a bundle, said as the part it concerns and why, so that an operator
//! reading `bundle FILE: part "artifact 3f2a…": …` knows where to look.

/// Every failure of writing, opening, verifying or trusting a bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A part of the file (`header`, `entries`, `artifact <digest>`, `manifest`, `signature`,
    /// `trailer`) is not what it must be.
    #[error("part \"{part}\": {reason}")]
    Part { part: String, reason: String },
    /// What the writer was given cannot make a bundle (a duplicate key, an artifact whose bytes
    /// do not match its digest).
    #[error("{0}")]
    Input(String),
    /// A key file that cannot be used.
    #[error("key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl BundleError {
    pub(crate) fn part(part: impl Into<String>, reason: impl Into<String>) -> BundleError {
        BundleError::Part {
            part: part.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BundleError {
        let what = what.into();
        move |source| BundleError::Io { what, source }
    }

    /// The part an error names, if it names one.
    pub fn part_name(&self) -> Option<&str> {
        match self {
            BundleError::Part { part, .. } => Some(part),
            _ => None,
        }
    }
}
