//! The service's Stats: its own fields and request counters, every owner of Stats fields the
//! Stats handler asks (`stats_owners`), and their metric rows in the order of the metrics
//! text (`stats_metrics`, which `ops::metrics` writes).

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

use tunecache_proto::v1;

use super::TuneCacheService;
use crate::artifacts::Artifacts;
use crate::coord::Coordinator;
use crate::report::registry::Metric;
use crate::report::{FillStats, StatsRegistry};
use crate::snapshot::SnapshotHandle;
use crate::store::Store;
use crate::tuner::TunerHandle;
use crate::views::Views;

crate::report::stats_registry! {
    /// Request counters reported by Stats.
    #[derive(Default)]
    pub struct RequestCounters {
        /// Keys asked for by Lookup, found, not found.
        pub lookups: AtomicU64 => counter(1, "Keys asked for by Lookup."),
        pub hits: AtomicU64 => counter(2, "Looked-up keys found in the cache."),
        pub misses: AtomicU64 => counter(3, "Looked-up keys not in the cache."),
        /// Record calls, and what their entries did to the cache.
        pub records: AtomicU64 => counter(4, "Record calls."),
        pub entries_stored: AtomicU64
            => counter(5, "Recorded entries that were new or improved the cache."),
        pub entries_unchanged: AtomicU64
            => counter(6, "Recorded entries that did not beat the cached result."),
        /// Resolve calls, counted at the door: however they are answered (the coordinator,
        /// a view's pin, a read in replay).
        pub resolves: AtomicU64 => counter(7, "Resolve calls."),
        /// Scope Forgets refused PERMISSION_DENIED (the caller is not an administrator).
        pub forgets_refused: AtomicU64 => counter(
            73,
            "Scope Forgets refused: the caller is not an --admin-uid or --admin-gid.",
        ),
    }
}

impl TuneCacheService {
    /// The daemon's Stats now: each owner fills its own fields (no I/O, short locks only).
    pub fn stats_now(&self) -> v1::StatsResponse {
        let mut stats = v1::StatsResponse::default();
        for owner in self.stats_owners() {
            owner.fill_stats(&mut stats);
        }
        stats
    }

    /// Every owner of Stats fields; `stats_metrics` names the same by type.
    fn stats_owners(&self) -> [&dyn FillStats; 14] {
        [
            self,
            &*self.artifacts,
            &self.counters,
            &self.store,
            &self.coordinator,
            &self.views,
            self.views.replay(),
            &self.tuner,
            &self.connection_limits,
            &self.request_limits,
            &self.snapshots,
            &self.cluster,
            &self.bundles,
            &self.exact_forgets,
        ]
    }
}

/// The metric rows of every owner of Stats fields (`TuneCacheService::stats_owners`), in
/// their places in the metrics text.
pub(crate) fn stats_metrics() -> &'static [&'static Metric] {
    static ROWS: OnceLock<Vec<&'static Metric>> = OnceLock::new();
    ROWS.get_or_init(|| {
        let mut rows = Vec::new();
        TuneCacheService::metrics(&mut rows);
        Artifacts::metrics(&mut rows);
        RequestCounters::metrics(&mut rows);
        Store::metrics(&mut rows);
        Coordinator::metrics(&mut rows);
        Views::metrics(&mut rows);
        crate::views::Replay::metrics(&mut rows);
        TunerHandle::metrics(&mut rows);
        crate::ops::limits::ConnectionLimits::metrics(&mut rows);
        crate::ops::request_limits::RequestLimits::metrics(&mut rows);
        SnapshotHandle::metrics(&mut rows);
        crate::cluster::Cluster::metrics(&mut rows);
        crate::bundles::Bundles::metrics(&mut rows);
        crate::ops::forget_budget::ExactForgets::metrics(&mut rows);
        rows.sort_by_key(|row| row.place);
        rows
    })
}

