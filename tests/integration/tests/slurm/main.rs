//! A real single-node Slurm (munge, slurmctld and slurmd per test) with deploy/slurm's prolog,
//! epilog and wrapper.
//!
//! One test binary for these modules (each was its own binary): they share no process-wide
//! state (no environment variable, rlimit or working directory is changed), so their tests
//! run side by side, and the suite links one binary instead of 6.

mod cluster_jobs;
mod slurm_doc;
mod slurm_latency;
mod slurm_markers;
mod slurm_users;
mod slurm_wrapper;
