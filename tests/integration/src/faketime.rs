//! A daemon process whose wall clock is off by a fixed offset: libfaketime preloaded into it
//! (`LD_PRELOAD` and `FAKETIME`), so that what it records is dated in the past (or future) while
//! the test and every other process keep the real time. Only the wall clock moves: the
//! monotonic clock stays real, as tokio's timers need.
//!
//! libfaketime is required, not optional: a test that asks for it fails without it (`apt-get
//! install faketime`), rather than passing without having run.

use std::path::PathBuf;
use std::process::Command;

/// Where libfaketime is looked for, after `$TUNECACHE_LIBFAKETIME`: Debian's and Ubuntu's
/// multiarch directories (`/usr/lib/<triple>/faketime`), then the other usual prefixes.
const LIBRARY: &str = "libfaketime.so.1";
const PREFIXES: [&str; 4] = [
    "/usr/lib/faketime",
    "/usr/lib64/faketime",
    "/usr/local/lib/faketime",
    "/usr/local/lib",
];

/// The libfaketime library; panics, saying how to install it, when there is none.
pub fn library() -> PathBuf {
    if let Some(path) = std::env::var_os("TUNECACHE_LIBFAKETIME").filter(|path| !path.is_empty()) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "$TUNECACHE_LIBFAKETIME {path:?} is no file");
        return path;
    }
    let multiarch = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(|entry| Some(entry.ok()?.path().join("faketime")));
    multiarch
        .chain(PREFIXES.iter().map(PathBuf::from))
        .map(|dir| dir.join(LIBRARY))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{LIBRARY} not found: this test runs the daemon with its clock moved by \
                 libfaketime; install it (`apt-get install -y faketime`) or set \
                 $TUNECACHE_LIBFAKETIME"
            )
        })
}

/// A wall-clock offset in libfaketime's relative syntax: "-40d" (40 days ago), "+2h"; or a
/// file holding one, read again on every clock call, so a running process's clock can be
/// moved on (`Faketime::following`, `Faketime::set`).
#[derive(Clone, Debug)]
pub struct Faketime {
    offset: String,
    file: Option<PathBuf>,
}

impl Faketime {
    pub fn offset(offset: &str) -> Faketime {
        assert!(
            offset.starts_with(['+', '-']),
            "{offset:?}: a relative offset (+N or -N, with s, m, h, d or y)"
        );
        Faketime {
            offset: offset.to_owned(),
            file: None,
        }
    }

    /// The offset `file` holds, whenever the process reads its clock: `set` moves every
    /// process started with it at once. The file is written with no offset if missing.
    pub fn following(file: &std::path::Path) -> Faketime {
        if !file.exists() {
            Faketime::set(file, 0);
        }
        Faketime {
            offset: String::new(),
            file: Some(file.to_path_buf()),
        }
    }

    /// Moves the clocks that follow `file` to `days` days from now.
    pub fn set(file: &std::path::Path, days: u32) {
        // Written whole, then renamed: a reader never sees half an offset.
        let temp = file.with_extension("tmp");
        std::fs::write(&temp, format!("+{days}d\n")).expect("writing the faketime file");
        std::fs::rename(&temp, file).expect("placing the faketime file");
    }

    /// `days` days before now.
    pub fn days_ago(days: u32) -> Faketime {
        Faketime::offset(&format!("-{days}d"))
    }

    /// Runs `command` with this offset: the library preloaded (before any the environment
    /// preloads already), the offset, and the monotonic clock left real.
    pub fn apply(&self, command: &mut Command) {
        let mut preload = library().into_os_string();
        if let Some(others) = std::env::var_os("LD_PRELOAD").filter(|others| !others.is_empty()) {
            preload.push(":");
            preload.push(others);
        }
        command.env("LD_PRELOAD", preload);
        match &self.file {
            Some(file) => command
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_NO_CACHE", "1"),
            None => command.env("FAKETIME", &self.offset),
        };
        command
            // Both names: libfaketime 0.9.8 and later read the first, older ones the second.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("DONT_FAKE_MONOTONIC", "1");
    }
}
