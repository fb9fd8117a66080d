//! Thin async client for the `tunecached` node daemon.
//!
//! `Client::connect` opens the daemon's Unix socket; every call carries a deadline so a
//! rank never hangs on the cache. The generated gRPC client is available through
//! [`Client::raw`] for anything this wrapper does not cover.
//!
//! A client reads in the view its environment names (see [`view`]): the job's ranks then all see
//! the same result for a key, the first one any of them read. It tunes, or, in replay
//! (`TUNECACHE_MODE=replay`, [`Client::replay`]; see [`mode`] and [`replay`]), serves only what
//! is cached: it never waits and never takes a lease, and a miss is answered at once.
//!
//! The policies every client needs are here, once, and the Python binding exposes them: tuning
//! under the daemon's lease ([`tuning`]: `begin_tune`, `finish_tune`, `abandon`, and the rank
//! flow [`Client::get_or_tune`] built on them) and storing a batch so that every valid entry is
//! kept ([`record`]: `record_keeping_valid`), and moving a result's artifacts, the files a tuner
//! built, to and from the daemon, verified by their digests ([`artifacts`]: `put_artifact`,
//! `put_artifacts`, `fetch_artifacts`, `get_artifact`, `stat_artifacts`).

use std::time::Duration;

use tunecache_proto::v1;

pub mod artifacts;
pub mod autostart;
mod calls;
mod connection;
pub mod encoded_scan;
mod error;
mod fetch;
mod handed;
pub mod handoff;
pub mod mode;
pub mod opening;
mod rank_flow;
pub mod record;
pub mod replay;
mod resolve;
mod socket;
mod status;
pub mod tuning;
pub mod view;

pub use artifacts::{StoredArtifact, DEFAULT_ARTIFACT_TIMEOUT};
pub use connection::{connect_channel, Client};
pub use error::{ClientError, Result};
pub use mode::Mode;
pub use rank_flow::{FlowCall, FlowFailure, RankOutcome};
pub use record::{KeptRecord, RefusedEntry};
pub use resolve::{Resolution, ResolveOptions};
pub(crate) use socket::trusted_daemon_uids;
pub use socket::{check_daemon_uid, socket_path, TRUST_UID_ENV};
pub use status::{past_deadline, refused_entry_index};
pub use tuning::{FinishFailed, LeaseAfterFailure, TuneLease, TuneStart};

pub use tunecache_proto::socket_path::{default_socket_path, UntrustedSocket};
pub use tunecache_proto::v1 as proto;

/// Default deadline of unary calls.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default deadline of a whole Scan.
pub const DEFAULT_SCAN_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds a key; `rank: None` is the entry shared by all ranks.
pub fn key(namespace: &str, op: &str, device: &str, problem: &str, rank: Option<u32>) -> v1::Key {
    v1::Key {
        namespace: namespace.to_owned(),
        op: op.to_owned(),
        device: device.to_owned(),
        problem: problem.to_owned(),
        rank,
    }
}
