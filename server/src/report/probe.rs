//! In-process reads of the daemon's own `Stats`, for the parts of the daemon that report on it
//! (systemd status, Prometheus metrics, the idle timer). The probe reads what the Stats
//! handler answers a client (`rpc` builds it from the service), so every figure is reported
//! the same way everywhere, with no second set of counters to keep in step, and the
//! reporters need nothing from the layers above them.

use std::sync::Arc;

use tunecache_proto::v1;

/// Reads the daemon's Stats as a client would see them.
#[derive(Clone)]
pub struct StatsProbe {
    read: Arc<dyn Fn() -> v1::StatsResponse + Send + Sync>,
}

impl StatsProbe {
    /// A probe that answers what `read` returns (cheap: no I/O, short locks only).
    pub fn new(read: impl Fn() -> v1::StatsResponse + Send + Sync + 'static) -> Self {
        StatsProbe {
            read: Arc::new(read),
        }
    }

    /// The daemon's Stats now. `Option` so that a reporter is written for a read that can
    /// fail, should the handler ever refuse.
    pub async fn read(&self) -> Option<v1::StatsResponse> {
        Some((self.read)())
    }
}
