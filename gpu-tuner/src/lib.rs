//! The tunecache GPU tuner (namespace `tunecache`).
//!
//! * [`problem`]: what a `gemm` / `nvrtc` problem is, and its canonical key text.
//! * [`backend`]: the cpu stand-in and the cuda backend that tune one job.
//! * [`measure`]: the shared timing policy.
//! * [`frame`]: the length-delimited prost frames of the daemon <-> worker protocol.
//! * [`supervisor`]: the daemon side, which runs the `tunecache-tuner` worker as a child
//!   process and restarts it when it dies, so a faulting kernel never takes the daemon down.

pub mod backend;
pub mod frame;
pub mod measure;
pub mod problem;
pub mod supervisor;
