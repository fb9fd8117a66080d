//! The tunecache GPU tuner worker, `tunecache-tuner` (namespace `tunecache`): the process
//! the daemon runs as a child to measure problems, so that a faulting kernel kills only it.
//!
//! * [`backend`]: the cpu stand-in and the cuda backend that tune one job, and the host
//!   reference both check their answers against.
//! * [`measure`]: the shared timing policy.
//! * [`error`]: why a backend cannot open or a job cannot be tuned.
//!
//! What a problem is and how frames travel on the worker's pipes belong to the contract it
//! shares with the daemon, in `tunecache_proto::tuner`; the daemon's supervisor is in
//! `tunecache-server`.

pub mod backend;
pub mod error;
pub mod measure;
