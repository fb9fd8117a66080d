//! File-system helpers every part shares: `atomic`, the one way the daemon puts a file in
//! place whole (a temporary file in the same directory, synced, renamed or linked over its
//! name, the directory synced).

pub mod atomic;
