//! `tunecached`, the per-node daemon that owns the GPU autotuning cache.
//!
//! Ranks talk to it over gRPC on a Unix socket (`rpc`), and on its node take blobs as
//! descriptors on the handoff socket beside it (`handoff`). One writer thread serialises every
//! change (`store`), makes it durable in a node-local journal (`journal`), publishes immutable
//! versions that readers use without waiting, and tells every subscriber where each change
//! came from (the change feed). Which result wins is decided in one place (`model::merge`).
//! Every read goes through the job views (`views`): within a job's view every rank gets the
//! same answer. Missing results are tuned once per node (`coord`, `tuner`) and once per
//! cluster with Redis (`cluster`). Nodes share results through segments on a shared
//! filesystem (`snapshot`), whose I/O never runs on the async runtime. `ops` has what
//! deployment needs; `report` what every part reports with.
//!
//! # Layers
//!
//! The parts, top to bottom. A part uses only the parts below it (and its own); nothing
//! imports a part above it, which `tests/layers.rs` checks on every build of the tests:
//!
//! 1. `server`: assembles the daemon;
//! 2. `config`: the flags, and each part's typed settings made from them;
//! 3. `rpc`, `handoff`: the doors: the gRPC service and its routes, the descriptor handoff;
//! 4. `views`: every read (Lookup, Scan, Resolve), with or without a job view;
//! 5. `coord`: who tunes a missing key on this node;
//! 6. `bundles`, `cluster`, `snapshot`, `tuner`: the bundles staging exported, the Redis tier,
//!    the shared directory, the tuner worker;
//! 7. `artifacts`: the node's blob store (the files results name), fed by the tiers above;
//! 8. `tiers`: what every tier implements (`Tier`), their one order, the list of them;
//! 9. `store`: the cache, its writer and its change feed;
//! 10. `journal`: the durable log under the store;
//! 11. `wire`, `ops`: protobuf bytes; sockets, connections, callers and their limits;
//! 12. `error`: the one error type and its gRPC codes;
//! 13. `model`: keys and results, the merge and Forget rules, request checks, names;
//! 14. `report`, `tasks`, `sync`, `fsx`: Stats, logging and health helpers; every background
//!     task and the one stop signal; locks; files put in place whole (`fsx::atomic`).
//!
//! Public are only the modules `main`, the tests, the fuzz targets and the benchmarks use.

pub mod server;

pub mod config;

pub(crate) mod handoff;
pub(crate) mod rpc;

pub(crate) mod views;

pub(crate) mod coord;

pub(crate) mod bundles;
pub(crate) mod cluster;
pub mod snapshot;
pub mod tuner;

pub(crate) mod artifacts;

pub(crate) mod tiers;

pub mod store;

pub mod journal;

pub(crate) mod ops;
pub(crate) mod wire;

pub mod error;

pub mod model;

pub(crate) mod fsx;
pub(crate) mod report;
mod sync;
pub(crate) mod tasks;

pub use config::Config;
pub use error::{Error, Result};
