//! The statistics of a candidate's samples: the [`Stats`] a result reports (median, range,
//! interquartile spread) and how they are computed.

use serde::Serialize;

use crate::error::TuneError;

/// The measurement of one candidate; serialised into the result's config JSON.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    /// Median over samples of the mean time of one run within a sample.
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Interquartile range divided by the median.
    pub spread: f64,
    /// Samples taken (one per round the candidate took part in).
    pub repeats: u32,
    /// Back-to-back runs inside each sample.
    pub runs_per_sample: u32,
    pub backend: String,
    pub flush_l2: bool,
}

/// Summary statistics of a candidate's samples.
pub fn stats_of(
    samples: &[f64],
    runs_per_sample: u32,
    backend: &str,
    flush_l2: bool,
) -> Result<Stats, TuneError> {
    if samples.is_empty() {
        return Err(TuneError::NothingRan(
            "no sample was taken within the time budget".to_string(),
        ));
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Ok(Stats {
        median_us: percentile(&sorted, 0.5),
        min_us: sorted[0],
        max_us: sorted[sorted.len() - 1],
        spread: relative_iqr(samples),
        repeats: samples.len() as u32,
        runs_per_sample,
        backend: backend.to_string(),
        flush_l2,
    })
}

/// Linear-interpolated percentile of sorted, non-empty samples.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

pub(super) fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 0.5)
}

/// Interquartile range over the median; infinite for no samples (never "stable").
pub(super) fn relative_iqr(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::INFINITY;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = percentile(&sorted, 0.5);
    if median <= 0.0 {
        return 0.0;
    }
    (percentile(&sorted, 0.75) - percentile(&sorted, 0.25)) / median
}
