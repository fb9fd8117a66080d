//! What every part of the daemon reports with, below every part: its Stats fields, each
//! declared once in the part's `registry::stats_registry!` (whence the fill, `stats::FillStats`,
//! and the metric rows), the daemon's own Stats as its reporters read them (`probe`), the
//! once-per-cause log of a repeated event (`log_once`), and a component's state on the gRPC
//! health service (`health`). It imports nothing of the daemon's.

pub(crate) mod health;
pub(crate) mod log_once;
pub(crate) mod probe;
pub(crate) mod registry;
pub(crate) mod stats;

pub(crate) use log_once::LogOnce;
pub(crate) use probe::StatsProbe;
pub(crate) use registry::{stats_registry, StatsRegistry};
pub(crate) use stats::FillStats;
