//! The timing policy every backend shares: how candidates are warmed up, how many runs one
//! sample covers, in which order candidates are sampled, when to stop, and which statistic
//! is reported.
//!
//! It follows what the frameworks do (TensorRT-LLM's autotuner profiler, Triton's
//! `do_bench`): one sample is N back-to-back runs between one pair of timestamps, so the
//! host's launch time is not inside any run; candidates are sampled in rounds whose order
//! changes from round to round, so no candidate is always first after idle time; and the
//! method is written into the result (`TimingMethod`), since a cached time means something
//! only together with how it was taken.
//!
//! The backend supplies one [`Timed`] value (GPU events behind a delay kernel on CUDA,
//! `Instant` on the CPU); everything statistical is here and pure enough to test on a CPU.

mod device_sample;
mod statistics;

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::backend::SplitMix64;
use crate::error::TuneError;

pub use device_sample::{rotation_sets, DelayPolicy};
use statistics::{median, relative_iqr};
pub use statistics::{stats_of, Stats};

/// Version of the policy below, recorded in every result: bump it when a change would make
/// new times incomparable with old ones.
pub const METHOD_VERSION: u32 = 2;

/// How hard to try for a stable number.
#[derive(Debug, Clone)]
pub struct MeasureConfig {
    /// Untimed single runs of each candidate before the first round (clocks, caches, lazy
    /// module loading); the last one also sizes the candidate's samples.
    pub warmup_runs: u32,
    /// Rounds always taken (each round takes one sample of every unsettled candidate).
    pub min_rounds: u32,
    /// Rounds never exceeded.
    pub max_rounds: u32,
    /// After `min_rounds`, a candidate is settled once its relative interquartile range
    /// falls to this.
    pub target_spread: f64,
    /// Wall-clock budget per candidate, warm-up included; the whole measurement gets this
    /// times the number of candidates.
    pub max_time_per_tactic: Duration,
    /// Cold-L2 timing (GPU backends): every run reads inputs that are not in L2.
    pub flush_l2: bool,
    /// One sample covers at least this much device time (more runs for short kernels), so
    /// the timer's resolution and the per-sample overhead stay small against it.
    pub target_sample_us: f64,
    /// At most this many back-to-back runs in one sample.
    pub max_runs_per_sample: u32,
    /// After `min_rounds`, a candidate whose fastest sample is slower than this factor times
    /// the best median cannot win and is not sampled further.
    pub prune_factor: f64,
}

impl Default for MeasureConfig {
    fn default() -> Self {
        MeasureConfig {
            warmup_runs: 2,
            min_rounds: 5,
            max_rounds: 100,
            target_spread: 0.02,
            max_time_per_tactic: Duration::from_secs(2),
            flush_l2: false,
            target_sample_us: 200.0,
            max_runs_per_sample: 100,
            prune_factor: 1.5,
        }
    }
}

/// How the times of a result were taken; written into the result beside `stats`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimingMethod {
    pub version: u32,
    /// "interleaved rounds of back-to-back runs".
    pub scheme: &'static str,
    /// What the device was busy with while the host queued a sample ("spin kernel", or
    /// "none: host timer" on the CPU).
    pub queued_behind: String,
    /// "off", or how cold L2 was achieved.
    pub cold_l2: String,
    pub rounds: u32,
    pub warmup_runs: u32,
    pub target_sample_us: f64,
    pub statistic: &'static str,
}

impl TimingMethod {
    pub fn new(
        config: &MeasureConfig,
        rounds: u32,
        queued_behind: String,
        cold_l2: String,
    ) -> Self {
        TimingMethod {
            version: METHOD_VERSION,
            scheme: "interleaved rounds of back-to-back runs",
            queued_behind,
            cold_l2,
            rounds,
            warmup_runs: config.warmup_runs,
            target_sample_us: config.target_sample_us,
            statistic: "median over rounds of the per-run mean of one sample",
        }
    }
}

