//! Device choice and fingerprint: which GPU the worker tunes on (the one `--device` names,
//! else the least-loaded by NVML, else the last) and how it describes that GPU in `Ready`
//! (the fingerprint jobs name it by, its driver and CUDA versions). These rules are pure;
//! `CudaBackend::open` reads the facts they decide on from the driver and NVML.

use tunecache_proto::v1;

use crate::backend::DeviceChoice;
use crate::error::TuneError;

/// How busy a GPU is, by NVML.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuLoad {
    /// Percent of time a kernel ran over NVML's last sample period.
    pub utilization_percent: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
}

impl GpuLoad {
    fn score(&self) -> f64 {
        let memory = self.memory_used_bytes as f64 / self.memory_total_bytes.max(1) as f64;
        f64::from(self.utilization_percent) + 100.0 * memory
    }
}

/// The GPU to tune on when none is named: the least-loaded one when every GPU's load is
/// known (ties go to the higher ordinal), else the last GPU, since rank 0 usually runs on
/// the first. Returns the ordinal and why it was picked.
pub fn pick_device(loads: &[Option<GpuLoad>]) -> (usize, String) {
    let last = loads.len().saturating_sub(1);
    let known: Option<Vec<GpuLoad>> = loads.iter().copied().collect();
    match known {
        Some(loads) if !loads.is_empty() => {
            let (ordinal, load) = loads
                .iter()
                .enumerate()
                .rev()
                .min_by(|x, y| x.1.score().total_cmp(&y.1.score()))
                .map(|(i, l)| (i, *l))
                .unwrap_or((last, loads[last]));
            (
                ordinal,
                format!(
                    "least-loaded by NVML ({}% busy, {} MiB of {} MiB used)",
                    load.utilization_percent,
                    load.memory_used_bytes >> 20,
                    load.memory_total_bytes >> 20
                ),
            )
        }
        _ => (last, "the last GPU (NVML not loadable)".to_string()),
    }
}

/// The GPU to open among the `count` the driver shows, and why: the ordinal `--device`
/// names if the driver has it, else [`pick_device`] on `loads` (asked for only then, so a
/// named GPU never loads NVML).
pub(super) fn choose_device(
    choice: DeviceChoice,
    count: usize,
    loads: impl FnOnce() -> Vec<Option<GpuLoad>>,
) -> Result<(usize, String), TuneError> {
    if count < 1 {
        return Err(TuneError::Unavailable(
            "the CUDA driver reports no devices".to_string(),
        ));
    }
    match choice {
        DeviceChoice::Ordinal(ordinal) if ordinal < count => {
            Ok((ordinal, "named by --device".to_string()))
        }
        DeviceChoice::Ordinal(ordinal) => Err(TuneError::Unavailable(format!(
            "--device {ordinal}: the CUDA driver shows {count} device(s) (0..{})",
            count - 1
        ))),
        DeviceChoice::Auto => Ok(pick_device(&loads())),
    }
}

/// `cuDriverGetVersion`'s number (1000 * major + 10 * minor) as "major.minor".
pub(super) fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// What `Ready` says about the GPU. The fingerprint (name, SM arch and CUDA version) is what
/// a job names the device by, and part of every result's key.
pub(super) fn describe_device(
    name: String,
    (major, minor): (i32, i32),
    memory_bytes: u64,
    driver_version: String,
    cuda_version: String,
) -> v1::Device {
    v1::Device {
        backend: "cuda".to_string(),
        fingerprint: format!("{name}|sm_{major}{minor}|cuda {cuda_version}"),
        name,
        compute_capability: format!("{major}.{minor}"),
        memory_bytes,
        driver_version,
        cuda_version,
    }
}

