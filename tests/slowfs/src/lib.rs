//! Owns the slowfs filesystem: a FUSE passthrough of one backing directory in which every
//! operation first passes an [`OpGate`] (hang while the gate is closed, then sleep a fixed
//! latency). It stands in for a slow or stalled shared filesystem (NFS under load) in the
//! tunecache benchmarks, so the file-lock cache and the daemon can be compared on it.
//!
//! Design choices, and why:
//! - Inode numbers are our own (root = 1), mapped to paths relative to the backing dir; the
//!   backing filesystem's inode numbers could collide with FUSE's reserved root number.
//! - Reads and writes use `pread`/`pwrite` on a backing fd per FUSE file handle, so
//!   concurrent requests on one file need no lock of ours.
//! - Attribute and entry TTLs default to zero so every path walk reaches us and pays the
//!   latency (a worst case of NFS attribute caching; `attr_ttl` relaxes it).
//! - POSIX (`lockf`/`fcntl`) and `flock` locks are *not* negotiated with the kernel
//!   (`FUSE_POSIX_LOCKS`/`FUSE_FLOCK_LOCKS` off), so the kernel grants them locally on the
//!   FUSE inode. They exclude each other correctly between processes on this node (the only
//!   case the benchmarks need) but do not pay the latency themselves; opening the lock file
//!   does.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// Errors setting up a slowfs instance.
#[derive(Debug, thiserror::Error)]
pub enum SlowFsError {
    #[error("backing directory {path}: {source}")]
    Backing { path: PathBuf, source: io::Error },
    #[error("backing path {0} is not a directory")]
    NotADirectory(PathBuf),
}

/// What every operation passes before it runs: a hang switch and a fixed latency.
///
/// Shared between the filesystem threads and whoever controls the hang (the signal thread
/// of the binary, or a test).
#[derive(Debug)]
pub struct OpGate {
    latency: Duration,
    hung: Mutex<bool>,
    hang_changed: Condvar,
    ops_passed: AtomicU64,
}

impl OpGate {
    pub fn new(latency: Duration) -> Self {
        Self {
            latency,
            hung: Mutex::new(false),
            hang_changed: Condvar::new(),
            ops_passed: AtomicU64::new(0),
        }
    }

    pub fn latency(&self) -> Duration {
        self.latency
    }

    fn hung_flag(&self) -> MutexGuard<'_, bool> {
        // A poisoned flag is still a valid bool: keep serving rather than wedge the mount.
        self.hung
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets the hang state; returns the new state.
    pub fn set_hung(&self, hung: bool) -> bool {
        *self.hung_flag() = hung;
        self.hang_changed.notify_all();
        hung
    }

    /// Flips the hang state; returns the new state.
    pub fn toggle_hung(&self) -> bool {
        let mut flag = self.hung_flag();
        *flag = !*flag;
        let now_hung = *flag;
        drop(flag);
        self.hang_changed.notify_all();
        now_hung
    }

    pub fn is_hung(&self) -> bool {
        *self.hung_flag()
    }

    /// Operations that have gone through the gate so far.
    pub fn ops_passed(&self) -> u64 {
        self.ops_passed.load(Ordering::Relaxed)
    }

