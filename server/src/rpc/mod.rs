//! The `tunecache.v1.TuneCache` gRPC service (`service`), who fills its Stats (`stats`), and
//! the in-process reads of those Stats by the daemon's own reporters (`probe`).

pub(crate) mod probe;
pub(crate) mod service;
pub(crate) mod stats;
