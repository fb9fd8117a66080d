//! Who may speak in the shared directory: the verdicts on `v2/` itself, on a missing `v2/`,
//! on a file's owner, on a segment whose contents disagree with its name, and on another
//! user's file under a name this daemon trusts. Facts in (what `lstat` and `fstat` saw, what
//! a file says of itself), verdicts out.
//!
//! A file counts only if it proves who wrote it: with `--shared-dir-key-file`, a MAC that
//! verifies (judged while it is parsed, `format`); without, an owner among this daemon's own
//! uid and `--shared-dir-writer-uid`. `v2/` must be a real directory owned by an allowed
//! writer or root, and not writable by group or others unless a key is set or it is root's
//! and sticky (mode 1777: one `v2/` for every user, each file trusted by its owner's uid
//! alone; the sticky bit stops anyone but a file's owner from removing or renaming it). There,
//! files of uids this daemon does not trust are other users' caches and are skipped quietly,
//! except under a name it trusts: that is name squatting, refused like a forgery.
//! `v2/artifacts/` is judged and made by these same rules (`blob_layout`).

use std::path::Path;

use crate::error::{Error, Result};
use crate::snapshot::format::{ParsedSnapshot, FORMAT_VERSION};
use crate::snapshot::segments::SegmentName;

/// Who may write the shared directory, as the settings say.
#[derive(Clone, Copy, Debug)]
pub struct Writers<'a> {
    /// This daemon's own uid first, then `--shared-dir-writer-uid`.
    pub uids: &'a [u32],
    /// `--shared-dir-key-file` is set: a file's MAC, not its owner, says who wrote it.
    pub keyed: bool,
}

/// What `lstat` saw of `v2/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirFacts {
    pub is_symlink: bool,
    pub is_dir: bool,
    pub owner: u32,
    /// The permission bits, `st_mode & 0o7777`.
    pub mode: u32,
}

/// Whether `v2/` may be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirVerdict {
    /// It may. `shared_by_users`: it is root's, sticky, and group or others may write it, the
    /// one `v2/` of every user: files of uids this daemon does not trust are other users'
    /// caches there, not forgeries.
    Usable { shared_by_users: bool },
    /// It may not; why, as the end of "it ...".
    Unsafe(String),
}

/// The verdict on `v2/`.
pub fn judge_segment_dir(facts: DirFacts, writers: Writers<'_>) -> DirVerdict {
    let DirFacts { owner, mode, .. } = facts;
    let root_and_sticky = owner == 0 && mode & 0o1000 != 0;
    let why = if facts.is_symlink {
        "is a symbolic link".to_owned()
    } else if !facts.is_dir {
        "is not a directory".to_owned()
    } else if owner != 0 && !writers.uids.contains(&owner) {
        format!(
            "is owned by uid {owner}, not an allowed writer (this daemon's uid and \
             --shared-dir-writer-uid: {}) or root",
            uid_list(writers.uids)
        )
    } else if mode & 0o022 != 0 && !writers.keyed && !root_and_sticky {
        format!(
            "is writable by group or others (mode {mode:04o}), and neither the sticky bit \
             on a root-owned directory (mode 1777) nor --shared-dir-key-file protects its files"
        )
    } else {
        return DirVerdict::Usable {
            shared_by_users: root_and_sticky && mode & 0o022 != 0,
        };
    };
    DirVerdict::Unsafe(why)
}

/// What to do about a `v2/` that does not exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingDir {
    /// Make it with this mode (set explicitly: the umask may clear bits of it).
    Create { mode: u32 },
    /// Leave it to the administrator: this daemon does not run as root and group or others
    /// may write the top directory, so the `v2/` there is every user's. Whoever made it would
    /// own it (and so could remove every other user's files), and the other users' daemons
    /// would refuse it.
    LeaveToAdmin,
}