    /// Blocks while hung, then sleeps the latency. Called at the start of every operation.
    pub fn pass(&self) {
        let mut flag = self.hung_flag();
        while *flag {
            flag = self
                .hang_changed
                .wait(flag)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        drop(flag);
        if !self.latency.is_zero() {
            std::thread::sleep(self.latency);
        }
        self.ops_passed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Inode number <-> path (relative to the backing dir) table.
#[derive(Debug, Default)]
struct InodeTable {
    path_of: HashMap<u64, PathBuf>,
    ino_of: HashMap<PathBuf, u64>,
    next_ino: u64,
}

impl InodeTable {
    fn new() -> Self {
        let mut table = Self {
            next_ino: INodeNo::ROOT.0 + 1,
            ..Self::default()
        };
        table.path_of.insert(INodeNo::ROOT.0, PathBuf::new());
        table.ino_of.insert(PathBuf::new(), INodeNo::ROOT.0);
        table
    }

    fn ino_for(&mut self, rel: &Path) -> u64 {
        if let Some(ino) = self.ino_of.get(rel) {
            return *ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.path_of.insert(ino, rel.to_path_buf());
        self.ino_of.insert(rel.to_path_buf(), ino);
        ino
    }

    fn forget_path(&mut self, rel: &Path) {
        if let Some(ino) = self.ino_of.remove(rel) {
            self.path_of.remove(&ino);
        }
    }

    /// Moves `from` (and everything below it) to `to`, dropping whatever `to` was.
    fn rename(&mut self, from: &Path, to: &Path) {
        self.forget_path(to);
        let moved: Vec<(PathBuf, u64)> = self
            .ino_of
            .iter()
            .filter(|(path, _)| path.starts_with(from))
            .map(|(path, ino)| (path.clone(), *ino))
            .collect();
        for (old_path, ino) in moved {
            let Ok(suffix) = old_path.strip_prefix(from) else {
                continue;
            };
            let new_path = if suffix.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(suffix)
            };
            self.ino_of.remove(&old_path);
            self.ino_of.insert(new_path.clone(), ino);
            self.path_of.insert(ino, new_path);
        }
    }
}

/// The attribute changes of one `setattr` request that slowfs applies.
#[derive(Debug, Clone, Copy)]
struct AttrChanges {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

/// The passthrough filesystem.
#[derive(Debug)]
pub struct SlowFs {
    backing_root: PathBuf,
    gate: Arc<OpGate>,
    attr_ttl: Duration,
    inodes: Mutex<InodeTable>,
    open_files: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
}

/// Answers an operation that returns no data: ok, or the errno.
fn reply_empty(result: Result<(), Errno>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(errno) => reply.error(errno),
    }
}

fn errno_of(err: &io::Error) -> Errno {
    Errno::from_i32(err.raw_os_error().unwrap_or(libc::EIO))
}

fn file_type_of(meta: &fs::Metadata) -> FileType {
    FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile)
}

fn system_time(secs: i64, nanos: i64) -> SystemTime {
    let nanos = u32::try_from(nanos).unwrap_or(0);
    match u64::try_from(secs) {
        Ok(secs) => UNIX_EPOCH + Duration::new(secs, nanos),
        Err(_) => UNIX_EPOCH,
    }
}

fn attr_of(ino: u64, meta: &fs::Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: meta.size(),
        blocks: meta.blocks(),
        atime: system_time(meta.atime(), meta.atime_nsec()),
        mtime: system_time(meta.mtime(), meta.mtime_nsec()),
        ctime: system_time(meta.ctime(), meta.ctime_nsec()),
        crtime: system_time(meta.ctime(), meta.ctime_nsec()),
        kind: file_type_of(meta),
        // The low 12 bits are the permission bits; the file type is carried by `kind`.
        perm: (meta.mode() & 0o7777) as u16,
        nlink: u32::try_from(meta.nlink()).unwrap_or(u32::MAX),
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: u32::try_from(meta.rdev()).unwrap_or(0),
        blksize: u32::try_from(meta.blksize()).unwrap_or(4096),
        flags: 0,
    }
}

fn time_or_now(value: TimeOrNow) -> SystemTime {
    match value {
        TimeOrNow::SpecificTime(time) => time,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// Open flags the backing `open` must not see again: access mode and creation flags are set
/// through `OpenOptions`, and `O_APPEND` would make `pwrite` ignore the kernel's offsets.
fn passthrough_open_flags(flags: i32) -> i32 {
    flags & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND)
}

fn open_options_for(flags: i32) -> OpenOptions {
    let mut options = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => options.write(true),
        libc::O_RDWR => options.read(true).write(true),
        _ => options.read(true),
    };
    options.truncate(flags & libc::O_TRUNC != 0);
    options.custom_flags(passthrough_open_flags(flags));
    options
}

impl SlowFs {
    pub fn new(
        backing_root: &Path,
        gate: Arc<OpGate>,
        attr_ttl: Duration,
    ) -> Result<Self, SlowFsError> {
        let backing_root = backing_root
            .canonicalize()
            .map_err(|source| SlowFsError::Backing {
                path: backing_root.to_path_buf(),
                source,
            })?;
        if !backing_root.is_dir() {
            return Err(SlowFsError::NotADirectory(backing_root));
        }
        Ok(Self {
            backing_root,
            gate,
            attr_ttl,
            inodes: Mutex::new(InodeTable::new()),
            open_files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        })
    }

