//! cuBLASLt gemm measurement: one `gemm` job on the GPU. The problem's operands are
//! uploaded (and copied for cold-L2 rotation), the heuristic's algorithms are verified
//! against the f64 host reference and then timed, and the fastest correct one is the result.
//!
//! [`cublaslt`] makes the library calls; [`verify`] and [`outcome`] hold the rules (what is
//! checked and how closely, which algorithms run, what the measurements make), tested
//! without a GPU. [`time_algo_back_to_back`] is the GPU check's independent timing.

mod cublaslt;
mod outcome;
mod verify;

use std::sync::Arc;

use cudarc::cublaslt::sys as lt_sys;
use cudarc::driver::sys as driver_sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use serde_json::json;
use tunecache_proto::tuner::problem::{parse_gemm, GemmProblem};
use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::v1;

use self::cublaslt::{cublaslt_version, describe_algo, enqueue_gemm, GemmSet, LtDescriptors};
pub use self::cublaslt::{parse_algo_hex, GEMM_WORKSPACE_BYTES, HEURISTIC_ALGOS};
use self::outcome::{skip_reason, GemmWinner};
use self::verify::{
    check_entry, checked_bytes, decode_gemm_value, encode_gemm_values, GEMM_CHECK_COLUMNS,
    GEMM_CHECK_SAMPLES,
};
pub use self::verify::{check_plan, gemm_tolerance};
use super::library::{cublaslt_library_present, driver_library_present};
use super::sticky::driver_error;
use super::timer::{plan_rotation, SampleTimer};
use super::CudaDevice;
use crate::backend::reference::{random_operands, reference_entry_with_magnitude, GemmShape};
use crate::backend::report::{bound_error, bound_report, record_timings, REPORT_BUDGET_BYTES};
use crate::backend::{excluded, make_result, tactic_deadline};
use crate::error::TuneError;
use crate::measure::{measure_interleaved, MeasureConfig, Timed, TimingMethod};

/// One gemm problem set up on a device: operands, descriptors, host copies for checking.
pub(super) struct GemmRun {
    stream: Arc<CudaStream>,
    problem: GemmProblem,
    shape: GemmShape,
    host_a: Vec<f32>,
    host_b: Vec<f32>,
    element: usize,
    sets: Vec<GemmSet>,
    next_set: usize,
    workspace: CudaSlice<u8>,
    descriptors: LtDescriptors,
    candidates: Vec<lt_sys::cublasLtMatmulHeuristicResult_t>,
    timer: SampleTimer,
    cold_l2: String,
    measure: MeasureConfig,
}

impl GemmRun {
    pub(super) fn prepare(
        device: &CudaDevice,
        problem: &GemmProblem,
        measure: &MeasureConfig,
    ) -> Result<Self, TuneError> {
        let stream = device.context.default_stream();
        let shape = GemmShape::from_problem(problem);
        let (mut host_a, mut host_b) = random_operands(&shape, 1);
        let a_bytes = encode_gemm_values(&mut host_a, problem.dtype);
        let b_bytes = encode_gemm_values(&mut host_b, problem.dtype);
        let element = a_bytes.len() / host_a.len().max(1);
        let d_bytes = shape.m * shape.n * element;
        let first = GemmSet {
            a: stream
                .clone_htod(&a_bytes)
                .map_err(|e| driver_error("uploading A", e))?,
            b: stream
                .clone_htod(&b_bytes)
                .map_err(|e| driver_error("uploading B", e))?,
            d: stream
                .alloc_zeros::<u8>(d_bytes)
                .map_err(|e| driver_error("allocating D", e))?,
        };
        let set_bytes = (a_bytes.len() + b_bytes.len() + d_bytes) as u64;
        let (count, cold_l2) = plan_rotation(&device.context, set_bytes, measure.flush_l2)?;
        let mut sets = vec![first];
        for _ in 1..count {
            let copy = GemmSet {
                a: stream
                    .clone_dtod(&sets[0].a)
                    .map_err(|e| driver_error("copying A for L2 rotation", e))?,
                b: stream
                    .clone_dtod(&sets[0].b)
                    .map_err(|e| driver_error("copying B for L2 rotation", e))?,
                d: stream
                    .alloc_zeros::<u8>(d_bytes)
                    .map_err(|e| driver_error("allocating D for L2 rotation", e))?,
            };
            sets.push(copy);
        }
        let workspace = stream
            .alloc_zeros::<u8>(GEMM_WORKSPACE_BYTES)
            .map_err(|e| driver_error("allocating the workspace", e))?;
        let descriptors = LtDescriptors::new(problem)?;
        let candidates = descriptors.heuristic()?;
        Ok(GemmRun {
            timer: SampleTimer::new(&device.context)?,
            stream,
            problem: problem.clone(),
            shape,
            host_a,
            host_b,
            element,
            sets,
            next_set: 0,
            workspace,
            descriptors,
            candidates,
            cold_l2,
            measure: measure.clone(),
        })
    }

