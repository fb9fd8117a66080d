//! The GPU check: the cuda backend through the real worker and supervisor, on one GPU.
//! Every test is `#[ignore]`d because CI has no GPU; `gpu-tuner/scripts/gpu-check.sh` runs
//! them from prebuilt binaries on a GPU node and prints their check lines as one table.
//!
//! Each check prints one line `GPU-CHECK<TAB>check<TAB>figure<TAB>expected<TAB>PASS|FAIL`
//! (to stdout, so run with `--nocapture`), and a test fails if any of its checks does.
//! Every check compares a measured figure with a range it can fall outside of.
//!
//! Environment: `TUNECACHE_GPU_CHECK_DEVICE` (CUDA ordinal, default 0) and
//! `TUNECACHE_GPU_CHECK_WORKER` (the worker binary; default the one cargo built beside this).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::CudaContext;
use serde_json::{json, Value};
use tunecache_gpu_tuner::backend::cuda::{time_algo_back_to_back, POISONED_EXIT_CODE};
use tunecache_proto::tuner::BackendChoice;
use tunecache_server::tuner::{Supervisor, SupervisorConfig, TunerHandle};

fn ordinal() -> usize {
    std::env::var("TUNECACHE_GPU_CHECK_DEVICE")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

fn worker_path() -> PathBuf {
    std::env::var_os("TUNECACHE_GPU_CHECK_WORKER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tunecache-tuner")))
}

/// The checks of one test; the test fails at the end if any failed.
struct Checks {
    test: &'static str,
    count: usize,
    failed: Vec<String>,
}

impl Checks {
    fn new(test: &'static str) -> Self {
        Checks {
            test,
            count: 0,
            failed: Vec::new(),
        }
    }

    fn line(&mut self, check: &str, figure: impl std::fmt::Display, expected: &str, pass: bool) {
        let verdict = if pass { "PASS" } else { "FAIL" };
        println!("GPU-CHECK\t{check}\t{figure}\t{expected}\t{verdict}");
        self.count += 1;
        if !pass {
            self.failed
                .push(format!("{check}: {figure} (expected {expected})"));
        }
    }

    /// Prints the test's own line (gpu-check.sh reports a test without one as unfinished)
    /// and fails the test if a check failed.
    fn finish(self) {
        let verdict = if self.failed.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        println!(
            "GPU-CHECK\ttest {}\t{} checks, {} failed\tall checks pass\t{verdict}",
            self.test,
            self.count,
            self.failed.len()
        );
        assert!(self.failed.is_empty(), "failed checks: {:#?}", self.failed);
    }
}

/// What the GPU can do at most, from its attributes.
struct Peaks {
    name: String,
    /// Dense f16/bf16 tensor-core TFLOP/s with f32 accumulation.
    f16_tflops: f64,
    /// f32 FMA TFLOP/s (no TF32).
    f32_tflops: f64,
    /// DRAM bandwidth, GB/s (1e9 bytes).
    dram_gbps: f64,
}

fn nvidia_smi(query: &str) -> Option<String> {
    let output = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={query}"),
            "--format=csv,noheader,nounits",
            &format!("--id={}", ordinal()),
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
    (output.status.success() && !text.is_empty()).then_some(text)
}

