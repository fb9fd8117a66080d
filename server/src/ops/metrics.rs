//! `--metrics-addr`: Prometheus/OpenMetrics text on `GET /metrics`, off by default.
//!
//! Every figure is read from the daemon's own Stats at scrape time (see `probe`), encoded with
//! `prometheus-client`. The HTTP side is a minimal handler on a tokio TCP listener (one request
//! per connection, then close), which is all a Prometheus scrape needs and adds no HTTP server
//! stack to the daemon. A bare port binds loopback only; another interface must be named.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tunecache_proto::v1::StatsResponse;

use crate::error::{Error, Result};
use crate::model::entry::unix_now_ms;
use crate::report::StatsProbe;
use crate::tasks::Tasks;

/// A scrape request larger than this, or slower than the timeout, is dropped.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `PORT` means `127.0.0.1:PORT`; `HOST:PORT` (e.g. `0.0.0.0:9464`, `[::1]:9464`) is taken as
/// given.
pub fn parse_addr(spec: &str) -> Result<SocketAddr> {
    if let Ok(port) = spec.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    spec.parse()
        .map_err(|_| Error::BadMetricsAddr(spec.to_owned()))
}

pub async fn bind(spec: &str) -> Result<TcpListener> {
    let addr = parse_addr(spec)?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io("binding the metrics address", spec, e))?;
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "metrics served beyond loopback, as --metrics-addr asked");
    }
    // Logged here, before the daemon says it is serving, so the address (port 0 resolved) is
    // in the log by the time anyone reads it.
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
    }
    Ok(listener)
}

