//! The `tunecache.v1.TuneCache` gRPC service (`service`), the routes that serve Lookup,
//! Record and Scan from their bytes (`routes`), both reading large requests off the runtime
//! (`off_runtime`), and the artifact store's messages and statuses (`artifacts`).

pub(crate) mod artifacts;
pub(crate) mod off_runtime;
pub(crate) mod routes;
pub(crate) mod service;
