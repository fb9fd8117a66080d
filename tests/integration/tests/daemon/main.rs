//! The single-node daemon: its calls, views, leases, validation, journal, Forget, socket,
//! shutdown, operations and its documented commands.
//!
//! One test binary for these modules (each was its own binary): they share no process-wide
//! state (no environment variable, rlimit or working directory is changed), so their tests
//! run side by side, and the suite links one binary instead of 18.

mod bounded_decode;
mod client_policies;
mod daemon_core;
mod deploy;
mod forget;
mod forget_flood;
mod grpcurl_doc;
mod journal_faults;
mod lifecycle;
mod lifecycle_retention;
mod ops;
mod readme_doc;
mod resolve;
mod shutdown;
mod slow_scan;
mod socket_security;
mod trtllm_bridge;
mod tuner;
mod views;
mod views_hostile;
