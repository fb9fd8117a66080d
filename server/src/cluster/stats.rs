//! The Redis tier's Stats fields (140–162, 184–185, 320–334, 420, 451–452 and the blobs it
//! keeps out of Redis), each declared once: what the tier counted, and its link's state now.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{link, refusals, Cluster};
use crate::report::registry::StatsCell;

crate::report::stats_registry! {
    /// What the tier counted.
    #[derive(Default)]
    pub struct ClusterCounters {
        pub published: AtomicU64 as cluster_published
            => counter(52, "Results Redis stored from this node."),
        /// Bytes of blobs kept out of Redis by `--cluster-max-artifact-bytes`.
        pub artifact_bytes_over_limit: AtomicU64 as artifact_bytes_over_cluster_limit
            => counter(130, "Bytes of blobs kept out of Redis by --cluster-max-artifact-bytes."),
        pub publish_dropped: AtomicU64 as cluster_publish_dropped
            => counter(54, "Results dropped from a full publish queue (then all republished)."),
        pub received: AtomicU64 as cluster_received
            => counter(53, "Results learned from other nodes through Redis."),
        pub bootstrap_entries: AtomicU64 as cluster_bootstrap_entries => not_exported,
        pub leases_acquired: AtomicU64 as cluster_leases_acquired
            => counter(55, "Cluster leases this node took."),
        pub leases_held_elsewhere: AtomicU64 as cluster_leases_held_elsewhere
            => counter(56, "Resolves that found another node tuning the key."),
        pub lease_fallbacks: AtomicU64 as cluster_lease_fallbacks => counter(
            57,
            "Resolves that coordinated node-locally because Redis was slow or away.",
        ),
        pub takeovers: AtomicU64 as cluster_takeovers
            => counter(58, "Keys tuned here after another node's cluster lease ran out."),
        pub republished: AtomicU64 as cluster_republished
            => counter(59, "Results republished to a flushed or replaced Redis."),
        /// Publishes Redis already had (a retry of a batch it ran): nothing stored or announced.
        pub publish_already: AtomicU64 as cluster_publish_already
            => counter(62, "Publishes Redis already had (retries of a batch it ran): no-ops."),
        pub audits: AtomicU64 as cluster_audits
            => counter(63, "Comparisons of this node's shard digests with Redis's."),
        /// Shards an audit found differing from Redis (and read again).
        pub audit_differing: AtomicU64 as cluster_audit_differing
            => counter(67, "Shards an audit found differing from Redis (then read again)."),
        /// Results the audit or a stream gap found missing although their stream messages were
        /// already behind this node: 0 while the tier is healthy.
        pub audit_repaired: AtomicU64 as cluster_audit_repaired => counter(
            68,
            "Results found missing although Redis had announced them: 0 while healthy.",
        ),
        /// Shards whose stream skipped (trimmed past this node, or started over).
        pub stream_gaps: AtomicU64 as cluster_stream_gaps
            => counter(69, "Shards whose stream skipped past this node (trimmed or restarted)."),
        /// Results learned by reading shards again (audits and gaps), repairs included.
        pub resync_entries: AtomicU64 as cluster_resync_entries
            => counter(70, "Results learned by reading shards again after a gap or an audit."),
        /// Stream messages from another daemon that uses this node's name.
        pub name_conflicts: AtomicU64 as cluster_name_conflicts
            => counter(66, "Cluster messages from another daemon using this node's name."),
        /// Start-up (docs/cluster.md "Start-up"): shards whose saved place was read and matched
        /// Redis's data lifetime; shards followed on from a saved place or a checkpoint without
        /// reading their entries; shards read again from their entries.
        pub places_restored: AtomicU64 as cluster_places_restored
            => counter(100, "Shards whose saved stream place matched Redis at start."),
        pub shards_resumed: AtomicU64 as cluster_shards_resumed => counter(
            101,
            "Shards followed on at start from a saved place or a checkpoint, their entries not read.",
        ),
        pub shards_reread: AtomicU64 as cluster_shards_reread
            => counter(102, "Shards read again from their entries at start."),
        pub checkpoints_built: AtomicU64 as cluster_checkpoints_built
            => counter(103, "Shard checkpoints this node built in Redis."),
        pub checkpoints_loaded: AtomicU64 as cluster_checkpoints_loaded
            => counter(104, "Shard checkpoints this node loaded at start."),
        pub checkpoints_rejected: AtomicU64 as cluster_checkpoints_rejected => counter(
            105,
            "Shard checkpoints rejected at start: damaged, foreign, forged, misplaced or out of date.",
        ),
        /// Results the audit did not publish back because this node had them only from a
        /// checkpoint that Redis's entries do not bear out.
        pub checkpoint_results_withheld: AtomicU64 as cluster_checkpoint_results_withheld
            => counter(
                106,
                "Results the audit did not publish back because they came only from a checkpoint Redis's entries do not bear out.",
            ),
        /// Redis commands and reply bytes of this node's start, and how long it took.
        pub startup_commands: AtomicU64 => internal,
        pub startup_bytes: AtomicU64 => internal,
        pub startup_ms: AtomicU64 as cluster_startup_ms
            => gauge(109, "Milliseconds from the tier's start until it was bootstrapped."),
        /// This node's Forgets Redis stored and announced; tombstones read from Redis.
        pub forgets_published: AtomicU64 as cluster_forgets_published
            => counter(75, "This node's Forgets Redis stored and announced."),
        pub forgets_learned: AtomicU64 as cluster_forgets_learned
            => counter(76, "Tombstones read from Redis."),
        /// Redis commands sent to carry last uses (`lifecycle`): about the distinct entries
        /// this node's ranks used per day, never one per read.
        pub last_use_commands: AtomicU64 as cluster_last_use_commands => counter(
            149,
            "Redis commands this node sent to carry last uses of entries (the touch script).",
        ),
        pub entries_expired: AtomicU64 as cluster_entries_expired
            => counter(150, "Entries this node deleted from Redis because they expired."),
    }
}

