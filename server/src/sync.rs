//! Locking that survives a panic elsewhere. The daemon's std mutexes guard plain data (maps,
//! counters, status text) that a panicking holder cannot leave in a state worse than refusing
//! every later caller would, so a poisoned lock is taken over rather than propagated.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking it over if a panicking holder poisoned it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
