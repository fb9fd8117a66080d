//! Owns the tables of BENCHMARKS.md: each one is rendered from the raw output of the run that
//! measured it (a `suite` results.json, a `micro` JSON, `cluster.json`, `multinode.json`,
//! `segments.json`, `artifacts.json`, `bitblas.json`, `flashinfer.json`, `inductor.json`, `bundles.json`), so the report is regenerated, never hand-copied.
//!
//! A table sits between two marker comments that name its kind and its source file (relative
//! to the Markdown file):
//!
//! ```text
//! <!-- report:begin single-node docs/bench/current/suite/results.json -->
//! ...generated...
//! <!-- report:end -->
//! ```
//!
//! [`update`] rewrites every such block from its source; [`check`] says which blocks differ.
//! A block whose source file does not exist is left as it is (reported, not an error): its
//! figures were recorded before the run's raw output was kept.
//!
//! Sources are read as untyped JSON so that the output of older suite versions (other system
//! names, fields added since) still renders.
//!
//! `blocks` finds and rewrites the marked blocks; [`render`] picks the table of a kind,
//! written by `suite`, `cluster`, `micro`, `python` or `artifacts`, in the figures' formats of
//! `format`.

mod artifacts;
mod bitblas;
mod blocks;
mod bundles;
mod cluster;
mod flashinfer;
mod format;
mod inductor;
mod micro;
mod python;
mod suite;

use anyhow::{bail, Result};
use serde_json::Value;

pub use self::blocks::{check, read_source, regenerate, update, Block, Outcome};
pub use self::format::{bytes, ms, times};

/// The kinds of table, with the source each reads.
pub const KINDS: [(&str, &str); 19] = [
    (
        "single-node",
        "suite results.json: the local-disk rows of the matrix",
    ),
    (
        "shared-filesystem",
        "suite results.json: the slowfs rows of the matrix",
    ),
    ("peer-pickup", "suite results.json: micro.peer_pickup"),
    ("cluster", "cluster.json (`tunecache-bench cluster`)"),
    ("multinode", "multinode.json (`tunecache-bench multinode`)"),
    ("segments", "segments.json (`tunecache-bench segments`)"),
    (
        "data-path",
        "micro JSON (`micro --only lookup,pyscan,memory`)",
    ),
    ("transport", "micro JSON (`micro --only transport`)"),
    ("python-ranks", "suite results.json with the Python systems"),
    (
        "python-process",
        "python-client.json (`tunecache-bench python-client`): per process",
    ),
    (
        "python-scan",
        "python-client.json: the Scan against its floor",
    ),
    (
        "python-cold-start",
        "python-client.json: cold start of Python ranks",
    ),
    (
        "memory",
        "micro JSON (`micro --only memory`) or a suite results.json",
    ),
    ("views", "micro JSON (`micro --only views`)"),
    (
        "artifacts",
        "artifacts.json (`tunecache-bench artifacts`): GetArtifact against its floors",
    ),
    (
        "bitblas",
        "bitblas.json (`tunecache-bench bitblas`): BitBLAS ranks loading a database",
    ),
    (
        "flashinfer",
        "flashinfer.json (`tunecache-bench flashinfer`): FlashInfer ranks tuning through autotune_v2",
    ),
    (
        "inductor",
        "inductor.json (`tunecache-bench inductor`): Inductor ranks compiling with max-autotune",
    ),
    (
        "bundles",
        "bundles.json (`tunecache-bench bundles`): bundle export, start-up and replayed misses",
    ),
];

/// Renders one table of `kind` from a parsed source.
pub fn render(kind: &str, source: &Value) -> Result<String> {
    match kind {
        "single-node" => suite::single_node(source),
        "shared-filesystem" => suite::shared_filesystem(source),
        "peer-pickup" => suite::peer_pickup(source),
        "cluster" => cluster::cluster(source),
        "multinode" => cluster::multinode(source),
        "segments" => cluster::segments(source),
        "data-path" => micro::data_path(source),
        "transport" => micro::transport(source),
        "python-ranks" => suite::python_ranks(source),
        "python-process" => python::python_process(source),
        "python-scan" => python::python_scan(source),
        "python-cold-start" => python::python_cold_start(source),
        "memory" => micro::memory(source),
        "views" => micro::views(source),
        "artifacts" => artifacts::artifacts(source),
        "bitblas" => bitblas::bitblas(source),
        "flashinfer" => flashinfer::flashinfer(source),
        "inductor" => inductor::inductor(source),
        "bundles" => bundles::bundles(source),
        other => bail!(
            "unknown table kind {other:?}; known: {}",
            KINDS.map(|(kind, _)| kind).join(", ")
        ),
    }
}
