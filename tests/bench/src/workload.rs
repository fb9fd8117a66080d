//! Owns the made-up, deterministic tuning workload of the benchmarks: which keys a rank
//! "tunes" and with which values, how new entries split between the shared section and the
//! rank's own, and the generator of an initial cache file with S existing entries.
//!
//! Shared keys depend only on their index (never on the rank) because the ranks of a tuning
//! group hold the same shared entries; rank-specific keys may repeat across ranks since
//! each lives in its own `rank_<N>` section, but their values name the rank.

use std::path::Path;

use crate::cache_file::{
    rank_section, CacheDocument, CacheEntry, CacheFileError, CacheMetadata, Section, SHARED_SECTION,
};

/// Keeps generated generations of keys apart: existing entries (epoch 0) never collide with
/// the new ones a rank tunes (epoch 1).
const EPOCH_STRIDE: u64 = 1_000_000;
/// Epoch of the entries the generator writes.
pub const EXISTING_EPOCH: u64 = 0;
/// Epoch of the entries a rank tunes.
pub const NEW_EPOCH: u64 = 1;

/// How many of `total` entries go to the shared section for `shared_fraction`.
pub fn shared_count(total: usize, shared_fraction: f64) -> usize {
    let fraction = shared_fraction.clamp(0.0, 1.0);
    // Rounded, not truncated, so e.g. 5 entries at 0.5 give 3 shared, not 2.
    ((total as f64) * fraction).round() as usize
}

fn bucket(epoch: u64, index: usize) -> u64 {
    epoch * EPOCH_STRIDE + index as u64 + 1
}

/// A time in ms from whole microseconds, divided (not multiplied by 0.001) so the value is
/// the double nearest its short decimal text and survives a JSON round trip unchanged.
fn millis_from_micros(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

/// Key of shared entry `index`: a MoE op profiled under a broadcast/merge strategy.
pub fn shared_key(epoch: u64, index: usize) -> String {
    format!(
        "('trtllm::fused_moe', 'MoERunner', ({}, 4096), 0)",
        bucket(epoch, index)
    )
}

/// Key of rank-specific entry `index`: a GEMM profiled independently on each rank.
pub fn rank_key(epoch: u64, index: usize) -> String {
    format!(
        "('trtllm::fp8_block_scale_gemm', 'GemmRunner', ({}, 7168), 0)",
        bucket(epoch, index)
    )
}

/// Value of shared entry `index`, identical on every rank.
pub fn shared_entry(epoch: u64, index: usize) -> CacheEntry {
    let bucket = bucket(epoch, index);
    CacheEntry {
        runner_id: (bucket % 4) as i64,
        tactic: format!(
            "MoETactic(tile=({}, 128), stages={})",
            64 << (bucket % 3),
            2 + bucket % 4
        ),
        min_time: millis_from_micros(10 + bucket % 997),
    }
}

/// Value of rank `rank`'s entry `index`.
pub fn rank_entry(rank: u32, epoch: u64, index: usize) -> CacheEntry {
    let bucket = bucket(epoch, index);
    CacheEntry {
        runner_id: i64::from(rank % 2),
        tactic: format!(
            "GemmTactic(rank={rank}, tile=(128, {}), splitk={})",
            64 << (bucket % 2),
            1 + bucket % 3
        ),
        min_time: millis_from_micros(20 + (bucket + u64::from(rank)) % 991),
    }
}

/// The entries one rank tunes: `shared_count` shared ones and the rest rank-specific.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TunedEntries {
    pub shared: Section,
    pub own: Section,
}

/// The `new_entries` entries rank `rank` tunes in epoch `epoch`.
pub fn tuned_entries(
    rank: u32,
    epoch: u64,
    new_entries: usize,
    shared_fraction: f64,
) -> TunedEntries {
    let shared_total = shared_count(new_entries, shared_fraction);
    TunedEntries {
        shared: (0..shared_total)
            .map(|index| (shared_key(epoch, index), shared_entry(epoch, index)))
            .collect(),
        own: (0..new_entries - shared_total)
            .map(|index| (rank_key(epoch, index), rank_entry(rank, epoch, index)))
            .collect(),
    }
}

/// Writes an initial cache file holding `existing` entries: the shared fraction in
/// `shared`, the rest spread evenly over `rank_0..rank_<ranks-1>`. Returns bytes written.
pub fn write_initial_cache(
    path: &Path,
    ranks: u32,
    existing: usize,
    shared_fraction: f64,
) -> Result<u64, CacheFileError> {
    let shared_total = shared_count(existing, shared_fraction);
    let mut document = CacheDocument {
        metadata: Some(CacheMetadata::for_this_process()),
        ..CacheDocument::default()
    };
    document.sections.insert(
        SHARED_SECTION.to_string(),
        (0..shared_total)
            .map(|index| {
                (
                    shared_key(EXISTING_EPOCH, index),
                    shared_entry(EXISTING_EPOCH, index),
                )
            })
            .collect(),
    );
    let ranks = ranks.max(1);
    let per_rank_total = existing - shared_total;
    for rank in 0..ranks {
        // Spread the remainder over the first ranks so the total is exactly `existing`.
        let share = per_rank_total / ranks as usize
            + usize::from((rank as usize) < per_rank_total % ranks as usize);
        document.sections.insert(
            rank_section(rank),
            (0..share)
                .map(|index| {
                    (
                        rank_key(EXISTING_EPOCH, index),
                        rank_entry(rank, EXISTING_EPOCH, index),
                    )
                })
                .collect(),
        );
    }
    let bytes = document.to_json();
    std::fs::write(path, &bytes).map_err(|source| CacheFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes.len() as u64)
}
