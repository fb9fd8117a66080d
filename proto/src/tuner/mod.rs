//! The tuning contract between the daemon (which supervises the worker and keys its results)
//! and the `tunecache-tuner` worker (which measures): the generated protocol ([`v1`]), the
//! problems both sides must read the same way ([`problem`]), how protocol messages are framed
//! on the worker's pipes ([`frame`]) and which backend the worker is asked for
//! ([`BackendChoice`]).

pub mod v1 {
    tonic::include_proto!("tunecache.tuner.v1");
}

mod backend_choice;
pub mod frame;
pub mod problem;

pub use backend_choice::BackendChoice;

/// Exit status of a worker that found its CUDA context poisoned by a sticky error (a fault
/// in a kernel, an ECC error, ...): the daemon restarts it, and blames the candidate it had
/// announced last.
pub const POISONED_EXIT_CODE: i32 = 70;
