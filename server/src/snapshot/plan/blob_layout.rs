//! Where blobs live under `v2/artifacts/` and which files there a reader may take: the layout
//! rule for many users on one shared directory. Facts in (what `lstat` and `fstat` saw),
//! verdicts out.
//!
//! `v2/artifacts/` itself follows the rules of `v2/` (`trust::judge_segment_dir`, and
//! `trust::missing_segment_dir` with `v2/` as its parent): in the `v2/` every user shares it is
//! root's and sticky, made by the administrator (or a daemon running as root), never by a
//! user's daemon, which would own it and so could remove or rename every other user's blobs.
//! Inside it each writer uid has a directory of its own, `<uid>/` (its mode:
//! `trust::written_modes`), that only it can write: a blob there is its writer's file, and
//! nobody else can plant, replace or remove a name in it. A `<uid>/` that another user made first (squatting) is reported and passed
//! over: the writer makes a directory `<uid>.<16 hex>/` instead, which no one can take ahead
//! of it (the name is new and `mkdir` fails on a taken one), and readers find it by listing
//! `v2/artifacts/`. Blobs that older daemons linked straight into `v2/artifacts/<sha256>` are
//! still read, when a trusted writer owns them.
//!
//! A reader takes a file only when its owner is a trusted writer (`trust::judge_owner`), it is
//! a regular file and its size is the entry's; then it hashes it (the store keeps it only if
//! it hashes to the digest). So a planted file (wrong bytes, a symbolic link, a FIFO, a huge
//! sparse file) is never read, and a name taken by someone else never keeps a blob out.

use crate::snapshot::plan::trust::{self, DirFacts, Writers};

/// The name of `uid`'s own directory under `v2/artifacts/`.
pub fn own_dir_name(uid: u32) -> String {
    uid.to_string()
}

/// The name of a directory `uid` makes when another user took `<uid>/`.
pub fn fallback_dir_name(uid: u32, nonce: u64) -> String {
    format!("{uid}.{nonce:016x}")
}

/// What a name in `v2/artifacts/` is, as a writer's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirName {
    /// `<uid>`.
    Own(u32),
    /// `<uid>.<16 hex>`.
    Fallback(u32),
    Other,
}

/// A uid as `u32::to_string` writes it (no sign, no leading zero), so each uid has one name.
fn parse_uid(text: &str) -> Option<u32> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

pub fn classify_dir(name: &str) -> DirName {
    if let Some(uid) = parse_uid(name) {
        return DirName::Own(uid);
    }
    let Some((uid, nonce)) = name.split_once('.') else {
        return DirName::Other;
    };
    let nonce_ok = nonce.len() == 16
        && nonce
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match parse_uid(uid) {
        Some(uid) if nonce_ok => DirName::Fallback(uid),
        _ => DirName::Other,
    }
}

/// The verdict on a directory named for `uid` (`<uid>/` or `<uid>.<hex>/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterDir {
    /// A real directory `uid` owns: its blobs go there, and are looked for there.
    Usable,
    /// Another user's (a directory, a link, a file): squatting, reported and passed over.
    Squatted { owner: u32 },
    /// `uid`'s own, but not a directory: passed over.
    NotADirectory,
}

pub fn judge_writer_dir(facts: DirFacts, uid: u32) -> WriterDir {
    if facts.owner != uid {
        WriterDir::Squatted { owner: facts.owner }
    } else if facts.is_symlink || !facts.is_dir {
        WriterDir::NotADirectory
    } else {
        WriterDir::Usable
    }
}

/// What `fstat` saw of an opened blob file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileFacts {
    pub owner: u32,
    pub is_file: bool,
    pub len: u64,
}

/// Whether a reader takes a file as the blob of `size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobFile {
    /// Read it (and hash it).
    Take,
    /// Its owner is no trusted writer: under a name a reader looks at, that is squatting.
    Untrusted { owner: u32 },
    /// A trusted writer's, but no blob: not a regular file, or not the entry's size.
    NotTheBlob,
}

/// The verdict on a file found where a blob of `size` bytes is looked for.
pub fn judge_blob_file(facts: FileFacts, size: u64, writers: Writers<'_>) -> BlobFile {
    if trust::judge_owner(facts.owner, writers, true).is_err() {
        BlobFile::Untrusted { owner: facts.owner }
    } else if !facts.is_file || facts.len != size {
        BlobFile::NotTheBlob
    } else {
        BlobFile::Take
    }
}

