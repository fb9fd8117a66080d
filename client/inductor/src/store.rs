//! An Inductor cache directory read into entries (`tunecache import inductor DIR`): every timing
//! group of every `DIR/cache/<system_hash>` file and every `DIR/<dir>/<name>.best_config`
//! file; and what reading and writing share: the files skipped with their reasons, the rule for
//! a best config's relative path, and the atomic write ([`crate::export`] writes the directory
//! back).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tunecache_proto::v1;

use crate::pyjson::{self, Layout, Value};
use crate::{best_config_key, gemm_key, timings_config, timings_time_us};

/// The extension of a kernel's best-config file.
pub const BEST_CONFIG_EXTENSION: &str = "best_config";
/// The directory of the GEMM timing files, under the cache directory.
pub const TIMINGS_DIR: &str = "cache";

/// A file (a timing group, a directory) that was not imported or exported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFile {
    pub path: String,
    pub reason: String,
}

pub(crate) fn skip(path: &Path, reason: impl Into<String>) -> SkippedFile {
    SkippedFile {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

#[derive(Debug, Default)]
pub struct ImportOutcome {
    /// One entry per timing group and one per best-config file.
    pub entries: Vec<v1::Entry>,
    /// `cache/<system_hash>` files read.
    pub timing_files: usize,
    /// Timing groups among `entries` (the rest are best configs).
    pub timings: usize,
    /// Best-config files among `entries`.
    pub best_configs: usize,
    pub skipped: Vec<SkippedFile>,
}

/// The entries of a file, sorted by path; names starting with `.` left out: Inductor's
/// `write_atomic` and ours write there first (`.<pid>.<tid>.tmp`, `.tunecache_*.tmp`), and a
/// file being written is no one's result yet.
fn sorted_dir(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut paths = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<io::Result<Vec<_>>>()?;
    paths.retain(|path| {
        path.file_name()
            .is_some_and(|name| !name.to_string_lossy().starts_with('.'))
    });
    paths.sort();
    Ok(paths)
}

/// A name that is one file in one directory: not empty, `.` or `..`, no separator or NUL.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// `(dir, name)` of a best config's path relative to the cache directory, which must be
/// `<dir>/<name>.best_config`, one directory deep, nothing absolute and no `..`: export writes
/// there, so a key must not name a file outside the directory.
pub fn best_config_rel_path(rel_path: &str) -> Result<(&str, &str), String> {
    let refused = |why: &str| Err(format!("{rel_path:?} {why}"));
    if Path::new(rel_path).is_absolute() || rel_path.contains("..") {
        return refused("is absolute or has \"..\"");
    }
    let Some((dir, name)) = rel_path.split_once('/') else {
        return refused("is not <dir>/<name>.best_config");
    };
    let stem = name.strip_suffix(&format!(".{BEST_CONFIG_EXTENSION}"));
    if !is_plain_name(dir) || !is_plain_name(name) || stem.is_none_or(str::is_empty) {
        return refused("is not <dir>/<name>.best_config");
    }
    Ok((dir, name))
}

/// Reads the cache directory `dir`: every timing group of `dir/cache/*` and every
/// `dir/*/*.best_config`, entries tuned by `tuned_by` at `now_ms`. A file or group that is not
/// what Inductor writes is skipped with the reason, the rest imported; errors only when `dir`
/// itself cannot be read.
pub fn import_cache_dir(dir: &Path, tuned_by: &str, now_ms: i64) -> io::Result<ImportOutcome> {
    let subdirs = sorted_dir(dir)?;
    let mut outcome = ImportOutcome::default();
    let result = |config: String, time_us: f64| v1::Result {
        config,
        time_us,
        tuned_by: tuned_by.to_owned(),
        tuned_at_unix_ms: now_ms,
        ..Default::default()
    };
    for subdir in subdirs.into_iter().filter(|path| path.is_dir()) {
        let files = match sorted_dir(&subdir) {
            Ok(files) => files,
            Err(error) => {
                outcome.skipped.push(skip(&subdir, error.to_string()));
                continue;
            }
        };
        let is_timings_dir = subdir.file_name().is_some_and(|name| name == TIMINGS_DIR);
        for file in files.into_iter().filter(|path| path.is_file()) {
            if is_timings_dir {
                import_timings_file(&file, &mut outcome, &result);
            } else if file
                .extension()
                .is_some_and(|ext| ext == BEST_CONFIG_EXTENSION)
            {
                match best_config_entry(&file, &result) {
                    Ok(entry) => {
                        outcome.best_configs += 1;
                        outcome.entries.push(entry);
                    }
                    Err(reason) => outcome.skipped.push(skip(&file, reason)),
                }
            }
        }
    }
    Ok(outcome)
}

fn read_json(file: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(file).map_err(|error| error.to_string())?;
    pyjson::parse(&text).map_err(|error| format!("not JSON: {error}"))
}

/// One entry per timing group of the file `cache/<system_hash>`; a group that is not
/// `{choice_hash: number}` is skipped, the others imported.
fn import_timings_file(
    file: &Path,
    outcome: &mut ImportOutcome,
    result: &impl Fn(String, f64) -> v1::Result,
) {
    let value = match read_json(file) {
        Ok(value) => value,
        Err(reason) => return outcome.skipped.push(skip(file, reason)),
    };
    let Some(root) = value.as_object() else {
        return outcome.skipped.push(skip(file, "not a JSON object"));
    };
    let Some(cache) = pyjson::member(root, "cache").and_then(Value::as_object) else {
        return outcome
            .skipped
            .push(skip(file, "no \"cache\" object (not Inductor's)"));
    };
    let system = pyjson::member(root, "system").and_then(Value::as_object);
    let system_member = |name: &str| system.and_then(|system| pyjson::member(system, name));
    let file_name = file
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let system_hash = system_member("hash")
        .and_then(Value::as_str)
        .filter(|hash| !hash.is_empty())
        .unwrap_or(&file_name);
    let device_name = system_member("device")
        .and_then(Value::as_object)
        .and_then(|device| pyjson::member(device, "name"))
        .and_then(Value::as_str);
    outcome.timing_files += 1;
    for (op, by_key) in cache {
        let Some(by_key) = by_key.as_object() else {
            outcome
                .skipped
                .push(skip(file, format!("op {op:?}: not an object")));
            continue;
        };
        for (cache_key, by_precision) in by_key {
            let Some(by_precision) = by_precision.as_object() else {
                outcome.skipped.push(skip(
                    file,
                    format!("op {op:?}, key {cache_key:?}: not an object"),
                ));
                continue;
            };
            for (precision, group) in by_precision {
                match group_timings(group) {
                    Ok(timings) => {
                        let choices: Vec<&str> =
                            timings.iter().map(|(choice, _)| choice.as_str()).collect();
                        let key =
                            gemm_key(system_hash, device_name, op, cache_key, precision, &choices);
                        let result = result(timings_config(&timings), timings_time_us(&timings));
                        outcome.timings += 1;
                        outcome.entries.push(v1::Entry {
                            key: Some(key),
                            result: Some(result),
                        });
                    }
                    Err(reason) => outcome.skipped.push(skip(
                        file,
                        format!("op {op:?}, key {cache_key:?}, precision {precision:?}: {reason}"),
                    )),
                }
            }
        }
    }
}

/// The `(choice_hash, timing_ms)` of one group, which must be an object of numbers.
fn group_timings(group: &Value) -> Result<Vec<(String, f64)>, String> {
    let members = group.as_object().ok_or("not an object")?;
    if members.is_empty() {
        return Err("no timings".to_owned());
    }
    members
        .iter()
        .map(|(choice, timing)| {
            timing
                .as_f64()
                .map(|timing| (choice.clone(), timing))
                .ok_or_else(|| format!("the timing of {choice:?} is not a number"))
        })
        .collect()
}

/// The entry of a best-config file: keyed by its path and `configs_hash` (without which
/// Inductor would not load it), its object as the config, `time_taken_ms` as the time.
fn best_config_entry(
    file: &Path,
    result: &impl Fn(String, f64) -> v1::Result,
) -> Result<v1::Entry, String> {
    let rel_path = match (file.parent().and_then(Path::file_name), file.file_name()) {
        (Some(dir), Some(name)) => match (dir.to_str(), name.to_str()) {
            (Some(dir), Some(name)) => format!("{dir}/{name}"),
            _ => return Err("its path is not UTF-8".to_owned()),
        },
        _ => return Err("no file name".to_owned()),
    };
    best_config_rel_path(&rel_path)?;
    let value = read_json(file)?;
    let members = value.as_object().ok_or("not a JSON object")?;
    let configs_hash = pyjson::member(members, "configs_hash")
        .and_then(Value::as_str)
        .ok_or("no string \"configs_hash\" (Inductor would not load it)")?;
    if value.has_nonfinite() {
        return Err("a non-finite number, which a config cannot hold".to_owned());
    }
    // time_taken_ms is how long the tuning took; absent (older files) or not a time, 0.
    let time_us = pyjson::member(members, "time_taken_ms")
        .and_then(Value::as_f64)
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map_or(0.0, |ms| ms * 1000.0);
    Ok(v1::Entry {
        key: Some(best_config_key(&rel_path, configs_hash)),
        result: Some(result(pyjson::write(&value, Layout::Compact), time_us)),
    })
}

/// Creates `dir` and its parents, an error naming it.
pub(crate) fn create_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir).map_err(|error| {
        io::Error::new(error.kind(), format!("creating {}: {error}", dir.display()))
    })
}

