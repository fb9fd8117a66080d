//! The shared directory's Stats fields (40–59, 170–171, 360–361, 400, 440, 453), each declared once:
//! what the tier counted, and what it is doing now. Filling them touches no filesystem.

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use super::SnapshotHandle;
use crate::model::entry::unix_now_ms;
use crate::sync::lock;

crate::report::stats_registry! {
    /// What the tier counted.
    #[derive(Default)]
    pub(super) struct SnapshotCounters {
        pub(super) written: AtomicU64 as snapshots_written
            => counter(18, "Snapshots written to the shared directory."),
        pub(super) skipped_unchanged: AtomicU64 as snapshots_skipped_unchanged => not_exported,
        pub(super) errors: AtomicU64 as snapshot_errors
            => counter(19, "Failed snapshot writes or loads."),
        pub(super) peer_files_loaded: AtomicU64
            => counter(20, "Other nodes' snapshot files loaded."),
        pub(super) peer_files_skipped: AtomicU64 => not_exported,
        pub(super) segments_loaded: AtomicU64 as peer_segments_loaded
            => counter(23, "Other nodes' snapshot segments loaded."),
        pub(super) compactions: AtomicU64 as segment_compactions
            => counter(24, "Compactions of this node's own snapshot segments."),
        pub(super) last_snapshot_unix_ms: AtomicI64 => signed_gauge(
            49,
            "Seconds since the last snapshot; -1 before the first.",
            named "snapshot_age_seconds",
            via snapshot_age_seconds,
        ),
        /// File bytes read from the shared directory (shared with the readers that count them).
        pub(super) bytes_read: Arc<AtomicU64> as snapshot_bytes_read
            => counter(21, "File bytes read from the shared directory."),
        /// File bytes written to the shared directory.
        pub(super) bytes_written: AtomicU64 as snapshot_bytes_written
            => counter(22, "File bytes written to the shared directory."),
        pub(super) passes: AtomicU64 as snapshot_passes => not_exported,
        pub(super) last_pass_bytes_read: AtomicU64 as snapshot_pass_bytes_read
            => gauge(25, "File bytes the last shared-directory pass read."),
        pub(super) last_pass_bytes_written: AtomicU64 as snapshot_pass_bytes_written
            => gauge(26, "File bytes the last shared-directory pass wrote."),
        /// Own contributions published in all.
        pub(super) published: AtomicU64 as own_entries_published => not_exported,
        /// Files skipped because they do not prove who wrote them.
        pub(super) untrusted_files: AtomicU64 as snapshot_untrusted_files => counter(
            64,
            "Shared-directory files skipped: no valid MAC, an owner not allowed, or content that disagrees with the name.",
        ),
        /// Of those, other users' files under a name this daemon trusts (name squatting).
        pub(super) squatted_files: AtomicU64 as snapshot_squatted_files => counter(
            137,
            "Of the untrusted files, other users' files named after a node whose segments this daemon trusts (name squatting).",
        ),
        /// Segments under this node's name that it did not write.
        pub(super) name_conflicts: AtomicU64 as snapshot_name_conflicts
            => counter(65, "Segments under this node's name that it did not write."),
        /// Entries dropped from loaded files (a Record would refuse them).
        pub(super) invalid_entries: AtomicU64 as snapshot_invalid_entries => not_exported,
        /// Other nodes read on from the place the state directory recorded, not from the start.
        pub(super) peers_resumed: AtomicU64 as peer_nodes_resumed => counter(
            110,
            "Other nodes whose segments were read on at start from the place the state directory recorded.",
        ),
        /// Last uses of keys this node put in its segments' `used` lists.
        pub(super) last_uses_published: AtomicU64 as snapshot_last_uses_published => counter(
            148,
            "Last uses of keys this node put in its shared-directory segments.",
        ),
        /// Blobs of `v2/artifacts/` no entry named, deleted by this node's sweeps.
        pub(super) blobs_collected: AtomicU64 as artifact_shared_dir_collections => counter(
            131,
            "Blobs of the shared directory no entry named, deleted by this node's sweeps.",
        ),
    }
}

crate::report::stats_registry! {
    /// The tier's Stats fields: its directory, its counters, its last error and what is stuck.
    impl FillStats for SnapshotHandle {
        fn fill_stats(snapshots, stats) {
            let shared = &snapshots.shared;
            let stuck = snapshots.stuck();
        }
        include SnapshotCounters = shared.counters;
        fields {
            shared_dir = shared.settings.dir.display().to_string() => not_exported,
            last_snapshot_error = lock(&shared.last_error).clone() => not_exported,
            /// Empty when no shared-filesystem call is stuck.
            stuck_operation = stuck
                .map(|(operation, _)| operation.as_str().to_owned())
                .unwrap_or_default() => not_exported,
            stuck_since_unix_ms = stuck.map_or(0, |(_, since_unix_ms)| since_unix_ms)
                => not_exported,
            snapshot_format_version = super::format::FORMAT_VERSION as u32 => not_exported,
            artifact_shared_dir_squatted = shared.squats.count() => counter(
                136,
                "Names in the shared blob directory held by an untrusted owner where blobs go or are looked for; each reported once, never used.",
            ),
        }
    }
}

/// -1 until the first snapshot, so "never" is not mistaken for "just now".
fn snapshot_age_seconds(last_snapshot_unix_ms: &i64) -> i64 {
    if *last_snapshot_unix_ms > 0 {
        (unix_now_ms() - last_snapshot_unix_ms).max(0) / 1000
    } else {
        -1
    }
}
