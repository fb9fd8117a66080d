//! The CPU stand-in backend: op `gemm` for `f32` only, tuned over the block sizes of a packed,
//! blocked matmul.
//!
//! It exists so the tuning pipeline (worker, supervisor, daemon, cache) measures something
//! real on machines without a GPU. Its numbers are CPU numbers: they carry the `cpu|...`
//! fingerprint, so they never answer keys of a GPU.

use serde::Serialize;
use serde_json::json;
use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::v1;

use tunecache_proto::tuner::problem::{parse_gemm, GemmDtype, GemmProblem};

use super::reference::{naive_matmul, random_operands, reference_entry, GemmShape};
use super::{make_result, tactic_deadline, Backend, SplitMix64};
use crate::error::TuneError;
use crate::measure::{measure, MeasureConfig, Stats};

/// Problems above this many multiply-adds would take minutes per tactic on a CPU.
pub const MAX_CPU_GEMM_MACS: u64 = 1 << 32;

/// Block sizes of one blocked-matmul tactic: rows of A (`mc`), columns of B (`nc`) and the
/// shared dimension (`kc`) held in the packed panels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlockTile {
    pub mc: usize,
    pub nc: usize,
    pub kc: usize,
}

/// The tactics tried, from cache-small to cache-large panels.
pub const TACTICS: [BlockTile; 6] = [
    BlockTile {
        mc: 32,
        nc: 32,
        kc: 64,
    },
    BlockTile {
        mc: 64,
        nc: 64,
        kc: 64,
    },
    BlockTile {
        mc: 64,
        nc: 128,
        kc: 128,
    },
    BlockTile {
        mc: 128,
        nc: 128,
        kc: 128,
    },
    BlockTile {
        mc: 128,
        nc: 256,
        kc: 256,
    },
    BlockTile {
        mc: 256,
        nc: 64,
        kc: 512,
    },
];

/// Scratch panels reused across runs so allocation is not timed.
#[derive(Default)]
pub struct PackBuffers {
    a_panel: Vec<f32>,
    b_panel: Vec<f32>,
}

/// `c = op(a) · op(b)` blocked by `tile`: panels of A (`mc×kc`) and B (`kc×nc`) are packed
/// contiguously so the inner loop is a unit-stride axpy whatever the layout.
pub fn blocked_matmul(
    shape: &GemmShape,
    tile: BlockTile,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    pack: &mut PackBuffers,
) {
    let (m, n, k) = (shape.m, shape.n, shape.k);
    c[..m * n].fill(0.0);
    pack.a_panel.resize(tile.mc * tile.kc, 0.0);
    pack.b_panel.resize(tile.kc * tile.nc, 0.0);
    for jc in (0..n).step_by(tile.nc) {
        let nc = tile.nc.min(n - jc);
        for pc in (0..k).step_by(tile.kc) {
            let kc = tile.kc.min(k - pc);
            for jj in 0..nc {
                for pp in 0..kc {
                    pack.b_panel[pp + jj * kc] = b[shape.b_index(pc + pp, jc + jj)];
                }
            }
            for ic in (0..m).step_by(tile.mc) {
                let mc = tile.mc.min(m - ic);
                for pp in 0..kc {
                    for ii in 0..mc {
                        pack.a_panel[ii + pp * mc] = a[shape.a_index(ic + ii, pc + pp)];
                    }
                }
                for jj in 0..nc {
                    let c_col = &mut c[ic + (jc + jj) * m..ic + (jc + jj) * m + mc];
                    for pp in 0..kc {
                        let b_value = pack.b_panel[pp + jj * kc];
                        let a_col = &pack.a_panel[pp * mc..pp * mc + mc];
                        for (c_value, a_value) in c_col.iter_mut().zip(a_col) {
                            *c_value += a_value * b_value;
                        }
                    }
                }
            }
        }
    }
}

/// Largest `|got - want| / (1 + |want|)` over entries compared.
fn worst_error(got: &[f32], want: &[f32]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| f64::from(g - w).abs() / (1.0 + f64::from(*w).abs()))
        .fold(0.0, f64::max)
}

pub struct CpuBackend {
    devices: Vec<v1::Device>,
    measure: MeasureConfig,
}

impl CpuBackend {
    pub fn new(measure: MeasureConfig) -> Self {
        CpuBackend {
            devices: vec![cpu_device()],
            measure,
        }
    }