/// Serves scrapes until the daemon stops, each connection one of its `tasks`.
pub async fn serve(listener: TcpListener, probe: StatsProbe, tasks: Tasks) {
    loop {
        let connection = tokio::select! {
            () = tasks.stopping() => return,
            accepted = listener.accept() => accepted,
        };
        match connection {
            Ok((stream, _)) => {
                let probe = probe.clone();
                tasks.spawn(async move {
                    if let Err(error) = answer(stream, &probe).await {
                        tracing::debug!(%error, "metrics request failed");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "metrics: accept failed");
                // Out of fds, typically; don't spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads one request head and answers it.
async fn answer(mut stream: TcpStream, probe: &StatsProbe) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let read_head = async {
        let mut buffer = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
            let n = stream.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buffer[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, read_head)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let request_line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let request_line = String::from_utf8_lossy(request_line);
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => match probe.read().await.map(|stats| render(&stats)) {
            Some(Ok(text)) => ("200 OK", CONTENT_TYPE, text),
            _ => (
                "500 Internal Server Error",
                "text/plain",
                "stats unavailable\n".to_owned(),
            ),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_owned(),
        ),
    };
    let mut response = String::with_capacity(body.len() + 128);
    let _ = write!(
        response,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// How a metric is read from one scrape's Stats.
#[derive(Clone, Copy)]
enum Read {
    Counter(fn(&StatsResponse) -> u64),
    /// A gauge of an unsigned Stats field; saturates at `i64::MAX`.
    Gauge(fn(&StatsResponse) -> u64),
    /// A gauge that may be negative (a -1 "never"/"off").
    SignedGauge(fn(&StatsResponse) -> i64),
}

/// One row of the metrics table: the name (after the `tunecache_` prefix), its HELP line
/// and how to read it. Adding a metric is one row here and the Stats field it reads.
struct Metric {
    name: &'static str,
    help: &'static str,
    read: Read,
}

const fn row(name: &'static str, help: &'static str, read: Read) -> Metric {
    Metric { name, help, read }
}

use Read::{Counter, Gauge, SignedGauge};

/// Every metric, in the order it is written.
#[rustfmt::skip]
const METRICS: &[Metric] = &[
    row("lookups", "Keys asked for by Lookup.", Counter(|s| s.lookups)),
    row("hits", "Looked-up keys found in the cache.", Counter(|s| s.hits)),
    row("misses", "Looked-up keys not in the cache.", Counter(|s| s.misses)),
    row("records", "Record calls.", Counter(|s| s.records)),
    row("entries_stored", "Recorded entries that were new or improved the cache.", Counter(|s| s.entries_stored)),
    row("entries_unchanged", "Recorded entries that did not beat the cached result.", Counter(|s| s.entries_unchanged)),
    row("resolves", "Resolve calls.", Counter(|s| s.resolves)),
    row("resolve_leases_granted", "Resolve outcome: the caller was told to tune (lease granted).", Counter(|s| s.leases_granted)),
    row("resolve_waits_satisfied", "Resolve outcome: a waiting caller got someone else's result.", Counter(|s| s.waits_satisfied)),
    row("resolve_waits_timed_out", "Resolve outcome: a waiting caller gave up (miss).", Counter(|s| s.waits_timed_out)),
    row("leases_expired", "Tuning leases that ran out before a Record.", Counter(|s| s.leases_expired)),
    row("leases_released_dead", "Tuning leases released because their holder died.", Counter(|s| s.leases_released_dead)),
    row("leases_given_up", "Tuning leases given up by an empty Record.", Counter(|s| s.leases_given_up)),
    row("journal_compactions", "Journal compactions.", Counter(|s| s.journal_compactions)),
    row("journal_compaction_failures", "Journal compactions and repair rewrites that failed.", Counter(|s| s.journal_compaction_failures)),
    row("journal_write_failures", "Journal appends or syncs that failed; their Records were refused.", Counter(|s| s.journal_write_failures)),
    row("journal_unwritable", "1 while the journal refuses Records until it is repaired.", SignedGauge(|s| i64::from(!s.journal_unwritable.is_empty()))),
    row("snapshots_written", "Snapshots written to the shared directory.", Counter(|s| s.snapshots_written)),
    row("snapshot_errors", "Failed snapshot writes or loads.", Counter(|s| s.snapshot_errors)),
    row("peer_files_loaded", "Other nodes' snapshot files loaded.", Counter(|s| s.peer_files_loaded)),
    row("snapshot_bytes_read", "File bytes read from the shared directory.", Counter(|s| s.snapshot_bytes_read)),
    row("snapshot_bytes_written", "File bytes written to the shared directory.", Counter(|s| s.snapshot_bytes_written)),
    row("peer_segments_loaded", "Other nodes' snapshot segments loaded.", Counter(|s| s.peer_segments_loaded)),
    row("segment_compactions", "Compactions of this node's own snapshot segments.", Counter(|s| s.segment_compactions)),
    row("snapshot_pass_bytes_read", "File bytes the last shared-directory pass read.", Gauge(|s| s.snapshot_pass_bytes_read)),
    row("snapshot_pass_bytes_written", "File bytes the last shared-directory pass wrote.", Gauge(|s| s.snapshot_pass_bytes_written)),
    row("tuner_jobs_done", "Tuner worker jobs finished.", Counter(|s| s.tuner_jobs_done)),
    row("tuner_jobs_failed", "Tuner worker jobs failed.", Counter(|s| s.tuner_jobs_failed)),
    row("tuner_restarts", "Tuner worker restarts.", Counter(|s| s.tuner_restarts)),
    row("accept_errors", "Failed accepts (out of descriptors, typically), each followed by a back-off.", Counter(|s| s.accept_errors)),
    row("connections_refused_per_uid", "Connections closed at accept: the uid held --max-connections-per-uid.", Counter(|s| s.connections_refused_per_uid)),
    row("preface_timeouts", "Connections closed for sending no HTTP/2 preface within --preface-timeout.", Counter(|s| s.preface_timeouts)),
    row("leases_refused_per_pid", "Resolves refused: the process held --max-leases-per-pid leases.", Counter(|s| s.leases_refused_per_pid)),
    row("tuner_queue_refusals", "Resolves refused: the node's tuner queue was full.", Counter(|s| s.tuner_queue_refusals)),
    row("writes_shed", "Records refused: the journal writer's queue was full.", Counter(|s| s.writes_shed)),
    row("requests_refused_too_large", "Requests refused from their header: over --max-message-bytes.", Counter(|s| s.requests_refused_too_large)),
    row("requests_refused_per_uid", "Requests refused from their header: the uid had --max-request-bytes-per-uid in flight.", Counter(|s| s.requests_refused_per_uid)),
    row("connections_open", "Client connections open.", Gauge(|s| s.connections_open)),
    row("write_queue_bytes", "Bytes of Records waiting for the journal writer.", Gauge(|s| s.write_queue_bytes)),
    row("request_bytes_in_flight", "Bytes of request messages being read, decoded or served.", Gauge(|s| s.request_bytes_in_flight)),
    row("nofile_soft_limit", "Open-file limit the daemon runs under.", Gauge(|s| s.nofile_soft_limit)),
    row("entries", "Entries in the cache.", Gauge(|s| s.entries)),
    row("resolve_waiters", "Resolve callers waiting right now.", Gauge(|s| s.waiters)),
    row("leases_active", "Tuning leases and tuner jobs in flight.", Gauge(|s| s.leases_active)),
    row("tuner_queue_depth", "Jobs queued for the tuner worker.", Gauge(|s| s.tuner_queue_depth)),
    row("journal_bytes", "Size of the journal.", Gauge(|s| s.journal_bytes)),
    row("journal_live_bytes", "Journal bytes still needed by live entries.", Gauge(|s| s.journal_live_bytes)),
    row("uptime_seconds", "Seconds since the daemon started.", Gauge(|s| s.uptime_ms / 1000)),
    row("snapshot_age_seconds", "Seconds since the last snapshot; -1 before the first.", SignedGauge(snapshot_age_seconds)),
    row("cluster_connected", "Redis cluster tier: 1 connected, 0 away, -1 off.", SignedGauge(cluster_connected)),
    row("cluster_publish_queue", "Results waiting to be published to Redis.", Gauge(|s| s.cluster_publish_queue)),
    row("cluster_published", "Results Redis stored from this node.", Counter(|s| s.cluster_published)),
    row("cluster_received", "Results learned from other nodes through Redis.", Counter(|s| s.cluster_received)),
    row("cluster_publish_dropped", "Results dropped from a full publish queue (then all republished).", Counter(|s| s.cluster_publish_dropped)),
    row("cluster_leases_acquired", "Cluster leases this node took.", Counter(|s| s.cluster_leases_acquired)),
    row("cluster_leases_held_elsewhere", "Resolves that found another node tuning the key.", Counter(|s| s.cluster_leases_held_elsewhere)),
    row("cluster_lease_fallbacks", "Resolves that coordinated node-locally because Redis was slow or away.", Counter(|s| s.cluster_lease_fallbacks)),
    row("cluster_takeovers", "Keys tuned here after another node's cluster lease ran out.", Counter(|s| s.cluster_takeovers)),
    row("cluster_republished", "Results republished to a flushed or replaced Redis.", Counter(|s| s.cluster_republished)),
    row("cluster_reconnects", "Reconnections to Redis.", Counter(|s| s.cluster_reconnects)),
    row("cluster_errors", "Failed or timed-out Redis commands.", Counter(|s| s.cluster_errors)),
    row("cluster_publish_already", "Publishes Redis already had (retries of a batch it ran): no-ops.", Counter(|s| s.cluster_publish_already)),
    row("cluster_audits", "Comparisons of this node's shard digests with Redis's.", Counter(|s| s.cluster_audits)),
    row("snapshot_untrusted_files", "Shared-directory files skipped: no valid MAC, an owner not allowed, or content that disagrees with the name.", Counter(|s| s.snapshot_untrusted_files)),
    row("snapshot_squatted_files", "Of the untrusted files, other users' files named after a node whose segments this daemon trusts (name squatting).", Counter(|s| s.snapshot_squatted_files)),
    row("snapshot_name_conflicts", "Segments under this node's name that it did not write.", Counter(|s| s.snapshot_name_conflicts)),
    row("cluster_name_conflicts", "Cluster messages from another daemon using this node's name.", Counter(|s| s.cluster_name_conflicts)),
    row("cluster_audit_differing", "Shards an audit found differing from Redis (then read again).", Counter(|s| s.cluster_audit_differing)),
    row("cluster_audit_repaired", "Results found missing although Redis had announced them: 0 while healthy.", Counter(|s| s.cluster_audit_repaired)),
    row("cluster_stream_gaps", "Shards whose stream skipped past this node (trimmed or restarted).", Counter(|s| s.cluster_stream_gaps)),
    row("cluster_resync_entries", "Results learned by reading shards again after a gap or an audit.", Counter(|s| s.cluster_resync_entries)),
    row("forgets_received", "Forgets applied: asked of this node, or learned from other nodes.", Counter(|s| s.forgets_received)),
    row("forget_entries_dropped", "Entries removed from this node's cache by Forgets.", Counter(|s| s.forget_entries_dropped)),
    row("forgets_refused", "Scope Forgets refused: the caller is not an --admin-uid or --admin-gid.", Counter(|s| s.forgets_refused)),
    row("tombstones_held", "Forgets kept so that no replica brings their entries back.", Gauge(|s| s.tombstones_held)),
    row("cluster_forgets_published", "This node's Forgets Redis stored and announced.", Counter(|s| s.cluster_forgets_published)),
    row("cluster_forgets_learned", "Tombstones read from Redis.", Counter(|s| s.cluster_forgets_learned)),
    row("max_exact_forgets_per_uid", "Forgets of one key (only_if) one uid may ask per minute (--max-exact-forgets-per-uid).", Gauge(|s| s.max_exact_forgets_per_uid)),
    row("exact_forgets_refused", "Forgets of one key refused: their uid was over --max-exact-forgets-per-uid.", Counter(|s| s.exact_forgets_refused)),
    row("oversize_records_dropped", "Entries and tombstones from other nodes too big for a journal frame, dropped.", Counter(|s| s.oversize_records_dropped)),
    row("views_active", "Job views on this node, empty ones included.", Gauge(|s| s.views_active)),
    row("view_pins", "Pins held now, all views.", Gauge(|s| s.view_pins)),
    row("max_view_pins", "Most pins this node holds (--max-view-pins).", Gauge(|s| s.max_view_pins)),
    row("max_view_pins_per_uid", "Most pins one uid's views hold (--max-view-pins-per-uid).", Gauge(|s| s.max_view_pins_per_uid)),
    row("max_views_per_uid", "Most views one uid holds (--max-views-per-uid).", Gauge(|s| s.max_views_per_uid)),
    row("view_pins_made", "First answers pinned in a view (here, or taken from the cluster).", Counter(|s| s.view_pins_made)),
    row("view_pin_conflicts", "View reads answered with a pin while a better result was stored.", Counter(|s| s.view_pin_conflicts)),
    row("view_pin_fallbacks", "Pins made node-locally because Redis did not answer in time.", Counter(|s| s.view_pin_fallbacks)),
    row("view_pins_from_cluster", "Pins another node made first, taken from Redis.", Counter(|s| s.view_pins_from_cluster)),
    row("view_pins_evicted", "Pins dropped with whole views to hold their uid's caps.", Counter(|s| s.view_pins_evicted)),
    row("views_evicted", "Whole views dropped to hold their uid's caps.", Counter(|s| s.views_evicted)),
    row("view_pins_over_cap", "Answers left unpinned: their view alone held its uid's cap, or the node --max-view-pins.", Counter(|s| s.view_pins_over_cap)),
    row("view_pins_forgotten", "Pins dropped by Forgets.", Counter(|s| s.view_pins_forgotten)),
    row("views_ended_idle", "Views ended after --view-idle-secs without a request.", Counter(|s| s.views_ended_idle)),
    row("views_ended", "Views ended by an operator.", Counter(|s| s.views_ended)),
    row("cluster_refused_stream", "Announcements read from Redis streams that no client could send, refused.", Counter(|s| s.cluster_refused_stream)),
    row("cluster_refused_entries", "Entries read from Redis hashes or script replies that no client could send, refused.", Counter(|s| s.cluster_refused_entries)),
    row("cluster_refused_tombstones", "Tombstones read from Redis that no Forget could make, refused.", Counter(|s| s.cluster_refused_tombstones)),
    row("cluster_clock_skew_ms", "This node's clock minus Redis's TIME at the last reading.", SignedGauge(|s| s.cluster_clock_skew_ms)),
    row("cluster_prune_paused", "1 while the clock skew is over 1 h and no tombstone is expired from Redis.", Gauge(|s| u64::from(s.cluster_prune_paused))),
    row("cluster_places_restored", "Shards whose saved stream place matched Redis at start.", Counter(|s| s.cluster_places_restored)),
    row("cluster_shards_resumed", "Shards followed on at start from a saved place or a checkpoint, their entries not read.", Counter(|s| s.cluster_shards_resumed)),
    row("cluster_shards_reread", "Shards read again from their entries at start.", Counter(|s| s.cluster_shards_reread)),
    row("cluster_checkpoints_built", "Shard checkpoints this node built in Redis.", Counter(|s| s.cluster_checkpoints_built)),
    row("cluster_checkpoints_loaded", "Shard checkpoints this node loaded at start.", Counter(|s| s.cluster_checkpoints_loaded)),
    row("cluster_checkpoints_rejected", "Shard checkpoints rejected at start: damaged, foreign, forged, misplaced or out of date.", Counter(|s| s.cluster_checkpoints_rejected)),
    row("cluster_checkpoint_results_withheld", "Results the audit did not publish back because they came only from a checkpoint Redis's entries do not bear out.", Counter(|s| s.cluster_checkpoint_results_withheld)),
    row("cluster_startup_commands", "Redis commands this node's start took.", Gauge(|s| s.cluster_startup_commands)),
    row("cluster_startup_bytes", "Reply bytes this node's start read from Redis.", Gauge(|s| s.cluster_startup_bytes)),
    row("cluster_startup_ms", "Milliseconds from the tier's start until it was bootstrapped.", Gauge(|s| s.cluster_startup_ms)),
    row("peer_nodes_resumed", "Other nodes whose segments were read on at start from the place the state directory recorded.", Counter(|s| s.peer_nodes_resumed)),
    row("artifact_blobs_held", "Artifact blobs held in this node's store.", Gauge(|s| s.artifact_blobs_held)),
    row("artifact_bytes_held", "Bytes of the artifact blobs held.", Gauge(|s| s.artifact_bytes_held)),
    row("artifact_uploads", "PutArtifact calls that stored a new blob.", Counter(|s| s.artifact_uploads)),
    row("artifact_uploads_already_held", "PutArtifact calls answered already_held.", Counter(|s| s.artifact_uploads_already_held)),
    row("artifact_uploads_refused", "PutArtifact calls refused (digest, size or a limit).", Counter(|s| s.artifact_uploads_refused)),
    row("artifact_digest_failures", "Blobs whose bytes did not hash to their digest: uploads, this node's disk, the tiers.", Counter(|s| s.artifact_digest_failures)),
    row("artifact_fetches_local", "GetArtifact calls served from this node's store.", Counter(|s| s.artifact_fetches_local)),
    row("artifact_fetches_shared_dir", "Blobs fetched from the shared directory into the store.", Counter(|s| s.artifact_fetches_shared_dir)),
    row("artifact_fetches_cluster", "Blobs fetched from the Redis tier into the store.", Counter(|s| s.artifact_fetches_cluster)),
    row("artifact_fetches_missing", "GetArtifact calls answered NOT_FOUND or UNAVAILABLE.", Counter(|s| s.artifact_fetches_missing)),
    row("artifact_bytes_served", "Bytes GetArtifact streamed.", Counter(|s| s.artifact_bytes_served)),
    row("artifact_bytes_read_from_tiers", "Bytes read from the shared directory or Redis for blobs.", Counter(|s| s.artifact_bytes_read_from_tiers)),
    row("artifact_collections", "Unreferenced blobs deleted after --artifact-grace-secs.", Counter(|s| s.artifact_collections)),
    row("artifact_bytes_over_blob_limit", "Announced bytes of uploads refused by --max-artifact-bytes.", Counter(|s| s.artifact_bytes_over_blob_limit)),
    row("artifact_bytes_over_store_limit", "Bytes of uploads refused by --artifact-store-mib.", Counter(|s| s.artifact_bytes_over_store_limit)),
    row("artifact_bytes_over_uid_limit", "Bytes of uploads refused by --artifact-unreferenced-mib-per-uid.", Counter(|s| s.artifact_bytes_over_uid_limit)),
    row("max_artifact_bytes", "The largest blob this node stores (--max-artifact-bytes).", Gauge(|s| s.max_artifact_bytes)),
    row("artifact_store_bytes", "The artifact store's bound in bytes (--artifact-store-mib).", Gauge(|s| s.artifact_store_bytes)),
    row("artifact_records_refused", "Records refused for naming a blob this node cannot serve.", Counter(|s| s.artifact_records_refused)),
    row("artifact_bytes_over_cluster_limit", "Bytes of blobs kept out of Redis by --cluster-max-artifact-bytes.", Counter(|s| s.artifact_bytes_over_cluster_limit)),
    row("artifact_shared_dir_collections", "Blobs of the shared directory no entry named, deleted by this node's sweeps.", Counter(|s| s.artifact_shared_dir_collections)),
    row("artifact_handoffs", "Blobs handed to a rank on this node as a read-only descriptor (the handoff socket).", Counter(|s| s.artifact_handoffs)),
    row("artifact_store_bytes_per_uid", "One uid's share of the artifact store in bytes (--artifact-store-mib-per-uid).", Gauge(|s| s.artifact_store_bytes_per_uid)),
    row("artifact_bytes_over_uid_store_limit", "Bytes of uploads refused by --artifact-store-mib-per-uid.", Counter(|s| s.artifact_bytes_over_uid_store_limit)),
    row("artifact_fetches_over_store_limit", "Fetches from the tiers refused by --artifact-store-mib.", Counter(|s| s.artifact_fetches_over_store_limit)),
    row("artifact_shared_dir_squatted", "Names in the shared blob directory held by an untrusted owner where blobs go or are looked for; each reported once, never used.", Counter(|s| s.artifact_shared_dir_squatted)),
];

/// -1 until the first snapshot, so "never" is not mistaken for "just now".
fn snapshot_age_seconds(s: &StatsResponse) -> i64 {
    if s.last_snapshot_unix_ms > 0 {
        (unix_now_ms() - s.last_snapshot_unix_ms).max(0) / 1000
    } else {
        -1
    }
}

/// The Redis cluster tier: -1 when off, 0 while Redis is away, 1 when connected.
fn cluster_connected(s: &StatsResponse) -> i64 {
    match s.cluster_state.as_str() {
        "off" | "" => -1,
        state if state.starts_with("connected") => 1,
        _ => 0,
    }
}

/// One scrape's worth of Stats, encoded as the rows of `METRICS`.
#[derive(Debug)]
struct StatsCollector(StatsResponse);

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let stats = &self.0;
        for metric in METRICS {
            match metric.read {
                Read::Counter(read) => {
                    encode(&mut encoder, metric, ConstCounter::new(read(stats)))?
                }
                Read::Gauge(read) => {
                    let value = i64::try_from(read(stats)).unwrap_or(i64::MAX);
                    encode(&mut encoder, metric, ConstGauge::new(value))?
                }
                Read::SignedGauge(read) => {
                    encode(&mut encoder, metric, ConstGauge::new(read(stats)))?
                }
            }
        }
        Ok(())
    }
}

fn encode(
    encoder: &mut DescriptorEncoder,
    metric: &Metric,
    value: impl EncodeMetric,
) -> std::fmt::Result {
    value.encode(encoder.encode_descriptor(metric.name, metric.help, None, value.metric_type())?)
}

/// The metrics text for one set of Stats.
pub fn render(stats: &StatsResponse) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("tunecache");
    registry.register_collector(Box::new(StatsCollector(stats.clone())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_is_loopback_and_an_address_is_taken_as_given() {
        assert_eq!(
            parse_addr("9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_addr("0.0.0.0:9464").unwrap(),
            "0.0.0.0:9464".parse().unwrap()
        );
        assert_eq!(
            parse_addr("[::1]:9464").unwrap(),
            "[::1]:9464".parse().unwrap()
        );
        assert!(parse_addr("localhost").is_err());
    }

    #[test]
    fn snapshot_age_is_minus_one_before_the_first_snapshot() {
        let text = render(&StatsResponse::default()).unwrap();
        assert!(text.contains("tunecache_snapshot_age_seconds -1"), "{text}");
        let recent = StatsResponse {
            last_snapshot_unix_ms: unix_now_ms() - 5_000,
            ..Default::default()
        };
        let text = render(&recent).unwrap();
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
            ..Default::default()
        }
    }

    /// The metrics text (names, HELP, TYPE, order and which Stats field each reads) is a
    /// contract with dashboards: pinned byte for byte. `snapshot_age_seconds` is -1 here
    /// (no snapshot yet); its arithmetic has its own test.
    #[test]
    fn metrics_text_is_pinned() {
        let text = render(&every_metric_field()).unwrap();
        let pinned = include_str!("../../testdata/metrics.txt");
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
            let text = render(&stats).unwrap();
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
