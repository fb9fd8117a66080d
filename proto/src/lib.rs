//! The tunecache contract, shared by the daemon, the tuner worker and every client.
//!
//! * [`v1`], [`tuner::v1`], [`journal::v1`]: generated types of the TuneCache gRPC contract
//!   (`tunecache.v1`), the private daemon/worker protocol (`tunecache.tuner.v1`) and the
//!   journal frame payload (`tunecache.journal.v1`). The `.proto` files under
//!   `proto/tunecache/` are the source of truth; Python stubs are generated from the same files.
//! * [`tuner`]: the rest of the tuning contract: what a problem of namespace `tunecache` is and
//!   its canonical text ([`tuner::problem`]), the worker's frame codec ([`tuner::frame`]) and
//!   the backend choice ([`tuner::BackendChoice`]).
//! * [`artifact`]: the rules of an artifact's name and digest, and its streams' limits.
//! * [`limits`]: transport limits both ends of a connection must agree on.
//! * [`socket_path`]: where the daemon's socket is when nobody says.
//! * [`unix_now_ms`]: the clock of every `*_unix_ms` field.

pub mod v1 {
    tonic::include_proto!("tunecache.v1");
}

pub mod journal {
    pub mod v1 {
        tonic::include_proto!("tunecache.journal.v1");
    }
}

pub mod tuner;

/// Encoded `FileDescriptorSet` of every proto here, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tunecache_descriptor");

/// The fully qualified gRPC service name, as reflection and health report it.
pub const SERVICE_NAME: &str = "tunecache.v1.TuneCache";

pub mod artifact;
pub mod handoff;
pub mod limits;
pub mod socket_path;

mod clock;
pub use clock::{unix_ms, unix_now_ms};