/// The kernel module version from `/proc/driver/nvidia/version`, in both flavours:
/// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  ..." and
/// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build ...".
/// The version is the first word after "Kernel Module" that looks like one.
pub fn parse_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.contains("NVRM version"))?;
    let after = line.split("Kernel Module").nth(1)?;
    after
        .split_whitespace()
        .find(|word| {
            word.starts_with(|c: char| c.is_ascii_digit())
                && word.contains('.')
                && word.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(str::to_string)
}

pub(super) fn nvidia_driver_version() -> String {
    std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|text| parse_driver_version(&text))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(busy: u32, used: u64) -> Option<GpuLoad> {
        Some(GpuLoad {
            utilization_percent: busy,
            memory_used_bytes: used << 30,
            memory_total_bytes: 80 << 30,
        })
    }

    #[test]
    fn the_tuning_gpu_is_the_least_loaded_or_else_the_last() {
        let (ordinal, why) = pick_device(&[load(90, 70), load(0, 1), load(95, 75)]);
        assert_eq!(ordinal, 1);
        assert!(why.contains("least-loaded"), "{why}");
        // Equal loads: the last of them (rank 0 is usually on the first).
        assert_eq!(pick_device(&[load(0, 1), load(0, 1)]).0, 1);
        // One GPU NVML cannot answer for: no ranking, the last GPU.
        let (ordinal, why) = pick_device(&[load(0, 1), None, load(99, 79)]);
        assert_eq!(ordinal, 2);
        assert!(why.contains("last"), "{why}");
        assert_eq!(pick_device(&[None]).0, 0);
    }

    #[test]
    fn a_named_gpu_must_exist_and_never_asks_nvml() {
        let no_nvml = || -> Vec<Option<GpuLoad>> { panic!("NVML asked for a named device") };
        assert_eq!(
            choose_device(DeviceChoice::Ordinal(1), 2, no_nvml).unwrap(),
            (1, "named by --device".to_string())
        );
        let error = choose_device(DeviceChoice::Ordinal(2), 2, no_nvml)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "--device 2: the CUDA driver shows 2 device(s) (0..1)"
        );
        let error = choose_device(DeviceChoice::Auto, 0, no_nvml)
            .unwrap_err()
            .to_string();
        assert_eq!(error, "the CUDA driver reports no devices");
        // Auto ranks by load.
        let (ordinal, why) =
            choose_device(DeviceChoice::Auto, 2, || vec![load(5, 1), load(50, 40)]).unwrap();
        assert_eq!(ordinal, 0);
        assert!(why.contains("least-loaded"), "{why}");
    }

    #[test]
    fn the_fingerprint_names_the_gpu_its_arch_and_cuda_version() {
        assert_eq!(cuda_version_text(12080), "12.8");
        assert_eq!(cuda_version_text(12020), "12.2");
        assert_eq!(cuda_version_text(13000), "13.0");
        let device = describe_device(
            "NVIDIA H200".to_string(),
            (9, 0),
            141 << 30,
            "570.86.15".to_string(),
            cuda_version_text(12080),
        );
        assert_eq!(device.fingerprint, "NVIDIA H200|sm_90|cuda 12.8");
        assert_eq!(device.compute_capability, "9.0");
        assert_eq!(device.backend, "cuda");
        assert_eq!(device.name, "NVIDIA H200");
        assert_eq!(device.memory_bytes, 141 << 30);
        assert_eq!(device.driver_version, "570.86.15");
        assert_eq!(device.cuda_version, "12.8");
    }

    #[test]
    fn driver_version_parses_both_kernel_module_flavours() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n";
        let arm = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build  (dvs-builder@U16-I2-C03-12-4)  Thu Jan 23 21:07:27 UTC 2025\n";
        assert_eq!(
            parse_driver_version(proprietary).as_deref(),
            Some("550.54.14")
        );
        assert_eq!(parse_driver_version(open).as_deref(), Some("580.65.06"));
        assert_eq!(parse_driver_version(arm).as_deref(), Some("570.86.15"));
        assert_eq!(parse_driver_version("GCC version: 12\n"), None);
        assert_eq!(parse_driver_version(""), None);
    }
}
