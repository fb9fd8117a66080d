//! Entries written out as an Inductor cache directory (`tunecache export inductor DIR`): timing
//! groups merged into the `DIR/cache/<system_hash>` file of their system, as Inductor's
//! `update_local_cache` writes it (`json.dumps(..., indent=4)`, non-finite timings as the bare
//! tokens its `json.load` reads back), and best configs written to their files as its
//! `LocalAutotuneCache` writes them (`json.dumps(data)`); each file put in place atomically.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use tunecache_proto::v1;

use crate::key::{
    best_config_parts, choices_digest, device_name_of_device, gemm_problem_parts,
    system_hash_of_device,
};
use crate::pyjson::{self, Layout, Value};
use crate::store::{
    best_config_rel_path, create_dir_all, is_plain_name, skip, write_atomically, SkippedFile,
};
use crate::{timings_of, BEST_CONFIG_NAMESPACE, NAMESPACE};

#[derive(Debug, Default)]
pub struct ExportOutcome {
    /// Timing groups (entries of [`NAMESPACE`]) merged into their system's file.
    pub timings: usize,
    /// The systems whose `cache/<system_hash>` file was written, sorted.
    pub systems: Vec<String>,
    /// Best-config files written.
    pub best_configs: usize,
    pub skipped: Vec<SkippedFile>,
}

/// One timing group to merge: where it goes in `cache` and its timings.
struct Group<'a> {
    op: &'a str,
    cache_key: &'a str,
    precision: &'a str,
    timings: Vec<(String, f64)>,
}

impl Group<'_> {
    /// The group as a skipped file's reason names it.
    fn name(&self) -> String {
        format!(
            "op {:?}, key {:?}, precision {:?}",
            self.op, self.cache_key, self.precision
        )
    }
}

/// One system's file to write.
#[derive(Default)]
struct SystemFile<'a> {
    device_name: Option<&'a str>,
    groups: Vec<Group<'a>>,
}

/// Writes the entries of [`NAMESPACE`] and [`BEST_CONFIG_NAMESPACE`] among `entries` under the
/// cache directory `dir`; other namespaces are ignored. A system's existing file keeps what it
/// holds (its `system` object, other groups, other choices of the same group); ours win on
/// the same choice hash, and one that cannot be read is left as it is, its entries skipped. An
/// entry that does not map to a file is skipped with the reason. Errors only when a file
/// cannot be written.
pub fn export_cache_dir(dir: &Path, entries: &[v1::Entry]) -> io::Result<ExportOutcome> {
    let mut outcome = ExportOutcome::default();
    let mut systems: BTreeMap<&str, SystemFile> = BTreeMap::new();
    // Per file the newest entry (the later one of equal times): a file holds one config.
    let mut best_configs: BTreeMap<&str, (i64, &str, Value)> = BTreeMap::new();
    for entry in entries {
        let (Some(key), Some(result)) = (&entry.key, &entry.result) else {
            continue;
        };
        let named = Path::new(&key.problem);
        if key.namespace == NAMESPACE {
            match timing_group(key, &result.config) {
                Ok((system_hash, group)) => {
                    let system = systems.entry(system_hash).or_default();
                    system.device_name = system
                        .device_name
                        .or_else(|| device_name_of_device(&key.device));
                    system.groups.push(group);
                }
                Err(reason) => outcome.skipped.push(skip(named, reason)),
            }
        } else if key.namespace == BEST_CONFIG_NAMESPACE {
            let (rel_path, value) = match best_config(&key.problem, &result.config) {
                Ok(found) => found,
                Err(reason) => {
                    outcome.skipped.push(skip(named, reason));
                    continue;
                }
            };
            let tuned_at = result.tuned_at_unix_ms;
            let replaced = match best_configs.get(rel_path) {
                Some((kept_at, kept_problem, _)) if *kept_at > tuned_at => {
                    outcome.skipped.push(skip(
                        named,
                        format!("{kept_problem:?}, tuned later, holds the same file"),
                    ));
                    continue;
                }
                Some((_, kept_problem, _)) => Some(*kept_problem),
                None => None,
            };
            if let Some(replaced) = replaced {
                outcome.skipped.push(skip(
                    Path::new(replaced),
                    format!("{:?}, tuned later, holds the same file", key.problem),
                ));
            }
            best_configs.insert(rel_path, (tuned_at, &key.problem, value));
        }
    }
    for (system_hash, system) in systems {
        write_system(dir, system_hash, system, &mut outcome)?;
    }
    for (rel_path, (_, _, value)) in best_configs {
        let path = dir.join(rel_path);
        if let Some(parent) = path.parent() {
            create_dir_all(parent)?;
        }
        write_atomically(&path, &pyjson::write(&value, Layout::Default))?;
        outcome.best_configs += 1;
    }
    Ok(outcome)
}

