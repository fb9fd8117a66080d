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
//! files of uids this daemon does not trust are other users' caches: skipped, counted and
//! said once per owner per hour, never read; under a name it trusts (its own, or one it has
//! read a segment of from a trusted owner) that is name squatting, warned about the same way.
//! `v2/artifacts/` is judged and made by these same rules (`blob_layout`).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

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

/// The modes this daemon gives what it writes into the shared directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrittenModes {
    /// A segment, or a blob file.
    pub file: u32,
    /// A writer uid's blob directory under `v2/artifacts/`.
    pub dir: u32,
}

/// In the `v2/` every user shares, what a user's daemon writes is its owner's alone (files
/// 0600, its blob directory 0700): other users see names and sizes in the listing, nothing
/// else. A site-wide daemon (`--shared-dir-public`) writes for every user to read (0644,
/// 0755). Elsewhere (a `v2/` of one user or of trusted writers) `None`: files are created 0644
/// under the umask and blob directories 0755, so the other trusted writers read them.
pub fn written_modes(shared_by_users: bool, public: bool) -> Option<WrittenModes> {
    shared_by_users.then_some(if public {
        WrittenModes {
            file: 0o644,
            dir: 0o755,
        }
    } else {
        WrittenModes {
            file: 0o600,
            dir: 0o700,
        }
    })
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
/// (`Error::OtherUsersFile`, skipped and counted, see `skip`), elsewhere it is a forgery
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
    /// Another user's cache in the `v2/` every user shares, under a name no trusted writer
    /// was read from: counted (`snapshot_untrusted_files`) and said at info, once per owner
    /// per hour (`OwnerNotices`).
    OtherUser { uid: u32 },
    /// Another user's file under a name this daemon trusts (its own, or one it has read a
    /// segment of from a trusted owner): name squatting, never read. Counted
    /// (`snapshot_untrusted_files`, `snapshot_squatted_files`) and warned about once per owner
    /// per hour.
    Squatting { uid: u32 },
    /// Counted (`peer_files_skipped`) and warned about, once per file version; `untrusted`
    /// when it did not prove its writer (`snapshot_untrusted_files` too).
    Warned { untrusted: bool },
}

/// How a file not read counts: `name_trusted` when its name is one this daemon trusts.
pub fn skip(reason: &Error, name_trusted: bool) -> Skip {
    match reason {
        Error::OtherUsersFile(uid) if name_trusted => Skip::Squatting { uid: *uid },
        Error::OtherUsersFile(uid) => Skip::OtherUser { uid: *uid },
        other => Skip::Warned {
            untrusted: matches!(other, Error::Unauthenticated(_)),
        },
    }
}

/// How often the files of one other user are said again (of each kind: another user's
/// cache, name squatting), however many there are: a directory of thousands of another
/// user's files costs a line an hour, not a line a file.
pub const OWNER_NOTICE_EVERY: Duration = Duration::from_secs(3600);
/// Owners remembered at most; past it, owners not said for an hour are forgotten first.
const MAX_OWNERS_REMEMBERED: usize = 4096;

/// When the files of each other user were last said, and how many were skipped since.
#[derive(Debug, Default)]
pub struct OwnerNotices {
    owners: HashMap<(u32, bool), Notice>,
}

#[derive(Debug)]
struct Notice {
    said_at: Instant,
    skipped_since: u64,
}