/// What a backend times: a set of candidates, each run `runs` times back to back per sample.
pub trait Timed {
    /// The candidate's name, as announced to the supervisor before it runs.
    fn name(&self, index: usize) -> String;
    /// Runs candidate `index` `runs` times back to back and returns the mean time of one
    /// run in microseconds.
    fn sample(&mut self, index: usize, runs: u32) -> Result<f64, TuneError>;
}

/// Everything [`measure_interleaved`] found out.
#[derive(Debug)]
pub struct Measured {
    /// Per candidate given, in the order given: its stats, or why it has none.
    pub outcomes: Vec<(usize, Result<Stats, TuneError>)>,
    /// Rounds taken.
    pub rounds: u32,
}

/// Back-to-back runs per sample for a candidate whose single run took `estimate_us`.
pub fn runs_per_sample(estimate_us: f64, config: &MeasureConfig) -> u32 {
    let cap = config.max_runs_per_sample.max(1);
    if !estimate_us.is_finite() || estimate_us <= 0.0 {
        return cap;
    }
    let wanted = (config.target_sample_us / estimate_us).ceil();
    if wanted >= f64::from(cap) {
        cap
    } else {
        (wanted as u32).max(1)
    }
}

/// The order of round `round` over `count` candidates (positions `0..count`): candidate
/// `round % count` goes first and the rest follow in a per-round shuffled order, so over any
/// `count` consecutive rounds each candidate is first exactly once and no candidate always
/// follows the same one.
pub fn round_order(count: usize, round: u32) -> Vec<usize> {
    if count == 0 {
        return Vec::new();
    }
    let first = round as usize % count;
    let mut rest: Vec<usize> = (0..count).filter(|&i| i != first).collect();
    let mut rng = SplitMix64::new(0x5eed_0000 + u64::from(round));
    for i in (1..rest.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        rest.swap(i, j);
    }
    let mut order = Vec::with_capacity(count);
    order.push(first);
    order.extend(rest);
    order
}

/// Times `candidates` (indices into `timed`) under `config`: each is warmed up alone, then
/// all are sampled in interleaved rounds until each is stable, cannot win, or the budget or
/// `deadline` runs out. `announce` is called with a candidate's name before any of its runs.
pub fn measure_interleaved(
    config: &MeasureConfig,
    backend: &str,
    candidates: &[usize],
    timed: &mut dyn Timed,
    announce: &mut dyn FnMut(&str),
    deadline: Option<Instant>,
) -> Measured {
    struct Track {
        index: usize,
        runs: u32,
        samples: Vec<f64>,
        failed: Option<TuneError>,
        settled: bool,
    }
    let started = Instant::now();
    let budget = config.max_time_per_tactic * (candidates.len().max(1) as u32);
    let out_of_time = |rounds: u32| {
        rounds >= 1 && (started.elapsed() > budget || deadline.is_some_and(|d| Instant::now() > d))
    };
    let mut tracks: Vec<Track> = Vec::with_capacity(candidates.len());
    for &index in candidates {
        announce(&timed.name(index));
        let mut warm = || -> Result<f64, TuneError> {
            let mut estimate = f64::NAN;
            for _ in 0..config.warmup_runs.max(1) {
                estimate = checked(timed.sample(index, 1)?)?;
            }
            Ok(estimate)
        };
        let (runs, failed) = match warm() {
            Ok(estimate) => (runs_per_sample(estimate, config), None),
            Err(error) => (1, Some(error)),
        };
        tracks.push(Track {
            index,
            runs,
            samples: Vec::new(),
            failed,
            settled: false,
        });
    }

    let max_rounds = config.max_rounds.max(config.min_rounds).max(1);
    let mut rounds = 0;
    while rounds < max_rounds && !out_of_time(rounds) {
        let active: Vec<usize> = (0..tracks.len())
            .filter(|&t| tracks[t].failed.is_none() && !tracks[t].settled)
            .collect();
        if active.is_empty() {
            break;
        }
        for position in round_order(active.len(), rounds) {
            let track = &mut tracks[active[position]];
            announce(&timed.name(track.index));
            match timed.sample(track.index, track.runs).and_then(checked) {
                Ok(sample) => track.samples.push(sample),
                Err(error) => track.failed = Some(error),
            }
        }
        rounds += 1;
        if rounds >= config.min_rounds {
            let best_median = tracks
                .iter()
                .filter(|t| t.failed.is_none() && !t.samples.is_empty())
                .map(|t| median(&t.samples))
                .fold(f64::INFINITY, f64::min);
            for track in tracks.iter_mut().filter(|t| t.failed.is_none()) {
                let fastest = track.samples.iter().copied().fold(f64::INFINITY, f64::min);
                if relative_iqr(&track.samples) <= config.target_spread
                    || fastest > config.prune_factor * best_median
                {
                    track.settled = true;
                }
            }
        }
    }

    let outcomes = tracks
        .into_iter()
        .map(|track| {
            let result = match track.failed {
                Some(error) => Err(error),
                None => stats_of(&track.samples, track.runs, backend, config.flush_l2),
            };
            (track.index, result)
        })
        .collect();
    Measured { outcomes, rounds }
}