    fn inode_table(&self) -> MutexGuard<'_, InodeTable> {
        self.inodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn file_table(&self) -> MutexGuard<'_, HashMap<u64, Arc<File>>> {
        self.open_files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn rel_path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.inode_table()
            .path_of
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn child_rel_path(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.rel_path(parent)?.join(name))
    }

    fn backing(&self, rel: &Path) -> PathBuf {
        self.backing_root.join(rel)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        self.file_table().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn register_file(&self, file: File) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.file_table().insert(fh, Arc::new(file));
        FileHandle(fh)
    }

    /// Stats `rel` in the backing dir and returns its attributes under our inode number.
    fn entry_attr(&self, rel: &Path) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(self.backing(rel)).map_err(|e| errno_of(&e))?;
        let ino = self.inode_table().ino_for(rel);
        Ok(attr_of(ino, &meta))
    }

    fn do_setattr(
        &self,
        ino: INodeNo,
        changes: AttrChanges,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        let AttrChanges {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        } = changes;
        let rel = self.rel_path(ino)?;
        let path = self.backing(&rel);
        let io_err = |e: io::Error| errno_of(&e);
        if let Some(mode) = mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))
                .map_err(io_err)?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid).map_err(io_err)?;
        }
        if size.is_some() || atime.is_some() || mtime.is_some() {
            // Prefer the caller's open handle: it works on a file already unlinked or renamed over.
            let file = match fh.map(|fh| self.file(fh)) {
                Some(Ok(file)) => file,
                _ => Arc::new(
                    OpenOptions::new()
                        .write(size.is_some())
                        .read(size.is_none())
                        .open(&path)
                        .map_err(io_err)?,
                ),
            };
            if let Some(size) = size {
                file.set_len(size).map_err(io_err)?;
            }
            let mut times = fs::FileTimes::new();
            if let Some(atime) = atime {
                times = times.set_accessed(time_or_now(atime));
            }
            if let Some(mtime) = mtime {
                times = times.set_modified(time_or_now(mtime));
            }
            if atime.is_some() || mtime.is_some() {
                file.set_times(times).map_err(io_err)?;
            }
        }
        let meta = fs::symlink_metadata(&path).map_err(io_err)?;
        Ok(attr_of(ino.0, &meta))
    }

    fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let from = self.child_rel_path(parent, name)?;
        let to = self.child_rel_path(newparent, newname)?;
        let to_cstring = |rel: &Path| {
            CString::new(self.backing(rel).as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
        };
        let (from_c, to_c) = (to_cstring(&from)?, to_cstring(&to)?);
        // renameat2 rather than std::fs::rename so RENAME_NOREPLACE/EXCHANGE pass through.
        // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from_c.as_ptr(),
                libc::AT_FDCWD,
                to_c.as_ptr(),
                flags.bits(),
            )
        };
        if rc != 0 {
            return Err(errno_of(&io::Error::last_os_error()));
        }
        let mut inodes = self.inode_table();
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let scratch = PathBuf::from(format!(
                "\0exchange-{}",
                self.next_fh.fetch_add(1, Ordering::Relaxed)
            ));
            inodes.rename(&from, &scratch);
            inodes.rename(&to, &from);
            inodes.rename(&scratch, &to);
        } else {
            inodes.rename(&from, &to);
        }
        Ok(())
    }
}