impl OwnerNotices {
    /// One more file of `uid` skipped (`squatting` or another user's cache). `Some(files)`
    /// when it is to be said now, with the files of that owner and kind skipped since it was
    /// last said (this one included).
    pub fn skipped(&mut self, uid: u32, squatting: bool, now: Instant) -> Option<u64> {
        let key = (uid, squatting);
        if let Some(notice) = self.owners.get_mut(&key) {
            notice.skipped_since += 1;
            if now.saturating_duration_since(notice.said_at) < OWNER_NOTICE_EVERY {
                return None;
            }
            let files = std::mem::take(&mut notice.skipped_since);
            notice.said_at = now;
            return Some(files);
        }
        if self.owners.len() >= MAX_OWNERS_REMEMBERED {
            self.owners.retain(|_, notice| {
                now.saturating_duration_since(notice.said_at) < OWNER_NOTICE_EVERY
            });
        }
        if self.owners.len() < MAX_OWNERS_REMEMBERED {
            let notice = Notice {
                said_at: now,
                skipped_since: 0,
            };
            self.owners.insert(key, notice);
        }
        Some(1)
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
            used: Vec::new(),
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
    fn another_users_file_proves_nothing_and_is_squatting_only_under_a_trusted_name() {
        let other = Error::OtherUsersFile(STRANGER);
        assert_eq!(skip(&other, false), Skip::OtherUser { uid: STRANGER });
        assert_eq!(skip(&other, true), Skip::Squatting { uid: STRANGER });
        assert!(proves_no_writer(&Err(Error::OtherUsersFile(STRANGER))));
        assert!(proves_no_writer(&Err(Error::Unauthenticated("x".into()))));
        // A damaged file of a trusted writer is its writer's: passed over, not treated as
        // absent.
        assert!(!proves_no_writer(&Err(Error::SnapshotFormat("x".into()))));
        assert!(!proves_no_writer(&Ok(parsed("a", 2, Some(1), Some(1)))));
    }

    #[test]
    fn a_file_not_read_is_counted_by_what_it_failed_to_prove() {
        for name_trusted in [false, true] {
            assert_eq!(
                skip(&Error::Unauthenticated("x".into()), name_trusted),
                Skip::Warned { untrusted: true }
            );
            assert_eq!(
                skip(&Error::SnapshotFormat("x".into()), name_trusted),
                Skip::Warned { untrusted: false }
            );
        }
    }

    #[test]
    fn another_users_files_are_said_once_per_owner_and_kind_per_hour() {
        let mut notices = OwnerNotices::default();
        let start = Instant::now();
        assert_eq!(notices.skipped(STRANGER, false, start), Some(1));
        for _ in 0..2999 {
            assert_eq!(notices.skipped(STRANGER, false, start), None);
        }
        // Squatting is said apart from another user's cache; another owner apart too.
        assert_eq!(notices.skipped(STRANGER, true, start), Some(1));
        assert_eq!(notices.skipped(WRITER, false, start), Some(1));
        let later = start + OWNER_NOTICE_EVERY - Duration::from_secs(1);
        assert_eq!(notices.skipped(STRANGER, false, later), None);
        // An hour on: said again, with every file skipped since.
        let hour = start + OWNER_NOTICE_EVERY;
        assert_eq!(notices.skipped(STRANGER, false, hour), Some(3001));
        assert_eq!(notices.skipped(STRANGER, false, hour), None);

        // Bounded: owners not said for an hour are forgotten first; past the bound an owner
        // is said each time rather than remembered.
        let mut many = OwnerNotices::default();
        for uid in 0..MAX_OWNERS_REMEMBERED as u32 {
            assert_eq!(many.skipped(uid, false, start), Some(1));
        }
        assert_eq!(many.skipped(u32::MAX, false, start), Some(1));
        assert_eq!(
            many.skipped(u32::MAX, false, start),
            Some(1),
            "not remembered"
        );
        assert_eq!(many.skipped(u32::MAX, false, hour), Some(1));
        assert_eq!(many.skipped(u32::MAX, false, hour), None, "room again");
    }

    #[test]
    fn what_a_users_daemon_writes_in_the_v2_of_every_user_is_its_own_alone() {
        let private = written_modes(true, false).unwrap();
        assert_eq!((private.file, private.dir), (0o600, 0o700));
        let public = written_modes(true, true).unwrap();
        assert_eq!((public.file, public.dir), (0o644, 0o755));
        assert_eq!(written_modes(false, false), None);
        assert_eq!(written_modes(false, true), None);
    }
}