/// Whether an owner of `v2/artifacts/` itself is one a reader does not trust (neither root nor
/// an allowed writer): the directory is then squatting, reported as such.
pub fn untrusted_dir_owner(owner: u32, writers: Writers<'_>) -> bool {
    owner != 0 && !writers.uids.contains(&owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: u32 = 1001;
    const WRITER: u32 = 1002;
    const STRANGER: u32 = 1003;

    fn writers(keyed: bool) -> Writers<'static> {
        Writers {
            uids: &[ME, WRITER],
            keyed,
        }
    }

    fn dir(owner: u32) -> DirFacts {
        DirFacts {
            is_symlink: false,
            is_dir: true,
            owner,
            mode: 0o755,
        }
    }

    #[test]
    fn each_uid_has_one_own_name_and_fallbacks_carry_a_16_hex_nonce() {
        assert_eq!(own_dir_name(ME), "1001");
        assert_eq!(classify_dir("1001"), DirName::Own(ME));
        assert_eq!(classify_dir("0"), DirName::Own(0));
        let fallback = fallback_dir_name(ME, 0xab);
        assert_eq!(fallback, "1001.00000000000000ab");
        assert_eq!(classify_dir(&fallback), DirName::Fallback(ME));
        for other in [
            "01001",
            "+1001",
            "-1",
            "",
            "4294967296",
            "1001.ab",
            "1001.00000000000000AB",
            "1001.00000000000000ab.x",
            ".1001",
            &"ab".repeat(32),
            ".tmp",
        ] {
            assert_eq!(classify_dir(other), DirName::Other, "{other}");
        }
    }

    #[test]
    fn only_the_uids_own_real_directory_holds_its_blobs() {
        assert_eq!(judge_writer_dir(dir(ME), ME), WriterDir::Usable);
        assert_eq!(
            judge_writer_dir(dir(STRANGER), ME),
            WriterDir::Squatted { owner: STRANGER }
        );
        // Even a trusted writer's directory under my name is not mine to write.
        assert_eq!(
            judge_writer_dir(dir(WRITER), ME),
            WriterDir::Squatted { owner: WRITER }
        );
        let link = DirFacts {
            is_symlink: true,
            is_dir: false,
            ..dir(STRANGER)
        };
        assert_eq!(
            judge_writer_dir(link, ME),
            WriterDir::Squatted { owner: STRANGER }
        );
        let file = DirFacts {
            is_dir: false,
            ..dir(ME)
        };
        assert_eq!(judge_writer_dir(file, ME), WriterDir::NotADirectory);
    }

    #[test]
    fn a_blob_is_taken_only_from_a_trusted_writers_regular_file_of_its_size() {
        let file = |owner, is_file, len| FileFacts {
            owner,
            is_file,
            len,
        };
        for owner in [ME, WRITER] {
            assert_eq!(
                judge_blob_file(file(owner, true, 10), 10, writers(false)),
                BlobFile::Take
            );
        }
        // Wrong bytes, a FIFO, a 100 GiB sparse file of another user: never opened further.
        for planted in [
            file(STRANGER, true, 10),
            file(STRANGER, false, 0),
            file(STRANGER, true, 100 << 30),
        ] {
            assert_eq!(
                judge_blob_file(planted, 10, writers(false)),
                BlobFile::Untrusted { owner: STRANGER }
            );
        }
        // Root is no writer of blobs either.
        assert_eq!(
            judge_blob_file(file(0, true, 10), 10, writers(false)),
            BlobFile::Untrusted { owner: 0 }
        );
        assert_eq!(
            judge_blob_file(file(ME, false, 10), 10, writers(false)),
            BlobFile::NotTheBlob
        );
        assert_eq!(
            judge_blob_file(file(ME, true, 11), 10, writers(false)),
            BlobFile::NotTheBlob
        );
        // With a key, the digest alone vouches for a blob, whoever wrote it.
        assert_eq!(
            judge_blob_file(file(STRANGER, true, 10), 10, writers(true)),
            BlobFile::Take
        );
    }

    #[test]
    fn the_blob_directory_of_a_stranger_is_squatting_and_roots_is_not() {
        assert!(untrusted_dir_owner(STRANGER, writers(false)));
        assert!(!untrusted_dir_owner(0, writers(false)));
        assert!(!untrusted_dir_owner(WRITER, writers(false)));
    }
}
