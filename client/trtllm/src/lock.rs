//! The writers' lock: `<file>.lock`, taken the way TensorRT-LLM's own writers take it (both a
//! POSIX `lockf` and a BSD `flock`), around the read-merge-replace of a cache file.

use std::fs;
use std::path::{Path, PathBuf};

use crate::TrtllmError;

/// `<file>.lock`: the lock TensorRT-LLM's writers take around their read-merge-rename of
/// the cache file: a POSIX lock (`fcntl.lockf`) in the newest versions, `flock(LOCK_EX)`
/// (py-filelock) in earlier ones. On Linux the two kinds do not exclude each other, so
/// [`WriterLock`] takes both.
pub fn lock_path(cache_path: &Path) -> PathBuf {
    let mut name = cache_path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The writers' lock on a cache file, held until dropped (closing the descriptor releases it).
#[derive(Debug)]
pub struct WriterLock {
    _file: fs::File,
}

/// How often a blocked [`WriterLock::acquire`] tries again.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl WriterLock {
    /// Takes `<cache_path>.lock` exclusively (both kinds of lock, see [`lock_path`]), waiting
    /// at most `timeout` for the writer that holds it. The lock file is created if missing (0644) and never followed if it is a
    /// symlink: the cache may sit in a directory other users can write.
    pub fn acquire(cache_path: &Path, timeout: std::time::Duration) -> Result<Self, TrtllmError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let path = lock_path(cache_path);
        let lock_error = |source| TrtllmError::Lock {
            path: path.clone(),
            source,
        };
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(lock_error)?;
        let metadata = file.metadata().map_err(lock_error)?;
        if !metadata.is_file() {
            return Err(lock_error(std::io::Error::other("not a regular file")));
        }
        let started = std::time::Instant::now();
        let busy = |error: &std::io::Error| {
            matches!(
                error.raw_os_error(),
                Some(libc::EWOULDBLOCK | libc::EACCES | libc::EINTR)
            )
        };
        loop {
            let fd = file.as_raw_fd();
            // SAFETY: flock and lockf on a descriptor this function owns.
            let error = if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                std::io::Error::last_os_error()
            } else if unsafe { libc::lockf(fd, libc::F_TLOCK, 0) } == 0 {
                // Both held; closing the descriptor releases both.
                return Ok(WriterLock { _file: file });
            } else {
                let error = std::io::Error::last_os_error();
                // SAFETY: as above; never hold one lock while waiting for the other.
                unsafe { libc::flock(fd, libc::LOCK_UN) };
                error
            };
            if !busy(&error) {
                return Err(lock_error(error));
            }
            if started.elapsed() >= timeout {
                return Err(TrtllmError::LockTimeout {
                    path,
                    waited: timeout,
                });
            }
            std::thread::sleep(LOCK_POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_lock_waits_for_the_holder_and_times_out_clearly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("cache.json");
        let held = WriterLock::acquire(&cache, std::time::Duration::ZERO).expect("first lock");
        assert!(lock_path(&cache).is_file());
        let started = std::time::Instant::now();
        let error = WriterLock::acquire(&cache, std::time::Duration::from_millis(300))
            .expect_err("held elsewhere");
        assert!(started.elapsed() >= std::time::Duration::from_millis(300));
        assert!(matches!(error, TrtllmError::LockTimeout { .. }), "{error}");
        assert!(error.to_string().contains("cache.json.lock"), "{error}");
        let waiter = std::thread::spawn({
            let cache = cache.clone();
            move || WriterLock::acquire(&cache, std::time::Duration::from_secs(30)).map(|_| ())
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(held);
        waiter
            .join()
            .expect("join")
            .expect("acquired once released");
        // A symlink planted at the lock path is not followed.
        let other = dir.path().join("other.json");
        std::os::unix::fs::symlink(dir.path().join("target"), lock_path(&other)).expect("symlink");
        assert!(matches!(
            WriterLock::acquire(&other, std::time::Duration::ZERO),
            Err(TrtllmError::Lock { .. })
        ));
        assert!(!dir.path().join("target").exists());
    }
}
