//! The `tunecache.v1.TuneCache` gRPC service (`service`) and the routes that serve Lookup,
//! Record and Scan from their bytes (`routes`); both read large requests off the runtime
//! (`off_runtime`).

pub(crate) mod off_runtime;
pub(crate) mod routes;
pub(crate) mod service;
