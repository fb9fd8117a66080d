//! `tunecached`, the per-node daemon that owns the GPU autotuning cache.
//!
//! Ranks talk to it over gRPC on a Unix socket. One writer thread serialises every change
//! (`store`), makes it durable in a node-local journal (`journal`) and publishes immutable
//! versions that readers use without waiting. Which result wins is decided in one place
//! (`merge`). Nodes share results through snapshots on a shared filesystem
//! (`snapshot`), whose I/O never runs on the async runtime.
//!
//! Public are only the modules `main`, the tests, the fuzz targets and the benchmarks use.

pub(crate) mod cluster;
pub mod config;
pub(crate) mod coord;
pub(crate) mod encoded;
pub mod entry;
pub mod error;
pub(crate) mod health;
pub(crate) mod heap;
pub(crate) mod incoming;
pub mod journal;
pub(crate) mod limits;
pub(crate) mod listener;
pub(crate) mod lookup_request;
pub mod merge;
pub(crate) mod record_request;
pub(crate) mod request_limits;
pub(crate) mod scan;
pub mod server;
pub(crate) mod service;
pub(crate) mod shared_file;
pub(crate) mod snapshot;
pub mod snapshot_format;
mod state_lock;
pub(crate) mod stats;
pub mod store;
pub(crate) mod stored;
mod sync;
pub mod tuner;
pub(crate) mod validate;
pub(crate) mod wire;

// Deployment and operations.
pub(crate) mod access;
pub(crate) mod idle;
pub(crate) mod metrics;
pub(crate) mod probe;
pub(crate) mod systemd;

pub use config::Config;
pub use error::{Error, Result};
