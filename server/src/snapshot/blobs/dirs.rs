//! The directories of `v2/artifacts/` on disk: the blob directory checked (and made, when
//! this daemon may) before a publish, the directory a writer uid links its blobs into found or
//! made, and the directories of a uid that readers and sweeps look in. What may be trusted is
//! for `plan::blob_layout` and `plan::trust` to say; this only looks and makes.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::snapshot::plan::blob_layout::{self, DirName, WriterDir};
use crate::snapshot::plan::trust::{self, DirFacts, DirVerdict, MissingDir, Writers};

use super::{Squats, BLOB_DIR};

/// Fallback names tried before giving up (each is new: a taken one means a race or an attack).
const FALLBACK_TRIES: usize = 8;

/// Why blobs cannot be published now.
#[derive(Debug)]
pub(crate) enum DirTrouble {
    /// The blob directory is not safe to use, or is the administrator's to make: the message.
    Refused(String),
    Io {
        what: &'static str,
        path: PathBuf,
        error: io::Error,
    },
}

impl DirTrouble {
    pub(crate) fn message(&self) -> String {
        match self {
            DirTrouble::Refused(why) => format!("publishing artifact blobs: {why}"),
            DirTrouble::Io { what, path, error } => {
                format!("publishing artifact blobs failed: {what} {path:?}: {error}")
            }
        }
    }

    /// What makes two failures the same, for logging each once.
    pub(crate) fn cause(&self) -> String {
        match self {
            DirTrouble::Refused(why) => why.clone(),
            DirTrouble::Io { what, error, .. } => format!("{what}:{:?}", error.kind()),
        }
    }
}

fn io_trouble<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DirTrouble + 'a {
    move |error| DirTrouble::Io {
        what,
        path: path.to_owned(),
        error,
    }
}

pub(super) fn dir_facts(metadata: &fs::Metadata) -> DirFacts {
    DirFacts {
        is_symlink: metadata.file_type().is_symlink(),
        is_dir: metadata.is_dir(),
        owner: metadata.uid(),
        mode: metadata.mode() & 0o7777,
    }
}

/// Makes `dir` with exactly `mode` (the umask may have cleared bits of it). `Ok(false)`: it
/// was there already.
fn make_dir(dir: &Path, mode: u32) -> io::Result<bool> {
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map(|()| true),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(error),
    }
}

/// `v2/artifacts/`, checked by the rules of `v2/` itself before a publish, and made when it
/// is missing and this daemon may make it (with `v2/` as its parent). An untrusted owner of
/// it is reported as squatting.
pub(crate) fn check_blob_dir(
    segment_dir: &Path,
    writers: Writers<'_>,
    squats: &Squats,
) -> Result<PathBuf, DirTrouble> {
    let dir = segment_dir.join(BLOB_DIR);
    for _ in 0..2 {
        let metadata = match fs::symlink_metadata(&dir) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let parent_mode = fs::metadata(segment_dir).ok().map(|m| m.mode());
                let euid_is_root = nix::unistd::geteuid().is_root();
                match trust::missing_segment_dir(euid_is_root, parent_mode) {
                    MissingDir::Create { mode } => {
                        make_dir(&dir, mode).map_err(io_trouble("creating", &dir))?;
                        continue;
                    }
                    MissingDir::LeaveToAdmin => {
                        return Err(DirTrouble::Refused(trust::left_to_admin_message(
                            &dir,
                            segment_dir,
                            parent_mode.unwrap_or(0),
                        )));
                    }
                }
            }
            Err(error) => return Err(io_trouble("checking", &dir)(error)),
        };
        let facts = dir_facts(&metadata);
        return match trust::judge_segment_dir(facts, writers) {
            DirVerdict::Usable { .. } => Ok(dir),
            DirVerdict::Unsafe(why) => {
                if blob_layout::untrusted_dir_owner(facts.owner, writers) {
                    squats.report(&dir, facts.owner);
                }
                Err(DirTrouble::Refused(format!(
                    "refusing to use {dir:?} (owner uid {}, mode {:04o}): it {why}",
                    facts.owner, facts.mode
                )))
            }
        };
    }
    Err(DirTrouble::Refused(format!(
        "{dir:?} keeps changing under this daemon"
    )))
}