/// The system hash and group of an entry of [`NAMESPACE`], which must be one
/// [`crate::gemm_key`] built from the timings its config holds.
fn timing_group<'a>(key: &'a v1::Key, config: &str) -> Result<(&'a str, Group<'a>), String> {
    let system_hash = system_hash_of_device(&key.device)
        .ok_or_else(|| format!("its device {:?} names no system", key.device))?;
    if !is_plain_name(system_hash) {
        return Err(format!(
            "its system hash {system_hash:?} is not a file name"
        ));
    }
    let (cache_key, precision, digest) = gemm_problem_parts(&key.problem)
        .ok_or("its problem is not <cache_key>|precision <p>|choices <digest>")?;
    let timings = timings_of(config)?;
    let choices: Vec<&str> = timings.iter().map(|(choice, _)| choice.as_str()).collect();
    if choices_digest(&choices) != digest {
        return Err("its config's choices are not the ones its key names".to_owned());
    }
    Ok((
        system_hash,
        Group {
            op: &key.op,
            cache_key,
            precision,
            timings,
        },
    ))
}

/// The relative path and object of an entry of [`BEST_CONFIG_NAMESPACE`], whose config must be
/// an object with the `configs_hash` its key names.
fn best_config<'a>(problem: &'a str, config: &str) -> Result<(&'a str, Value), String> {
    let (rel_path, configs_hash) =
        best_config_parts(problem).ok_or("its problem is not <path>|configs <hash>")?;
    best_config_rel_path(rel_path)?;
    let value = pyjson::parse(config).map_err(|error| format!("config: {error}"))?;
    let members = value.as_object().ok_or("config: not a JSON object")?;
    if pyjson::member(members, "configs_hash").and_then(Value::as_str) != Some(configs_hash) {
        return Err("config: its \"configs_hash\" is not the one its key names".to_owned());
    }
    Ok((rel_path, value))
}

/// The object member `name` of `members`, made when absent; None when it is there but no
/// object.
fn object_member<'m>(
    members: &'m mut Vec<(String, Value)>,
    name: &str,
) -> Option<&'m mut Vec<(String, Value)>> {
    let index = match members.iter().position(|(member, _)| member == name) {
        Some(index) => index,
        None => {
            members.push((name.to_owned(), Value::Object(Vec::new())));
            members.len() - 1
        }
    };
    match &mut members[index].1 {
        Value::Object(inner) => Some(inner),
        _ => None,
    }
}

