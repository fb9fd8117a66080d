//! `tunecached`, the per-node daemon that owns the GPU autotuning cache.
//!
//! Ranks talk to it over gRPC on a Unix socket. One writer thread serialises every change
//! (`store`), makes it durable in a node-local journal (`journal`) and publishes immutable
//! versions that readers use without waiting. Which result wins is decided in one place
//! (`merge`). Nodes share results through snapshots on a shared filesystem
//! (`snapshot`), whose I/O never runs on the async runtime.

pub mod cluster;
pub mod config;
pub mod coord;
pub mod entry;
pub mod error;
pub mod incoming;
pub mod journal;
pub mod limits;
pub mod listener;
pub mod merge;
pub mod scan;
pub mod server;
pub mod service;
pub mod shared_file;
pub mod snapshot;
pub mod snapshot_format;
pub mod store;
mod sync;
pub mod tuner;
pub mod validate;
pub mod wire;

// Deployment and operations.
pub mod access;
pub mod idle;
pub mod metrics;
pub mod probe;
pub mod systemd;

pub use config::Config;
pub use error::{Error, Result};