/// Puts `text` at `path` as Inductor's `write_atomic` does: a temporary file beside it, then a
/// rename over it, so that a reader sees the old file or the new one, never part of one.
pub(crate) fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let in_context = |error: io::Error| {
        io::Error::new(error.kind(), format!("writing {}: {error}", path.display()))
    };
    let mut file = tempfile::Builder::new()
        .prefix(".tunecache_")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(in_context)?;
    file.write_all(text.as_bytes()).map_err(in_context)?;
    file.persist(path)
        .map_err(|error| in_context(error.error))?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What Inductor's `update_local_cache` writes (`json.dumps({"system": system, "cache":
    /// cache}, indent=4)`, generated by Python 3): a failed choice's bare `Infinity`, and the
    /// text "Infinity" in strings that must stay strings (a cache key, a version, a timing
    /// that is no number).
    pub(crate) const TIMINGS_FILE: &str = r#"{
    "system": {
        "device": {
            "name": "NVIDIA H100 80GB HBM3"
        },
        "version": {
            "triton": "3.5.0 Infinity NaN",
            "cuda": "12.8"
        },
        "hash": "4c523330a89b931ba563edee4d369f9574db98d888d9df314b795db3c30ad3e9"
    },
    "cache": {
        "mm": {
            "[[8, 16], [16, 32]]|Infinity": {
                "highest": {
                    "c1": 0.012345678901234568,
                    "c0": Infinity,
                    "c2": 1e-05
                }
            }
        },
        "addmm": {
            "k2": {
                "high": {
                    "c3": 2.0
                },
                "medium": {}
            },
            "k3": {
                "high": {
                    "c4": "Infinity"
                }
            }
        }
    }
}"#;
    pub(crate) const SYSTEM_HASH: &str =
        "4c523330a89b931ba563edee4d369f9574db98d888d9df314b795db3c30ad3e9";
    /// `json.dumps(data)` of a best config, as Inductor's `LocalAutotuneCache` writes it.
    pub(crate) const BEST_CONFIG_FILE: &str = r#"{"XBLOCK": 128, "num_warps": 4, "num_stages": 1, "configs_hash": "abc", "found_by_coordesc": false, "time_taken_ms": 12, "triton_cache_hash": null}"#;

    /// A cache directory holding the two files above and some that are no one's results.
    pub(crate) fn cache_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(&format!("cache/{SYSTEM_HASH}"), TIMINGS_FILE);
        write("cache/.123.456.tmp", "{");
        write("ab/cabc.best_config", BEST_CONFIG_FILE);
        write("ab/cabc.py", "# the kernel");
        write("cd/cbad.best_config", "[]");
        write("ef/cnohash.best_config", r#"{"XBLOCK": 1}"#);
        dir
    }

    #[test]
    fn a_directory_inductor_wrote_is_imported() {
        let dir = cache_dir();
        let outcome = import_cache_dir(dir.path(), "me", 7).unwrap();
        let reasons: Vec<&str> = outcome
            .skipped
            .iter()
            .map(|skipped| skipped.reason.as_str())
            .collect();
        assert_eq!(
            reasons,
            [
                "op \"addmm\", key \"k2\", precision \"medium\": no timings",
                "op \"addmm\", key \"k3\", precision \"high\": the timing of \"c4\" is not a number",
                "not a JSON object",
                "no string \"configs_hash\" (Inductor would not load it)",
            ]
        );
        assert_eq!(
            (outcome.timing_files, outcome.timings, outcome.best_configs),
            (1, 2, 1)
        );
        let best = &outcome.entries[0];
        assert_eq!(
            best.key,
            Some(best_config_key("ab/cabc.best_config", "abc"))
        );
        let best = best.result.as_ref().unwrap();
        assert_eq!(
            best.config,
            r#"{"XBLOCK":128,"num_warps":4,"num_stages":1,"configs_hash":"abc","found_by_coordesc":false,"time_taken_ms":12,"triton_cache_hash":null}"#
        );
        assert_eq!(best.time_us, 12_000.0);

        let mm = &outcome.entries[1];
        let key = mm.key.as_ref().unwrap();
        assert_eq!(
            key,
            &gemm_key(
                SYSTEM_HASH,
                Some("NVIDIA H100 80GB HBM3"),
                "mm",
                "[[8, 16], [16, 32]]|Infinity",
                "highest",
                &["c2", "c0", "c1"],
            )
        );
        assert_eq!(
            key.device,
            format!("NVIDIA H100 80GB HBM3|system {SYSTEM_HASH}")
        );
        let result = mm.result.as_ref().unwrap();
        assert_eq!(
            result.config,
            r#"{"c0":"inf","c1":0.012345678901234568,"c2":1e-05}"#
        );
        assert_eq!(result.time_us, 1e-05 * 1000.0);
        assert_eq!(
            (result.tuned_by.as_str(), result.tuned_at_unix_ms),
            ("me", 7)
        );
        let addmm = outcome.entries[2].key.as_ref().unwrap();
        assert_eq!((addmm.op.as_str(), addmm.rank), ("addmm", None));
    }

    #[test]
    fn a_file_without_a_system_hash_is_keyed_by_its_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("cache")).unwrap();
        std::fs::write(
            dir.path().join("cache/h0"),
            r#"{"system": {"device": {"name": null}}, "cache": {"mm": {"k": {"high": {"c": 1.0}}}}}"#,
        )
        .unwrap();
        let outcome = import_cache_dir(dir.path(), "me", 0).unwrap();
        assert_eq!(outcome.entries[0].key.as_ref().unwrap().device, "system h0");
        assert!(import_cache_dir(&dir.path().join("missing"), "me", 0).is_err());
    }

    #[test]
    fn paths_outside_the_directory_are_refused() {
        assert_eq!(
            best_config_rel_path("ab/cabc.best_config"),
            Ok(("ab", "cabc.best_config"))
        );
        for bad in [
            "../cabc.best_config",
            "ab/../../cabc.best_config",
            "/etc/cabc.best_config",
            "ab/cd/cabc.best_config",
            "cabc.best_config",
            "ab/.best_config",
            "ab/cabc.json",
            "./cabc.best_config",
            "ab\\..\\x/c.best_config",
        ] {
            assert!(best_config_rel_path(bad).is_err(), "{bad}");
        }
    }
}
