//! The admission every door of the daemon shares, gRPC and the descriptor handoff alike: one
//! `ConnectionLimits` (each uid's connections bounded, per socket, by the same
//! `--max-connections-per-uid`, counted and logged in the same Stats fields), one `PeerCheck`
//! (`--allow-uid`/`--allow-gid`, each refused uid logged once whichever door it knocked on)
//! and one `ActivityClock` (every admitted request, whatever its transport, keeps
//! `--exit-when-idle` from firing). Built once by `server`; each door takes what it needs from
//! the same value, so no door can be built with a part of its own.

use std::sync::Arc;

use tokio::net::UnixListener;

use super::access::PeerCheck;
use super::idle::ActivityClock;
use super::incoming::Incoming;
use super::limits::ConnectionLimits;

/// The shared parts of every door's admission.
#[derive(Clone)]
pub struct Admission {
    limits: Arc<ConnectionLimits>,
    check: PeerCheck,
    activity: ActivityClock,
}

impl Admission {
    pub fn new(limits: Arc<ConnectionLimits>, check: PeerCheck, activity: ActivityClock) -> Self {
        Admission {
            limits,
            check,
            activity,
        }
    }

    /// The connections accepted on `listener`, under the shared limits.
    pub fn incoming(&self, listener: UnixListener) -> Incoming {
        Incoming::new(listener, Arc::clone(&self.limits))
    }

    pub fn limits(&self) -> &Arc<ConnectionLimits> {
        &self.limits
    }

    pub fn check(&self) -> &PeerCheck {
        &self.check
    }

    pub fn activity(&self) -> &ActivityClock {
        &self.activity
    }
}
