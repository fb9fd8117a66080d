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
use tokio_util::sync::CancellationToken;
use tunecache_proto::v1::StatsResponse;

use crate::entry::unix_now_ms;
use crate::error::{Error, Result};
use crate::probe::StatsProbe;

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
    Ok(listener)
}

/// Serves scrapes until `stop` is cancelled.
pub async fn serve(listener: TcpListener, probe: StatsProbe, stop: CancellationToken) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
    }
    loop {
        let connection = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match connection {
            Ok((stream, _)) => {
                let probe = probe.clone();
                tokio::spawn(async move {
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

/// One scrape's worth of Stats, encoded as metrics.
#[derive(Debug)]
struct StatsCollector(StatsResponse);

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> std::fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn as_gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let e = &mut encoder;
        counter(e, "lookups", "Keys asked for by Lookup.", s.lookups)?;
        counter(e, "hits", "Looked-up keys found in the cache.", s.hits)?;
        counter(e, "misses", "Looked-up keys not in the cache.", s.misses)?;
        counter(e, "records", "Record calls.", s.records)?;
        counter(
            e,
            "entries_stored",
            "Recorded entries that were new or improved the cache.",
            s.entries_stored,
        )?;
        counter(
            e,
            "entries_unchanged",
            "Recorded entries that did not beat the cached result.",
            s.entries_unchanged,
        )?;
        counter(e, "resolves", "Resolve calls.", s.resolves)?;
        counter(
            e,
            "resolve_leases_granted",
            "Resolve outcome: the caller was told to tune (lease granted).",
            s.leases_granted,
        )?;
        counter(
            e,
            "resolve_waits_satisfied",
            "Resolve outcome: a waiting caller got someone else's result.",
            s.waits_satisfied,
        )?;
        counter(
            e,
            "resolve_waits_timed_out",
            "Resolve outcome: a waiting caller gave up (miss).",
            s.waits_timed_out,
        )?;
        counter(
            e,
            "leases_expired",
            "Tuning leases that ran out before a Record.",
            s.leases_expired,
        )?;
        counter(
            e,
            "leases_released_dead",
            "Tuning leases released because their holder died.",
            s.leases_released_dead,
        )?;
        counter(
            e,
            "leases_given_up",
            "Tuning leases given up by an empty Record.",
            s.leases_given_up,
        )?;
        counter(
            e,
            "journal_compactions",
            "Journal compactions.",
            s.journal_compactions,
        )?;
        counter(
            e,
            "journal_compaction_failures",
            "Journal compactions and repair rewrites that failed.",
            s.journal_compaction_failures,
        )?;
        counter(
            e,
            "journal_write_failures",
            "Journal appends or syncs that failed; their Records were refused.",
            s.journal_write_failures,
        )?;
        gauge(
            e,
            "journal_unwritable",
            "1 while the journal refuses Records until it is repaired.",
            i64::from(!s.journal_unwritable.is_empty()),
        )?;
        counter(
            e,
            "snapshots_written",
            "Snapshots written to the shared directory.",
            s.snapshots_written,
        )?;
        counter(
            e,
            "snapshot_errors",
            "Failed snapshot writes or loads.",
            s.snapshot_errors,
        )?;
        counter(
            e,
            "peer_files_loaded",
            "Other nodes' snapshot files loaded.",
            s.peer_files_loaded,
        )?;
        counter(
            e,
            "snapshot_bytes_read",
            "File bytes read from the shared directory.",
            s.snapshot_bytes_read,
        )?;
        counter(
            e,
            "snapshot_bytes_written",
            "File bytes written to the shared directory.",
            s.snapshot_bytes_written,
        )?;
        counter(
            e,
            "peer_segments_loaded",
            "Other nodes' snapshot segments loaded.",
            s.peer_segments_loaded,
        )?;
        counter(
            e,
            "segment_compactions",
            "Compactions of this node's own snapshot segments.",
            s.segment_compactions,
        )?;
        gauge(
            e,
            "snapshot_pass_bytes_read",
            "File bytes the last shared-directory pass read.",
            as_gauge(s.snapshot_pass_bytes_read),
        )?;
        gauge(
            e,
            "snapshot_pass_bytes_written",
            "File bytes the last shared-directory pass wrote.",
            as_gauge(s.snapshot_pass_bytes_written),
        )?;
        counter(
            e,
            "tuner_jobs_done",
            "Tuner worker jobs finished.",
            s.tuner_jobs_done,
        )?;
        counter(
            e,
            "tuner_jobs_failed",
            "Tuner worker jobs failed.",
            s.tuner_jobs_failed,
        )?;
        counter(
            e,
            "tuner_restarts",
            "Tuner worker restarts.",
            s.tuner_restarts,
        )?;
        counter(
            e,
            "accept_errors",
            "Failed accepts (out of descriptors, typically), each followed by a back-off.",
            s.accept_errors,
        )?;
        counter(
            e,
            "connections_refused_per_uid",
            "Connections closed at accept: the uid held --max-connections-per-uid.",
            s.connections_refused_per_uid,
        )?;
        counter(
            e,
            "preface_timeouts",
            "Connections closed for sending no HTTP/2 preface within --preface-timeout.",
            s.preface_timeouts,
        )?;
        counter(
            e,
            "leases_refused_per_pid",
            "Resolves refused: the process held --max-leases-per-pid leases.",
            s.leases_refused_per_pid,
        )?;
        counter(
            e,
            "tuner_queue_refusals",
            "Resolves refused: the node's tuner queue was full.",
            s.tuner_queue_refusals,
        )?;
        counter(
            e,
            "writes_shed",
            "Records refused: the journal writer's queue was full.",
            s.writes_shed,
        )?;
        gauge(
            e,
            "connections_open",
            "Client connections open.",
            as_gauge(s.connections_open),
        )?;
        gauge(
            e,
            "write_queue_bytes",
            "Bytes of Records waiting for the journal writer.",
            as_gauge(s.write_queue_bytes),
        )?;
        gauge(
            e,
            "nofile_soft_limit",
            "Open-file limit the daemon runs under.",
            as_gauge(s.nofile_soft_limit),
        )?;
        gauge(e, "entries", "Entries in the cache.", as_gauge(s.entries))?;
        gauge(
            e,
            "resolve_waiters",
            "Resolve callers waiting right now.",
            as_gauge(s.waiters),
        )?;
        gauge(
            e,
            "leases_active",
            "Tuning leases and tuner jobs in flight.",
            as_gauge(s.leases_active),
        )?;
        gauge(
            e,
            "tuner_queue_depth",
            "Jobs queued for the tuner worker.",
            as_gauge(s.tuner_queue_depth),
        )?;
        gauge(
            e,
            "journal_bytes",
            "Size of the journal.",
            as_gauge(s.journal_bytes),
        )?;
        gauge(
            e,
            "journal_live_bytes",
            "Journal bytes still needed by live entries.",
            as_gauge(s.journal_live_bytes),
        )?;
        gauge(
            e,
            "uptime_seconds",
            "Seconds since the daemon started.",
            as_gauge(s.uptime_ms / 1000),
        )?;
        // -1 until the first snapshot, so "never" is not mistaken for "just now".
        let snapshot_age_s = if s.last_snapshot_unix_ms > 0 {
            (unix_now_ms() - s.last_snapshot_unix_ms).max(0) / 1000
        } else {
            -1
        };
        gauge(
            e,
            "snapshot_age_seconds",
            "Seconds since the last snapshot; -1 before the first.",
            snapshot_age_s,
        )?;
        encode_cluster(e, s)
    }
}

/// The Redis cluster tier: -1 when off, 0 while Redis is away, 1 when connected.
fn encode_cluster(e: &mut DescriptorEncoder, s: &StatsResponse) -> std::fmt::Result {
    let connected = match s.cluster_state.as_str() {
        "off" | "" => -1,
        state if state.starts_with("connected") => 1,
        _ => 0,
    };
    gauge(
        e,
        "cluster_connected",
        "Redis cluster tier: 1 connected, 0 away, -1 off.",
        connected,
    )?;
    gauge(
        e,
        "cluster_publish_queue",
        "Results waiting to be published to Redis.",
        as_gauge(s.cluster_publish_queue),
    )?;
    for (name, help, value) in [
        (
            "cluster_published",
            "Results Redis stored from this node.",
            s.cluster_published,
        ),
        (
            "cluster_received",
            "Results learned from other nodes through Redis.",
            s.cluster_received,
        ),
        (
            "cluster_publish_dropped",
            "Results dropped from a full publish queue (then all republished).",
            s.cluster_publish_dropped,
        ),
        (
            "cluster_leases_acquired",
            "Cluster leases this node took.",
            s.cluster_leases_acquired,
        ),
        (
            "cluster_leases_held_elsewhere",
            "Resolves that found another node tuning the key.",
            s.cluster_leases_held_elsewhere,
        ),
        (
            "cluster_lease_fallbacks",
            "Resolves that coordinated node-locally because Redis was slow or away.",
            s.cluster_lease_fallbacks,
        ),
        (
            "cluster_takeovers",
            "Keys tuned here after another node's cluster lease ran out.",
            s.cluster_takeovers,
        ),
        (
            "cluster_republished",
            "Results republished to a flushed or replaced Redis.",
            s.cluster_republished,
        ),
        (
            "cluster_reconnects",
            "Reconnections to Redis.",
            s.cluster_reconnects,
        ),
        (
            "cluster_errors",
            "Failed or timed-out Redis commands.",
            s.cluster_errors,
        ),
    ] {
        counter(e, name, help, value)?;
    }
    Ok(())
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
            ..Default::default()
        }
    }

    /// The metrics text (names, HELP, TYPE, order and which Stats field each reads) is a
    /// contract with dashboards: pinned byte for byte. `snapshot_age_seconds` is -1 here
    /// (no snapshot yet); its arithmetic has its own test.
    #[test]
    fn metrics_text_is_pinned() {
        let text = render(&every_metric_field()).unwrap();
        let pinned = include_str!("../testdata/metrics.txt");
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
