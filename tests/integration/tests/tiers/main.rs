//! The tiers between nodes: the shared directory (segments, trust, many users) and the Redis
//! cluster tier (faults, start-up, hostile writers, checkpoints, last use and expiry).
//!
//! One test binary for these modules (each was its own binary): they share no process-wide
//! state (no environment variable, rlimit or working directory is changed), so their tests
//! run side by side, and the suite links one binary instead of 11.

mod bundles;
mod cluster;
mod cluster_checkpoint_trust;
mod cluster_faults;
mod cluster_hostile;
mod cluster_startup;
mod lifecycle_redis;
mod lifecycle_shared_dir;
mod shared_dir_hostile;
mod shared_dir_squatting;
mod shared_dir_trust;
mod shared_dir_users;
mod snapshot;
mod snapshot_v2;
