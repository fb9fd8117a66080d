//! What this deployment's keys take in Redis, as `--cluster-max-mib` counts it: measured per
//! entry and per stream message (docs/cluster.md, "Memory per entry"), so that every node,
//! holding the same entries, computes the same total and expires the same ones.

use super::keys::SHARDS;

/// Bytes a stored entry's hash takes beyond its record's bytes (key name, field names, the
/// listpack's own overhead, the sequence number and last-use fields): measured about 250 bytes
/// for an entry whose key and config take 100.
pub const ENTRY_OVERHEAD_BYTES: u64 = 160;
/// Bytes of one stream message while it is retained.
pub const STREAM_MESSAGE_BYTES: u64 = 220;

/// What the shards' streams take at most, each capped at `stream_max_len` messages: set aside
/// from `--cluster-max-mib` before the entries are counted.
pub fn stream_reserve_bytes(stream_max_len: u64) -> u64 {
    SHARDS as u64 * stream_max_len * STREAM_MESSAGE_BYTES
}

/// The bytes left for entries under `--cluster-max-mib MIB`, or why the bound is too small.
pub fn entry_budget_bytes(max_mib: u64, stream_max_len: u64) -> Result<u64, String> {
    let total = max_mib.saturating_mul(1024 * 1024);
    let reserve = stream_reserve_bytes(stream_max_len);
    match total.checked_sub(reserve) {
        Some(left) if left >= 1024 * 1024 => Ok(left),
        _ => Err(format!(
            "--cluster-max-mib {max_mib} leaves less than 1 MiB for entries once the {} MiB the \
             streams take at --cluster-stream-max-len {stream_max_len} are set aside",
            reserve.div_ceil(1024 * 1024)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_streams_are_set_aside_and_too_small_a_bound_is_refused() {
        // 16 streams of 10,000 messages: about 34 MiB.
        assert_eq!(stream_reserve_bytes(10_000), 35_200_000);
        let left = entry_budget_bytes(100, 10_000).unwrap();
        assert_eq!(left, 100 * 1024 * 1024 - 35_200_000);
        assert!(entry_budget_bytes(30, 10_000)
            .unwrap_err()
            .contains("--cluster-max-mib 30"));
        assert!(entry_budget_bytes(2, 100).is_ok());
    }
}