/// `top_mode`: the top directory's permission bits, `None` when it cannot be looked at.
pub fn missing_segment_dir(euid_is_root: bool, top_mode: Option<u32>) -> MissingDir {
    let top_writable_by_others = top_mode.is_some_and(|mode| mode & 0o022 != 0);
    match (euid_is_root, top_writable_by_others) {
        (false, true) => MissingDir::LeaveToAdmin,
        // Root makes every user's v2/ in a top directory others may write, as the admin would.
        (true, true) => MissingDir::Create { mode: 0o1777 },
        (_, false) => MissingDir::Create { mode: 0o755 },
    }
}

/// What a daemon that must leave `dir` (`v2/`, or `v2/artifacts/` in it) to the administrator
/// says; `parent` is the directory it would be made in.
pub fn left_to_admin_message(dir: &Path, parent: &Path, parent_mode: u32) -> String {
    format!(
        "not creating {dir:?}: group or others may write {parent:?} (mode {:04o}), so a \
         directory made there by this daemon would be this user's alone; as root, create it \
         for every user with `install -d -m 1777 -o root -g root {}`",
        parent_mode & 0o7777,
        dir.display()
    )
}

/// Whether a file owned by `owner` may be read. Without a key, only an allowed writer's
/// file counts; in the `v2/` every user shares, another uid's file is that user's cache
/// (`Error::OtherUsersFile`, skipped quietly), elsewhere it is a forgery
/// (`Error::Unauthenticated`, warned about and counted).
pub fn judge_owner(owner: u32, writers: Writers<'_>, shared_by_users: bool) -> Result<()> {
    if writers.keyed || writers.uids.contains(&owner) {
        Ok(())
    } else if shared_by_users {
        Err(Error::OtherUsersFile(owner))
    } else {
        Err(Error::Unauthenticated(format!(
            "owned by uid {owner}, not an allowed writer (--shared-dir-writer-uid {})",
            uid_list(writers.uids)
        )))
    }
}

/// A segment must say inside what its name says (format version, node, sequence range):
/// a file copied or renamed under another name is refused like a forgery.
pub fn agrees_with_name(parsed: ParsedSnapshot, segment: &SegmentName) -> Result<ParsedSnapshot> {
    let agrees = parsed.version == FORMAT_VERSION
        && parsed.node == segment.node
        && parsed.first_seq == Some(segment.first)
        && parsed.last_seq == Some(segment.last);
    if agrees {
        Ok(parsed)
    } else {
        Err(Error::Unauthenticated(format!(
            "says it is node {:?}, sequence {:?}..{:?}, version {}, which its name does not",
            parsed.node, parsed.first_seq, parsed.last_seq, parsed.version
        )))
    }
}

/// Another user's file under a name this daemon trusts (its own, or one whose trusted
/// segments it has read) is name squatting: refused like a forgery, so it is warned about
/// and counted (`snapshot_untrusted_files`), never read.
pub fn squatting(parsed: Result<ParsedSnapshot>, node: &str) -> Result<ParsedSnapshot> {
    match parsed {
        Err(Error::OtherUsersFile(uid)) => Err(Error::Unauthenticated(format!(
            "owned by uid {uid}, not an allowed writer, yet named as node {node:?}, whose \
             segments this daemon trusts: name squatting, never read"
        ))),
        other => other,
    }
}

/// Whether a read proved nothing about its writer (a forgery, another user's file, one that
/// disagrees with its name): such a segment is treated as absent, so a forged name can never
/// make a reader skip the real segments it claims to cover.
pub fn proves_no_writer(parsed: &Result<ParsedSnapshot>) -> bool {
    matches!(
        parsed,
        Err(Error::Unauthenticated(_) | Error::OtherUsersFile(_))
    )
}

/// How a file that is not read counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Another user's file in the `v2/` every user shares: not counted, not warned about.
    Quietly { uid: u32 },
    /// Counted (`peer_files_skipped`) and warned about, once per file version; `untrusted`
    /// when it did not prove its writer (`snapshot_untrusted_files` too).
    Warned { untrusted: bool },
}

