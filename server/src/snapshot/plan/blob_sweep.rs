//! What a sweep of `v2/artifacts/` does with each name there: the rule that collects blobs no
//! live entry names from the shared directory, without ever losing one that a live segment
//! names, decided from the name, its ages and the digests this node's cache names.
//!
//! A sweep runs only after a load that read every trusted node's segments through, so the cache
//! holds every live entry of the directory. It goes in two steps, one pass apart:
//!
//! 1. A blob (`<sha256>`) that no entry names and that is older than the grace period is renamed
//!    to this node's trash name (`.<sha256>.<node>.trash`). From then on a publisher that looks
//!    for the blob finds it missing and links it in afresh.
//! 2. At the next sweep, after another load, a trash file whose digest an entry names again is
//!    linked back (a segment naming it landed between the two steps); any other is deleted.
//!
//! A publisher checks, after its segment is linked in, that every blob the segment names is
//! there, and links in what is not. So a segment written while a sweep renamed its blob gets the
//! blob back without waiting for the sweeper. Another node's trash is left to that node, unless
//! it is older than the grace period (its node stopped between the two steps). Temporary files
//! of publishers older than the grace period are deleted (a publisher that crashed). Any other
//! name is left as it is: the directory is shared with writers this node does not trust.

use std::time::Duration;

/// What the sweep does with one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepStep {
    Keep,
    /// Rename the blob to this node's trash name.
    Trash,
    /// Link the trash file back under its digest (the link is left alone if one is there),
    /// then delete it.
    Restore,
    Delete,
}

/// What a name in `v2/artifacts/` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobName<'a> {
    /// `<sha256>`.
    Blob(&'a str),
    /// `.<sha256>.<node>.trash`: a sweeper's, `ours` when this node's.
    Trash {
        digest: &'a str,
        ours: bool,
    },
    /// `.<sha256>.<node>.<pid>.tmp`: a publisher's copy before its link.
    Temp,
    Other,
}

const TRASH_SUFFIX: &str = ".trash";
const TEMP_SUFFIX: &str = ".tmp";

fn is_digest(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The trash name of `digest` for `node`.
pub fn trash_name(digest: &str, node: &str) -> String {
    format!(".{digest}.{node}{TRASH_SUFFIX}")
}

/// What `name` is, for the sweep of `node`.
pub fn classify<'a>(name: &'a str, node: &str) -> BlobName<'a> {
    if is_digest(name) {
        return BlobName::Blob(name);
    }
    let Some(rest) = name.strip_prefix('.') else {
        return BlobName::Other;
    };
    let (Some(digest), Some(tail)) = (rest.get(..64), rest.get(64..)) else {
        return BlobName::Other;
    };
    if !is_digest(digest) || !tail.starts_with('.') {
        return BlobName::Other;
    }
    let tail = &tail[1..];
    if let Some(owner) = tail.strip_suffix(TRASH_SUFFIX) {
        if owner.is_empty() {
            return BlobName::Other;
        }
        return BlobName::Trash {
            digest,
            ours: owner == node,
        };
    }
    if tail.ends_with(TEMP_SUFFIX) && tail.len() > TEMP_SUFFIX.len() {
        return BlobName::Temp;
    }
    BlobName::Other
}

/// The step for one name. `age` is how long ago the file was last written or renamed (the
/// later of its mtime and ctime; `None` when the clock cannot say, which keeps it), `named`
/// whether an entry of this node's cache names the digest, `grace` `--artifact-grace-secs`.
pub fn step(name: &BlobName<'_>, age: Option<Duration>, named: bool, grace: Duration) -> SweepStep {
    let old = age.is_some_and(|age| age >= grace);
    match *name {
        BlobName::Blob(_) if !named && old => SweepStep::Trash,
        BlobName::Blob(_) => SweepStep::Keep,
        BlobName::Trash { .. } if named => SweepStep::Restore,
        BlobName::Trash { ours: true, .. } => SweepStep::Delete,
        BlobName::Trash { ours: false, .. } if old => SweepStep::Delete,
        BlobName::Trash { .. } => SweepStep::Keep,
        BlobName::Temp if old => SweepStep::Delete,
        BlobName::Temp | BlobName::Other => SweepStep::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(3600);
    const OLD: Option<Duration> = Some(Duration::from_secs(3601));
    const NEW: Option<Duration> = Some(Duration::from_secs(10));

    fn digest() -> String {
        "ab".repeat(32)
    }

    #[test]
    fn names_are_told_apart_and_anything_unexpected_is_other() {
        let d = digest();
        assert_eq!(classify(&d, "n1"), BlobName::Blob(&d));
        let trash = trash_name(&d, "n1");
        assert_eq!(
            classify(&trash, "n1"),
            BlobName::Trash {
                digest: &d,
                ours: true
            }
        );
        assert_eq!(
            classify(&trash, "n2"),
            BlobName::Trash {
                digest: &d,
                ours: false
            }
        );
        assert_eq!(classify(&format!(".{d}.n1.4242.tmp"), "n1"), BlobName::Temp);
        for other in [
            "AB".repeat(32),        // not lowercase
            "ab".repeat(31),        // short
            format!("{d}x"),        // long
            format!(".{d}..trash"), // no node
            format!(".{d}.tmp"),    // a temp of nobody
            format!(".{}.n1.trash", "g".repeat(64)),
            "..".to_owned(),
            "segment-n1-1-2.tcs".to_owned(),
        ] {
            assert_eq!(classify(&other, "n1"), BlobName::Other, "{other}");
        }
    }

    #[test]
    fn a_blob_goes_to_trash_only_when_unnamed_and_past_grace() {
        let d = digest();
        let blob = BlobName::Blob(&d);
        assert_eq!(step(&blob, OLD, false, GRACE), SweepStep::Trash);
        assert_eq!(step(&blob, NEW, false, GRACE), SweepStep::Keep);
        assert_eq!(step(&blob, OLD, true, GRACE), SweepStep::Keep);
        assert_eq!(step(&blob, None, false, GRACE), SweepStep::Keep);
    }

    #[test]
    fn trash_named_again_is_restored_and_only_our_own_goes_at_once() {
        let d = digest();
        let ours = BlobName::Trash {
            digest: &d,
            ours: true,
        };
        let theirs = BlobName::Trash {
            digest: &d,
            ours: false,
        };
        assert_eq!(step(&ours, NEW, true, GRACE), SweepStep::Restore);
        assert_eq!(step(&theirs, NEW, true, GRACE), SweepStep::Restore);
        assert_eq!(step(&ours, NEW, false, GRACE), SweepStep::Delete);
        assert_eq!(step(&theirs, NEW, false, GRACE), SweepStep::Keep);
        assert_eq!(step(&theirs, OLD, false, GRACE), SweepStep::Delete);
    }

    #[test]
    fn a_publishers_temp_goes_past_grace_and_other_names_never() {
        assert_eq!(step(&BlobName::Temp, OLD, false, GRACE), SweepStep::Delete);
        assert_eq!(step(&BlobName::Temp, NEW, false, GRACE), SweepStep::Keep);
        assert_eq!(step(&BlobName::Other, OLD, false, GRACE), SweepStep::Keep);
    }
}
