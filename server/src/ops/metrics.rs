//! `--metrics-addr`: Prometheus/OpenMetrics text on `GET /metrics`, off by default.
//!
//! Every figure is read from the daemon's own Stats at scrape time (see `probe`) by the rows
//! each part declares with its Stats fields (`report::registry`), which the daemon hands in,
//! and encoded with `prometheus-client`. The HTTP side is a minimal handler on a tokio TCP
//! listener (one request per connection, then close), which is all a Prometheus scrape needs
//! and adds no HTTP server stack to the daemon. A bare port binds loopback only; another interface must be named.

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
use crate::report::registry::{Metric, Read};
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

/// Serves scrapes of `metrics` (every registry's rows, in their places) until the daemon
/// stops, each connection one of its `tasks`.
pub async fn serve(
    listener: TcpListener,
    probe: StatsProbe,
    metrics: &'static [&'static Metric],
    tasks: Tasks,
) {
    loop {
        let connection = tokio::select! {
            () = tasks.stopping() => return,
            accepted = listener.accept() => accepted,
        };
        match connection {
            Ok((stream, _)) => {
                let probe = probe.clone();
                tasks.spawn(async move {
                    if let Err(error) = answer(stream, &probe, metrics).await {
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
async fn answer(
    mut stream: TcpStream,
    probe: &StatsProbe,
    metrics: &'static [&'static Metric],
) -> std::io::Result<()> {
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
        ("GET", "/metrics") => match probe.read().await.map(|stats| render(metrics, &stats)) {
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

/// One scrape's worth of Stats, encoded as the given rows in their order.
#[derive(Debug)]
struct StatsCollector {
    stats: StatsResponse,
    metrics: &'static [&'static Metric],
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let stats = &self.stats;
        for metric in self.metrics {
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
                Read::GaugeFamily(read) => {
                    let samples = read(stats);
                    let gauge = ConstGauge::new(0i64);
                    let mut family = encoder.encode_descriptor(
                        metric.name,
                        metric.help,
                        None,
                        gauge.metric_type(),
                    )?;
                    for (labels, value) in &samples {
                        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
                    }
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

/// The metrics text of `metrics` (every registry's rows, in their places) for one set of
/// Stats.
pub fn render(
    metrics: &'static [&'static Metric],
    stats: &StatsResponse,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("tunecache");
    registry.register_collector(Box::new(StatsCollector {
        stats: stats.clone(),
        metrics,
    }));
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
}