/// The directory `uid`'s blobs go into: `blob_dir/<uid>/`, made if missing; when another user
/// took that name (reported), a directory `<uid>.<hex>/` of `uid`'s, found or made. It has
/// mode `mode` (`trust::written_modes`: only its uid may add, replace or remove a blob there,
/// and in the `v2/` every user shares only its uid reads them unless the daemon is public);
/// one an older daemon made with another mode is set to it.
pub(crate) fn writer_dir(
    blob_dir: &Path,
    uid: u32,
    mode: u32,
    squats: &Squats,
) -> Result<PathBuf, DirTrouble> {
    let own = blob_dir.join(blob_layout::own_dir_name(uid));
    for _ in 0..2 {
        match fs::symlink_metadata(&own) {
            Ok(metadata) => match blob_layout::judge_writer_dir(dir_facts(&metadata), uid) {
                WriterDir::Usable => return with_mode(own, &metadata, mode),
                WriterDir::Squatted { owner } => {
                    squats.report(&own, owner);
                    break;
                }
                WriterDir::NotADirectory => break,
            },
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                if make_dir(&own, mode).map_err(io_trouble("creating", &own))? {
                    return Ok(own);
                }
            }
            Err(error) => return Err(io_trouble("checking", &own)(error)),
        }
    }
    let listed = fallback_dirs(blob_dir).map_err(io_trouble("listing", blob_dir))?;
    if let Some((_, dir)) = listed.into_iter().find(|(owner, _)| *owner == uid) {
        let metadata = fs::symlink_metadata(&dir).map_err(io_trouble("checking", &dir))?;
        return with_mode(dir, &metadata, mode);
    }
    for _ in 0..FALLBACK_TRIES {
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| {
            io_trouble("naming a directory in", blob_dir)(io::Error::other(e.to_string()))
        })?;
        let name = blob_layout::fallback_dir_name(uid, u64::from_le_bytes(nonce));
        let dir = blob_dir.join(name);
        if make_dir(&dir, mode).map_err(io_trouble("creating", &dir))? {
            tracing::info!(dir = ?dir, "another user took this uid's blob directory; its blobs go to a new one of its own");
            return Ok(dir);
        }
    }
    Err(DirTrouble::Refused(format!(
        "no directory of uid {uid} could be made in {blob_dir:?}: every name tried was taken"
    )))
}

/// `dir` (this uid's own, as `metadata` saw it) with mode `mode`, set if it has another.
fn with_mode(dir: PathBuf, metadata: &fs::Metadata, mode: u32) -> Result<PathBuf, DirTrouble> {
    if metadata.mode() & 0o7777 != mode {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
            .map_err(io_trouble("setting the mode of", &dir))?;
    }
    Ok(dir)
}

/// Every usable fallback directory in `blob_dir` (`<uid>.<hex>/` that `uid` owns), with its
/// uid, in name order; none when `blob_dir` is missing.
pub(super) fn fallback_dirs(blob_dir: &Path) -> io::Result<Vec<(u32, PathBuf)>> {
    let listing = match fs::read_dir(blob_dir) {
        Ok(listing) => listing,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut found = Vec::new();
    for item in listing {
        let item = item?;
        let Some(name) = item.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let DirName::Fallback(uid) = blob_layout::classify_dir(&name) else {
            continue;
        };
        let path = blob_dir.join(&name);
        let usable = fs::symlink_metadata(&path).is_ok_and(|metadata| {
            blob_layout::judge_writer_dir(dir_facts(&metadata), uid) == WriterDir::Usable
        });
        if usable {
            found.push((uid, path));
        }
    }
    found.sort();
    Ok(found)
}

/// `uid`'s usable directories in `blob_dir`: its own `<uid>/`, then its fallbacks.
pub(super) fn dirs_of(blob_dir: &Path, uid: u32) -> io::Result<Vec<PathBuf>> {
    let own = blob_dir.join(blob_layout::own_dir_name(uid));
    let mut dirs = Vec::new();
    if fs::symlink_metadata(&own).is_ok_and(|metadata| {
        blob_layout::judge_writer_dir(dir_facts(&metadata), uid) == WriterDir::Usable
    }) {
        dirs.push(own);
    }
    dirs.extend(
        fallback_dirs(blob_dir)?
            .into_iter()
            .filter(|(owner, _)| *owner == uid)
            .map(|(_, dir)| dir),
    );
    Ok(dirs)
}
