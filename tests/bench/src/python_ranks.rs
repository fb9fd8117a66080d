//! Owns the Python ranks of the cold-start matrix: the interpreters they run on (the venv of
//! `client/python` with the package's wheel installed; for issue 28's "before", the grpcio
//! package of earlier releases from a source tree of its own), the Python systems under test
//! (tunecache through a `tunecache` package, and the file-lock cache as TensorRT-LLM's
//! autotuner kept it before PR 22173: a lock, `json.load`, merge, `json.dump`, fsync, rename),
//! and the Python parse floor. The rank programs themselves are the scripts in `tests/bench/python`,
//! compiled in and run with `python -c`; the harness hands each rank the entries it "tuned" in a
//! file on local disk, the same entries the Rust ranks use.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;
use tunecache_client::proto as v1;

use crate::scenario::{FileLockPeer, ScenarioError, ScenarioSpec, SystemUnderTest};
use crate::tunecache_system::{tuned_daemon_entries, TunecacheSystem, DEVICE, NAMESPACE};
use crate::workload::{tuned_entries, write_initial_cache, NEW_EPOCH};

/// The Python tunecache rank (see the script's header), after the view it builds.
pub const TUNECACHE_RANK_PY: &str = concat!(
    include_str!("../python/rank_view.py"),
    include_str!("../python/tunecache_rank.py")
);
/// The Python file-lock rank, "before" variant.
pub const FILELOCK_RANK_PY: &str = include_str!("../python/filelock_rank.py");
/// The Python parse floor, after the same view the rank builds and the client's own parse.
pub const PARSE_FLOOR_PY: &str = concat!(
    include_str!("../python/rank_view.py"),
    include_str!("../python/flavor.py"),
    include_str!("../python/parse_floor.py")
);
/// How each client fetches a Scan's raw bytes and builds its objects (for floors).
pub const FLAVOR_PY: &str = include_str!("../python/flavor.py");
/// One fresh process's cost of `import tunecache` and its first call.
pub const PROCESS_COST_PY: &str = include_str!("../python/process_cost.py");
/// A Scan through the client against its floor.
pub const SCAN_COST_PY: &str = concat!(
    include_str!("../python/flavor.py"),
    include_str!("../python/scan_cost.py")
);

/// Name of the Python tunecache system in reports (the package of today, over the Rust client).
pub const TUNECACHE_PY: &str = "tunecache-py";
/// Name of the same system through the grpcio package it replaced (issue 28's "before").
pub const TUNECACHE_PY_GRPCIO: &str = "tunecache-py-grpcio";
/// Name of the Python file-lock "before" peer in reports.
pub const FILELOCK_PY_BEFORE: &str = "filelock-py-before";

/// A Python interpreter that can `import tunecache`.
#[derive(Debug, Clone)]
pub struct PythonEnv {
    pub python: PathBuf,
    /// Put on `PYTHONPATH`: a source tree holding the package (the grpcio package's, whose stubs
    /// `gen_stubs.py` generated). None: the package installed in the venv (the wheel), with
    /// `PYTHONPATH` removed so no source tree shadows it.
    pub package_dir: Option<PathBuf>,
    /// The system name of tunecache ranks on this interpreter.
    pub system: &'static str,
}

impl PythonEnv {
    /// The venv of `python_dir` (`client/python`, made by its `run_tests.sh`, which installs the
    /// package's wheel), checked by importing the package and its native module once.
    pub fn find(python_dir: &Path) -> Result<Self, String> {
        Self::checked(
            Self {
                python: python_dir.join(".venv/bin/python"),
                package_dir: None,
                system: TUNECACHE_PY,
            },
            "import grpc, tunecache, tunecache._native",
            "client/python/run_tests.sh",
        )
    }

    /// The grpcio package of earlier releases, as a source tree `dir` with its stubs generated
    /// and a venv `dir/.venv` holding grpcio and protobuf (tests/bench/python/grpcio_before.sh
    /// makes both).
    pub fn find_grpcio(dir: &Path) -> Result<Self, String> {
        Self::checked(
            Self {
                python: dir.join(".venv/bin/python"),
                package_dir: Some(dir.to_path_buf()),
                system: TUNECACHE_PY_GRPCIO,
            },
            "import grpc, tunecache, tunecache.client; assert not hasattr(tunecache, '_native')",
            "tests/bench/python/grpcio_before.sh",
        )
    }

