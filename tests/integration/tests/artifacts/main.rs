//! Artifact blobs: upload, fetch, quotas, the descriptor handoff and its tampering, and the
//! bundles that carry entries with their blobs from one cache to another.
//!
//! One test binary for these modules (each was its own binary): they share no process-wide
//! state (no environment variable, rlimit or working directory is changed), so their tests
//! run side by side, and the suite links one binary instead of 4.

mod artifact_quotas;
mod blobs;
mod bundles;
mod handoff;
mod handoff_tamper;
