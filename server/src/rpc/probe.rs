//! In-process reads of the daemon's own `Stats`, for the parts of the daemon that report on it
//! (systemd status, Prometheus metrics, the idle timer). They call the same handler a client
//! does, so every figure that Stats carries (snapshot and tuner fields included, as those land)
//! is reported the same way everywhere, with no second set of counters to keep in step.

use std::sync::Arc;

use tunecache_proto::v1::{self, tune_cache_server::TuneCache};

use crate::rpc::service::TuneCacheService;

#[derive(Clone)]
pub struct StatsProbe {
    service: Arc<TuneCacheService>,
}

impl StatsProbe {
    pub fn new(service: Arc<TuneCacheService>) -> Self {
        StatsProbe { service }
    }

    /// The daemon's Stats, as a client would see them; `None` if the handler refused (it does
    /// not today, but a reporter must not fail the daemon if it ever does).
    pub async fn read(&self) -> Option<v1::StatsResponse> {
        self.service
            .stats(tonic::Request::new(v1::StatsRequest {}))
            .await
            .ok()
            .map(tonic::Response::into_inner)
    }
}
