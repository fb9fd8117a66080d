//! Owns the file-lock peer: one rank's view of the TensorRT-LLM autotuner cache file, in the
//! two variants the benchmark compares, re-implemented from the description of
//! TensorRT-LLM PR 22173 ("Bound autotuner cache I/O on slow shared filesystems"):
//!
//! - [`Variant::Before`]: load and save each take an exclusive `lockf` on `<file>.lock`
//!   (blocking, unbounded); a save reads the whole file, merges its `shared` and `rank_<N>`
//!   sections in, writes a temp file, fsyncs it and renames it over the file; a load
//!   replaces the in-memory cache.
//! - [`Variant::After`]: loads take no lock (writers only rename, so a reader sees one whole
//!   version), retry on ESTALE/ENOENT and skip an empty, unreadable or unparsable file, and
//!   merge into memory (file wins); saves do nothing when the file already holds every entry
//!   the rank would write, wait for the lock at most `lock_timeout` (then skip with a
//!   warning), skip the fsync, and only rank 0 writes the shared section.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache_file::{
    rank_section, CacheDocument, CacheFileError, CacheMetadata, Section, SHARED_SECTION,
};

/// Which cache implementation a rank runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    Before,
    After,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Variant::Before => "before",
            Variant::After => "after",
        })
    }
}

/// The TRT-LLM default of `TLLM_AUTOTUNER_CACHE_LOCK_TIMEOUT`.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a bounded lock wait retries (Python `filelock`'s default poll interval).
const LOCK_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Reads attempted before a load that keeps hitting ESTALE/ENOENT gives up.
const LOAD_ATTEMPTS: u32 = 3;
const LOAD_RETRY_PAUSE: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum FileLockError {
    #[error(transparent)]
    CacheFile(#[from] CacheFileError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> FileLockError + '_ {
    move |source| FileLockError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An exclusive `lockf` lock on the sidecar lock file, released on drop (closing the fd
/// drops the process's POSIX locks on the file).
#[derive(Debug)]
struct HeldLock {
    _file: File,
}

fn open_lock_file(path: &Path) -> Result<File, FileLockError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io_error(path))
}

fn lockf(file: &File, command: libc::c_int) -> std::io::Result<()> {
    // SAFETY: lockf on an fd owned by a live File.
    if unsafe { libc::lockf(file.as_raw_fd(), command, 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Blocks until the lock is ours (the "before" behaviour).
fn lock_blocking(path: &Path) -> Result<HeldLock, FileLockError> {
    let file = open_lock_file(path)?;
    loop {
        match lockf(&file, libc::F_LOCK) {
            Ok(()) => return Ok(HeldLock { _file: file }),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(io_error(path)(err)),
        }
    }
}

/// Polls for the lock until `timeout`; `Ok(None)` when it stayed taken.
fn lock_bounded(path: &Path, timeout: Duration) -> Result<Option<HeldLock>, FileLockError> {
    let file = open_lock_file(path)?;
    let deadline = Instant::now() + timeout;
    loop {
        match lockf(&file, libc::F_TLOCK) {
            Ok(()) => return Ok(Some(HeldLock { _file: file })),
            Err(err)
                if matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES))
                    || err.kind() == std::io::ErrorKind::Interrupted =>
            {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(LOCK_POLL_INTERVAL.min(deadline - now));
            }
            Err(err) => return Err(io_error(path)(err)),
        }
    }
}

/// What a load did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoadReport {
    /// Entries (shared + own) taken from the file into memory.
    pub entries_loaded: usize,
    /// Whether the file was skipped (absent, empty, unreadable or unparsable).
    pub skipped: bool,
    pub warnings: Vec<String>,
}

/// How a save ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SaveOutcome {
    Written,
    /// The file already held every entry this rank would write: no lock, no write.
    NothingNew,
    /// The lock stayed taken past the timeout: skipped, the entries stay in memory.
    LockTimeout,
}

/// What a save did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaveReport {
    pub outcome: SaveOutcome,
    pub bytes_written: u64,
    pub warnings: Vec<String>,
}

/// One rank's autotuner cache bound to a cache file.
#[derive(Debug)]
pub struct FileLockCache {
    variant: Variant,
    path: PathBuf,
    lock_path: PathBuf,
    rank: u32,
    lock_timeout: Duration,
    /// In-memory shared section (what the profiling cache holds for shared ops).
    shared: Section,
    /// In-memory `rank_<N>` section.
    own: Section,
}

