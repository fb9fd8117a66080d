//! Why a backend could not open or a job could not be tuned. The worker sends the text of a
//! [`TuneError`] as `JobDone.error` (a job error is not retried) or, for a backend that cannot
//! open, as its exit line, which the daemon quotes.

use cudarc::cublaslt::result::CublasError;
use cudarc::driver::DriverError;
use tunecache_proto::tuner::problem::ProblemError;

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The job names a device this worker does not have.
    #[error("this worker has no device {0:?}")]
    NoDevice(String),

    #[error("unknown op {0:?}")]
    UnknownOp(String),

    /// The problem text does not parse (the daemon sends canonical text, so this is a bug
    /// or a worker of another version).
    #[error(transparent)]
    Problem(#[from] ProblemError),

    /// The backend cannot be used here (no driver, no device, a library missing).
    #[error("{0}")]
    Unavailable(String),

    /// The problem is valid, but this backend does not tune it (e.g. f16 on the CPU).
    #[error("{0}")]
    Unsupported(String),

    /// A CUDA driver call failed (sticky errors end the worker before becoming one).
    #[error("{what}: {source:?}")]
    Driver {
        what: String,
        #[source]
        source: DriverError,
    },

    #[error("{what}: {source:?}")]
    Blas {
        what: &'static str,
        #[source]
        source: CublasError,
    },

    /// NVRTC refused a candidate; the text is its status and log, cut to a bounded size.
    #[error("compile: {0}")]
    Compile(String),

    /// A timer reported a negative or non-finite duration.
    #[error("timer returned {0} us")]
    BadSample(f64),

    /// A tactic computed the wrong answer, so its timing means nothing.
    #[error("{0}")]
    WrongOutput(String),

    /// No tactic survived to be measured; the text says what happened to each.
    #[error("{0}")]
    NothingRan(String),

    #[error("tuner panicked: {0}")]
    Panicked(String),
}

impl TuneError {
    /// A failed driver call, without the sticky-error check (for set-up calls made before
    /// any kernel ran).
    pub fn driver(what: impl Into<String>, source: DriverError) -> Self {
        TuneError::Driver {
            what: what.into(),
            source,
        }
    }
}
