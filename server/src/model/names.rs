//! The names the daemon writes where others read them: a node's name (it names files in the
//! shared directory and keys in Redis) and a job view's name (it keys pins here and in
//! Redis, and is listed to operators). Both are checked here, once, for every path in.
//!
//! A view belongs to the uid that reads in it ([`ViewId`]): the same name read by another
//! uid is another view, so no user can read in, pin in, or squat the view of another
//! user's job (docs/views.md).

use crate::model::validate::InvalidField;

/// Longest view name accepted (a job id with a step; bounded like a key's fields).
pub const MAX_VIEW_NAME_BYTES: usize = 256;

/// Whether `c` may appear in a node name.
pub fn node_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The node name rule: it names files in the shared directory and keys in Redis, so 1 to 64
/// of A-Z a-z 0-9 . _ -, not starting with '.' (hidden files) or '-'.
pub fn check_node_name(name: &str) -> Result<(), String> {
    let rule = "1 to 64 of A-Z a-z 0-9 . _ -, not starting with '.' or '-'";
    if name.is_empty() || name.len() > 64 {
        return Err(format!(
            "{name:?} is {} bytes; a node name is {rule}",
            name.len()
        ));
    }
    if name.starts_with(['.', '-']) || !name.chars().all(node_name_char) {
        return Err(format!("{name:?} breaks the rule: a node name is {rule}"));
    }
    Ok(())
}

/// A job view: its name, within the uid that reads in it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ViewId {
    pub uid: u32,
    pub name: String,
}

impl ViewId {
    /// The view's name in places shared by every uid (Redis): `<uid>/<name>`. Unambiguous,
    /// as the uid part holds no `/`.
    pub fn shared_name(&self) -> String {
        format!("{}/{}", self.uid, self.name)
    }
}

impl std::fmt::Display for ViewId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (uid {})", self.name, self.uid)
    }
}

/// The view name rule: 1 to 256 printable ASCII characters (`!` to `~`), so that no two
/// names that look alike in a listing differ (no spaces, controls, format characters such
/// as a zero-width space or a right-to-left override, separators, or look-alike letters).
const VIEW_NAME_RULE: &str = "1 to 256 printable ASCII characters (! to ~, no spaces)";

/// Checks a request's view name in `field`: `Ok(None)` for none (empty).
pub fn view_name(field: &str, view: &str) -> Result<Option<String>, InvalidField> {
    if view.is_empty() {
        return Ok(None);
    }
    if view.len() > MAX_VIEW_NAME_BYTES {
        return Err(InvalidField::new(
            field,
            format!(
                "{} bytes, longer than the {MAX_VIEW_NAME_BYTES} a view name may have",
                view.len()
            ),
        ));
    }
    if let Some(bad) = view.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(InvalidField::new(
            field,
            format!(
                "{:?} is not allowed in a view name; a view name is {VIEW_NAME_RULE}",
                bad.escape_unicode().to_string()
            ),
        ));
    }
    Ok(Some(view.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_follow_the_rule() {
        for good in ["node-a", "gpu01.cluster_2", "A", &"n".repeat(64)] {
            assert!(check_node_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "a\nb",
            "a b",
            "é",
            &"n".repeat(65),
        ] {
            let why = check_node_name(bad).unwrap_err();
            assert!(why.contains("1 to 64"), "{why}");
        }
    }

    #[test]
    fn view_names_are_bounded_and_printable() {
        assert_eq!(view_name("view", ""), Ok(None));
        assert_eq!(
            view_name("view", "slurm-42.0"),
            Ok(Some("slurm-42.0".into()))
        );
        let long = view_name("view", &"v".repeat(257)).unwrap_err();
        assert_eq!(long.path, "view");
        assert!(long.reason.contains("256"), "{long}");
        assert!(view_name("view", &"v".repeat(256)).is_ok());
        let control = view_name("name", "job\n7").unwrap_err();
        assert_eq!(control.path, "name");
        assert!(control.reason.contains("printable ASCII"), "{control}");
        // What looks like another job's name in a listing is refused (issue 39, finding 4):
        // a zero-width space, a right-to-left override, a line separator, a space, a
        // look-alike letter.
        for spoof in [
            "slurm-42.0\u{200b}",
            "slurm-\u{202e}0.24",
            "slurm-42.0\u{2028}",
            "slurm 42.0",
            "slurm-42.\u{39f}",
        ] {
            let refused = view_name("view", spoof).unwrap_err();
            assert!(refused.reason.contains("\\u{"), "{spoof:?}: {refused}");
        }
        for fine in ["slurm-42.0", "torchelastic-5c1d:a/b", "job_7+x@y=z~"] {
            assert_eq!(view_name("view", fine), Ok(Some(fine.to_owned())));
        }
    }

    #[test]
    fn a_views_shared_name_carries_its_uid() {
        let id = ViewId {
            uid: 1000,
            name: "job/7".into(),
        };
        assert_eq!(id.shared_name(), "1000/job/7");
        assert_ne!(
            id.shared_name(),
            ViewId {
                uid: 100,
                name: "0/job/7".into()
            }
            .shared_name(),
            "the uid ends at the first /, and a uid has no /"
        );
    }
}
