//! JSON text as Python's `json` module spells it, kept from what their code wrote: a member's
//! value is carried as the text Python wrote (numbers included: `1e-05`, not `1e-5`), objects are
//! put back together with their members sorted (`sort_keys=True`), compact (`separators=(",",
//! ":")`) and ASCII-only (the default `ensure_ascii=True`); `json.dump(..., indent=2)`'s layout
//! is `tunecache_trtllm::pyjson::python_indent_2` of that compact text.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use tunecache_trtllm::strip_json_whitespace;

/// A JSON object's members, each value as the text that spelled it, sorted by name (a
/// `BTreeMap` of `String` orders by code point, as Python's `sort_keys` does).
pub(crate) type Members = BTreeMap<String, Box<RawValue>>;

/// The members of the JSON object `text`; why not, for any other text. A repeated name keeps
/// its last value, as Python's `json.load` does.
pub(crate) fn members(text: &str) -> Result<Members, String> {
    serde_json::from_str::<Members>(text).map_err(|error| format!("not a JSON object: {error}"))
}

/// The member `name` as a string; None when absent or not a string.
pub(crate) fn string_member(members: &Members, name: &str) -> Option<String> {
    serde_json::from_str::<String>(members.get(name)?.get()).ok()
}

/// `text` with every character beyond ASCII (and DEL) as `\uXXXX`, as `ensure_ascii` writes
/// it. Valid JSON has such characters only inside strings.
pub(crate) fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() && c != '\u{7f}' {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// A JSON string literal of `text` as Python's `json.dumps` writes it.
pub(crate) fn string(text: &str) -> String {
    // serde_json escapes what Python's encoder escapes (quote, backslash, \n \r \t \b \f, the
    // other control characters as \u00XX), leaving the rest to `ascii`.
    ascii(&serde_json::Value::String(text.to_owned()).to_string())
}

/// The compact, sorted, ASCII-only text of an object with these members: Python's
/// `json.dumps(obj, sort_keys=True, separators=(",", ":"))` when each value's text is its own
/// such text.
pub(crate) fn object(members: &Members) -> String {
    let mut out = String::from("{");
    for (index, (name, value)) in members.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&string(name));
        out.push(':');
        out.push_str(&ascii(&strip_json_whitespace(value.get())));
    }
    out.push('}');
    out
}

/// A member value from JSON text this module wrote; why not, should it not be JSON.
pub(crate) fn raw(text: String) -> Result<Box<RawValue>, String> {
    RawValue::from_string(text).map_err(|error| format!("not JSON: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_spelled_as_python_sorts_and_escapes_them() {
        let parsed =
            members("{\"tactic\": [1, 1e-05], \"runner\": \"R\u{e9}\", \"a\": {\"b\": 1}}")
                .unwrap();
        assert_eq!(
            object(&parsed),
            r#"{"a":{"b":1},"runner":"R\u00e9","tactic":[1,1e-05]}"#
        );
        assert_eq!(
            string("it's \"q\"\n\u{1f600}"),
            r#""it's \"q\"\n\ud83d\ude00""#
        );
        assert_eq!(string("\u{7f}\u{1}"), r#""\u007f\u0001""#);
    }
}
