//! GPU-only checks of the cuda backend through the real worker and supervisor. They are
//! `#[ignore]`d because CI has no GPU; run them with `gpu-tuner/scripts/gpu-check.sh` on a
//! machine with an NVIDIA driver.

use std::path::PathBuf;
use std::time::Duration;

use tunecache_gpu_tuner::backend::cuda::POISONED_EXIT_CODE;
use tunecache_proto::tuner::BackendChoice;
use tunecache_server::tuner::{Supervisor, SupervisorConfig, TunerHandle};

async fn start_cuda() -> TunerHandle {
    let tuner = Supervisor::start(SupervisorConfig {
        worker_path: PathBuf::from(env!("CARGO_BIN_EXE_tunecache-tuner")),
        backend: BackendChoice::Cuda,
        job_timeout: Duration::from_secs(300),
        queue_capacity: 4,
        device: None,
        worker_args: Vec::new(),
    })
    .await
    .expect("a cuda worker starts (is there an NVIDIA GPU and driver?)");
    assert_eq!(tuner.backend(), "cuda");
    tuner
}

fn cuda_fingerprint(tuner: &TunerHandle) -> String {
    let device = &tuner.devices()[0];
    let parts: Vec<&str> = device.fingerprint.split('|').collect();
    assert_eq!(parts.len(), 3, "{}", device.fingerprint);
    assert_eq!(parts[0], device.name);
    assert_eq!(
        parts[1],
        format!("sm_{}", device.compute_capability.replace('.', ""))
    );
    assert_eq!(parts[2], format!("cuda {}", device.cuda_version));
    device.fingerprint.clone()
}

async fn tune(tuner: &TunerHandle, op: &str, problem: &str) -> Result<serde_json::Value, String> {
    let device = cuda_fingerprint(tuner);
    let result = tuner
        .submit(op, problem, &device)
        .expect("accepted")
        .await
        .expect("answered")?;
    let config: serde_json::Value = serde_json::from_str(&result.config).expect("config is JSON");
    assert_eq!(config["stats"]["median_us"].as_f64(), Some(result.time_us));
    assert!(result.tuned_by.starts_with("tunecache-tuner/cuda@"));
    eprintln!("{op}: {} us\n{config:#}", result.time_us);
    Ok(config)
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn gemm_4096_f16_beats_or_ties_heuristic_0_with_verified_output() {
    let tuner = start_cuda().await;
    let config = tune(
        &tuner,
        "gemm",
        r#"{"m":4096,"n":4096,"k":4096,"dtype":"f16","layout":"nn"}"#,
    )
    .await
    .expect("tuned");
    let time_us = config["stats"]["median_us"].as_f64().unwrap();
    let heuristic0 = config["heuristic0_median_us"]
        .as_f64()
        .expect("heuristic #0 ran and passed verification");
    assert!(
        time_us <= heuristic0,
        "tuned {time_us} us vs heuristic #0 {heuristic0} us"
    );
    // Every timed algorithm was checked against the host reference first; the winner too.
    let winner_rank = config["algo"]["heuristic_rank"].as_u64().unwrap();
    let winner = config["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["heuristic_rank"].as_u64() == Some(winner_rank))
        .expect("winner listed");
    assert!(winner.get("error").is_none(), "{winner}");
    assert_eq!(config["algo"]["algo_hex"].as_str().unwrap().len(), 128);
    assert!(config["algo"]["algo_id"].is_u64());
    // 4096^3 f16 runs well above 50 TFLOP/s on any datacenter GPU since Volta.
    assert!(
        config["tflops"].as_f64().unwrap() > 50.0,
        "{}",
        config["tflops"]
    );
}

const MATMUL_SOURCE: &str = r#"
extern "C" __global__ void matmul(const float* a, const float* b, float* c, int n) {
#if defined(NAIVE)
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n && col < n) {
        float acc = 0.0f;
        for (int k = 0; k < n; ++k) acc += a[row * n + k] * b[k * n + col];
        c[row * n + col] = acc;
    }
#elif defined(SKIP)
    // Deliberately wrong: writes nothing, so it is the fastest and must be caught.
#else
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        ta[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < n) ? a[row * n + t + threadIdx.x] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < n) ? b[(t + threadIdx.y) * n + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) c[row * n + col] = acc;
#endif
}
"#;

