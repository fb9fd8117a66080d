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

use super::faults::FaultPlan;
use super::reference::{naive_matmul, random_operands, reference_entry, GemmShape};
use super::report::{bound_error, bound_report, record_timings, REPORT_BUDGET_BYTES};
use super::{excluded, excluded_text, make_result, tactic_deadline, Backend, SplitMix64};
use crate::error::TuneError;
use crate::measure::{measure_interleaved, MeasureConfig, Timed, TimingMethod};

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

/// A tactic's name, as announced and reported: `mc x nc x kc`.
pub fn tactic_name(tile: BlockTile) -> String {
    format!("{}x{}x{}", tile.mc, tile.nc, tile.kc)
}

pub struct CpuBackend {
    devices: Vec<v1::Device>,
    measure: MeasureConfig,
    faults: FaultPlan,
}

/// The problem's operands and scratch, timed by `measure_interleaved`.
struct CpuTimed<'a> {
    shape: GemmShape,
    a: &'a [f32],
    b: &'a [f32],
    c: &'a mut [f32],
    pack: &'a mut PackBuffers,
    faults: &'a FaultPlan,
}

impl CpuTimed<'_> {
    fn run(&mut self, tile: BlockTile) {
        // An injected wrong tactic skips the work: the fastest, and wrong.
        if self.faults.is_wrong(&tactic_name(tile)) {
            self.c.fill(0.5);
            return;
        }
        blocked_matmul(&self.shape, tile, self.a, self.b, self.c, self.pack);
    }
}

impl Timed for CpuTimed<'_> {
    fn name(&self, index: usize) -> String {
        tactic_name(TACTICS[index])
    }
    fn sample(&mut self, index: usize, runs: u32) -> Result<f64, TuneError> {
        let started = std::time::Instant::now();
        for _ in 0..runs.max(1) {
            self.run(TACTICS[index]);
        }
        Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(runs.max(1)))
    }
}

impl CpuBackend {
    pub fn new(measure: MeasureConfig) -> Self {
        CpuBackend {
            devices: vec![cpu_device()],
            measure,
            faults: FaultPlan::default(),
        }
    }

    /// Injects `faults` into named tactics (tests only; see `faults`).
    pub fn with_faults(mut self, faults: FaultPlan) -> Self {
        self.faults = faults;
        self
    }

