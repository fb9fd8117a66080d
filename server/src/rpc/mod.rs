//! The `tunecache.v1.TuneCache` gRPC service (`service`), the routes that serve Lookup,
//! Record and Scan from their bytes (`routes`), and the artifact store's messages and
//! statuses (`artifacts`).

pub(crate) mod artifacts;
pub(crate) mod routes;
pub(crate) mod service;
