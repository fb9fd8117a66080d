//! The names the daemon writes where others read them: a node's name (it names files in the
//! shared directory and keys in Redis) and a job view's name (it keys pins here and in
//! Redis, and is listed to operators). Both are checked here, once, for every path in.

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
    if view.chars().any(char::is_control) {
        return Err(InvalidField::new(
            field,
            "a view name must not contain control characters",
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
        assert!(control.reason.contains("control"), "{control}");
    }
}