fn matmul_problem(extra_candidates: &[serde_json::Value]) -> String {
    let n = 1024;
    let mut candidates = vec![
        serde_json::json!({"name": "naive", "defines": {"NAIVE": ""}, "grid": [n / 16, n / 16], "block": [16, 16]}),
        serde_json::json!({"name": "tile8", "defines": {"TILE": "8"}, "grid": [n / 8, n / 8], "block": [8, 8]}),
        serde_json::json!({"name": "tile16", "defines": {"TILE": "16"}, "grid": [n / 16, n / 16], "block": [16, 16]}),
        serde_json::json!({"name": "tile32", "defines": {"TILE": "32"}, "grid": [n / 32, n / 32], "block": [32, 32]}),
        // Does not compile (TILE undefined): reported as failed, not fatal.
        serde_json::json!({"name": "broken", "defines": {}, "grid": [1], "block": [1]}),
    ];
    candidates.extend_from_slice(extra_candidates);
    serde_json::json!({
        "source": MATMUL_SOURCE,
        "kernel": "matmul",
        "buffers": [
            {"name": "a", "dtype": "f32", "len": n * n, "init": "random"},
            {"name": "b", "dtype": "f32", "len": n * n, "init": "random"},
            {"name": "c", "dtype": "f32", "len": n * n, "init": "zeros"},
        ],
        "args": [{"buffer": "a"}, {"buffer": "b"}, {"buffer": "c"}, {"i32": n}],
        "candidates": candidates,
        "check": {"buffer": "c", "reference": "naive", "rtol": 1e-3, "atol": 1e-3},
    })
    .to_string()
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn nvrtc_picks_the_fastest_tile_and_checks_it_against_the_reference() {
    let tuner = start_cuda().await;
    let config = tune(&tuner, "nvrtc", &matmul_problem(&[]))
        .await
        .expect("tuned");
    let candidates = config["candidates"].as_array().unwrap();
    let broken = candidates.iter().find(|c| c["name"] == "broken").unwrap();
    assert!(
        broken["error"].as_str().unwrap().contains("compile"),
        "{broken}"
    );
    let fastest = candidates
        .iter()
        .filter_map(|c| Some((c["name"].as_str()?, c["median_us"].as_f64()?)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .unwrap();
    assert_eq!(config["candidate"], fastest.0);
    assert_eq!(config["stats"]["median_us"].as_f64(), Some(fastest.1));
    assert!(
        config["candidate"].as_str().unwrap().starts_with("tile"),
        "tiling should beat naive: {}",
        config["candidate"]
    );
    assert_eq!(config["verified"]["reference"], "naive");

    // A fastest-but-wrong candidate must not win silently.
    let wrong =
        serde_json::json!({"name": "skip", "defines": {"SKIP": ""}, "grid": [1], "block": [32]});
    let error = tune(&tuner, "nvrtc", &matmul_problem(&[wrong]))
        .await
        .expect_err("wrong winner");
    assert!(error.contains("disagrees with reference"), "{error}");
}

#[tokio::test]
#[ignore = "needs an NVIDIA GPU"]
async fn a_faulting_kernel_kills_only_the_worker_which_is_restarted() {
    let tuner = start_cuda().await;
    let device = cuda_fingerprint(&tuner);
    let faulting = serde_json::json!({
        "source": "extern \"C\" __global__ void boom(float* p) { float* bad = (float*)0x10; bad[threadIdx.x] = p[0]; }",
        "kernel": "boom",
        "buffers": [{"name": "p", "dtype": "f32", "len": 32}],
        "args": [{"buffer": "p"}],
        "candidates": [{"name": "only", "grid": [1], "block": [32]}],
    })
    .to_string();
    let error = tuner
        .submit("nvrtc", &faulting, &device)
        .expect("accepted")
        .await
        .expect("answered")
        .expect_err("the kernel faults");
    assert!(error.contains("died"), "{error}");
    assert!(
        error.contains(&format!("status {POISONED_EXIT_CODE}")),
        "{error}"
    );
    // This process (the daemon's stand-in) is fine, and so is the fresh worker.
    tune(
        &tuner,
        "gemm",
        r#"{"m":256,"n":256,"k":256,"dtype":"f16","layout":"tn"}"#,
    )
    .await
    .expect("a restarted worker tunes again");
    assert_eq!(tuner.state(), "running");
    // One restart for the retry, one after the second death.
    let counters = tuner.counters();
    assert_eq!(
        (counters.restarts, counters.jobs_failed),
        (2, 1),
        "{counters:?}"
    );
}
