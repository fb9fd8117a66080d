//! One daemon per state directory: the journal and the record of published segments are
//! written by one process only, or one daemon's compaction would drop what another appended.
//!
//! At start the daemon takes an exclusive `flock` on `<state_dir>/daemon.lock` (opened without
//! following a symlink) and writes its pid and socket into it; a second daemon finds the lock
//! held and refuses to start, naming the holder. The lock lives as long as the process: the
//! kernel drops it when the daemon exits, however it exits, so no stale lock is left behind.
//! On NFS, Linux turns `flock` into a whole-file POSIX lock, which works where the server
//! supports locking (NFSv4, or NFSv3 with lockd); on a `nolock` mount every daemon must get a
//! state directory of its own (docs/launchers.md).
//!
//! The same directory keeps `last-shutdown.json`: what the previous run's last publish at
//! shutdown did, reported in Stats by the next run.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;

use crate::error::{Error, Result};

const LOCK_FILE: &str = "daemon.lock";
const LAST_SHUTDOWN_FILE: &str = "last-shutdown.json";

/// Held while the daemon runs; the kernel releases it on exit.
pub struct StateLock {
    _lock: Flock<File>,
    dir: PathBuf,
}

impl StateLock {
    /// Takes the state directory for this daemon (creating it 0700 if missing).
    pub fn acquire(dir: &Path, socket: &Path) -> Result<StateLock> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io("creating the state directory", dir, e))?;
        let path = dir.join(LOCK_FILE);
        let opened = nix::fcntl::open(
            &path,
            OFlag::O_CREAT | OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|errno| Error::io("opening the state directory's lock", &path, errno.into()))?;
        let file = File::from(opened);
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((mut file, _)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(Error::StateDirInUse {
                    dir: dir.to_path_buf(),
                    holder: holder.trim().to_owned(),
                });
            }
        };
        let holder = format!("pid {} serving {}\n", std::process::id(), socket.display());
        let write = |file: &mut File| -> std::io::Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(holder.as_bytes())
        };
        write(&mut lock).map_err(|e| Error::io("writing the state directory's lock", &path, e))?;
        Ok(StateLock {
            _lock: lock,
            dir: dir.to_path_buf(),
        })
    }

    /// What the previous run said about its last publish at shutdown; empty if nothing.
    pub fn previous_shutdown(&self) -> String {
        std::fs::read_to_string(self.dir.join(LAST_SHUTDOWN_FILE))
            .map(|text| text.trim().to_owned())
            .unwrap_or_default()
    }

    /// Keeps this run's outcome for the next one.
    pub fn record_shutdown(&self, outcome: &str) {
        let path = self.dir.join(LAST_SHUTDOWN_FILE);
        if let Err(error) = std::fs::write(&path, format!("{outcome}\n")) {
            tracing::debug!(path = %path.display(), %error, "shutdown outcome not kept");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path(), Path::new("/run/a.sock")).unwrap();
        match StateLock::acquire(dir.path(), Path::new("/run/b.sock")) {
            Err(Error::StateDirInUse { holder, .. }) => {
                assert!(holder.contains(&std::process::id().to_string()), "{holder}");
                assert!(holder.contains("/run/a.sock"), "{holder}");
            }
            other => panic!("a second lock was granted: {:?}", other.err()),
        }
        first.record_shutdown("published");
        drop(first);
        let again = StateLock::acquire(dir.path(), Path::new("/run/b.sock")).unwrap();
        assert_eq!(again.previous_shutdown(), "published");
    }
}