crate::report::stats_registry! {
    /// The tier's Stats fields; "off" when no `--cluster-url`.
    impl FillStats for Cluster {
        fn fill_stats(cluster, stats) {
            let counters = &cluster.counters;
            let (commands, bytes) = link::startup_io();
        }
        include ClusterCounters = cluster.counters;
        include link::LinkCounters = cluster.redis.link.counters;
        include refusals::Refusals = cluster.observed.refusals;
        fields {
            cluster_state = cluster.state().describe(), absent "off".to_owned() => signed_gauge(
                50,
                "Redis cluster tier: 1 connected, 0 away, -1 off.",
                named "cluster_connected",
                via cluster_connected,
            ),
            cluster_url = cluster.link_url() => not_exported,
            cluster_bootstrapped = cluster.observed.bootstrapped.load(Ordering::Relaxed) => not_exported,
            cluster_publish_queue = cluster.lock_pending().entries.len() as u64
                => gauge(51, "Results waiting to be published to Redis."),
            cluster_publish_queue_limit = cluster.queue.limit as u64 => not_exported,
            cluster_wrong_type_keys = cluster.redis.wrong_types.describe() => not_exported,
            cluster_clock_skew_ms = cluster.observed.clock_skew_ms.load(Ordering::Relaxed)
                => signed_gauge(98, "This node's clock minus Redis's TIME at the last reading."),
            cluster_prune_paused = cluster.observed.prune_paused.load(Ordering::Relaxed) => gauge(
                99,
                "1 while the clock skew is over 1 h and no tombstone is expired from Redis.",
            ),
            /// Counted live while the start runs, kept once it is done.
            cluster_startup_commands = counters.startup_commands.read().max(commands)
                => gauge(107, "Redis commands this node's start took."),
            cluster_startup_bytes = counters.startup_bytes.read().max(bytes)
                => gauge(108, "Reply bytes this node's start read from Redis."),
        }
    }
}

/// The Redis cluster tier: -1 when off, 0 while Redis is away, 1 when connected.
fn cluster_connected(state: &str) -> i64 {
    match state {
        "off" | "" => -1,
        state if state.starts_with("connected") => 1,
        _ => 0,
    }
}
