//! Python's `json` module, mimicked on both sides: how `json.load` treats repeated names (the
//! last value wins, at the first one's position), the bare `NaN`/`Infinity` that `json.dump`
//! writes for non-finite floats, and the layout of `json.dump(..., indent=2)` with its default
//! `ensure_ascii` (every non-ASCII character in strings as `\uXXXX`).

use std::borrow::Cow;
use std::collections::HashMap;

pub(crate) struct Deduplicated<T> {
    pub(crate) kept: Vec<(String, T)>,
    /// Names of the members that a later one with the same name replaced.
    pub(crate) dropped: Vec<String>,
}

/// Python's json.load semantics for repeated names: the position of the first, the value of the
/// last.
pub(crate) fn keep_last_duplicate<T>(members: Vec<(String, T)>) -> Deduplicated<T> {
    let mut kept: Vec<(String, T)> = Vec::with_capacity(members.len());
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut dropped = Vec::new();
    for (name, value) in members {
        match position.get(&name) {
            Some(&existing) => {
                kept[existing].1 = value;
                dropped.push(name);
            }
            None => {
                position.insert(name.clone(), kept.len());
                kept.push((name, value));
            }
        }
    }
    Deduplicated { kept, dropped }
}

/// Quotes the bare `NaN`, `Infinity` and `-Infinity` that Python's json.dump writes for
/// non-finite floats, outside strings, so that serde_json parses the file. Those letters never
/// occur outside strings in valid JSON, so nothing valid is changed.
pub(crate) fn quote_python_nonfinite_literals(text: &str) -> Cow<'_, str> {
    const LITERALS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];
    let bytes = text.as_bytes();
    let mut rewritten: Option<String> = None;
    let mut copied_up_to = 0;
    let mut in_string = false;
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if in_string {
            match byte {
                b'\\' => index += 1,
                b'"' => in_string = false,
                _ => {}
            }
            index += 1;
            continue;
        }
        if byte == b'"' {
            in_string = true;
            index += 1;
            continue;
        }
        if let Some(literal) = LITERALS
            .iter()
            .find(|literal| bytes[index..].starts_with(literal.as_bytes()))
        {
            // `index` sits on an ASCII byte, so it is a char boundary.
            let out = rewritten.get_or_insert_with(|| String::with_capacity(text.len() + 16));
            out.push_str(&text[copied_up_to..index]);
            out.push('"');
            out.push_str(literal);
            out.push('"');
            index += literal.len();
            copied_up_to = index;
            continue;
        }
        index += 1;
    }
    match rewritten {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied_up_to..]);
            Cow::Owned(out)
        }
    }
}

/// Lays out valid JSON text as Python's `json.dump(obj, f, indent=2)` does (TensorRT-LLM's writer):
/// two-space indent, `": "` after keys, empty containers as `{}` / `[]`, and, as with Python's
/// default `ensure_ascii=True`, every non-ASCII character (and DEL) in strings as `\uXXXX`.
/// Scalars, escapes included, are copied as they are.
pub fn python_indent_2(json: &str) -> String {
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            if escaped {
                escaped = false;
                out.push(c);
            } else if c == '\\' {
                escaped = true;
                out.push(c);
            } else if c == '"' {
                in_string = false;
                out.push(c);
            } else if c.is_ascii() && c != '\u{7f}' {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while chars.peek().is_some_and(|next| next.is_ascii_whitespace()) {
                    chars.next();
                }
                out.push(c);
                if chars.peek() == Some(&close) {
                    chars.next();
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(',');
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_ascii_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_indent_matches_json_dump_layout() {
        assert_eq!(python_indent_2("{}"), "{}");
        assert_eq!(python_indent_2(r#"{"a":[],"b":{ },"c":[1,{"d":"x, y: {z}"}]}"#),
            "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    1,\n    {\n      \"d\": \"x, y: {z}\"\n    }\n  ]\n}");
        assert_eq!(
            python_indent_2(r#"["q\"\\",1]"#),
            "[\n  \"q\\\"\\\\\",\n  1\n]"
        );
    }

    #[test]
    fn nonfinite_literals_are_quoted_only_outside_strings() {
        assert_eq!(
            quote_python_nonfinite_literals(
                r#"{"NaN": [NaN, -Infinity, Infinity], "s": "Infinity\"NaN"}"#
            ),
            r#"{"NaN": ["NaN", "-Infinity", "Infinity"], "s": "Infinity\"NaN"}"#
        );
        assert!(matches!(
            quote_python_nonfinite_literals("{\"a\": 1}"),
            Cow::Borrowed(_)
        ));
    }
}