    fn checked(env: Self, probe: &str, maker: &str) -> Result<Self, String> {
        if !env.python.exists() {
            return Err(format!(
                "{} not found (create it with {maker})",
                env.python.display()
            ));
        }
        let output = env
            .command(probe)
            .output()
            .map_err(|err| format!("running {}: {err}", env.python.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} cannot import its tunecache package: {}",
                env.python.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(env)
    }

    /// `python -c <script>` with the package importable.
    pub fn command(&self, script: &str) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg("-c")
            .arg(script)
            // The rank's own timings are what counts; no .pyc writes into the source tree.
            .env("PYTHONDONTWRITEBYTECODE", "1")
            // Ranks read without a view, as every other system of the matrix.
            .env("TUNECACHE_VIEW", "");
        match &self.package_dir {
            Some(dir) => command.env("PYTHONPATH", dir),
            None => command.env_remove("PYTHONPATH"),
        };
        command
    }
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), ScenarioError> {
    let bytes = serde_json::to_vec(value)
        .map_err(|err| ScenarioError::Prepare(format!("{}: {err}", path.display())))?;
    std::fs::write(path, bytes)
        .map_err(|err| ScenarioError::Prepare(format!("{}: {err}", path.display())))
}

fn create_dir(dir: &Path) -> Result<(), ScenarioError> {
    std::fs::create_dir_all(dir)
        .map_err(|err| ScenarioError::Prepare(format!("{}: {err}", dir.display())))
}

/// One daemon entry as the `tunecache` package takes it: `{"key": {...}, "result": {...}}` with
/// the fields of `tunecache.v1.Key` and `tunecache.v1.Result` (`rank` absent when shared).
pub fn entry_json(entry: &v1::Entry) -> serde_json::Value {
    let mut key = serde_json::Map::new();
    let mut result = serde_json::Map::new();
    if let Some(k) = &entry.key {
        key.insert("namespace".into(), k.namespace.clone().into());
        key.insert("op".into(), k.op.clone().into());
        key.insert("device".into(), k.device.clone().into());
        key.insert("problem".into(), k.problem.clone().into());
        if let Some(rank) = k.rank {
            key.insert("rank".into(), rank.into());
        }
    }
    if let Some(r) = &entry.result {
        result.insert("config".into(), r.config.clone().into());
        result.insert("time_us".into(), r.time_us.into());
        result.insert("tuned_by".into(), r.tuned_by.clone().into());
        result.insert("tuned_at_unix_ms".into(), r.tuned_at_unix_ms.into());
    }
    serde_json::json!({ "key": key, "result": result })
}

fn tuned_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

/// tunecache with Python ranks: the same daemon set-up as [`TunecacheSystem`] (which it wraps),
/// each rank a `tunecache_rank.py` process.
pub struct PythonTunecacheSystem {
    pub inner: TunecacheSystem,
    env: PythonEnv,
    /// Local-disk directory for the per-rank entry files.
    tuned_root: PathBuf,
    runs: u32,
    tuned_dir: PathBuf,
}

impl PythonTunecacheSystem {
    pub fn new(inner: TunecacheSystem, env: PythonEnv, tuned_root: &Path) -> Self {
        Self {
            inner,
            env,
            tuned_root: tuned_root.to_path_buf(),
            runs: 0,
            tuned_dir: PathBuf::new(),
        }
    }
}

impl SystemUnderTest for PythonTunecacheSystem {
    fn name(&self) -> String {
        self.env.system.to_owned()
    }

    fn prepare(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        self.runs += 1;
        self.tuned_dir = self
            .tuned_root
            .join(format!("{}-{}", self.env.system, self.runs));
        create_dir(&self.tuned_dir)?;
        for rank in 0..spec.ranks {
            let entries: Vec<serde_json::Value> =
                tuned_daemon_entries(rank, NEW_EPOCH, spec.new_entries, spec.shared_fraction)
                    .iter()
                    .map(entry_json)
                    .collect();
            write_json(&tuned_file(&self.tuned_dir, rank), &entries)?;
        }
        self.inner.prepare(spec)
    }

    fn rank_command(&self, _spec: &ScenarioSpec, rank: u32) -> Command {
        let mut command = self.env.command(TUNECACHE_RANK_PY);
        command
            .arg("--socket")
            .arg(self.inner.socket())
            .arg("--rank")
            .arg(rank.to_string())
            .arg("--entries")
            .arg(tuned_file(&self.tuned_dir, rank))
            .arg("--namespace")
            .arg(NAMESPACE)
            .arg("--device")
            .arg(DEVICE)
            .arg("--system")
            .arg(self.env.system);
        command
    }

    fn finish(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        let finished = self.inner.finish(spec);
        // The entry files are not needed afterwards; a failed removal only costs space.
        let _ = std::fs::remove_dir_all(&self.tuned_dir);
        finished
    }

    fn bytes_written_by_system(&self) -> u64 {
        self.inner.bytes_written_by_system()
    }
}

