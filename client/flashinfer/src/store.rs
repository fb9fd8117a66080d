//! A store directory of theirs read into entries (`tunecache import flashinfer ROOT`: every
//! environment under `ROOT/v2/`) and entries written out as one (`tunecache export flashinfer
//! ROOT`): `manifest.json` and one file per entry, each put in place as their
//! `_atomic_write_json` does (a temporary file in the same directory, then a rename).

use std::io::Write;
use std::path::{Path, PathBuf};

use tunecache_proto::v1;

use crate::manifest::env_hash_of_device;
use crate::{entries_of, file_entry_of, Manifest, NAMESPACE, SCHEMA};

/// A file (or a directory) that was not imported or exported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFile {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct ImportOutcome {
    /// Two entries per entry file: the entry and its op unit.
    pub entries: Vec<v1::Entry>,
    /// Entry files read.
    pub files: usize,
    /// Environments (directories under `v2/`) read.
    pub environments: usize,
    pub skipped: Vec<SkippedFile>,
}

fn skip(path: &Path, reason: impl Into<String>) -> SkippedFile {
    SkippedFile {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn sorted_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<std::io::Result<Vec<_>>>()?;
    paths.sort();
    Ok(paths)
}

/// Reads every environment of the store at `root` (`root/v2/<env_hash>/`). An entry file is
/// taken when their `lookup` would serve it: valid JSON with a string `key` (hashing to the
/// file's name), a string `runner` and a `tactic`; an environment whose `manifest.json` is
/// missing or does not hash to its directory's name is skipped whole (its entries are no
/// environment's). Errors only when `root/v2` cannot be read.
pub fn import_store(
    root: &Path,
    tuned_by: &str,
    tuned_at_unix_ms: i64,
) -> Result<ImportOutcome, String> {
    let schema_dir = root.join(SCHEMA);
    let environments = sorted_dir(&schema_dir)
        .map_err(|error| format!("reading {}: {error}", schema_dir.display()))?;
    let mut outcome = ImportOutcome::default();
    for env_dir in environments.into_iter().filter(|path| path.is_dir()) {
        let manifest_path = env_dir.join("manifest.json");
        let manifest = match std::fs::read_to_string(&manifest_path)
            .map_err(|error| error.to_string())
            .and_then(|text| Manifest::from_json(&text))
        {
            Ok(manifest) => manifest,
            Err(reason) => {
                outcome.skipped.push(skip(&manifest_path, reason));
                continue;
            }
        };
        let dir_name = env_dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        if dir_name.as_deref() != Some(manifest.env_hash().as_str()) {
            outcome.skipped.push(skip(
                &env_dir,
                format!(
                    "its manifest hashes to {}, not to the directory's name",
                    manifest.env_hash()
                ),
            ));
            continue;
        }
        outcome.environments += 1;
        let entries_dir = env_dir.join("entries");
        let files = match sorted_dir(&entries_dir) {
            Ok(files) => files,
            Err(error) => {
                outcome.skipped.push(skip(&entries_dir, error.to_string()));
                continue;
            }
        };
        for file in files
            .into_iter()
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        {
            match import_file(&file, &manifest, tuned_by, tuned_at_unix_ms) {
                Ok((entry, unit)) => {
                    outcome.files += 1;
                    outcome.entries.push(entry);
                    outcome.entries.push(unit);
                }
                Err(reason) => outcome.skipped.push(skip(&file, reason)),
            }
        }
    }
    Ok(outcome)
}

fn import_file(
    file: &Path,
    manifest: &Manifest,
    tuned_by: &str,
    tuned_at_unix_ms: i64,
) -> Result<(v1::Entry, v1::Entry), String> {
    let text = std::fs::read_to_string(file).map_err(|error| error.to_string())?;
    let (entry, unit) = entries_of(manifest, &text, tuned_by, tuned_at_unix_ms)?;
    let (Some(key), Some(result)) = (&entry.key, &entry.result) else {
        return Err("no entry".to_owned());
    };
    // Their lookup reads the file its key hashes to: a file under another name is never served.
    let expected = file_entry_of(Some(&key.problem), &result.config)?.file_name;
    if file
        .file_name()
        .is_some_and(|name| name.to_string_lossy() != expected)
    {
        return Err(format!(
            "its key hashes to {expected}, not to the file's name"
        ));
    }
    Ok((entry, unit))
}

#[derive(Debug, Default)]
pub struct ExportOutcome {
    /// Entry files written.
    pub exported: usize,
    /// The environments written, sorted.
    pub environments: Vec<String>,
    pub skipped: Vec<SkippedFile>,
}

/// Writes the `NAMESPACE` entries among `entries` (those of environment `env` only, when
/// given) as their store under `root`. An existing `manifest.json` is left as it is (it is the
/// environment's by its name); entry files are replaced.
pub fn export_store(
    root: &Path,
    entries: &[v1::Entry],
    env: Option<&str>,
) -> Result<ExportOutcome, String> {
    let mut outcome = ExportOutcome::default();
    for entry in entries {
        let (Some(key), Some(result)) = (&entry.key, &entry.result) else {
            continue;
        };
        if key.namespace != NAMESPACE
            || env.is_some_and(|env| env_hash_of_device(&key.device) != Some(env))
        {
            continue;
        }
        let named = Path::new(&key.problem);
        let file_entry = match file_entry_of(Some(&key.problem), &result.config) {
            Ok(file_entry) => file_entry,
            Err(reason) => {
                outcome.skipped.push(skip(named, reason));
                continue;
            }
        };
        let env_hash = file_entry.manifest.env_hash();
        if env_hash_of_device(&key.device) != Some(env_hash.as_str()) {
            outcome.skipped.push(skip(
                named,
                format!(
                    "its device {:?} is not its manifest's ({env_hash})",
                    key.device
                ),
            ));
            continue;
        }
        let env_dir = root.join(SCHEMA).join(&env_hash);
        let entries_dir = env_dir.join("entries");
        std::fs::create_dir_all(&entries_dir)
            .map_err(|error| format!("creating {}: {error}", entries_dir.display()))?;
        let manifest_path = env_dir.join("manifest.json");
        if !manifest_path.exists() {
            write_atomically(&manifest_path, &file_entry.manifest.file_text())?;
        }
        write_atomically(
            &entries_dir.join(&file_entry.file_name),
            &file_entry.file_text(),
        )?;
        outcome.exported += 1;
        if !outcome.environments.contains(&env_hash) {
            outcome.environments.push(env_hash);
        }
    }
    outcome.environments.sort();
    Ok(outcome)
}

/// As their `_atomic_write_json`: a temporary file beside `path`, then a rename over it.
fn write_atomically(path: &Path, text: &str) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let failed = |error: std::io::Error| format!("writing {}: {error}", path.display());
    let mut file = tempfile::Builder::new()
        .prefix(".autotune_")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    file.persist(path).map_err(|error| failed(error.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_imports_back_to_the_same_entries() {
        let manifest = Manifest::from_json(r#"{"gpu":"G"}"#).unwrap();
        let entry_json = r#"{"key":"('op', 'R', ((1,),), ())","runner":"R","tactic":2}"#;
        let (entry, _unit) = entries_of(&manifest, entry_json, "t", 5).unwrap();
        let root = tempfile::tempdir().unwrap();
        let written = export_store(root.path(), std::slice::from_ref(&entry), None).unwrap();
        assert_eq!(
            (written.exported, written.environments.clone()),
            (1, vec![manifest.env_hash()])
        );
        let read = import_store(root.path(), "t", 5).unwrap();
        assert_eq!(read.skipped, vec![]);
        assert_eq!(read.entries[0], entry);
        let other_env = export_store(root.path(), &[entry], Some("0000000000000000")).unwrap();
        assert_eq!(other_env.exported, 0);
    }
}
