//! Linking this node's blobs into its writer directory (`dirs::writer_dir`), one file per
//! digest: a temporary file, then a link, which never replaces what another node of the same
//! uid linked in first. Each blob succeeds or fails on its own; a failure is handed back, never
//! stops the others.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::artifacts::Artifacts;
use crate::fsx::atomic::{Durability, TempFile, TempOptions};
use crate::tiers::PublishedBlobs;

/// Why one blob was not published.
#[derive(Debug)]
pub(crate) enum BlobTrouble {
    /// An entry names it and this node's store no longer holds it.
    NotHeld,
    Io {
        path: PathBuf,
        error: io::Error,
    },
}

impl BlobTrouble {
    pub(crate) fn message(&self, digest: &str) -> String {
        match self {
            BlobTrouble::NotHeld => format!(
                "publishing artifact blob {digest}: a published entry names it and this node no \
                 longer holds it"
            ),
            BlobTrouble::Io { path, error } => {
                format!("publishing artifact blob {digest} failed: writing {path:?}: {error}")
            }
        }
    }

    /// What makes two failures the same, for logging each once.
    pub(crate) fn cause(&self) -> String {
        match self {
            BlobTrouble::NotHeld => "not held".to_owned(),
            BlobTrouble::Io { error, .. } => format!("writing:{:?}", error.kind()),
        }
    }
}

/// What one publish of blobs did.
#[derive(Debug, Default)]
pub(crate) struct Linked {
    pub linked: usize,
    pub failed: Vec<(String, BlobTrouble)>,
}

/// Links every blob of `digests` that `dir` lacks into it, from this node's store.
/// `published` remembers the digests known to be there, so each is looked at once per daemon
/// (a fresh set looks at every one again).
pub(crate) fn link_missing<'a>(
    dir: &Path,
    digests: impl IntoIterator<Item = &'a str>,
    artifacts: &Artifacts,
    published: &mut PublishedBlobs,
    file_mode: u32,
    fsync: bool,
    node: &str,
) -> Linked {
    let mut outcome = Linked::default();
    for digest in digests {
        if published.holds(digest) {
            continue;
        }
        // Only this uid writes here: what has the name is a copy of its nodes'.
        let target = dir.join(digest);
        if fs::symlink_metadata(&target).is_ok() {
            published.mark(digest.to_owned());
            continue;
        }
        let Some(source) = artifacts.held_path(digest) else {
            outcome
                .failed
                .push((digest.to_owned(), BlobTrouble::NotHeld));
            continue;
        };
        match link_copy(&source, dir, &target, digest, file_mode, fsync, node) {
            Ok(()) => {
                published.mark(digest.to_owned());
                outcome.linked += 1;
            }
            Err(error) => outcome.failed.push((
                digest.to_owned(),
                BlobTrouble::Io {
                    path: target,
                    error,
                },
            )),
        }
    }
    outcome
}

/// Copies `source` to a temporary file (mode `mode`, whatever the umask) in `dir` and links it
/// in as `target`; a target that appeared meanwhile (another node's copy) is left as it is.
fn link_copy(
    source: &Path,
    dir: &Path,
    target: &Path,
    digest: &str,
    mode: u32,
    fsync: bool,
    node: &str,
) -> io::Result<()> {
    let temp = dir.join(format!(".{digest}.{node}.{}.tmp", std::process::id()));
    let options = TempOptions {
        mode: Some(mode),
        exact_mode: true,
        nofollow: true,
        append: false,
        replace_stale: true,
    };
    let mut out = TempFile::create(&temp, options)?;
    io::copy(&mut File::open(source)?, out.file())?;
    out.file().flush()?;
    out.sync(if fsync {
        Durability::All
    } else {
        Durability::None
    })?;
    match out.link_as(target) {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => Err(error),
        _ => Ok(()),
    }
}