    /// Runs algorithm `rank` once and compares sampled outputs with an f64 host reference,
    /// downloading only the checked rows of the checked columns.
    fn verify(&mut self, rank: usize) -> Result<(), TuneError> {
        let heuristic = self.candidates[rank];
        let set = &mut self.sets[0];
        self.stream
            .memset_zeros(&mut set.d)
            .map_err(|e| driver_error("clearing D", e))?;
        enqueue_gemm(
            &self.stream,
            &self.descriptors,
            set,
            &mut self.workspace,
            &heuristic,
        )?;
        let shape = self.shape;
        let element = self.element;
        for (j, rows) in check_plan(shape.m, shape.n, GEMM_CHECK_SAMPLES, GEMM_CHECK_COLUMNS, 5) {
            let (Some(&first), Some(&last)) = (rows.first(), rows.last()) else {
                continue;
            };
            let view = self.sets[0]
                .d
                .slice(checked_bytes(shape.m, element, j, first, last));
            let bytes = self
                .stream
                .clone_dtoh(&view)
                .map_err(|e| driver_error("downloading checked entries of D", e))?;
            self.stream
                .synchronize()
                .map_err(|e| driver_error("running the gemm", e))?;
            for i in rows {
                let (want, magnitude) =
                    reference_entry_with_magnitude(&shape, &self.host_a, &self.host_b, i, j);
                let got = decode_gemm_value(&bytes, i - first, self.problem.dtype);
                let tolerance = gemm_tolerance(self.problem.dtype, shape.k, want, magnitude);
                check_entry((i, j), got, want, tolerance)?;
            }
        }
        Ok(())
    }

    pub(super) fn tune(
        mut self,
        job: &TuneJob,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError> {
        let excluded = excluded(job);
        let mut report: Vec<serde_json::Value> = Vec::new();
        let mut live = Vec::new();
        for rank in 0..self.candidates.len() {
            let heuristic = self.candidates[rank];
            let name = self.name(rank);
            let mut entry = describe_algo(&heuristic);
            entry["name"] = json!(name);
            entry["heuristic_rank"] = json!(rank);
            let excluded_because = excluded.get(&name).map(String::as_str);
            if let Some(reason) = skip_reason(excluded_because, heuristic.state) {
                entry["error"] = json!(reason);
            } else {
                // Correctness before timing: a fast wrong answer must never win.
                announce(&name);
                match self.verify(rank) {
                    Ok(()) => live.push(rank),
                    Err(error) => entry["error"] = json!(format!("failed verification: {error}")),
                }
            }
            report.push(entry);
        }
        let measure = self.measure.clone();
        let measured = measure_interleaved(
            &measure,
            "cuda",
            &live,
            &mut self,
            announce,
            tactic_deadline(job),
        );
        let ranked = record_timings(&mut report, measured.outcomes, "timing: ");
        let report = bound_report(report, REPORT_BUDGET_BYTES);
        let Some(winner) = GemmWinner::of(ranked) else {
            return Err(TuneError::NothingRan(bound_error(&format!(
                "no cuBLASLt algorithm ran correctly: {}",
                json!(report)
            ))));
        };
        let mut algo = describe_algo(&self.candidates[winner.rank]);
        algo["heuristic_rank"] = json!(winner.rank);
        let timing = TimingMethod::new(
            &measure,
            measured.rounds,
            self.timer.queued_behind(),
            self.cold_l2.clone(),
        );
        let config = json!({
            "backend": "cuda",
            "op": "gemm",
            "library": "cublasLt",
            "cublaslt_version": cublaslt_version(),
            "compute_type": "CUBLAS_COMPUTE_32F",
            "algo": algo,
            "stats": winner.stats,
            "timing": timing,
            "tflops": winner.tflops(&self.shape),
            "heuristic0_median_us": winner.heuristic0_median_us,
            "speedup_vs_heuristic0": winner.speedup_vs_heuristic0(),
            "verified": {
                "sampled_entries": GEMM_CHECK_SAMPLES,
                "columns": GEMM_CHECK_COLUMNS,
                "reference": "f64 host dot products",
                "tolerance": "u_out*|want| + (u_out + 4*sqrt(k)*u_f32) * sum|a||b|",
            },
            "candidates": report,
        });
        Ok(make_result("cuda", config, winner.stats.median_us))
    }
}

impl Timed for GemmRun {
    fn name(&self, rank: usize) -> String {
        format!("heuristic#{rank}")
    }

