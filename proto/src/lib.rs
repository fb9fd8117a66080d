//! Generated types for the TuneCache gRPC contract (`tunecache.v1`), the private
//! daemon/worker protocol (`tunecache.tuner.v1`) and the journal frame payload
//! (`tunecache.journal.v1`), plus the socket-path rule every client and the daemon share.
//!
//! The `.proto` files under `proto/tunecache/` are the source of truth; Python stubs are
//! generated from the same files.

pub mod v1 {
    tonic::include_proto!("tunecache.v1");
}

pub mod journal {
    pub mod v1 {
        tonic::include_proto!("tunecache.journal.v1");
    }
}

pub mod tuner {
    pub mod v1 {
        tonic::include_proto!("tunecache.tuner.v1");
    }
}

/// Encoded `FileDescriptorSet` of every proto here, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tunecache_descriptor");

/// The fully qualified gRPC service name, as reflection and health report it.
pub const SERVICE_NAME: &str = "tunecache.v1.TuneCache";

pub mod socket_path;
