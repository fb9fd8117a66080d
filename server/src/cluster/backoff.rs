//! How long the tier waits after a failure before it tries again: exponential, from 100 ms
//! doubling to 5 s, each wait drawn at random from the upper half of its step ("equal
//! jitter"), so nodes that failed together (a Redis restart, a refused command) do not come
//! back together. A pure type: the connector and the forget follower each own one.

use std::time::Duration;

pub const FIRST: Duration = Duration::from_millis(100);
pub const MAX: Duration = Duration::from_secs(5);
/// A connection (or a follower's run) that lasted this long was healthy: the next failure
/// starts the backoff over. One that failed sooner waits longer each time, so whatever fails
/// it (a refused command, a damaged key), it comes back at most about once a second.
pub const HEALTHY_FOR: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Backoff {
    step: Duration,
    state: u64,
}

impl Backoff {
    /// `seed`: any value, different per daemon (the jitter's generator starts from it).
    pub fn new(seed: u64) -> Backoff {
        Backoff {
            step: FIRST,
            state: seed | 1,
        }
    }

    /// The wait before the next try: within the upper half of the current step, which then
    /// doubles (up to `MAX`).
    pub fn next_wait(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(MAX);
        let half = step / 2;
        let spread = u64::try_from(half.as_micros()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_micros(self.random() % (spread + 1))
    }

    /// After a success: the next failure waits the shortest step again.
    pub fn reset(&mut self) {
        self.step = FIRST;
    }

    /// xorshift64*: enough to spread waits; nothing depends on it being unpredictable.
    fn random(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_100_ms_to_5_s_each_in_the_upper_half_of_its_step() {
        let mut backoff = Backoff::new(7);
        let mut step = FIRST;
        for _ in 0..12 {
            let wait = backoff.next_wait();
            assert!(
                wait >= step / 2 && wait <= step,
                "{wait:?} for step {step:?}"
            );
            step = (step * 2).min(MAX);
        }
        // At the top, never less than 2.5 s: at most one try every 2.5 s.
        for _ in 0..100 {
            let wait = backoff.next_wait();
            assert!(wait >= MAX / 2 && wait <= MAX, "{wait:?}");
        }
        backoff.reset();
        assert!(backoff.next_wait() <= FIRST);
    }

    #[test]
    fn nodes_that_fail_together_spread_out() {
        let waits: Vec<Duration> = (1..=50u64)
            .map(|seed| {
                let mut backoff = Backoff::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                (0..6).map(|_| backoff.next_wait()).sum()
            })
            .collect();
        let mut distinct = waits.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 45, "{waits:?}");
    }
}