    fn tune_gemm(&self, job: &TuneJob, problem: &GemmProblem) -> Result<v1::Result, TuneError> {
        if problem.dtype != GemmDtype::F32 {
            return Err(TuneError::Unsupported(format!(
                "the cpu backend tunes gemm for dtype f32 only, not {:?}; tune {} problems on a cuda worker",
                problem.dtype.as_str(),
                problem.dtype.as_str()
            )));
        }
        let macs = problem.m * problem.n * problem.k;
        if macs > MAX_CPU_GEMM_MACS {
            return Err(TuneError::Unsupported(format!(
                "m*n*k = {macs} is too large for the CPU stand-in (at most {MAX_CPU_GEMM_MACS})"
            )));
        }
        let shape = GemmShape::from_problem(problem);
        let mut pack = PackBuffers::default();

        // Every tactic must agree with the definition on an awkward small case (sizes that
        // are not multiples of any block) before its timing means anything.
        let small = GemmShape {
            m: 37,
            n: 29,
            k: 41,
            ..shape
        };
        let (small_a, small_b) = random_operands(&small, 7);
        let mut want = vec![0.0; small.m * small.n];
        naive_matmul(&small, &small_a, &small_b, &mut want);
        let mut got = vec![0.0; small.m * small.n];
        for tile in TACTICS {
            blocked_matmul(&small, tile, &small_a, &small_b, &mut got, &mut pack);
            let error = worst_error(&got, &want);
            if error > 1e-5 {
                return Err(TuneError::WrongOutput(format!(
                    "blocked matmul {tile:?} disagrees with the reference (error {error:e}); refusing to time it"
                )));
            }
        }

        let (a, b) = random_operands(&shape, 1);
        let mut c = vec![0.0f32; shape.m * shape.n];
        let deadline = tactic_deadline(job);
        let mut measured: Vec<(BlockTile, Stats)> = Vec::new();
        let mut skipped = 0;
        for tile in TACTICS {
            if deadline.is_some_and(|d| std::time::Instant::now() > d) && !measured.is_empty() {
                skipped += 1;
                continue;
            }
            let stats = measure(&self.measure, "cpu", || {
                let started = std::time::Instant::now();
                blocked_matmul(&shape, tile, &a, &b, &mut c, &mut pack);
                Ok(started.elapsed().as_secs_f64() * 1e6)
            })?;
            measured.push((tile, stats));
        }
        let (best_tile, best_stats) = measured
            .iter()
            .min_by(|x, y| x.1.median_us.total_cmp(&y.1.median_us))
            .cloned()
            .ok_or_else(|| TuneError::NothingRan("no tactic was measured".to_string()))?;

        // Check the winner on the real problem too, at sampled entries.
        blocked_matmul(&shape, best_tile, &a, &b, &mut c, &mut pack);
        let mut rng = SplitMix64::new(11);
        let samples = 64.min(shape.m * shape.n);
        for _ in 0..samples {
            let i = (rng.next_u64() % shape.m as u64) as usize;
            let j = (rng.next_u64() % shape.n as u64) as usize;
            let want = reference_entry(&shape, &a, &b, i, j);
            let got = f64::from(c[i + j * shape.m]);
            let tolerance = 1e-4 * (shape.k as f64).sqrt() * (1.0 + want.abs());
            if (got - want).abs() > tolerance {
                return Err(TuneError::WrongOutput(format!(
                    "winner {best_tile:?} is wrong at ({i},{j}): {got} vs {want}"
                )));
            }
        }

        let gflops = 2.0 * macs as f64 / (best_stats.median_us * 1e3);
        let config = json!({
            "backend": "cpu",
            "note": "CPU stand-in: blocked f32 matmul on the host, not a GPU measurement",
            "op": "gemm",
            "tactic": best_tile,
            "stats": best_stats,
            "gflops": gflops,
            "verified": {"small_case": "37x29x41 vs naive, all tactics", "sampled_entries": samples},
            "candidates": measured.iter().map(|(tile, stats)| json!({
                "tactic": tile,
                "median_us": stats.median_us,
                "spread": stats.spread,
                "repeats": stats.repeats,
            })).collect::<Vec<_>>(),
            "skipped_for_time": skipped,
        });
        Ok(make_result("cpu", &config, best_stats.median_us))
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn devices(&self) -> &[v1::Device] {
        &self.devices
    }

    fn tune(&mut self, job: &TuneJob) -> Result<v1::Result, TuneError> {
        if !self.devices.iter().any(|d| d.fingerprint == job.device) {
            return Err(TuneError::NoDevice(job.device.clone()));
        }
        match job.op.as_str() {
            "gemm" => self.tune_gemm(job, &parse_gemm(&job.problem)?),
            "nvrtc" => Err(TuneError::Unsupported(
                "op \"nvrtc\" needs a cuda worker; the cpu backend cannot run CUDA C".to_string(),
            )),
            other => Err(TuneError::UnknownOp(other.to_string())),
        }
    }
}

/// The host CPU as a tuning device: `cpu|<model name>|<arch>`.
pub fn cpu_device() -> v1::Device {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            matches!(key.trim(), "model name" | "Model" | "cpu model")
                .then(|| value.trim().to_string())
        })
        .filter(|model| !model.is_empty())
        .unwrap_or_else(|| "unknown cpu".to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_bytes = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024);
    let arch = std::env::consts::ARCH;
    v1::Device {
        backend: "cpu".to_string(),
        name: model.clone(),
        compute_capability: String::new(),
        memory_bytes,
        driver_version: String::new(),
        cuda_version: String::new(),
        fingerprint: format!("cpu|{model}|{arch}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunecache_proto::tuner::problem::GemmLayout;

    #[test]
    fn blocked_matmul_matches_naive_for_every_layout_and_tactic() {
        for layout in [
            GemmLayout::Nn,
            GemmLayout::Nt,
            GemmLayout::Tn,
            GemmLayout::Tt,
        ] {
            let shape = GemmShape {
                m: 70,
                n: 45,
                k: 133,
                transpose_a: layout.transpose_a(),
                transpose_b: layout.transpose_b(),
            };
            let (a, b) = random_operands(&shape, 3);
            let mut want = vec![0.0; shape.m * shape.n];
            naive_matmul(&shape, &a, &b, &mut want);
            let mut pack = PackBuffers::default();
            for tile in TACTICS {
                let mut got = vec![f32::NAN; shape.m * shape.n];
                blocked_matmul(&shape, tile, &a, &b, &mut got, &mut pack);
                let error = worst_error(&got, &want);
                assert!(error < 1e-5, "{layout:?} {tile:?}: error {error}");
            }
        }
    }

    #[test]
    fn cpu_backend_rejects_f16_and_nvrtc_with_reasons() {
        let mut backend = CpuBackend::new(MeasureConfig::default());
        let device = backend.devices()[0].fingerprint.clone();
        assert!(device.starts_with("cpu|"));
        let job = |op: &str, problem: &str| TuneJob {
            job_id: 1,
            op: op.into(),
            problem: problem.into(),
            device: device.clone(),
            timeout_ms: 0,
        };
        let err = backend
            .tune(&job(
                "gemm",
                r#"{"m":8,"n":8,"k":8,"dtype":"f16","layout":"nn"}"#,
            ))
            .unwrap_err()
            .to_string();
        assert!(err.contains("f32 only"), "{err}");
        let err = backend.tune(&job("nvrtc", "{}")).unwrap_err().to_string();
        assert!(err.contains("cuda"), "{err}");
    }

    #[test]
    fn cpu_backend_tunes_a_small_gemm() {
        let mut backend = CpuBackend::new(MeasureConfig {
            max_repeats: 5,
            ..MeasureConfig::default()
        });
        let job = TuneJob {
            job_id: 1,
            op: "gemm".into(),
            problem: r#"{"m":40,"n":24,"k":56,"dtype":"f32","layout":"tn"}"#.into(),
            device: backend.devices()[0].fingerprint.clone(),
            timeout_ms: 0,
        };
        let result = backend.tune(&job).unwrap();
        let config: serde_json::Value = serde_json::from_str(&result.config).unwrap();
        assert_eq!(config["stats"]["median_us"].as_f64(), Some(result.time_us));
        assert_eq!(
            config["candidates"].as_array().map(Vec::len),
            Some(TACTICS.len())
        );
        assert!(result.tuned_by.starts_with("tunecache-tuner/cpu@"));
    }
}
