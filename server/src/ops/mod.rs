//! Deployment and operations: the socket and its guard (`listener`), accepted connections
//! (`incoming`), who may call (`access`), what callers may hold (`limits`, `request_limits`,
//! `forget_budget`, `forget_turns`), what every door (gRPC, the descriptor handoff) is admitted
//! by (`admission`), what callers get before the daemon is open (`opening`), life under systemd
//! (`systemd`), Prometheus text (`metrics`), the idle exit (`idle`) and the jobs that hold it
//! (`jobs_here`), the allocator's free pages (`heap`), and one daemon per state directory
//! (`state_lock`).

pub(crate) mod access;
pub(crate) mod admission;
pub(crate) mod forget_budget;
pub(crate) mod forget_turns;
pub(crate) mod heap;
pub(crate) mod idle;
pub(crate) mod incoming;
pub(crate) mod jobs_here;
pub(crate) mod limits;
pub(crate) mod listener;
pub(crate) mod metrics;
pub(crate) mod opening;
pub(crate) mod request_limits;
pub(crate) mod state_lock;
pub(crate) mod systemd;