pub fn skip(reason: &Error) -> Skip {
    match reason {
        Error::OtherUsersFile(uid) => Skip::Quietly { uid: *uid },
        other => Skip::Warned {
            untrusted: matches!(other, Error::Unauthenticated(_)),
        },
    }
}

/// Uids as the flag takes them.
pub fn uid_list(uids: &[u32]) -> String {
    uids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
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

    fn dir(owner: u32, mode: u32) -> DirFacts {
        DirFacts {
            is_symlink: false,
            is_dir: true,
            owner,
            mode,
        }
    }

    fn unsafe_because(facts: DirFacts, keyed: bool) -> String {
        match judge_segment_dir(facts, writers(keyed)) {
            DirVerdict::Unsafe(why) => why,
            usable => panic!("{facts:?} (keyed {keyed}) was {usable:?}"),
        }
    }

    #[test]
    fn v2_is_used_only_when_its_owner_and_mode_protect_its_files() {
        let usable = |shared_by_users| DirVerdict::Usable { shared_by_users };
        // Private to an allowed writer or root.
        for owner in [ME, WRITER, 0] {
            assert_eq!(
                judge_segment_dir(dir(owner, 0o755), writers(false)),
                usable(false)
            );
        }
        // Anyone may write it: only a key, or root's sticky bit, makes that safe.
        assert_eq!(
            judge_segment_dir(dir(ME, 0o777), writers(true)),
            usable(false)
        );
        assert_eq!(
            judge_segment_dir(dir(0, 0o1777), writers(false)),
            usable(true)
        );
        assert_eq!(
            judge_segment_dir(dir(0, 0o1777), writers(true)),
            usable(true)
        );
        // Root's and sticky, but nobody else may write it: not every user's.
        assert_eq!(
            judge_segment_dir(dir(0, 0o1755), writers(false)),
            usable(false)
        );
        for (facts, names) in [
            (dir(ME, 0o777), "mode 0777"),
            (dir(ME, 0o775), "mode 0775"),
            (dir(ME, 0o757), "mode 0757"),
            // Sticky, but not root's: its owner could still remove every file.
            (dir(ME, 0o1777), "mode 1777"),
            (dir(0, 0o777), "mode 0777"),
            (dir(STRANGER, 0o755), "owned by uid 1003"),
            (dir(STRANGER, 0o1777), "owned by uid 1003"),
            (
                DirFacts {
                    is_symlink: true,
                    ..dir(ME, 0o755)
                },
                "symbolic link",
            ),
            (
                DirFacts {
                    is_dir: false,
                    ..dir(ME, 0o644)
                },
                "not a directory",
            ),
        ] {
            let why = unsafe_because(facts, false);
            assert!(why.contains(names), "{facts:?}: {why}");
        }
        // A key authenticates files, not the directory's owner.
        assert!(unsafe_because(dir(STRANGER, 0o755), true).contains("1001,1002"));
    }

    #[test]
    fn a_missing_v2_is_made_private_unless_it_is_every_users() {
        assert_eq!(
            missing_segment_dir(false, Some(0o755)),
            MissingDir::Create { mode: 0o755 }
        );
        assert_eq!(
            missing_segment_dir(false, None),
            MissingDir::Create { mode: 0o755 }
        );
        for top in [0o777, 0o1777, 0o775, 0o757] {
            assert_eq!(
                missing_segment_dir(false, Some(top)),
                MissingDir::LeaveToAdmin,
                "{top:o}"
            );
            assert_eq!(
                missing_segment_dir(true, Some(top)),
                MissingDir::Create { mode: 0o1777 },
                "{top:o}"
            );
        }
        assert_eq!(
            missing_segment_dir(true, Some(0o755)),
            MissingDir::Create { mode: 0o755 }
        );
        let message = left_to_admin_message(Path::new("/s/v2"), Path::new("/s"), 0o41777);
        assert!(
            message.contains("mode 1777") && message.contains("install -d -m 1777"),
            "{message}"
        );
    }

    #[test]
    fn only_an_allowed_writers_file_counts_without_a_key() {
        for owner in [ME, WRITER] {
            assert!(judge_owner(owner, writers(false), false).is_ok());
            assert!(judge_owner(owner, writers(false), true).is_ok());
        }
        assert!(matches!(
            judge_owner(STRANGER, writers(false), false),
            Err(Error::Unauthenticated(why)) if why.contains("uid 1003") && why.contains("1001,1002")
        ));
        // Root is no writer of files either.
        assert!(judge_owner(0, writers(false), false).is_err());
        assert!(matches!(
            judge_owner(STRANGER, writers(false), true),
            Err(Error::OtherUsersFile(STRANGER))
        ));
        // With a key, the MAC decides.
        assert!(judge_owner(STRANGER, writers(true), false).is_ok());
    }

    fn parsed(node: &str, version: u64, first: Option<u64>, last: Option<u64>) -> ParsedSnapshot {
        ParsedSnapshot {
            node: node.into(),
            version,
            first_seq: first,
            last_seq: last,
            written_at_unix_ms: 0,
            entries: Vec::new(),
            invalid_entries: 0,
            tombstones: Vec::new(),
        }
    }

    #[test]
    fn a_segment_must_say_what_its_name_says() {
        let name = SegmentName {
            node: "a".into(),
            first: 3,
            last: 5,
        };
        assert!(agrees_with_name(parsed("a", 2, Some(3), Some(5)), &name).is_ok());
        for (node, version, first, last) in [
            ("b", 2, Some(3), Some(5)),
            ("a", 1, Some(3), Some(5)),
            ("a", 2, Some(1), Some(5)),
            ("a", 2, Some(3), Some(9)),
            ("a", 2, None, None),
        ] {
            let refused = agrees_with_name(parsed(node, version, first, last), &name);
            assert!(
                matches!(&refused, Err(Error::Unauthenticated(why)) if why.contains("its name does not")),
                "{node} {version} {first:?} {last:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn another_users_file_under_a_trusted_name_is_squatting_and_proves_nothing() {
        let squatted = squatting(Err(Error::OtherUsersFile(STRANGER)), "a");
        assert!(
            matches!(&squatted, Err(Error::Unauthenticated(why)) if why.contains("name squatting")),
            "{squatted:?}"
        );
        assert_eq!(
            skip(&squatted.unwrap_err()),
            Skip::Warned { untrusted: true }
        );
        // Anything else passes through as it was.
        assert!(squatting(Ok(parsed("a", 2, Some(1), Some(1))), "a").is_ok());
        assert!(matches!(
            squatting(Err(Error::SnapshotFormat("damaged".into())), "a"),
            Err(Error::SnapshotFormat(_))
        ));

        assert!(proves_no_writer(&Err(Error::OtherUsersFile(STRANGER))));
        assert!(proves_no_writer(&Err(Error::Unauthenticated("x".into()))));
        // A damaged file of a trusted writer is its writer's: passed over, not treated as
        // absent.
        assert!(!proves_no_writer(&Err(Error::SnapshotFormat("x".into()))));
        assert!(!proves_no_writer(&Ok(parsed("a", 2, Some(1), Some(1)))));
    }

    #[test]
    fn a_file_not_read_is_counted_by_what_it_failed_to_prove() {
        assert_eq!(
            skip(&Error::OtherUsersFile(STRANGER)),
            Skip::Quietly { uid: STRANGER }
        );
        assert_eq!(
            skip(&Error::Unauthenticated("x".into())),
            Skip::Warned { untrusted: true }
        );
        assert_eq!(
            skip(&Error::SnapshotFormat("x".into())),
            Skip::Warned { untrusted: false }
        );
    }
}
