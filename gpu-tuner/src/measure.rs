//! Timing policy shared by every backend: warm up, repeat until the spread is small or a cap
//! is reached, report the median.
//!
//! The backend supplies a closure that runs the tactic once and returns its duration in
//! microseconds (CUDA events on the GPU, `Instant` on the CPU); everything statistical is here
//! so that CPU and GPU numbers mean the same thing.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::TuneError;

/// How hard to try for a stable number.
#[derive(Debug, Clone)]
pub struct MeasureConfig {
    /// Untimed runs first (clocks, caches, lazy module loading).
    pub warmup_runs: u32,
    /// Timed runs always taken.
    pub min_repeats: u32,
    /// Timed runs never exceeded.
    pub max_repeats: u32,
    /// Stop once the relative interquartile range falls to this.
    pub target_spread: f64,
    /// Wall-clock budget of one tactic, warm-up included.
    pub max_time_per_tactic: Duration,
    /// Evict the L2 cache before each timed run (GPU backends), so timings are cold-cache.
    pub flush_l2: bool,
}

impl Default for MeasureConfig {
    fn default() -> Self {
        MeasureConfig {
            warmup_runs: 2,
            min_repeats: 5,
            max_repeats: 100,
            target_spread: 0.02,
            max_time_per_tactic: Duration::from_secs(2),
            flush_l2: false,
        }
    }
}

/// The measurement of one tactic; serialised into the result's config JSON.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Interquartile range divided by the median.
    pub spread: f64,
    pub repeats: u32,
    pub backend: String,
    pub flush_l2: bool,
}

/// Runs `run_once` under `config`. `run_once` returns one duration in microseconds.
pub fn measure<F>(
    config: &MeasureConfig,
    backend: &str,
    mut run_once: F,
) -> Result<Stats, TuneError>
where
    F: FnMut() -> Result<f64, TuneError>,
{
    let started = Instant::now();
    for _ in 0..config.warmup_runs {
        run_once()?;
        if started.elapsed() > config.max_time_per_tactic {
            break;
        }
    }
    let min_repeats = config.min_repeats.max(1);
    let mut samples: Vec<f64> = Vec::new();
    loop {
        let sample = run_once()?;
        if !sample.is_finite() || sample < 0.0 {
            return Err(TuneError::BadSample(sample));
        }
        samples.push(sample);
        let count = samples.len() as u32;
        if count >= config.max_repeats.max(min_repeats) {
            break;
        }
        if count >= min_repeats
            && (relative_iqr(&samples) <= config.target_spread
                || started.elapsed() > config.max_time_per_tactic)
        {
            break;
        }
    }
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Stats {
        median_us: percentile(&sorted, 0.5),
        min_us: sorted[0],
        max_us: sorted[sorted.len() - 1],
        spread: relative_iqr(&samples),
        repeats: samples.len() as u32,
        backend: backend.to_string(),
        flush_l2: config.flush_l2,
    })
}

/// Linear-interpolated percentile of sorted, non-empty samples.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn relative_iqr(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = percentile(&sorted, 0.5);
    if median <= 0.0 {
        return 0.0;
    }
    (percentile(&sorted, 0.75) - percentile(&sorted, 0.25)) / median
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_samples_stop_at_min_repeats_and_report_median() {
        let config = MeasureConfig::default();
        let mut calls = 0;
        let stats = measure(&config, "test", || {
            calls += 1;
            Ok(10.0)
        })
        .unwrap();
        assert_eq!(stats.repeats, config.min_repeats);
        assert_eq!(calls, config.min_repeats + config.warmup_runs);
        assert_eq!(stats.median_us, 10.0);
        assert_eq!(stats.spread, 0.0);
    }

    #[test]
    fn noisy_samples_run_to_the_cap() {
        let config = MeasureConfig {
            max_repeats: 20,
            ..MeasureConfig::default()
        };
        let mut i = 0u32;
        let stats = measure(&config, "test", || {
            i += 1;
            Ok(if i % 2 == 0 { 10.0 } else { 20.0 })
        })
        .unwrap();
        assert_eq!(stats.repeats, 20);
        assert_eq!((stats.min_us, stats.max_us), (10.0, 20.0));
        assert!(stats.spread > 0.5);
    }

    #[test]
    fn errors_propagate() {
        let result = measure(&MeasureConfig::default(), "test", || {
            Err(TuneError::WrongOutput("boom".to_string()))
        });
        assert!(
            matches!(&result, Err(TuneError::WrongOutput(why)) if why == "boom"),
            "{result:?}"
        );
        let result = measure(&MeasureConfig::default(), "test", || Ok(-1.0));
        assert!(
            matches!(result, Err(TuneError::BadSample(sample)) if sample == -1.0),
            "{result:?}"
        );
    }
}
