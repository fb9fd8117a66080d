//! The decisions of a gemm job around its GPU work, as pure rules: which of the heuristic's
//! algorithms are verified at all, and what the measurements of those that ran make (the
//! winner, its speed-up over the heuristic's own first choice, its TFLOP/s).

use cudarc::cublaslt::sys as lt_sys;

use crate::backend::excluded_text;
use crate::backend::reference::GemmShape;
use crate::measure::Stats;

/// Why an algorithm of the heuristic is not run at all, or `None` when it is verified (and
/// then timed): one the job excludes (it killed an earlier worker) is never run, whatever
/// the heuristic said of it, and one the heuristic could not set up is not run either.
pub(super) fn skip_reason(
    excluded_because: Option<&str>,
    heuristic_state: lt_sys::cublasStatus_t,
) -> Option<String> {
    if let Some(reason) = excluded_because {
        Some(excluded_text(reason))
    } else if heuristic_state != lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Some(format!("heuristic state {heuristic_state:?}"))
    } else {
        None
    }
}

/// The fastest algorithm that ran correctly, from the measured ones fastest first (as
/// `record_timings` returns them; ranks are the heuristic's).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GemmWinner {
    /// Its rank in the heuristic's list.
    pub(super) rank: usize,
    pub(super) stats: Stats,
    /// The median of the heuristic's first choice, when it was measured: what cuBLASLt
    /// alone would have run.
    pub(super) heuristic0_median_us: Option<f64>,
}

impl GemmWinner {
    /// `None` when nothing was measured.
    pub(super) fn of(ranked: Vec<(usize, Stats)>) -> Option<Self> {
        let heuristic0_median_us = ranked
            .iter()
            .find(|(rank, _)| *rank == 0)
            .map(|(_, stats)| stats.median_us);
        let (rank, stats) = ranked.into_iter().next()?;
        Some(GemmWinner {
            rank,
            stats,
            heuristic0_median_us,
        })
    }

    /// How many times faster than the heuristic's first choice.
    pub(super) fn speedup_vs_heuristic0(&self) -> Option<f64> {
        self.heuristic0_median_us
            .map(|h0| h0 / self.stats.median_us)
    }

    /// 2mnk floating-point operations per median run.
    pub(super) fn tflops(&self, shape: &GemmShape) -> f64 {
        let flops = 2.0 * (shape.m * shape.n * shape.k) as f64;
        flops / (self.stats.median_us * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lt_sys::cublasStatus_t;

    fn stats(median_us: f64) -> Stats {
        Stats {
            median_us,
            min_us: median_us,
            max_us: median_us,
            spread: 0.0,
            repeats: 5,
            runs_per_sample: 3,
            backend: "cuda".into(),
            flush_l2: false,
        }
    }

    #[test]
    fn an_excluded_algorithm_is_skipped_before_its_heuristic_state_is_read() {
        assert_eq!(
            skip_reason(None, cublasStatus_t::CUBLAS_STATUS_SUCCESS),
            None
        );
        let bad = cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED;
        assert_eq!(
            skip_reason(None, bad).as_deref(),
            Some("heuristic state CUBLAS_STATUS_NOT_SUPPORTED")
        );
        // Excluded wins over everything: it killed a worker, its state does not matter.
        for state in [cublasStatus_t::CUBLAS_STATUS_SUCCESS, bad] {
            assert_eq!(
                skip_reason(Some("signal 11"), state),
                Some(excluded_text("signal 11"))
            );
        }
    }

    #[test]
    fn the_winner_is_the_fastest_and_is_compared_with_the_heuristics_first_choice() {
        assert_eq!(GemmWinner::of(Vec::new()), None);
        // Fastest first, as record_timings returns them: rank 3 won, rank 0 ran at 150 us.
        let winner = GemmWinner::of(vec![
            (3, stats(100.0)),
            (0, stats(150.0)),
            (1, stats(200.0)),
        ])
        .unwrap();
        assert_eq!(winner.rank, 3);
        assert_eq!(winner.stats.median_us, 100.0);
        assert_eq!(winner.heuristic0_median_us, Some(150.0));
        assert_eq!(winner.speedup_vs_heuristic0(), Some(1.5));
        // Rank 0 failed or was not measured: no comparison.
        let winner = GemmWinner::of(vec![(2, stats(100.0)), (1, stats(120.0))]).unwrap();
        assert_eq!(winner.heuristic0_median_us, None);
        assert_eq!(winner.speedup_vs_heuristic0(), None);
        // The heuristic's first choice won: a speed-up of 1.
        let winner = GemmWinner::of(vec![(0, stats(80.0))]).unwrap();
        assert_eq!(winner.speedup_vs_heuristic0(), Some(1.0));
    }

    #[test]
    fn tflops_counts_two_operations_per_multiply_add() {
        let shape = GemmShape {
            m: 4096,
            n: 4096,
            k: 4096,
            transpose_a: false,
            transpose_b: false,
        };
        // 2 * 4096^3 = 137.4 GFLOP in 1 ms is 137.4 TFLOP/s.
        let winner = GemmWinner::of(vec![(0, stats(1000.0))]).unwrap();
        let expected = 2.0 * 4096f64.powi(3) / 1e12 / 1e-3;
        assert!((expected - 137.4).abs() < 0.1, "{expected}");
        assert!(
            (winner.tflops(&shape) - expected).abs() < 1e-9,
            "{}",
            winner.tflops(&shape)
        );
    }
}
