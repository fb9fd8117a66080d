//! Handing the allocator's free pages back to the kernel.
//!
//! A burst of writes decodes every request into short-lived strings on the runtime's threads
//! (and a shared-directory load parses every entry), while the entries the cache keeps live
//! on. glibc keeps the freed pages in its per-thread arenas, so after 100,000 Recorded entries
//! a daemon stays ~8 MiB above what its entries need, and after a 1M-entry load far more.
//! `malloc_trim` walks every arena and releases whole free pages; the store's writer calls it
//! once it has been idle for a moment after such a burst (`store`).

/// Releases the heap's free pages. Takes milliseconds on a large heap, so it runs on the
/// writer thread while that is idle, never on the async runtime.
pub fn return_free_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
