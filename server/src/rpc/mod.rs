//! The `tunecache.v1.TuneCache` gRPC service (`service`), the routes that serve Lookup,
//! Record and Scan from their bytes (`routes`), both reading large requests off the runtime
//! (`off_runtime`), the artifact store's messages and statuses (`artifacts`), and the lifecycle's
//! Usage and Prune (`lifecycle`).

pub(crate) mod artifacts;
pub(crate) mod lifecycle;
pub(crate) mod off_runtime;
pub(crate) mod routes;
pub(crate) mod service;
