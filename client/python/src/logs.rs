//! The Rust client's log lines as Python `logging` records: what `tunecache-client` logs with
//! `tracing` at WARN or above under a `tunecache` target (replay's once-per-key miss line,
//! `tunecache::replay`) is written by the logger of the same name with dots
//! (`tunecache.replay`), so that the rule of what is logged, and how often, stays the Rust
//! client's and a Python rank sees it where it sees the package's other warnings.
//!
//! Events happen on the process runtime's thread, which must never wait for the GIL (a Python
//! thread may hold it while it waits for that runtime), so they are kept here, at most
//! [`MAX_PENDING`], and written by the thread that called, with the GIL, when its call returns
//! ([`forward`], from [`crate::runtime`]). The subscriber is installed as the process's global
//! one when the module is imported, unless another already is.

use std::fmt::Write as _;
use std::sync::{Mutex, TryLockError};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};

/// Lines kept until a call returns; past this, new ones are dropped.
const MAX_PENDING: usize = 1_000;
/// How many times the runtime's thread tries a lock the calling thread holds for a moment.
const LOCK_TRIES: usize = 1_000;

/// `(level, target, message)` of each event not yet written.
static PENDING: Mutex<Vec<(Level, &'static str, String)>> = Mutex::new(Vec::new());

/// Keeps the Rust client's warnings for [`forward`].
struct Keep;

fn wanted(metadata: &Metadata<'_>) -> bool {
    metadata.level() <= &Level::WARN && metadata.target().starts_with("tunecache")
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl tracing::Subscriber for Keep {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        wanted(metadata)
    }

    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        // Spans are not kept; every one gets the same id.
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let metadata = event.metadata();
        // Never a blocking lock here: a fork may have copied it held by a thread that does not
        // exist in the child. A line lost then is the lesser harm.
        for _ in 0..LOCK_TRIES {
            match PENDING.try_lock() {
                Ok(mut pending) => {
                    if pending.len() < MAX_PENDING {
                        pending.push((*metadata.level(), metadata.target(), message.0));
                    }
                    return;
                }
                Err(TryLockError::Poisoned(_)) => return,
                Err(TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}
}

/// Installs the subscriber, unless the process has a global one already (an embedding
/// program's own: its lines go there).
pub fn install() {
    let _ = tracing::subscriber::set_global_default(Keep);
}

/// Writes the kept lines through Python's `logging`, on the calling thread. Never fails: a line
/// that cannot be written is dropped.
pub fn forward(py: Python<'_>) {
    let lines = match PENDING.try_lock() {
        Ok(mut pending) if !pending.is_empty() => std::mem::take(&mut *pending),
        // Empty, or the runtime's thread is adding one: the next call writes it.
        _ => return,
    };
    let Ok(logging) = py.import("logging") else {
        return;
    };
    for (level, target, message) in lines {
        let number = if level == Level::ERROR { 40 } else { 30 };
        let name = target.replace("::", ".");
        if let Ok(logger) = logging.call_method1("getLogger", (name,)) {
            let _ = logger.call_method1("log", (number, message));
        }
    }
}
