//! NVRTC kernel candidates: one `nvrtc` job on the GPU. Every candidate is compiled at run
//! time, checked against the problem's `check` on fresh buffers, then timed; the fastest
//! that passed is the result.
//!
//! [`compile`] builds a candidate (targets, options, launch shape, shared memory),
//! [`buffers`] holds the problem's data and arguments and launches, [`check`] decides
//! whether an output passes. This module runs the job in that order.

mod buffers;
mod check;
mod compile;

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::sys as driver_sys;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig};
use serde_json::json;
use tunecache_proto::tuner::problem::{CheckSpec, NvrtcProblem};
use tunecache_proto::tuner::v1::TuneJob;
use tunecache_proto::v1;

use self::buffers::{decode_buffer, initial_contents, kernel_args, launch, ArgValue};
use self::check::{check_output, reference_candidate};
use self::compile::{define_options, first_accepted_target, launch_config, nvrtc_compile};
pub use self::compile::{nvrtc_targets, shared_memory_opt_in};
use super::sticky::driver_error;
use super::timer::{plan_rotation, SampleTimer};
use super::CudaDevice;
use crate::backend::report::{bound_error, bound_report, record_timings, REPORT_BUDGET_BYTES};
use crate::backend::{excluded, excluded_text, make_result, tactic_deadline};
use crate::error::TuneError;
use crate::measure::{measure_interleaved, MeasureConfig, Timed, TimingMethod};

struct CompiledCandidate {
    function: CudaFunction,
    config: LaunchConfig,
    /// The NVRTC target the module was built for.
    target: String,
}

/// One nvrtc problem set up on a device.
pub(super) struct NvrtcRun<'a> {
    device: &'a CudaDevice,
    stream: Arc<CudaStream>,
    problem: NvrtcProblem,
    initial: Vec<Vec<u8>>,
    /// Copies of every buffer; cold-L2 timing rotates through them, checks use the first.
    sets: Vec<Vec<CudaSlice<u8>>>,
    next_set: usize,
    args: Vec<ArgValue>,
    compiled: Vec<Option<CompiledCandidate>>,
    timer: SampleTimer,
    cold_l2: String,
    measure: MeasureConfig,
}

