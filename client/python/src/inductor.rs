//! PyTorch Inductor's cache mapping of `tunecache-inductor` for the Python drop-in
//! (`tunecache.integrations.inductor`), so that the drop-in and the CLI's `import inductor` /
//! `export inductor` key and spell entries by one implementation: a system's device, a GEMM
//! timing group's key, config and time, and a kernel best config's key.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tunecache_inductor as inductor;

use crate::messages::Key;

/// `Key.device` of a system (`CacheBase.get_system()`): `<device_name>|system <system_hash>`,
/// or `system <system_hash>` when `device_name` is None or empty.
#[pyfunction]
#[pyo3(signature = (system_hash, device_name))]
pub fn inductor_device(system_hash: &str, device_name: Option<&str>) -> String {
    inductor::device(system_hash, device_name)
}

/// The Key of the timing group `cache[op][cache_key][precision]` whose choices are
/// `choice_hashes` (in any order; repeats count once): namespace `inductor`, `Key.device` as
/// `inductor_device`, problem `<cache_key>|precision <precision>|choices <digest>`, shared by
/// all ranks.
#[pyfunction]
#[pyo3(signature = (system_hash, device_name, op, cache_key, precision, choice_hashes))]
pub fn inductor_gemm_key(
    system_hash: &str,
    device_name: Option<&str>,
    op: &str,
    cache_key: &str,
    precision: &str,
    choice_hashes: Vec<String>,
) -> Key {
    Key::from_proto(inductor::gemm_key(
        system_hash,
        device_name,
        op,
        cache_key,
        precision,
        &choice_hashes,
    ))
}

/// The config of a timing group, `timings` being `(choice_hash, timing_ms)`: compact JSON with
/// sorted names, a non-finite timing as the string `"inf"`, `"-inf"` or `"nan"`.
#[pyfunction]
pub fn inductor_timings_config(timings: Vec<(String, f64)>) -> String {
    inductor::timings_config(&timings)
}

/// The `(choice_hash, timing_ms)` of a config `inductor_timings_config` wrote, in its order.
/// Raises ValueError for any other text.
#[pyfunction]
pub fn inductor_timings(config: &str) -> PyResult<Vec<(String, f64)>> {
    inductor::timings_of(config)
        .map_err(|reason| PyValueError::new_err(format!("tunecache: {reason}")))
}

/// `Result.time_us` of a timing group: its smallest finite timing (ms) in µs, 0.0 when none is
/// finite.
#[pyfunction]
pub fn inductor_time_us(timings: Vec<(String, f64)>) -> f64 {
    inductor::timings_time_us(&timings)
}

/// The Key of a kernel's best config: `rel_path` its file relative to the cache directory
/// (`<2 chars>/<hash>.best_config`), `configs_hash` the file's `configs_hash`.
#[pyfunction]
pub fn inductor_best_config_key(rel_path: &str, configs_hash: &str) -> Key {
    Key::from_proto(inductor::best_config_key(rel_path, configs_hash))
}
