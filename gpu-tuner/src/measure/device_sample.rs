//! What a device's samples need besides the statistics: the spin kernel's delay queued ahead
//! of each sample, so the device never waits for the host inside one, and how many buffer sets
//! cold-L2 timing rotates through.

/// How long the spin kernel queued ahead of a sample keeps the device busy: long enough to
/// cover the host's time to queue the sample's runs, so the device never waits for the host
/// between the two timestamps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DelayPolicy {
    pub delay_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

impl Default for DelayPolicy {
    fn default() -> Self {
        DelayPolicy {
            delay_us: 50.0,
            min_us: 20.0,
            max_us: 20_000.0,
        }
    }
}

impl DelayPolicy {
    /// Notes that queueing the last sample took `enqueue_us` of host time. Returns whether
    /// the delay may not have covered it (the sample may hold idle device time and should be
    /// taken again) and sets the delay for the next sample to twice that time.
    pub fn observe(&mut self, enqueue_us: f64) -> bool {
        // 0.8: the spin kernel starts a little after it is queued, so a margin is kept.
        let starved = enqueue_us > 0.8 * self.delay_us;
        let wanted = (2.0 * enqueue_us).clamp(self.min_us, self.max_us);
        if wanted > self.delay_us {
            self.delay_us = wanted;
        }
        starved
    }
}

/// Cold-L2 timing by rotation: how many copies of a run's buffers (`set_bytes` each) to
/// cycle through so that a run never finds its inputs in an L2 of `l2_bytes`, within
/// `budget_bytes` of device memory. Returns the number of sets (at least 1) and whether
/// that many are enough.
pub fn rotation_sets(
    set_bytes: u64,
    l2_bytes: u64,
    budget_bytes: u64,
    max_sets: u64,
) -> (u64, bool) {
    let set_bytes = set_bytes.max(1);
    // What the other sets of one cycle touch must exceed twice the L2 size, so that nothing
    // a run left in L2 survives until the same set comes round again.
    let wanted = (2 * l2_bytes).div_ceil(set_bytes) + 1;
    let wanted = wanted.max(2);
    let affordable = (budget_bytes / set_bytes).max(1);
    let sets = wanted.min(affordable).min(max_sets.max(1));
    (sets, sets >= wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_grows_to_cover_the_host_enqueue_time() {
        let mut delay = DelayPolicy::default();
        assert!(!delay.observe(10.0), "10 us of enqueue fits a 50 us delay");
        assert_eq!(delay.delay_us, 50.0);
        assert!(delay.observe(45.0), "45 us is too close to 50 us");
        assert_eq!(delay.delay_us, 90.0);
        assert!(!delay.observe(30.0));
        assert_eq!(delay.delay_us, 90.0, "the delay never shrinks");
        delay.observe(1e9);
        assert_eq!(delay.delay_us, delay.max_us);
    }

    #[test]
    fn rotation_covers_twice_the_l2_when_memory_allows() {
        let mib = 1u64 << 20;
        // 50 MiB L2, 8 MiB sets: 13 + 1 sets.
        assert_eq!(rotation_sets(8 * mib, 50 * mib, 1 << 40, 64), (14, true));
        // A set bigger than twice the L2 still alternates between two copies.
        assert_eq!(rotation_sets(512 * mib, 50 * mib, 1 << 40, 64), (2, true));
        // Not enough memory for the copies: fewer sets, and it says so.
        assert_eq!(rotation_sets(8 * mib, 50 * mib, 32 * mib, 64), (4, false));
        assert_eq!(rotation_sets(8 * mib, 50 * mib, mib, 64), (1, false));
    }
}