    fn sample(&mut self, rank: usize, runs: u32) -> Result<f64, TuneError> {
        let heuristic = self.candidates[rank];
        let GemmRun {
            stream,
            descriptors,
            sets,
            next_set,
            workspace,
            timer,
            ..
        } = self;
        let stream: &Arc<CudaStream> = stream;
        let count = sets.len();
        timer.sample(stream, runs, &mut || {
            let set = *next_set;
            *next_set = (set + 1) % count;
            enqueue_gemm(stream, descriptors, &mut sets[set], workspace, &heuristic)
        })
    }
}

/// For the GPU check (`tests/gpu.rs`): the mean time of one run of `algo_hex` on `problem`
/// (canonical gemm JSON) on GPU `ordinal`, timed the plain way: `runs` back-to-back launches
/// between one event pair after a warm-up, no delay kernel, warm L2. An independent method
/// to hold the tuner's median against.
pub fn time_algo_back_to_back(
    ordinal: usize,
    problem: &str,
    algo_hex: &str,
    runs: u32,
) -> Result<f64, TuneError> {
    if !driver_library_present() || !cublaslt_library_present() {
        return Err(TuneError::Unavailable(
            "libcuda or libcublasLt is missing".into(),
        ));
    }
    let problem = parse_gemm(problem)?;
    let data = parse_algo_hex(algo_hex)
        .ok_or_else(|| TuneError::Unsupported(format!("not an algo_hex: {algo_hex:?}")))?;
    let context = CudaContext::new(ordinal).map_err(|e| TuneError::driver("context", e))?;
    let device = CudaDevice { ordinal, context };
    let mut run = GemmRun::prepare(&device, &problem, &MeasureConfig::default())?;
    let mut heuristic = run.candidates[0];
    heuristic.algo.data = data;
    heuristic.workspaceSize = GEMM_WORKSPACE_BYTES;
    let GemmRun {
        stream,
        descriptors,
        sets,
        workspace,
        ..
    } = &mut run;
    for _ in 0..20 {
        enqueue_gemm(stream, descriptors, &mut sets[0], workspace, &heuristic)?;
    }
    let event = || {
        device
            .context
            .new_event(Some(driver_sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| driver_error("creating a CUDA event", e))
    };
    let (start, end) = (event()?, event()?);
    stream
        .synchronize()
        .map_err(|e| driver_error("warming up", e))?;
    start
        .record(stream)
        .map_err(|e| driver_error("recording the start event", e))?;
    for _ in 0..runs.max(1) {
        enqueue_gemm(stream, descriptors, &mut sets[0], workspace, &heuristic)?;
    }
    end.record(stream)
        .map_err(|e| driver_error("recording the end event", e))?;
    end.synchronize()
        .map_err(|e| driver_error("waiting for the runs", e))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(|e| driver_error("reading the event timer", e))?;
    Ok(f64::from(ms) * 1e3 / f64::from(runs.max(1)))
}