/// The file-lock "before" peer with Python ranks (`filelock_rank.py`) on the same initial file
/// as the Rust peer.
pub struct PythonFileLockPeer {
    env: PythonEnv,
    tuned_root: PathBuf,
    runs: u32,
    tuned_dir: PathBuf,
}

impl PythonFileLockPeer {
    pub fn new(env: PythonEnv, tuned_root: &Path) -> Self {
        Self {
            env,
            tuned_root: tuned_root.to_path_buf(),
            runs: 0,
            tuned_dir: PathBuf::new(),
        }
    }
}

impl SystemUnderTest for PythonFileLockPeer {
    fn name(&self) -> String {
        FILELOCK_PY_BEFORE.to_owned()
    }

    fn prepare(&mut self, spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        self.runs += 1;
        self.tuned_dir = self.tuned_root.join(format!("filelock-py-{}", self.runs));
        create_dir(&self.tuned_dir)?;
        for rank in 0..spec.ranks {
            let tuned = tuned_entries(rank, NEW_EPOCH, spec.new_entries, spec.shared_fraction);
            let sections = serde_json::json!({ "shared": tuned.shared, "own": tuned.own });
            write_json(&tuned_file(&self.tuned_dir, rank), &sections)?;
        }
        create_dir(&spec.dir)?;
        write_initial_cache(
            &FileLockPeer::cache_path(spec),
            spec.ranks,
            spec.existing,
            spec.shared_fraction,
        )
        .map_err(|err| ScenarioError::Prepare(err.to_string()))?;
        Ok(())
    }

    fn rank_command(&self, spec: &ScenarioSpec, rank: u32) -> Command {
        let mut command = self.env.command(FILELOCK_RANK_PY);
        command
            .arg("--cache")
            .arg(FileLockPeer::cache_path(spec))
            .arg("--rank")
            .arg(rank.to_string())
            .arg("--entries")
            .arg(tuned_file(&self.tuned_dir, rank));
        command
    }

    fn finish(&mut self, _spec: &ScenarioSpec) -> Result<(), ScenarioError> {
        let _ = std::fs::remove_dir_all(&self.tuned_dir);
        Ok(())
    }
}

/// What one Python rank parses at least, for one R (medians of one uncontended process).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PythonParse {
    pub ranks: u32,
    /// Whose parse: "binding" (the package over the Rust client) or "grpcio" (the one before).
    #[serde(default)]
    pub client: String,
    /// Entries and bytes of rank 0's Scan (shared + its own) for this R.
    pub scan_entries: usize,
    pub scan_bytes: usize,
    /// Entries the rank's in-memory cache holds after building it from the Scan.
    pub view_entries: usize,
    /// protobuf's parse of those Scan bytes.
    pub scan_parse_ms: f64,
    /// That parse plus building the rank's in-memory cache (what the rank does with the bytes).
    pub scan_view_ms: f64,
    /// The initial cache file of this R, parsed whole by `json.loads`.
    pub file_bytes: usize,
    pub file_entries: usize,
    pub file_parse_ms: f64,
}

/// Measures [`PythonParse`] for R = `ranks`: a daemon set up as for the scenario (`daemon` is
/// prepared and finished here), the initial cache file written beside it, and `parse_floor.py`.
pub fn measure_python_parse(
    env: &PythonEnv,
    daemon: &mut TunecacheSystem,
    spec: &ScenarioSpec,
    runs: usize,
) -> Result<PythonParse, String> {
    daemon.prepare(spec).map_err(|err| err.to_string())?;
    // Beside the daemon's shared directory, not in it: that directory is the daemon's own.
    let cache = spec
        .dir
        .with_file_name(format!("autotuner_cache-r{}.json", spec.ranks));
    let measured = write_initial_cache(&cache, spec.ranks, spec.existing, spec.shared_fraction)
        .map_err(|err| err.to_string())
        .and_then(|_| {
            env.command(PARSE_FLOOR_PY)
                .arg("--socket")
                .arg(daemon.socket())
                .arg("--namespace")
                .arg(NAMESPACE)
                .arg("--device")
                .arg(DEVICE)
                .arg("--rank")
                .arg("0")
                .arg("--cache")
                .arg(&cache)
                .arg("--runs")
                .arg(runs.to_string())
                .output()
                .map_err(|err| format!("running {}: {err}", env.python.display()))
        });
    let finished = daemon.finish(spec);
    let output = measured?;
    finished.map_err(|err| err.to_string())?;
    if !output.status.success() {
        return Err(format!(
            "parse_floor.py failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let mut value: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|err| format!("parse_floor.py report: {err}"))?;
    value["ranks"] = spec.ranks.into();
    serde_json::from_value(value).map_err(|err| format!("parse_floor.py report: {err}"))
}