    fn tune_gemm(
        &self,
        job: &TuneJob,
        problem: &GemmProblem,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError> {
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
        let excluded = excluded(job);
        let mut report: Vec<serde_json::Value> = TACTICS
            .iter()
            .map(|tile| json!({"name": tactic_name(*tile), "tactic": tile}))
            .collect();

        // Every tactic must agree with the definition on an awkward small case (sizes that
        // are not multiples of any block) before its timing means anything; one that does
        // not is reported and left out, and the rest go on.
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
        let mut live = Vec::new();
        for (index, tile) in TACTICS.iter().enumerate() {
            let name = tactic_name(*tile);
            if let Some(reason) = excluded.get(&name) {
                report[index]["error"] = json!(excluded_text(reason));
                continue;
            }
            announce(&name);
            blocked_matmul(&small, *tile, &small_a, &small_b, &mut got, &mut pack);
            let error = worst_error(&got, &want);
            if error > 1e-5 {
                report[index]["error"] = json!(format!(
                    "failed verification: disagrees with the reference on 37x29x41 (error {error:e})"
                ));
                continue;
            }
            live.push(index);
        }

        let (a, b) = random_operands(&shape, 1);
        let mut c = vec![0.0f32; shape.m * shape.n];
        let mut timed = CpuTimed {
            shape,
            a: &a,
            b: &b,
            c: &mut c,
            pack: &mut pack,
            faults: &self.faults,
        };
        let measured = measure_interleaved(
            &self.measure,
            "cpu",
            &live,
            &mut timed,
            announce,
            tactic_deadline(job),
        );
        let ranked = record_timings(&mut report, measured.outcomes, "");

        // The fastest counts only if it is right on the real problem too (sampled entries);
        // a wrong one is reported and the next fastest is checked.
        let mut rng = SplitMix64::new(11);
        let samples = 64.min(shape.m * shape.n);
        let picks: Vec<(usize, usize)> = (0..samples)
            .map(|_| {
                let i = (rng.next_u64() % shape.m as u64) as usize;
                let j = (rng.next_u64() % shape.n as u64) as usize;
                (i, j)
            })
            .collect();
        let mut winner = None;
        for (index, stats) in ranked {
            let tile = TACTICS[index];
            announce(&tactic_name(tile));
            timed.run(tile);
            let wrong = picks.iter().find_map(|&(i, j)| {
                let want = reference_entry(&shape, &a, &b, i, j);
                let got = f64::from(timed.c[i + j * shape.m]);
                let tolerance = 1e-4 * (shape.k as f64).sqrt() * (1.0 + want.abs());
                ((got - want).abs() > tolerance || got.is_nan())
                    .then(|| format!("({i},{j}): {got} vs {want}"))
            });
            match wrong {
                Some(at) => {
                    report[index]["error"] = json!(format!(
                        "failed verification on the problem (it was the fastest left) at {at}"
                    ))
                }
                None => {
                    winner = Some((tile, stats));
                    break;
                }
            }
        }
        let report = bound_report(report, REPORT_BUDGET_BYTES);
        let Some((best_tile, best_stats)) = winner else {
            return Err(TuneError::NothingRan(bound_error(&format!(
                "no tactic was measured and verified: {}",
                json!(report)
            ))));
        };

        let gflops = 2.0 * macs as f64 / (best_stats.median_us * 1e3);
        let timing = TimingMethod::new(
            &self.measure,
            measured.rounds,
            "none: host timer (CPU stand-in)".to_string(),
            "off".to_string(),
        );
        let config = json!({
            "backend": "cpu",
            "note": "CPU stand-in: blocked f32 matmul on the host, not a GPU measurement",
            "op": "gemm",
            "tactic": best_tile,
            "candidate": tactic_name(best_tile),
            "stats": best_stats,
            "timing": timing,
            "gflops": gflops,
            "verified": {"small_case": "37x29x41 vs naive, every tactic", "sampled_entries": samples},
            "candidates": report,
        });
        Ok(make_result("cpu", config, best_stats.median_us))
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn devices(&self) -> &[v1::Device] {
        &self.devices
    }

    fn tune(
        &mut self,
        job: &TuneJob,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError> {
        if !self.devices.iter().any(|d| d.fingerprint == job.device) {
            return Err(TuneError::NoDevice(job.device.clone()));
        }
        match job.op.as_str() {
            "gemm" => self.tune_gemm(job, &parse_gemm(&job.problem)?, announce),
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
            excluded: Vec::new(),
        };
        let err = backend
            .tune(
                &job("gemm", r#"{"m":8,"n":8,"k":8,"dtype":"f16","layout":"nn"}"#),
                &mut |_| {},
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("f32 only"), "{err}");
        let err = backend
            .tune(&job("nvrtc", "{}"), &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(err.contains("cuda"), "{err}");
    }

    #[test]
    fn cpu_backend_tunes_a_small_gemm() {
        let mut backend = CpuBackend::new(MeasureConfig {
            max_rounds: 5,
            ..MeasureConfig::default()
        });
        let job = TuneJob {
            job_id: 1,
            op: "gemm".into(),
            problem: r#"{"m":40,"n":24,"k":56,"dtype":"f32","layout":"tn"}"#.into(),
            device: backend.devices()[0].fingerprint.clone(),
            timeout_ms: 0,
            excluded: Vec::new(),
        };
        let mut announced = Vec::new();
        let result = backend
            .tune(&job, &mut |name| announced.push(name.to_string()))
            .unwrap();
        // Each tactic was announced before its check, warm-up and samples.
        for tile in TACTICS {
            assert!(announced.contains(&tactic_name(tile)), "{announced:?}");
        }
        let config: serde_json::Value = serde_json::from_str(&result.config).unwrap();
        assert_eq!(config["stats"]["median_us"].as_f64(), Some(result.time_us));
        assert_eq!(
            config["candidates"].as_array().map(Vec::len),
            Some(TACTICS.len())
        );
        assert!(result.tuned_by.starts_with("tunecache-tuner/cpu@"));
        assert_eq!(
            config["timing"]["version"].as_u64(),
            Some(u64::from(crate::measure::METHOD_VERSION))
        );
        assert!(config["stats"]["runs_per_sample"].as_u64().unwrap() >= 1);
    }

    #[test]
    fn excluded_and_fastest_but_wrong_tactics_lose_to_the_best_of_the_rest() {
        let wrong = tactic_name(TACTICS[0]);
        let gone = tactic_name(TACTICS[1]);
        let faults = FaultPlan::parse(&[format!("{wrong}=wrong")]).unwrap();
        let mut backend = CpuBackend::new(MeasureConfig {
            max_rounds: 5,
            ..MeasureConfig::default()
        })
        .with_faults(faults);
        let job = TuneJob {
            job_id: 1,
            op: "gemm".into(),
            problem: r#"{"m":48,"n":32,"k":64,"dtype":"f32","layout":"nn"}"#.into(),
            device: backend.devices()[0].fingerprint.clone(),
            timeout_ms: 0,
            excluded: vec![tunecache_proto::tuner::v1::ExcludedCandidate {
                candidate: gone.clone(),
                reason: "killed by signal 6 (SIGABRT)".into(),
            }],
        };
        let mut announced = Vec::new();
        let result = backend
            .tune(&job, &mut |name| announced.push(name.to_string()))
            .unwrap();
        let config: serde_json::Value = serde_json::from_str(&result.config).unwrap();
        let winner = config["candidate"].as_str().unwrap();
        assert_ne!(winner, wrong);
        assert_ne!(winner, gone);
        assert!(!announced.contains(&gone), "an excluded tactic never runs");
        let entry = |name: &str| {
            config["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == name)
                .cloned()
                .unwrap()
        };
        let gone_entry = entry(&gone);
        let why = gone_entry["error"].as_str().unwrap();
        assert!(why.contains("excluded") && why.contains("SIGABRT"), "{why}");
        let wrong_entry = entry(&wrong);
        let why = wrong_entry["error"].as_str().unwrap();
        assert!(why.contains("failed verification on the problem"), "{why}");
    }
}
