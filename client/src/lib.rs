//! Placeholder crate root for branch `py`: only the TensorRT-LLM cache file interop lives here.
//! The real client crate on `main` replaces this file at merge and declares `pub mod trtllm;`.
pub mod trtllm;
