//! The `tunecache.v1.TuneCache` gRPC service (`service`) and the routes that serve Lookup,
//! Record and Scan from their bytes (`routes`).

pub(crate) mod routes;
pub(crate) mod service;