impl Filesystem for SlowFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.gate.pass();
        match self
            .child_rel_path(parent, name)
            .and_then(|rel| self.entry_attr(&rel))
        {
            Ok(attr) => reply.entry(&self.attr_ttl, &attr, Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.gate.pass();
        let meta = match fh.map(|fh| self.file(fh)) {
            Some(Ok(file)) => file.metadata(),
            _ => match self.rel_path(ino) {
                Ok(rel) => fs::symlink_metadata(self.backing(&rel)),
                Err(errno) => return reply.error(errno),
            },
        };
        match meta {
            Ok(meta) => reply.attr(&self.attr_ttl, &attr_of(ino.0, &meta)),
            Err(e) => reply.error(errno_of(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.gate.pass();
        let changes = AttrChanges {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        match self.do_setattr(ino, changes, fh) {
            Ok(attr) => reply.attr(&self.attr_ttl, &attr),
            Err(errno) => reply.error(errno),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.gate.pass();
        let result = self.child_rel_path(parent, name).and_then(|rel| {
            fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(self.backing(&rel))
                .map_err(|e| errno_of(&e))?;
            self.entry_attr(&rel)
        });
        match result {
            Ok(attr) => reply.entry(&self.attr_ttl, &attr, Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.gate.pass();
        let result = self.child_rel_path(parent, name).and_then(|rel| {
            fs::remove_file(self.backing(&rel)).map_err(|e| errno_of(&e))?;
            self.inode_table().forget_path(&rel);
            Ok(())
        });
        reply_empty(result, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.gate.pass();
        let result = self.child_rel_path(parent, name).and_then(|rel| {
            fs::remove_dir(self.backing(&rel)).map_err(|e| errno_of(&e))?;
            self.inode_table().forget_path(&rel);
            Ok(())
        });
        reply_empty(result, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.gate.pass();
        match self.do_rename(parent, name, newparent, newname, flags) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.gate.pass();
        let result = self.rel_path(ino).and_then(|rel| {
            open_options_for(flags.0)
                .open(self.backing(&rel))
                .map_err(|e| errno_of(&e))
        });
        match result {
            Ok(file) => reply.opened(self.register_file(file), FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.gate.pass();
        let result = self.child_rel_path(parent, name).and_then(|rel| {
            let mut options = open_options_for(flags);
            if flags & libc::O_ACCMODE == libc::O_RDONLY {
                // O_CREAT needs write access through OpenOptions; the kernel checks the caller's.
                options.write(true);
            }
            if flags & libc::O_EXCL != 0 {
                options.create_new(true);
            } else {
                options.create(true);
            }
            let file = options
                .mode(mode & !umask & 0o7777)
                .open(self.backing(&rel))
                .map_err(|e| errno_of(&e))?;
            let attr = self.entry_attr(&rel)?;
            Ok((file, attr))
        });
        match result {
            Ok((file, attr)) => {
                let fh = self.register_file(file);
                reply.created(
                    &self.attr_ttl,
                    &attr,
                    Generation(0),
                    fh,
                    FopenFlags::empty(),
                );
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.gate.pass();
        let file = match self.file(fh) {
            Ok(file) => file,
            Err(errno) => return reply.error(errno),
        };
        let mut buf = vec![0u8; size as usize];
        let mut filled = 0usize;
        // A short pread is not EOF on every filesystem; loop until EOF or the buffer is full.
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return reply.error(errno_of(&e)),
            }
        }
        reply.data(&buf[..filled]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.gate.pass();
        let result = self
            .file(fh)
            .and_then(|file| file.write_all_at(data, offset).map_err(|e| errno_of(&e)));
        match result {
            Ok(()) => reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX)),
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) sends FLUSH; an NFS client flushes dirty pages here, so it pays latency too.
        self.gate.pass();
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.gate.pass();
        self.file_table().remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.gate.pass();
        let result = self.file(fh).and_then(|file| {
            let synced = if datasync {
                file.sync_data()
            } else {
                file.sync_all()
            };
            synced.map_err(|e| errno_of(&e))
        });
        reply_empty(result, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.gate.pass();
        match self.rel_path(ino) {
            Ok(rel) if self.backing(&rel).is_dir() => {
                reply.opened(FileHandle(0), FopenFlags::empty())
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.gate.pass();
        let rel = match self.rel_path(ino) {
            Ok(rel) => rel,
            Err(errno) => return reply.error(errno),
        };
        let read_dir = match fs::read_dir(self.backing(&rel)) {
            Ok(read_dir) => read_dir,
            Err(e) => return reply.error(errno_of(&e)),
        };
        let parent_ino = rel
            .parent()
            .map(|parent| self.inode_table().ino_for(parent))
            .unwrap_or(INodeNo::ROOT.0);
        let mut entries: Vec<(u64, FileType, std::ffi::OsString)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (parent_ino, FileType::Directory, "..".into()),
        ];
        for dir_entry in read_dir.flatten() {
            let kind = dir_entry
                .file_type()
                .ok()
                .and_then(FileType::from_std)
                .unwrap_or(FileType::RegularFile);
            let child_ino = self.inode_table().ino_for(&rel.join(dir_entry.file_name()));
            entries.push((child_ino, kind, dir_entry.file_name()));
        }
        // The offset handed back to us is the index of the next entry to return.
        for (index, (entry_ino, kind, name)) in
            entries.into_iter().enumerate().skip(offset as usize)
        {
            if reply.add(INodeNo(entry_ino), index as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.gate.pass();
        match nix::sys::statvfs::statvfs(&self.backing_root) {
            Ok(stat) => reply.statfs(
                stat.blocks(),
                stat.blocks_free(),
                stat.blocks_available(),
                stat.files(),
                stat.files_free(),
                u32::try_from(stat.block_size()).unwrap_or(4096),
                u32::try_from(stat.name_max()).unwrap_or(255),
                u32::try_from(stat.fragment_size()).unwrap_or(4096),
            ),
            Err(errno) => reply.error(Errno::from_i32(errno as i32)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permission checks stay the backing filesystem's job; access() only proves existence.
        self.gate.pass();
        match self.rel_path(ino) {
            Ok(rel) if self.backing(&rel).symlink_metadata().is_ok() => reply.ok(),
            Ok(_) => reply.error(Errno::ENOENT),
            Err(errno) => reply.error(errno),
        }
    }
}

/// Mount settings for slowfs: `threads` FUSE worker threads, each with its own cloned
/// `/dev/fuse` fd, so a request sleeping in the gate does not hold up the others.
pub fn mount_config(threads: usize, allow_other: bool) -> fuser::Config {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("slowfs".to_string()),
        fuser::MountOption::Subtype("slowfs".to_string()),
    ];
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    config
}

/// Whether `mountpoint` is currently a FUSE mount, per `/proc/self/mountinfo`.
pub fn is_fuse_mounted(mountpoint: &Path) -> bool {
    // Canonicalize only the parent: a stat of the mountpoint itself would block on a hung mount.
    let (Some(parent), Some(name)) = (mountpoint.parent(), mountpoint.file_name()) else {
        return false;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(canonical_parent) = parent.canonicalize() else {
        return false;
    };
    let canonical = canonical_parent.join(name);
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let fstype = line
            .split(" - ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next());
        fields.get(4).map(Path::new) == Some(canonical.as_path())
            && fstype.is_some_and(|fstype| fstype.starts_with("fuse"))
    })
}
