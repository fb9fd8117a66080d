//! `tunecached`, the per-node daemon that owns the GPU autotuning cache.
//!
//! Ranks talk to it over gRPC on a Unix socket (`rpc`). One writer thread serialises every
//! change (`store`), makes it durable in a node-local journal (`journal`), publishes immutable
//! versions that readers use without waiting, and tells every subscriber where each change
//! came from (the change feed). Which result wins is decided in one place (`model::merge`).
//! Missing results are tuned once per node (`coord`, `tuner`) and once per cluster with
//! Redis (`cluster`). Within a job's view every rank gets the same answer (`views`). Nodes share results through segments on a shared filesystem
//! (`snapshot`), whose I/O never runs on the async runtime. `ops` has what deployment needs.
//!
//! Public are only the modules `main`, the tests, the fuzz targets and the benchmarks use.

// The model: what an entry is, which result wins, what a request may hold.
pub mod model;
// Every hand-written protobuf byte: entries kept in wire form, responses sent as stored.
pub(crate) mod wire;
// The cache and its change feed, the journal under it.
pub mod journal;
pub mod store;
// Who tunes what: coordination on the node, the tuner worker, the cluster tier.
pub(crate) mod cluster;
pub(crate) mod coord;
pub mod tuner;
// Job views: one answer per job for every key, on every node.
pub(crate) mod views;
// Sharing through the shared filesystem.
pub mod snapshot;
// The gRPC service and its Stats.
pub(crate) mod rpc;
// Deployment and operations: the socket, connections, limits, systemd, metrics, health.
pub(crate) mod ops;

pub mod config;
pub mod error;
pub mod server;
mod sync;

pub use config::Config;
pub use error::{Error, Result};