/// Merges `system`'s groups into `dir/cache/<system_hash>` and writes it.
fn write_system(
    dir: &Path,
    system_hash: &str,
    system: SystemFile,
    outcome: &mut ExportOutcome,
) -> io::Result<()> {
    let cache_dir = dir.join(crate::store::TIMINGS_DIR);
    let path = cache_dir.join(system_hash);
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => match pyjson::parse(&text) {
            Ok(Value::Object(root))
                if pyjson::member(&root, "cache")
                    .is_none_or(|cache| cache.as_object().is_some()) =>
            {
                Ok(root)
            }
            Ok(_) => Err("the existing file is not Inductor's".to_owned()),
            Err(error) => Err(format!("the existing file is not JSON ({error})")),
        },
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(format!("the existing file cannot be read ({error})")),
    };
    let mut root = match existing {
        Ok(root) => root,
        Err(reason) => {
            for group in &system.groups {
                outcome.skipped.push(skip(
                    &path,
                    format!("{}: {reason}; left as it is", group.name()),
                ));
            }
            return Ok(());
        }
    };
    // Their system object, as Inductor wrote it, when the file has one; else ours.
    let mut system_object = match pyjson::member(&root, "system") {
        Some(Value::Object(members)) => members.clone(),
        _ => Vec::new(),
    };
    if pyjson::member(&system_object, "hash").is_none() {
        system_object.push(("hash".to_owned(), Value::String(system_hash.to_owned())));
    }
    if let (None, Some(name)) = (pyjson::member(&system_object, "device"), system.device_name) {
        let device = vec![("name".to_owned(), Value::String(name.to_owned()))];
        system_object.insert(0, ("device".to_owned(), Value::Object(device)));
    }
    pyjson::set_member(&mut root, "system", Value::Object(system_object));
    let mut merged = 0;
    {
        let Some(cache) = object_member(&mut root, "cache") else {
            return Ok(());
        };
        for group in &system.groups {
            let place = object_member(cache, group.op)
                .and_then(|by_key| object_member(by_key, group.cache_key))
                .and_then(|by_precision| object_member(by_precision, group.precision));
            let Some(timings) = place else {
                outcome.skipped.push(skip(
                    &path,
                    format!(
                        "{}: the existing file holds no object there; left as it is",
                        group.name()
                    ),
                ));
                continue;
            };
            for (choice, timing) in &group.timings {
                pyjson::set_member(timings, choice, Value::float(*timing));
            }
            merged += 1;
        }
    }
    if merged == 0 {
        return Ok(());
    }
    create_dir_all(&cache_dir)?;
    write_atomically(
        &path,
        &pyjson::write(&Value::Object(root), Layout::Indent(4)),
    )?;
    outcome.timings += merged;
    outcome.systems.push(system_hash.to_owned());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{cache_dir, BEST_CONFIG_FILE, SYSTEM_HASH, TIMINGS_FILE};
    use crate::{best_config_key, gemm_key, import_cache_dir, timings_config, timings_time_us};

    fn entry(key: v1::Key, config: String, time_us: f64, tuned_at_unix_ms: i64) -> v1::Entry {
        v1::Entry {
            key: Some(key),
            result: Some(v1::Result {
                config,
                time_us,
                tuned_by: "t".to_owned(),
                tuned_at_unix_ms,
                ..Default::default()
            }),
        }
    }

    fn timing_entry(system: &str, name: Option<&str>, timings: &[(&str, f64)]) -> v1::Entry {
        let timings: Vec<(String, f64)> = timings
            .iter()
            .map(|(choice, timing)| ((*choice).to_owned(), *timing))
            .collect();
        let choices: Vec<&str> = timings.iter().map(|(choice, _)| choice.as_str()).collect();
        let key = gemm_key(system, name, "mm", "[(8, 16)]", "high", &choices);
        entry(key, timings_config(&timings), timings_time_us(&timings), 5)
    }

    fn sorted(mut entries: Vec<v1::Entry>) -> Vec<v1::Entry> {
        entries.sort_by(|a, b| format!("{:?}", a.key).cmp(&format!("{:?}", b.key)));
        entries
    }

    #[test]
    fn an_export_imports_back_to_the_same_entries() {
        let entries = vec![
            timing_entry(
                "h1",
                Some("G"),
                &[("b", 0.5), ("a", f64::INFINITY), ("c", f64::NAN)],
            ),
            timing_entry("h2", None, &[("d", 1e-05), ("e", f64::NEG_INFINITY)]),
            entry(
                best_config_key("ab/cabc.best_config", "abc"),
                r#"{"XBLOCK":128,"configs_hash":"abc","time_taken_ms":3}"#.to_owned(),
                3000.0,
                5,
            ),
            entry(
                v1::Key {
                    namespace: "flashinfer".to_owned(),
                    ..Default::default()
                },
                "{}".to_owned(),
                1.0,
                5,
            ),
        ];
        let dir = tempfile::tempdir().unwrap();
        let written = export_cache_dir(dir.path(), &entries).unwrap();
        assert_eq!(written.skipped, vec![]);
        assert_eq!(
            (
                written.timings,
                written.systems.clone(),
                written.best_configs
            ),
            (2, vec!["h1".to_owned(), "h2".to_owned()], 1)
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cache/h1")).unwrap(),
            "{\n    \"system\": {\n        \"device\": {\n            \"name\": \"G\"\n        },\n        \"hash\": \"h1\"\n    },\n    \"cache\": {\n        \"mm\": {\n            \"[(8, 16)]\": {\n                \"high\": {\n                    \"a\": Infinity,\n                    \"b\": 0.5,\n                    \"c\": NaN\n                }\n            }\n        }\n    }\n}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ab/cabc.best_config")).unwrap(),
            r#"{"XBLOCK": 128, "configs_hash": "abc", "time_taken_ms": 3}"#
        );
        let read = import_cache_dir(dir.path(), "t", 5).unwrap();
        assert_eq!(read.skipped, vec![]);
        assert_eq!(sorted(read.entries), sorted(entries[..3].to_vec()));
    }

    #[test]
    fn what_was_imported_is_written_back_byte_for_byte() {
        let dir = cache_dir();
        let imported = import_cache_dir(dir.path(), "t", 5).unwrap();
        let written = export_cache_dir(dir.path(), &imported.entries).unwrap();
        assert_eq!((written.timings, written.best_configs), (2, 1));
        let read = |rel: &str| std::fs::read_to_string(dir.path().join(rel)).unwrap();
        // The groups we do not hold (an empty one, one with a string timing) are kept.
        assert_eq!(read(&format!("cache/{SYSTEM_HASH}")), TIMINGS_FILE);
        assert_eq!(read("ab/cabc.best_config"), BEST_CONFIG_FILE);
    }

    #[test]
    fn a_group_is_merged_into_the_existing_file_ours_winning() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("cache")).unwrap();
        let existing = r#"{"system": {"hash": "h", "version": {"cuda": "12.8"}}, "cache": {"mm": {"[(8, 16)]": {"high": {"a": 1.0, "b": 2.0}}}, "bmm": {}}}"#;
        std::fs::write(dir.path().join("cache/h"), existing).unwrap();
        let ours = timing_entry("h", Some("G"), &[("b", 0.5), ("c", f64::INFINITY)]);
        let written = export_cache_dir(dir.path(), &[ours]).unwrap();
        assert_eq!(written.timings, 1);
        let text = std::fs::read_to_string(dir.path().join("cache/h")).unwrap();
        let compact: String = text.split_whitespace().collect();
        assert_eq!(
            compact,
            r#"{"system":{"device":{"name":"G"},"hash":"h","version":{"cuda":"12.8"}},"cache":{"mm":{"[(8,16)]":{"high":{"a":1.0,"b":0.5,"c":Infinity}}},"bmm":{}}}"#
        );
        // The union is one group now: imported, one entry keyed by all three choices.
        let read = import_cache_dir(dir.path(), "t", 5).unwrap();
        let key = read.entries[0].key.as_ref().unwrap();
        assert_eq!(
            key,
            &gemm_key("h", Some("G"), "mm", "[(8, 16)]", "high", &["a", "b", "c"])
        );
    }

    #[test]
    fn entries_that_map_to_no_file_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub/cache")).unwrap();
        std::fs::write(dir.path().join("sub/cache/bad"), "{ not json").unwrap();
        let mut wrong_choices = timing_entry("h", None, &[("a", 1.0)]);
        if let Some(result) = wrong_choices.result.as_mut() {
            result.config = r#"{"b":1.0}"#.to_owned();
        }
        let best = |path: &str, config: &str, tuned_at: i64| {
            entry(best_config_key(path, "h"), config.to_owned(), 0.0, tuned_at)
        };
        let entries = [
            timing_entry("bad", None, &[("a", 1.0)]),
            timing_entry("..", None, &[("a", 1.0)]),
            wrong_choices,
            best("../cevil.best_config", r#"{"configs_hash":"h"}"#, 1),
            best("ab/cx.best_config", r#"{"configs_hash":"other"}"#, 1),
            best("ab/cy.best_config", r#"{"configs_hash":"h","n":1}"#, 9),
            best("ab/cy.best_config", r#"{"configs_hash":"h","n":2}"#, 1),
        ];
        let written = export_cache_dir(&dir.path().join("sub"), &entries).unwrap();
        assert_eq!((written.timings, written.best_configs), (0, 1));
        assert_eq!(written.skipped.len(), 6, "{:?}", written.skipped);
        assert!(!dir.path().join("cevil.best_config").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sub/ab/cy.best_config")).unwrap(),
            r#"{"configs_hash": "h", "n": 1}"#
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sub/cache/bad")).unwrap(),
            "{ not json"
        );
    }
}