fn peaks() -> Peaks {
    let context = CudaContext::new(ordinal()).expect("a CUDA context on the checked GPU");
    let attribute = |a| f64::from(context.attribute(a).unwrap_or(0));
    let (major, minor) = context.compute_capability().expect("compute capability");
    let sms = attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    let clock_hz = attribute(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE) * 1e3;
    // Dense f16 tensor FLOPs and f32 FLOPs per SM per clock, by architecture.
    let (tensor, fp32) = match (major, minor) {
        (7, _) => (1024.0, 128.0),
        (8, 0) => (2048.0, 128.0),
        (8, _) => (1024.0, 256.0),
        (9, 0) => (4096.0, 256.0),
        (10, _) => (8192.0, 256.0),
        _ => (1024.0, 256.0),
    };
    let mut memory_hz = attribute(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) * 1e3;
    if memory_hz <= 0.0 {
        memory_hz = nvidia_smi("clocks.max.memory")
            .and_then(|mhz| mhz.parse::<f64>().ok())
            .map_or(0.0, |mhz| mhz * 1e6);
    }
    let bus_bits = attribute(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    Peaks {
        name: context.name().unwrap_or_default(),
        f16_tflops: sms * clock_hz * tensor / 1e12,
        f32_tflops: sms * clock_hz * fp32 / 1e12,
        dram_gbps: 2.0 * memory_hz * bus_bits / 8.0 / 1e9,
    }
}

async fn start(job_timeout: Duration, worker_args: &[&str]) -> TunerHandle {
    let tuner = Supervisor::start(SupervisorConfig {
        worker_path: worker_path(),
        backend: BackendChoice::Cuda,
        job_timeout,
        queue_capacity: 4,
        device: Some(ordinal() as u32),
        worker_args: worker_args.iter().map(|a| a.to_string()).collect(),
    })
    .await
    .expect("a cuda worker starts (is there an NVIDIA GPU and driver?)");
    assert_eq!(tuner.backend(), "cuda");
    tuner
}

async fn tune(tuner: &TunerHandle, op: &str, problem: &str) -> Result<Value, String> {
    let device = tuner.devices()[0].fingerprint.clone();
    let result = tuner
        .submit(op, problem, &device)
        .expect("accepted")
        .await
        .expect("answered")?;
    let config: Value = serde_json::from_str(&result.config).expect("config is JSON");
    assert_eq!(config["stats"]["median_us"].as_f64(), Some(result.time_us));
    Ok(config)
}

fn gemm(m: u64, n: u64, k: u64, dtype: &str, layout: &str) -> String {
    json!({"m": m, "n": n, "k": k, "dtype": dtype, "layout": layout}).to_string()
}

fn candidates(config: &Value) -> &[Value] {
    config["candidates"].as_array().map_or(&[], Vec::as_slice)
}

fn failed_verification(config: &Value) -> usize {
    candidates(config)
        .iter()
        .filter(|c| {
            c["error"]
                .as_str()
                .is_some_and(|e| e.contains("failed verification"))
        })
        .count()
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn check_1_worker_driver_and_fingerprint() {
    let mut checks = Checks::new("check_1_worker_driver_and_fingerprint");
    let started = Instant::now();
    let tuner = start(Duration::from_secs(60), &[]).await;
    let ready_s = started.elapsed().as_secs_f64();
    checks.line(
        "worker ready",
        format!("{ready_s:.1} s"),
        "< 10 s",
        ready_s < 10.0,
    );
    let device = tuner.devices()[0].clone();
    let smi = nvidia_smi("driver_version").unwrap_or_else(|| "(nvidia-smi failed)".into());
    checks.line(
        "driver_version",
        &device.driver_version,
        &format!("= nvidia-smi {smi}"),
        device.driver_version == smi,
    );
    let expected = format!(
        "{}|sm_{}|cuda {}",
        device.name,
        device.compute_capability.replace('.', ""),
        device.cuda_version
    );
    checks.line(
        "fingerprint",
        &device.fingerprint,
        "name|sm_XY|cuda A.B of this GPU",
        device.fingerprint == expected && device.name == peaks().name,
    );
    checks.line(
        "devices in Ready",
        tuner.devices().len(),
        "1 (context on the tuning GPU only)",
        tuner.devices().len() == 1,
    );
    checks.finish();
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn check_2_gemm_4096_throughput_repeatability_and_selection() {
    let mut checks = Checks::new("check_2_gemm_4096_throughput_repeatability_and_selection");
    let peaks = peaks();
    let tuner = start(Duration::from_secs(300), &[]).await;
    let mut f16_times = Vec::new();
    for dtype in ["f16", "f16", "f16", "bf16"] {
        let config = tune(&tuner, "gemm", &gemm(4096, 4096, 4096, dtype, "nn"))
            .await
            .expect("4096^3 tunes");
        if dtype == "f16" {
            f16_times.push(config["stats"]["median_us"].as_f64().unwrap_or(f64::NAN));
        }
        if f16_times.len() == 1 || dtype == "bf16" {
            let tflops = config["tflops"].as_f64().unwrap_or(0.0);
            let fraction = tflops / peaks.f16_tflops;
            checks.line(
                &format!("4096^3 {dtype} TFLOP/s"),
                format!(
                    "{tflops:.0} ({:.0}% of {:.0})",
                    fraction * 100.0,
                    peaks.f16_tflops
                ),
                "35%..102% of dense peak",
                (0.35..=1.02).contains(&fraction),
            );
            // The winner is the fastest candidate listed (selection, not a tautology: a
            // wrong pick or a report out of step with the stats fails it).
            let fastest = candidates(&config)
                .iter()
                .filter_map(|c| c["median_us"].as_f64())
                .fold(f64::INFINITY, f64::min);
            let winner = config["stats"]["median_us"].as_f64().unwrap_or(f64::NAN);
            checks.line(
                &format!("4096^3 {dtype} winner is the fastest listed"),
                format!("{winner:.1} us vs {fastest:.1} us"),
                "equal",
                winner == fastest,
            );
        }
    }
    let (lo, hi) = f16_times
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), t| {
            (lo.min(*t), hi.max(*t))
        });
    let disagreement = hi / lo - 1.0;
    checks.line(
        "4096^3 f16 three repeats",
        format!("{:.1}% apart ({lo:.1}..{hi:.1} us)", disagreement * 100.0),
        "within 3%",
        disagreement <= 0.03,
    );
    let config = tune(&tuner, "gemm", &gemm(4096, 4096, 4096, "f32", "nn"))
        .await
        .expect("f32 tunes");
    let tflops = config["tflops"].as_f64().unwrap_or(f64::INFINITY);
    checks.line(
        "4096^3 f32 (no TF32) TFLOP/s",
        format!("{tflops:.1}"),
        &format!("20%..100% of f32 peak {:.1}", peaks.f32_tflops),
        tflops <= peaks.f32_tflops && tflops >= 0.2 * peaks.f32_tflops,
    );
    checks.finish();
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn check_3_every_dtype_and_layout_verifies() {
    let mut checks = Checks::new("check_3_every_dtype_and_layout_verifies");
    let tuner = start(Duration::from_secs(300), &[]).await;
    let mut verified = 0;
    let mut failures = Vec::new();
    for dtype in ["f16", "bf16", "f32"] {
        for layout in ["nn", "nt", "tn", "tt"] {
            // m, n, k all different, so a transposed layout cannot pass by symmetry.
            match tune(&tuner, "gemm", &gemm(384, 320, 448, dtype, layout)).await {
                Ok(config) if failed_verification(&config) == 0 => verified += 1,
                Ok(config) => failures.push(format!(
                    "{dtype}/{layout}: {} candidates failed",
                    failed_verification(&config)
                )),
                Err(error) => failures.push(format!("{dtype}/{layout}: {error}")),
            }
        }
    }
    checks.line(
        "dtype x layout combinations verify",
        format!("{verified}/12 {}", failures.join("; ")),
        "12/12, no candidate failing",
        verified == 12,
    );
    checks.finish();
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn check_4_decode_gemm_tolerance_cold_l2_and_timing_method() {
    let mut checks = Checks::new("check_4_decode_gemm_tolerance_cold_l2_and_timing_method");
    let problem = gemm(16, 4096, 4096, "bf16", "nn");
    let hot = start(Duration::from_secs(300), &[]).await;
    let hot_config = tune(&hot, "gemm", &problem)
        .await
        .expect("decode bf16 tunes");
    checks.line(
        "bf16 16x4096x4096 candidates failing verification",
        failed_verification(&hot_config),
        "0 (split-K in bf16 within tolerance)",
        failed_verification(&hot_config) == 0,
    );
    let hot_us = hot_config["stats"]["median_us"]
        .as_f64()
        .unwrap_or(f64::NAN);
    hot.shutdown().await;
    let cold = start(Duration::from_secs(300), &["--flush-l2"]).await;
    let cold_config = tune(&cold, "gemm", &problem)
        .await
        .expect("cold decode tunes");
    let cold_us = cold_config["stats"]["median_us"]
        .as_f64()
        .unwrap_or(f64::NAN);
    checks.line(
        "bf16 decode cold-L2 vs hot median",
        format!("{cold_us:.2} vs {hot_us:.2} us"),
        "cold > hot",
        cold_us > hot_us,
    );
    cold.shutdown().await;
    // The tuner's median against plain back-to-back launches of the same algorithm.
    let algo_hex = hot_config["algo"]["algo_hex"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let plain = tokio::task::spawn_blocking(move || {
        time_algo_back_to_back(ordinal(), &problem, &algo_hex, 200)
    })
    .await
    .expect("joined");
    match plain {
        Ok(plain_us) => checks.line(
            "bf16 decode tuner median vs back-to-back",
            format!("{hot_us:.2} vs {plain_us:.2} us"),
            "within 1 us",
            (hot_us - plain_us).abs() <= 1.0,
        ),
        Err(error) => checks.line(
            "bf16 decode tuner median vs back-to-back",
            error,
            "within 1 us",
            false,
        ),
    }
    checks.finish();
}

const COPY_SOURCE: &str = r#"
extern "C" __global__ void copy(const float4* in, float4* out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
#if defined(ILLEGAL)
        ((float4*)0x10)[i] = in[i];
#elif defined(TRAP)
        __trap();
#elif defined(ENDLESS)
        volatile int forever = 1;
        while (forever) {}
#else
        out[i] = in[i];
#endif
    }
}
"#;

/// An NVRTC copy of `bytes` (half read, half written) with candidates `extra` besides
/// three block sizes, checked against the 256-thread one.
fn copy_problem(bytes: u64, extra: &[Value]) -> String {
    let floats = bytes / 2 / 4;
    let vectors = floats / 4;
    let mut candidates = vec![
        json!({"name": "b128", "grid": [4096], "block": [128]}),
        json!({"name": "b256", "grid": [4096], "block": [256]}),
        json!({"name": "b512", "grid": [2048], "block": [512]}),
    ];
    candidates.extend_from_slice(extra);
    json!({
        "source": COPY_SOURCE,
        "kernel": "copy",
        "buffers": [
            {"name": "in", "dtype": "f32", "len": floats, "init": "random"},
            {"name": "out", "dtype": "f32", "len": floats, "init": "zeros"},
        ],
        "args": [{"buffer": "in"}, {"buffer": "out"}, {"u64": vectors}],
        "candidates": candidates,
        "check": {"buffer": "out", "reference": "b256", "rtol": 0.0, "atol": 0.0},
    })
    .to_string()
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn check_5_nvrtc_copy_bandwidth() {
    let mut checks = Checks::new("check_5_nvrtc_copy_bandwidth");
    let peaks = peaks();
    let tuner = start(Duration::from_secs(300), &[]).await;
    let gib = 1u64 << 30;
    let config = tune(&tuner, "nvrtc", &copy_problem(gib, &[]))
        .await
        .expect("the copy tunes");
    let us = config["stats"]["median_us"]
        .as_f64()
        .unwrap_or(f64::INFINITY);
    let gbps = gib as f64 / us / 1e3;
    let fraction = gbps / peaks.dram_gbps;
    checks.line(
        "NVRTC copy of 1 GiB",
        format!(
            "{gbps:.0} GB/s ({:.0}% of {:.0})",
            fraction * 100.0,
            peaks.dram_gbps
        ),
        "50%..100% of DRAM peak",
        (0.5..=1.0).contains(&fraction),
    );
    checks.line(
        "NVRTC module target",
        config["target"].as_str().unwrap_or("?"),
        "sm_* (SASS)",
        config["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("sm_")),
    );
    checks.finish();
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn check_6_faulting_candidates_cost_only_themselves() {
    let mut checks = Checks::new("check_6_faulting_candidates_cost_only_themselves");
    let tuner = start(Duration::from_secs(300), &[]).await;
    let faulting = [
        json!({"name": "illegal", "defines": {"ILLEGAL": ""}, "grid": [64], "block": [256]}),
        json!({"name": "trap", "defines": {"TRAP": ""}, "grid": [64], "block": [256]}),
    ];
    let outcome = tune(&tuner, "nvrtc", &copy_problem(64 << 20, &faulting)).await;
    let (winner, illegal, trap) = match &outcome {
        Ok(config) => {
            let why = |name: &str| {
                candidates(config)
                    .iter()
                    .find(|c| c["name"] == name)
                    .and_then(|c| c["error"].as_str())
                    .unwrap_or("")
                    .to_string()
            };
            (
                config["candidate"].as_str().unwrap_or("").to_string(),
                why("illegal"),
                why("trap"),
            )
        }
        Err(error) => (format!("job failed: {error}"), String::new(), String::new()),
    };
    let poisoned = format!("status {POISONED_EXIT_CODE}");
    checks.line(
        "illegal-address and __trap() candidates",
        format!("winner {winner}"),
        "job succeeds with a b* candidate",
        winner.starts_with('b'),
    );
    checks.line(
        "illegal-address candidate excluded",
        cut_figure(&illegal),
        "excluded, worker exit 70",
        illegal.contains("excluded") && illegal.contains(&poisoned),
    );
    checks.line(
        "__trap() candidate excluded",
        cut_figure(&trap),
        "excluded, worker exit 70",
        trap.contains("excluded") && trap.contains(&poisoned),
    );
    let next = tune(&tuner, "gemm", &gemm(256, 256, 256, "f16", "tn")).await;
    checks.line(
        "next job after the faults",
        next.as_ref()
            .map_or_else(|e| cut_figure(e), |_| "tuned".to_string()),
        "tuned",
        next.is_ok(),
    );
    checks.finish();
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn check_7_an_endless_kernel_hits_the_job_timeout() {
    let mut checks = Checks::new("check_7_an_endless_kernel_hits_the_job_timeout");
    let tuner = start(Duration::from_secs(20), &[]).await;
    let endless =
        json!({"name": "endless", "defines": {"ENDLESS": ""}, "grid": [1], "block": [32]});
    let mut problem: Value =
        serde_json::from_str(&copy_problem(1 << 20, &[endless])).expect("JSON");
    // No check: the endless candidate must be caught by the timeout, not by a comparison.
    problem.as_object_mut().map(|p| p.remove("check"));
    let started = Instant::now();
    let error = tune(&tuner, "nvrtc", &problem.to_string())
        .await
        .err()
        .unwrap_or_default();
    let took = started.elapsed().as_secs_f64();
    checks.line(
        "endless kernel",
        format!("{:.0} s: {}", took, cut_figure(&error)),
        "timed out near 20 s naming \"endless\"",
        error.contains("timed out") && error.contains("endless") && took < 40.0,
    );
    let next = tune(&tuner, "gemm", &gemm(256, 256, 256, "f16", "nn")).await;
    checks.line(
        "next job after the timeout",
        next.as_ref()
            .map_or_else(|e| cut_figure(e), |_| "tuned".to_string()),
        "tuned",
        next.is_ok(),
    );
    checks.finish();
}

/// A figure short enough for one table cell, on one line.
fn cut_figure(text: &str) -> String {
    let line = text.replace(['\t', '\n'], " ");
    if line.chars().count() <= 90 {
        line
    } else {
        line.chars().take(87).collect::<String>() + "..."
    }
}