/// Outcome of one lockless read attempt sequence.
enum LocklessRead {
    Document(CacheDocument),
    Skipped(Option<String>),
}

impl FileLockCache {
    pub fn new(variant: Variant, path: &Path, rank: u32, lock_timeout: Duration) -> Self {
        let mut lock_name = path.as_os_str().to_os_string();
        lock_name.push(".lock");
        Self {
            variant,
            path: path.to_path_buf(),
            lock_path: PathBuf::from(lock_name),
            rank,
            lock_timeout,
            shared: Section::new(),
            own: Section::new(),
        }
    }

    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }

    pub fn shared(&self) -> &Section {
        &self.shared
    }

    pub fn own(&self) -> &Section {
        &self.own
    }

    /// Records tuned results in memory, as the autotuner does after profiling.
    pub fn insert_tuned(&mut self, shared: &Section, own: &Section) {
        self.shared
            .extend(shared.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.own
            .extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    pub fn load(&mut self) -> Result<LoadReport, FileLockError> {
        match self.variant {
            Variant::Before => self.load_before(),
            Variant::After => Ok(self.load_after()),
        }
    }

    pub fn save(&mut self) -> Result<SaveReport, FileLockError> {
        match self.variant {
            Variant::Before => self.save_before(),
            Variant::After => self.save_after(),
        }
    }

    fn load_before(&mut self) -> Result<LoadReport, FileLockError> {
        let _lock = lock_blocking(&self.lock_path)?;
        if !self.path.exists() {
            return Ok(LoadReport {
                skipped: true,
                ..LoadReport::default()
            });
        }
        let document = CacheDocument::read(&self.path)?;
        // The old autotuner replaced its in-memory cache with the file's view.
        self.shared = document
            .section(SHARED_SECTION)
            .cloned()
            .unwrap_or_default();
        self.own = document
            .section(&rank_section(self.rank))
            .cloned()
            .unwrap_or_default();
        Ok(LoadReport {
            entries_loaded: self.shared.len() + self.own.len(),
            ..LoadReport::default()
        })
    }

    /// Reads the file without the lock, retrying reads that race a rename on NFS.
    fn read_lockless(&self) -> LocklessRead {
        let mut last_error = None;
        for attempt in 0..LOAD_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(LOAD_RETRY_PAUSE);
            }
            match std::fs::read(&self.path) {
                Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {
                    // An empty file is a writer's crash or a fresh lock-less create: skip quietly.
                    return LocklessRead::Skipped(None);
                }
                Ok(bytes) => {
                    return match CacheDocument::from_json(&self.path, &bytes) {
                        Ok(document) => LocklessRead::Document(document),
                        Err(err) => LocklessRead::Skipped(Some(format!(
                            "skipping unparsable autotuner cache: {err}"
                        ))),
                    };
                }
                Err(err)
                    if matches!(err.raw_os_error(), Some(libc::ESTALE) | Some(libc::ENOENT)) =>
                {
                    last_error = Some(err);
                }
                Err(err) => {
                    return LocklessRead::Skipped(Some(format!(
                        "skipping unreadable autotuner cache {}: {err}",
                        self.path.display()
                    )));
                }
            }
        }
        match last_error {
            // Still absent after the retries: there is simply no cache yet.
            Some(err) if err.raw_os_error() == Some(libc::ENOENT) => LocklessRead::Skipped(None),
            Some(err) => LocklessRead::Skipped(Some(format!(
                "skipping autotuner cache {} after {LOAD_ATTEMPTS} stale reads: {err}",
                self.path.display()
            ))),
            None => LocklessRead::Skipped(None),
        }
    }

    fn load_after(&mut self) -> LoadReport {
        match self.read_lockless() {
            LocklessRead::Document(document) => {
                let mut entries_loaded = 0;
                // Merge, file wins: a save skipped earlier must not drop our own entries.
                for (name, memory) in [
                    (SHARED_SECTION.to_string(), &mut self.shared),
                    (rank_section(self.rank), &mut self.own),
                ] {
                    if let Some(section) = document.section(&name) {
                        entries_loaded += section.len();
                        memory.extend(section.iter().map(|(k, v)| (k.clone(), v.clone())));
                    }
                }
                LoadReport {
                    entries_loaded,
                    ..LoadReport::default()
                }
            }
            LocklessRead::Skipped(warning) => LoadReport {
                entries_loaded: 0,
                skipped: true,
                warnings: warning.into_iter().collect(),
            },
        }
    }

    /// Writes `document` to a temp file beside the cache and renames it over the cache.
    fn replace_file(&self, document: &CacheDocument, fsync: bool) -> Result<u64, FileLockError> {
        let bytes = document.to_json();
        let mut temp_name = self.path.as_os_str().to_os_string();
        temp_name.push(format!(".tmp.{}", std::process::id()));
        let temp_path = PathBuf::from(temp_name);
        let mut temp = File::create(&temp_path).map_err(io_error(&temp_path))?;
        temp.write_all(&bytes).map_err(io_error(&temp_path))?;
        if fsync {
            temp.sync_all().map_err(io_error(&temp_path))?;
        }
        drop(temp);
        std::fs::rename(&temp_path, &self.path).map_err(io_error(&self.path))?;
        Ok(bytes.len() as u64)
    }

    /// Reads the current file for a read-modify-write; an absent file starts empty.
    fn read_for_update(&self) -> Result<CacheDocument, FileLockError> {
        match CacheDocument::read(&self.path) {
            Ok(document) => Ok(document),
            Err(CacheFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(CacheDocument::default())
            }
            Err(err) => Err(err.into()),
        }
    }

    fn save_before(&mut self) -> Result<SaveReport, FileLockError> {
        let _lock = lock_blocking(&self.lock_path)?;
        let mut document = self.read_for_update()?;
        document.metadata = Some(CacheMetadata::for_this_process());
        document.merge_section(SHARED_SECTION, &self.shared);
        document.merge_section(&rank_section(self.rank), &self.own);
        let bytes_written = self.replace_file(&document, true)?;
        Ok(SaveReport {
            outcome: SaveOutcome::Written,
            bytes_written,
            warnings: Vec::new(),
        })
    }

    /// Whether this rank writes the shared section: only the tuning group's first rank does.
    fn writes_shared(&self) -> bool {
        self.rank == 0
    }

    fn has_nothing_new(&self, document: &CacheDocument) -> bool {
        (!self.writes_shared() || document.holds_all(SHARED_SECTION, &self.shared))
            && document.holds_all(&rank_section(self.rank), &self.own)
    }

    fn save_after(&mut self) -> Result<SaveReport, FileLockError> {
        // Lockless pre-check: a run that reused the cache takes no lock and writes nothing.
        if let LocklessRead::Document(on_disk) = self.read_lockless() {
            if self.has_nothing_new(&on_disk) {
                return Ok(SaveReport {
                    outcome: SaveOutcome::NothingNew,
                    bytes_written: 0,
                    warnings: Vec::new(),
                });
            }
        }
        let Some(_lock) = lock_bounded(&self.lock_path, self.lock_timeout)? else {
            return Ok(SaveReport {
                outcome: SaveOutcome::LockTimeout,
                bytes_written: 0,
                warnings: vec![format!(
                    "autotuner cache lock {} still taken after {:?}; skipping this save",
                    self.lock_path.display(),
                    self.lock_timeout
                )],
            });
        };
        // A torn or foreign file is replaced rather than failing the save.
        let mut warnings = Vec::new();
        let mut document = match self.read_for_update() {
            Ok(document) => document,
            Err(err) => {
                warnings.push(format!("replacing unreadable autotuner cache: {err}"));
                CacheDocument::default()
            }
        };
        if self.has_nothing_new(&document) {
            // Another writer saved the same entries while we waited for the lock.
            return Ok(SaveReport {
                outcome: SaveOutcome::NothingNew,
                bytes_written: 0,
                warnings,
            });
        }
        document.metadata = Some(CacheMetadata::for_this_process());
        if self.writes_shared() {
            document.merge_section(SHARED_SECTION, &self.shared);
        }
        document.merge_section(&rank_section(self.rank), &self.own);
        let bytes_written = self.replace_file(&document, false)?;
        Ok(SaveReport {
            outcome: SaveOutcome::Written,
            bytes_written,
            warnings,
        })
    }
}
