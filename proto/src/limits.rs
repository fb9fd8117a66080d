//! Transport limits that the daemon and its clients must agree on: a message one side may
//! send, the other must accept.

/// Largest gRPC request or response message, either way; a full 10,000-entry Record or
/// Lookup batch fits.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