crate::report::stats_registry! {
    /// The daemon's own Stats fields: who and what it is, and for how long.
    impl FillStats for TuneCacheService {
        fn fill_stats(service, stats) {}
        fields {
            node_name = service.node_name.clone() => not_exported,
            /// What the previous run's last publish at shutdown did.
            previous_shutdown_publish = service.previous_shutdown.clone() => not_exported,
            daemon_pid = std::process::id() => not_exported,
            daemon_uid = nix::unistd::geteuid().as_raw() => not_exported,
            version = env!("CARGO_PKG_VERSION").to_owned() => not_exported,
            uptime_ms = service.started.elapsed().as_millis() as u64 => gauge(
                48,
                "Seconds since the daemon started.",
                named "uptime_seconds",
                via |ms: &u64| ms / 1000,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::entry::unix_now_ms;
    use crate::ops::metrics::render;
    use tunecache_proto::v1::StatsResponse;

    #[test]
    fn every_row_has_a_place_and_a_name_of_its_own() {
        let rows = stats_metrics();
        let mut places: Vec<u32> = rows.iter().map(|row| row.place).collect();
        let mut names: Vec<&str> = rows.iter().map(|row| row.name).collect();
        places.dedup();
        names.sort_unstable();
        names.dedup();
        assert_eq!(places.len(), rows.len(), "two rows share a place");
        assert_eq!(names.len(), rows.len(), "two rows share a name");
    }

    #[test]
    fn snapshot_age_is_minus_one_before_the_first_snapshot() {
        let text = render(stats_metrics(), &StatsResponse::default()).unwrap();
        assert!(text.contains("tunecache_snapshot_age_seconds -1"), "{text}");
        let recent = StatsResponse {
            last_snapshot_unix_ms: unix_now_ms() - 5_000,
            ..Default::default()
        };
        let text = render(stats_metrics(), &recent).unwrap();
        let age: i64 = text
            .lines()
            .find_map(|l| l.strip_prefix("tunecache_snapshot_age_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((5..60).contains(&age), "{text}");
    }

    /// Every Stats field the metrics read, each a different value (one past `i64::MAX` where a
    /// gauge must saturate), so the pinned text shows which field each metric reads.
    fn every_metric_field() -> StatsResponse {
        StatsResponse {
            accept_errors: 1001,
            cluster_errors: 1002,
            cluster_lease_fallbacks: 1003,
            cluster_leases_acquired: 1004,
            cluster_leases_held_elsewhere: 1005,
            cluster_publish_dropped: 1006,
            cluster_publish_queue: 1007,
            cluster_published: 1008,
            cluster_received: 1009,
            cluster_reconnects: 1010,
            cluster_republished: 1011,
            cluster_state: "connected to redis://10.0.0.1:6379".to_owned(),
            cluster_takeovers: 1012,
            connections_open: 1013,
            connections_refused_per_uid: 1014,
            entries: 1015,
            entries_stored: 1016,
            entries_unchanged: 1017,
            hits: 1018,
            journal_bytes: 1019,
            journal_compaction_failures: 1020,
            journal_compactions: 1021,
            journal_live_bytes: 1022,
            journal_unwritable: "no space left on device".to_owned(),
            journal_write_failures: 1023,
            last_snapshot_unix_ms: 0,
            leases_active: 1024,
            leases_expired: 1025,
            leases_given_up: 1026,
            leases_granted: 1027,
            leases_refused_per_pid: 1028,
            leases_released_dead: 1029,
            lookups: 1030,
            misses: 1031,
            nofile_soft_limit: u64::MAX,
            peer_files_loaded: 1032,
            peer_segments_loaded: 1033,
            preface_timeouts: 1034,
            records: 1035,
            resolves: 1036,
            segment_compactions: 1037,
            snapshot_bytes_read: 1038,
            snapshot_bytes_written: 1039,
            snapshot_errors: 1040,
            snapshot_pass_bytes_read: 1041,
            snapshot_pass_bytes_written: 1042,
            snapshots_written: 1043,
            tuner_jobs_done: 1044,
            tuner_jobs_failed: 1045,
            tuner_queue_depth: 1046,
            tuner_queue_refusals: 1047,
            tuner_restarts: 1048,
            uptime_ms: 3_600_999,
            waiters: 1049,
            waits_satisfied: 1050,
            waits_timed_out: 1051,
            write_queue_bytes: 1052,
            writes_shed: 1053,
            cluster_publish_already: 1054,
            cluster_audits: 1055,
            cluster_audit_repaired: 1056,
            cluster_stream_gaps: 1057,
            cluster_resync_entries: 1058,
            cluster_audit_differing: 1059,
            snapshot_untrusted_files: 1060,
            snapshot_name_conflicts: 1061,
            cluster_name_conflicts: 1062,
            requests_refused_too_large: 1063,
            requests_refused_per_uid: 1064,
            request_bytes_in_flight: 1065,
            forgets_received: 1066,
            forget_entries_dropped: 1067,
            forgets_refused: 1068,
            tombstones_held: 1069,
            cluster_forgets_published: 1070,
            cluster_forgets_learned: 1071,
            views_active: 1072,
            view_pins: 1073,
            max_view_pins: 1074,
            view_pins_made: 1075,
            view_pin_conflicts: 1076,
            view_pin_fallbacks: 1077,
            view_pins_from_cluster: 1078,
            view_pins_evicted: 1079,
            view_pins_over_cap: 1080,
            view_pins_forgotten: 1081,
            views_ended_idle: 1082,
            views_ended: 1083,
            max_view_pins_per_uid: 1100,
            max_views_per_uid: 1101,
            views_evicted: 1102,
            cluster_refused_stream: 1084,
            cluster_refused_entries: 1085,
            cluster_refused_tombstones: 1086,
            cluster_clock_skew_ms: -1087,
            cluster_prune_paused: true,
            cluster_places_restored: 1088,
            cluster_shards_resumed: 1089,
            cluster_shards_reread: 1090,
            cluster_checkpoints_built: 1091,
            cluster_checkpoints_loaded: 1092,
            cluster_checkpoints_rejected: 1093,
            cluster_checkpoint_results_withheld: 1420,
            cluster_startup_commands: 1094,
            cluster_startup_bytes: 1095,
            cluster_startup_ms: 1096,
            max_exact_forgets_per_uid: 1103,
            exact_forgets_refused: 1104,
            oversize_records_dropped: 1105,
            peer_nodes_resumed: 1106,
            artifact_blobs_held: 1107,
            artifact_bytes_held: 1108,
            artifact_uploads: 1109,
            artifact_uploads_already_held: 1110,
            artifact_uploads_refused: 1111,
            artifact_digest_failures: 1112,
            artifact_fetches_local: 1113,
            artifact_fetches_shared_dir: 1114,
            artifact_fetches_cluster: 1115,
            artifact_fetches_missing: 1116,
            artifact_bytes_served: 1117,
            artifact_bytes_read_from_tiers: 1118,
            artifact_collections: 1119,
            artifact_bytes_over_blob_limit: 1120,
            artifact_bytes_over_store_limit: 1121,
            artifact_bytes_over_uid_limit: 1122,
            max_artifact_bytes: 1123,
            artifact_store_bytes: 1124,
            artifact_records_refused: 1125,
            artifact_bytes_over_cluster_limit: 1126,
            artifact_shared_dir_collections: 1127,
            artifact_handoffs: 1128,
            artifact_store_bytes_per_uid: 1410,
            artifact_bytes_over_uid_store_limit: 1411,
            artifact_fetches_over_store_limit: 1412,
            artifact_shared_dir_squatted: 1129,
            snapshot_squatted_files: 1440,
            replay_misses: 1441,
            replay_bundled_entries: 1442,
            bundles_loaded: 1443,
            bundle_entries: 1444,
            artifact_fetches_bundle: 1445,
            last_use_updates_written: 1446,
            entries_expired: 1447,
            entries_expired_by_bound: 1448,
            entries_expired_on_arrival: 1449,
            artifacts_unnamed_by_expiry: 1450,
            snapshot_last_uses_published: 1453,
            namespace_usage: vec![tunecache_proto::v1::UsageGroup {
                name: "trtllm".to_owned(),
                entries: 1455,
                entry_bytes: 1456,
                artifact_bytes: 1457,
                by_age: vec![1, 2, 3, 4, 5],
            }],
            cluster_last_use_commands: 1451,
            cluster_entries_expired: 1452,
            ..Default::default()
        }
    }

    /// The metrics text (names, HELP, TYPE, order and which Stats field each reads) is a
    /// contract with dashboards: pinned byte for byte. `snapshot_age_seconds` is -1 here
    /// (no snapshot yet); its arithmetic has its own test.
    #[test]
    fn metrics_text_is_pinned() {
        let text = render(stats_metrics(), &every_metric_field()).unwrap();
        let pinned = include_str!("../../../testdata/metrics.txt");
        assert!(
            text == pinned,
            "metrics text changed; diff it against server/testdata/metrics.txt:\n{text}"
        );
    }

    #[test]
    fn cluster_connected_is_minus_one_off_zero_away_one_connected() {
        let connected = |state: &str| {
            let stats = StatsResponse {
                cluster_state: state.to_owned(),
                ..Default::default()
            };
            let text = render(stats_metrics(), &stats).unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("tunecache_cluster_connected "))
                .unwrap()
                .to_owned()
        };
        assert_eq!(connected("off"), "-1");
        assert_eq!(connected(""), "-1");
        assert_eq!(connected("connecting"), "0");
        assert_eq!(connected("down: timed out"), "0");
        assert_eq!(connected("connected to redis://x"), "1");
    }
}