fn checked(sample: f64) -> Result<f64, TuneError> {
    if sample.is_finite() && sample >= 0.0 {
        Ok(sample)
    } else {
        Err(TuneError::BadSample(sample))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Candidates with fixed per-run times, plus a penalty for whichever runs first in a
    /// round (a device coming out of idle). Every test using the penalty keeps all
    /// `round_size` candidates active in every round.
    struct Fake {
        times: Vec<f64>,
        first_penalty: f64,
        round_size: usize,
        batched: usize,
        calls: Vec<(usize, u32)>,
        fail: Option<usize>,
    }

    impl Fake {
        fn new(times: Vec<f64>) -> Self {
            Fake {
                round_size: times.len(),
                times,
                first_penalty: 0.0,
                batched: 0,
                calls: Vec::new(),
                fail: None,
            }
        }
    }

    impl Timed for Fake {
        fn name(&self, index: usize) -> String {
            format!("c{index}")
        }
        fn sample(&mut self, index: usize, runs: u32) -> Result<f64, TuneError> {
            self.calls.push((index, runs));
            if self.fail == Some(index) {
                return Err(TuneError::WrongOutput("boom".into()));
            }
            let mut time = self.times[index];
            if runs > 1 {
                if self.batched % self.round_size == 0 {
                    time += self.first_penalty;
                }
                self.batched += 1;
            }
            Ok(time)
        }
    }

    #[test]
    fn round_order_puts_each_candidate_first_once_per_cycle_and_varies_neighbours() {
        let count = 5;
        let mut firsts = vec![0; count];
        let mut successors = std::collections::BTreeSet::new();
        for round in 0..(count as u32 * 4) {
            let order = round_order(count, round);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                (0..count).collect::<Vec<_>>(),
                "round {round}: {order:?}"
            );
            firsts[order[0]] += 1;
            let after_zero = order.iter().position(|&c| c == 0).unwrap() + 1;
            if after_zero < count {
                successors.insert(order[after_zero]);
            }
        }
        assert_eq!(firsts, vec![4; count]);
        assert!(
            successors.len() >= 3,
            "candidate 0 is always followed by {successors:?}"
        );
        assert_eq!(round_order(0, 3), Vec::<usize>::new());
        assert_eq!(round_order(1, 7), vec![0]);
    }

    #[test]
    fn runs_per_sample_covers_the_target_time_within_the_cap() {
        let config = MeasureConfig::default();
        assert_eq!(runs_per_sample(2.0, &config), 100);
        assert_eq!(runs_per_sample(10.0, &config), 20);
        assert_eq!(runs_per_sample(150.0, &config), 2);
        assert_eq!(runs_per_sample(5000.0, &config), 1);
        assert_eq!(runs_per_sample(0.0, &config), 100);
        assert_eq!(runs_per_sample(f64::NAN, &config), 100);
    }

    #[test]
    fn stable_candidates_stop_at_min_rounds_with_batched_samples() {
        let config = MeasureConfig::default();
        let mut fake = Fake::new(vec![10.0, 40.0]);
        let mut announced = Vec::new();
        let measured = measure_interleaved(
            &config,
            "test",
            &[0, 1],
            &mut fake,
            &mut |name| announced.push(name.to_string()),
            None,
        );
        assert_eq!(measured.rounds, config.min_rounds);
        let stats: Vec<&Stats> = measured
            .outcomes
            .iter()
            .map(|(_, r)| r.as_ref().unwrap())
            .collect();
        assert_eq!(stats[0].median_us, 10.0);
        assert_eq!(stats[0].runs_per_sample, 20);
        assert_eq!(stats[1].runs_per_sample, 5);
        assert_eq!(stats[0].repeats, config.min_rounds);
        // Warm-up runs are single runs, then every sample is the batched size.
        let warmups = fake.calls.iter().filter(|(_, runs)| *runs == 1).count();
        assert_eq!(warmups, 2 * config.warmup_runs as usize);
        // One announcement per warm-up and per sample, each before the candidate ran.
        assert_eq!(announced.len(), 2 + 2 * config.min_rounds as usize);
    }

    #[test]
    fn interleaving_spreads_a_first_in_round_penalty_over_all_candidates() {
        let config = MeasureConfig {
            target_spread: -1.0,
            max_rounds: 20,
            min_rounds: 20,
            prune_factor: f64::INFINITY,
            ..MeasureConfig::default()
        };
        // c0 is truly faster; whoever runs first in a round pays 5 us.
        let mut fake = Fake::new(vec![10.0, 10.5]);
        fake.first_penalty = 5.0;
        let measured = measure_interleaved(&config, "test", &[0, 1], &mut fake, &mut |_| {}, None);
        let medians: Vec<f64> = measured
            .outcomes
            .iter()
            .map(|(_, r)| r.as_ref().unwrap().median_us)
            .collect();
        assert!(medians[0] < medians[1], "{medians:?}");
        // Each candidate went first in half of the rounds.
        let batched: Vec<usize> = fake
            .calls
            .iter()
            .filter(|(_, runs)| *runs > 1)
            .map(|(index, _)| *index)
            .collect();
        let mut firsts = [0; 2];
        for round in batched.chunks(2) {
            firsts[round[0]] += 1;
        }
        assert_eq!(firsts, [10, 10]);
    }

    #[test]
    fn a_failing_candidate_is_reported_and_the_rest_measured() {
        let mut fake = Fake::new(vec![10.0, 5.0, 20.0]);
        fake.fail = Some(1);
        let measured = measure_interleaved(
            &MeasureConfig::default(),
            "test",
            &[0, 1, 2],
            &mut fake,
            &mut |_| {},
            None,
        );
        assert!(matches!(
            measured.outcomes[1],
            (1, Err(TuneError::WrongOutput(_)))
        ));
        assert_eq!(measured.outcomes[0].1.as_ref().unwrap().median_us, 10.0);
        assert!(fake.calls.iter().filter(|(i, _)| *i == 1).count() == 1);
    }

    #[test]
    fn a_hopeless_candidate_is_pruned_after_min_rounds() {
        let config = MeasureConfig {
            target_spread: -1.0, // never stable, so only pruning can stop sampling
            ..MeasureConfig::default()
        };
        let mut fake = Fake::new(vec![10.0, 100.0]);
        let measured = measure_interleaved(&config, "test", &[0, 1], &mut fake, &mut |_| {}, None);
        let slow = measured.outcomes[1].1.as_ref().unwrap();
        let fast = measured.outcomes[0].1.as_ref().unwrap();
        assert_eq!(slow.repeats, config.min_rounds);
        assert_eq!(fast.repeats, config.max_rounds);
    }

    #[test]
    fn bad_samples_fail_the_candidate() {
        struct Negative;
        impl Timed for Negative {
            fn name(&self, _: usize) -> String {
                "neg".into()
            }
            fn sample(&mut self, _: usize, _: u32) -> Result<f64, TuneError> {
                Ok(-1.0)
            }
        }
        let measured = measure_interleaved(
            &MeasureConfig::default(),
            "test",
            &[0],
            &mut Negative,
            &mut |_| {},
            None,
        );
        assert!(
            matches!(measured.outcomes[0].1, Err(TuneError::BadSample(s)) if s == -1.0),
            "{:?}",
            measured.outcomes
        );
    }
}