impl<'a> NvrtcRun<'a> {
    pub(super) fn prepare(
        device: &'a CudaDevice,
        problem: &NvrtcProblem,
        measure: &MeasureConfig,
    ) -> Result<Self, TuneError> {
        let stream = device.context.default_stream();
        let initial = initial_contents(problem);
        let first = initial
            .iter()
            .map(|bytes| {
                stream
                    .clone_htod(bytes)
                    .map_err(|e| driver_error("uploading a buffer", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let set_bytes: u64 = initial.iter().map(|b| b.len() as u64).sum();
        let (count, cold_l2) = plan_rotation(&device.context, set_bytes, measure.flush_l2)?;
        let mut sets = vec![first];
        for _ in 1..count {
            let copy = sets[0]
                .iter()
                .map(|buffer| {
                    stream
                        .clone_dtod(buffer)
                        .map_err(|e| driver_error("copying a buffer for L2 rotation", e))
                })
                .collect::<Result<Vec<_>, _>>()?;
            sets.push(copy);
        }
        Ok(NvrtcRun {
            device,
            timer: SampleTimer::new(&device.context)?,
            stream,
            problem: problem.clone(),
            initial,
            sets,
            next_set: 0,
            args: kernel_args(problem),
            compiled: Vec::new(),
            cold_l2,
            measure: measure.clone(),
        })
    }

    fn reset_buffers(&mut self) -> Result<(), TuneError> {
        for (buffer, bytes) in self.sets[0].iter_mut().zip(&self.initial) {
            self.stream
                .memcpy_htod(bytes, buffer)
                .map_err(|e| driver_error("re-initialising a buffer", e))?;
        }
        Ok(())
    }

    /// Compiles and loads candidate `index`; `Err` is the text for its report entry.
    fn compile(&self, index: usize) -> Result<CompiledCandidate, TuneError> {
        let candidate = &self.problem.candidates[index];
        let context = &self.device.context;
        let (major, minor) = context
            .compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))?;
        let defines = define_options(&candidate.defines);
        let file = format!("{}.cu", candidate.name);
        let (module, target) =
            first_accepted_target(nvrtc_targets(major, minor), |target, cubin| {
                nvrtc_compile(&self.problem.source, &file, target, cubin, &defines)
            })?;
        let module = context
            .load_module(module)
            .map_err(|e| driver_error(&format!("loading the module built for {target}"), e))?;
        let function = module
            .load_function(&self.problem.kernel)
            .map_err(|e| driver_error(&format!("kernel {:?} not found", self.problem.kernel), e))?;
        let static_bytes = function
            .shared_size_bytes()
            .map_err(|e| driver_error("reading the kernel's static shared memory", e))?
            .max(0) as u64;
        let optin = context
            .attribute(
                driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| driver_error("reading the shared memory opt-in limit", e))?
            .max(0) as u64;
        match shared_memory_opt_in(static_bytes, u64::from(candidate.shared_mem_bytes), optin) {
            Err(why) => return Err(TuneError::Unsupported(why)),
            Ok(None) => {}
            Ok(Some(dynamic)) => function
                .set_attribute(
                    driver_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic as i32,
                )
                .map_err(|e| driver_error("raising the dynamic shared memory limit", e))?,
        }
        Ok(CompiledCandidate {
            function,
            config: launch_config(candidate),
            target,
        })
    }

    /// Runs a candidate once on fresh buffers and returns the contents of buffer `check`.
    fn output_of(&mut self, index: usize, check: usize) -> Result<Vec<f64>, TuneError> {
        self.reset_buffers()?;
        let compiled = self.compiled[index]
            .as_ref()
            .ok_or_else(|| TuneError::NothingRan("the candidate did not compile".to_string()))?;
        launch(
            &self.stream,
            &compiled.function,
            compiled.config,
            &self.args,
            &self.sets[0],
        )?;
        self.stream
            .synchronize()
            .map_err(|e| driver_error("running the kernel", e))?;
        let bytes = self
            .stream
            .clone_dtoh(&self.sets[0][check])
            .map_err(|e| driver_error("downloading the checked buffer", e))?;
        Ok(decode_buffer(&bytes, self.problem.buffers[check].dtype))
    }

    /// Whether candidate `index`'s output agrees with the check: `Err` says how it does not.
    fn check_candidate(
        &mut self,
        index: usize,
        check: &CheckSpec,
        buffer: usize,
        want: Option<&[f64]>,
    ) -> Result<(), TuneError> {
        let got = self.output_of(index, buffer)?;
        check_output(&got, check, want)
    }

    pub(super) fn tune(
        mut self,
        job: &TuneJob,
        announce: &mut dyn FnMut(&str),
    ) -> Result<v1::Result, TuneError> {
        let excluded = excluded(job);
        let count = self.problem.candidates.len();
        let names: Vec<String> = self
            .problem
            .candidates
            .iter()
            .map(|c| c.name.clone())
            .collect();
        let mut report: Vec<serde_json::Value> =
            names.iter().map(|name| json!({"name": name})).collect();
        let mut errors: BTreeMap<usize, String> = BTreeMap::new();
        self.compiled = (0..count).map(|_| None).collect();
        for index in 0..count {
            if let Some(reason) = excluded.get(&names[index]) {
                errors.insert(index, excluded_text(reason));
                continue;
            }
            // NVRTC runs in this process too: a crash inside it is this candidate's.
            announce(&names[index]);
            match self.compile(index) {
                Ok(compiled) => {
                    report[index]["target"] = json!(compiled.target);
                    self.compiled[index] = Some(compiled);
                }
                Err(error) => {
                    errors.insert(index, error.to_string());
                }
            }
        }

        // Correctness before timing: every candidate is checked before it is timed, so a
        // fast wrong one never wins and a faulting one is found alone.
        let mut live: Vec<usize> = (0..count).filter(|&i| self.compiled[i].is_some()).collect();
        let verification = match self.problem.check.clone() {
            None => json!("none requested"),
            Some(check) => {
                let buffer = self
                    .problem
                    .buffers
                    .iter()
                    .position(|b| b.name == check.buffer)
                    .ok_or_else(|| TuneError::WrongOutput("check buffer vanished".to_string()))?;
                let want = match &check.reference {
                    None => None,
                    Some(reference) => {
                        let index = reference_candidate(
                            &names,
                            reference,
                            |i| self.compiled[i].is_some(),
                            &errors,
                        )?;
                        announce(reference);
                        Some(self.output_of(index, buffer).map_err(|error| {
                            TuneError::NothingRan(bound_error(&format!(
                                "reference candidate {reference:?} failed to run: {error}"
                            )))
                        })?)
                    }
                };
                let mut passed = Vec::new();
                for index in live {
                    announce(&names[index]);
                    match self.check_candidate(index, &check, buffer, want.as_deref()) {
                        Ok(()) => passed.push(index),
                        Err(error) => {
                            errors.insert(index, format!("failed verification: {error}"));
                        }
                    }
                }
                live = passed;
                json!({"buffer": check.buffer, "reference": check.reference, "expected_sum": check.expected_sum, "every_candidate": true})
            }
        };

        let measure = self.measure.clone();
        let measured = measure_interleaved(
            &measure,
            "cuda",
            &live,
            &mut self,
            announce,
            tactic_deadline(job),
        );
        for (index, error) in errors {
            report[index]["error"] = json!(error);
        }
        let ranked = record_timings(&mut report, measured.outcomes, "launch: ");
        let report = bound_report(report, REPORT_BUDGET_BYTES);
        let Some((winner, stats)) = ranked.into_iter().next() else {
            return Err(TuneError::NothingRan(bound_error(&format!(
                "no candidate compiled, passed its check and ran: {}",
                json!(report)
            ))));
        };
        let candidate = &self.problem.candidates[winner];
        let target = self.compiled[winner]
            .as_ref()
            .map(|c| c.target.clone())
            .unwrap_or_default();
        let timing = TimingMethod::new(
            &measure,
            measured.rounds,
            self.timer.queued_behind(),
            self.cold_l2.clone(),
        );
        let config = json!({
            "backend": "cuda",
            "op": "nvrtc",
            "kernel": self.problem.kernel,
            "candidate": candidate.name,
            "defines": candidate.defines,
            "grid": candidate.grid,
            "block": candidate.block,
            "shared_mem_bytes": candidate.shared_mem_bytes,
            "target": target,
            "stats": stats,
            "timing": timing,
            "verified": verification,
            "candidates": report,
        });
        Ok(make_result("cuda", config, stats.median_us))
    }
}

impl Timed for NvrtcRun<'_> {
    fn name(&self, index: usize) -> String {
        self.problem.candidates[index].name.clone()
    }

    fn sample(&mut self, index: usize, runs: u32) -> Result<f64, TuneError> {
        let NvrtcRun {
            stream,
            sets,
            next_set,
            args,
            compiled,
            timer,
            ..
        } = self;
        let compiled = compiled[index]
            .as_ref()
            .ok_or_else(|| TuneError::NothingRan("the candidate did not compile".to_string()))?;
        let stream: &Arc<CudaStream> = stream;
        let count = sets.len();
        timer.sample(stream, runs, &mut || {
            let set = *next_set;
            *next_set = (set + 1) % count;
            launch(
                stream,
                &compiled.function,
                compiled.config,
                args,
                &sets[set],
            )
        })
    }
}
