//! The cache file on disk: reading the existing one ([`read_existing`]: no symlinks, regular
//! files only, bounded) and replacing it so that readers never see a part ([`write_atomically`]).

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::TrtllmError;

/// Most bytes [`read_existing`] reads of a cache file.
pub const MAX_CACHE_FILE_BYTES: u64 = 1 << 30;

/// The text of the cache file at `path`, `None` when there is none. Not followed if it is a
/// symlink, refused unless it is a regular file of at most [`MAX_CACHE_FILE_BYTES`].
pub fn read_existing(path: &Path) -> Result<Option<String>, TrtllmError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read_error = |source| TrtllmError::Read {
        path: path.to_owned(),
        source,
    };
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(read_error(error)),
    };
    let metadata = file.metadata().map_err(read_error)?;
    if !metadata.is_file() {
        return Err(read_error(std::io::Error::other("not a regular file")));
    }
    if metadata.len() > MAX_CACHE_FILE_BYTES {
        return Err(read_error(std::io::Error::other(format!(
            "{} bytes, more than the {MAX_CACHE_FILE_BYTES} read",
            metadata.len()
        ))));
    }
    let mut text = String::new();
    file.take(MAX_CACHE_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(read_error)?;
    Ok(Some(text))
}

/// Replaces the file at `path` with `bytes` so that readers see the old file or the new one,
/// never a part: a temporary file in the same directory, synced, then renamed over `path`, as
/// TensorRT-LLM's current writers do. The new file keeps the old one's permissions (0644 when
/// there was none). Hold the [`WriterLock`](crate::WriterLock) around reading, merging and this call.
///
/// Older TensorRT-LLM writers rewrote the file in place under `flock` on the file itself; one of
/// those still running would write to the replaced inode, so do not export while they run.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), TrtllmError> {
    let write_error = |source| TrtllmError::Write {
        path: path.to_owned(),
        source,
    };
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut temporary = tempfile::Builder::new()
        .prefix(".tunecache-trtllm-")
        .suffix(".tmp")
        .tempfile_in(directory)
        .map_err(write_error)?;
    temporary.write_all(bytes).map_err(write_error)?;
    // NamedTempFile creates the file 0600; a cache file other users' ranks read needs more.
    let permissions = match fs::metadata(path) {
        Ok(existing) => Some(existing.permissions()),
        Err(_) => default_file_permissions(),
    };
    if let Some(permissions) = permissions {
        temporary
            .as_file()
            .set_permissions(permissions)
            .map_err(write_error)?;
    }
    temporary.as_file().sync_all().map_err(write_error)?;
    temporary
        .persist(path)
        .map_err(|persist_error| write_error(persist_error.error))?;
    // The rename is only durable once the directory is synced.
    fs::File::open(directory)
        .and_then(|dir| dir.sync_all())
        .map_err(write_error)?;
    Ok(())
}

#[cfg(unix)]
fn default_file_permissions() -> Option<fs::Permissions> {
    use std::os::unix::fs::PermissionsExt;
    Some(fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn default_file_permissions() -> Option<fs::Permissions> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomically_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("autotuner_cache.json");
        write_atomically(&path, b"{\"old\": 1}").expect("first write");
        write_atomically(&path, b"{\"new\": 2}").expect("second write");
        assert_eq!(fs::read(&path).expect("read"), b"{\"new\": 2}");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("autotuner_cache.json")]
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
            assert_eq!(mode, 0o644);
        }
        let missing_dir = dir.path().join("missing").join("cache.json");
        assert!(matches!(
            write_atomically(&missing_dir, b"{}"),
            Err(TrtllmError::Write { .. })
        ));
    }
}
