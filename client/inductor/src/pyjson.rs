//! JSON as Python's `json` module reads and writes it, both ways, for Inductor's files: the bare
//! `Infinity`, `-Infinity` and `NaN` that `json.dumps` writes for non-finite floats (which
//! serde_json refuses) are numbers here, outside strings only; objects keep their members in
//! file order, a repeated name keeping the first one's position and the last one's value (as
//! `json.load` builds a dict); numbers are carried as the text that spelled them, so that a file
//! merged on export keeps what we did not change byte for byte. Text is written as
//! `json.dumps` lays it out (compact, default separators, or `indent=N`), ASCII-only as its
//! default `ensure_ascii=True` writes it, and floats we write are spelled as Python's `repr`.

/// Deepest nesting parsed: Inductor's files nest four levels; a deeper file is refused rather
/// than risking the stack.
const MAX_DEPTH: usize = 128;

/// A parsed JSON value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    /// A number as the text that spelled it: a JSON number, or `Infinity`, `-Infinity`, `NaN`.
    Number(String),
    String(String),
    Array(Vec<Value>),
    /// Members in file order, names unique.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// A float as Python's `json.dumps` writes it.
    pub(crate) fn float(value: f64) -> Value {
        Value::Number(python_float_repr(value))
    }

    /// The number as Python's `float()` of it; None for anything else.
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(text) => match text.as_str() {
                "Infinity" => Some(f64::INFINITY),
                "-Infinity" => Some(f64::NEG_INFINITY),
                "NaN" => Some(f64::NAN),
                // Rust's parse rounds correctly, as Python's float() does, and takes every JSON
                // number (exponents, integers beyond 2^53).
                number => number.parse().ok(),
            },
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(text) => Some(text),
            _ => None,
        }
    }

    pub(crate) fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(members) => Some(members),
            _ => None,
        }
    }

    /// Whether any number in it is non-finite (which plain JSON cannot spell).
    pub(crate) fn has_nonfinite(&self) -> bool {
        match self {
            Value::Number(text) => matches!(text.as_str(), "Infinity" | "-Infinity" | "NaN"),
            Value::Array(items) => items.iter().any(Value::has_nonfinite),
            Value::Object(members) => members.iter().any(|(_, value)| value.has_nonfinite()),
            _ => false,
        }
    }
}

/// The member `name` of `members`.
pub(crate) fn member<'a>(members: &'a [(String, Value)], name: &str) -> Option<&'a Value> {
    members
        .iter()
        .find(|(member, _)| member == name)
        .map(|(_, value)| value)
}

/// Sets `name` to `value`: in place when present, else appended (a Python dict's order).
pub(crate) fn set_member(members: &mut Vec<(String, Value)>, name: &str, value: Value) {
    match members.iter_mut().find(|(member, _)| member == name) {
        Some((_, existing)) => *existing = value,
        None => members.push((name.to_owned(), value)),
    }
}

/// Parses `text` as Python's `json.loads` does; why not, with the byte offset.
pub(crate) fn parse(text: &str) -> Result<Value, String> {
    let mut parser = Parser { text, at: 0 };
    let value = parser.value(0)?;
    parser.whitespace();
    if parser.at != text.len() {
        return Err(parser.error("trailing characters"));
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.at)
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &str) -> bool {
        let found = self.text[self.at..].starts_with(word);
        if found {
            self.at += word.len();
        }
        found
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        self.whitespace();
        if self.peek() != Some(byte) {
            return Err(self.error(&format!("expected '{}'", char::from(byte))));
        }
        self.at += 1;
        Ok(())
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(self.error("nested too deep"));
        }
        self.whitespace();
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Value::String),
            _ if self.literal("null") => Ok(Value::Null),
            _ if self.literal("true") => Ok(Value::Bool(true)),
            _ if self.literal("false") => Ok(Value::Bool(false)),
            _ if self.literal("NaN") => Ok(Value::Number("NaN".to_owned())),
            _ if self.literal("Infinity") => Ok(Value::Number("Infinity".to_owned())),
            _ if self.literal("-Infinity") => Ok(Value::Number("-Infinity".to_owned())),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.error("expected a value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, String> {
        self.at += 1;
        let mut members = Vec::new();
        self.whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a member name"));
            }
            let name = self.string()?;
            self.expect(b':')?;
            let value = self.value(depth + 1)?;
            set_member(&mut members, &name, value);
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Value::Object(members));
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, String> {
        self.at += 1;
        let mut items = Vec::new();
        self.whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }

    /// A string literal: its extent found here, its escapes decoded by serde_json (surrogate
    /// pairs included).
    fn string(&mut self) -> Result<String, String> {
        let start = self.at;
        let bytes = self.text.as_bytes();
        let mut index = start + 1;
        loop {
            match bytes.get(index) {
                None => return Err(self.error("unterminated string")),
                Some(b'\\') => index += 2,
                Some(b'"') => break,
                Some(_) => index += 1,
            }
        }
        // `index` is on the closing quote, an ASCII byte, so a char boundary.
        let literal = &self.text[start..=index];
        let decoded = serde_json::from_str::<String>(literal)
            .map_err(|error| self.error(&format!("bad string ({error})")))?;
        self.at = index + 1;
        Ok(decoded)
    }

    /// A JSON number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, kept as its text.
    fn number(&mut self) -> Result<Value, String> {
        let start = self.at;
        let bytes = self.text.as_bytes();
        let digits = |at: &mut usize| {
            let from = *at;
            while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at - from
        };
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        let int_start = at;
        let int_digits = digits(&mut at);
        let leading_zero = int_digits > 1 && bytes.get(int_start) == Some(&b'0');
        if int_digits == 0 || leading_zero {
            return Err(self.error("bad number"));
        }
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            if digits(&mut at) == 0 {
                return Err(self.error("bad number"));
            }
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(bytes.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if digits(&mut at) == 0 {
                return Err(self.error("bad number"));
            }
        }
        self.at = at;
        Ok(Value::Number(self.text[start..at].to_owned()))
    }
}

/// How `json.dumps` lays a value out.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Layout {
    /// `separators=(",", ":")`.
    Compact,
    /// The defaults: `", "` between items, `": "` after names, one line.
    Default,
    /// `indent=N`: an item a line, `","` at line ends, `": "` after names.
    Indent(usize),
}

/// `value` as `json.dumps(value, ...)` with `layout` writes it (`ensure_ascii` on, members in
/// their order).
pub(crate) fn write(value: &Value, layout: Layout) -> String {
    let mut out = String::new();
    write_value(&mut out, value, layout, 0);
    out
}

fn newline(out: &mut String, layout: Layout, depth: usize) {
    if let Layout::Indent(width) = layout {
        out.push('\n');
        out.push_str(&" ".repeat(width * depth));
    }
}

fn write_value(out: &mut String, value: &Value, layout: Layout, depth: usize) {
    let item_separator = match layout {
        Layout::Compact | Layout::Indent(_) => ",",
        Layout::Default => ", ",
    };
    let name_separator = match layout {
        Layout::Compact => ":",
        Layout::Default | Layout::Indent(_) => ": ",
    };
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(text) => out.push_str(text),
        Value::String(text) => write_string(out, text),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Object(members) if members.is_empty() => out.push_str("{}"),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push_str(item_separator);
                }
                newline(out, layout, depth + 1);
                write_value(out, item, layout, depth + 1);
            }
            newline(out, layout, depth);
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (index, (name, member)) in members.iter().enumerate() {
                if index > 0 {
                    out.push_str(item_separator);
                }
                newline(out, layout, depth + 1);
                write_string(out, name);
                out.push_str(name_separator);
                write_value(out, member, layout, depth + 1);
            }
            newline(out, layout, depth);
            out.push('}');
        }
    }
}

/// A string literal as `json.dumps` writes it with `ensure_ascii`: everything outside `' '..='~'`
/// escaped, the usual five by their letters, the rest as `\uXXXX` (lowercase, surrogate pairs
/// beyond the BMP).
pub(crate) fn write_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// `repr(value)` of a Python float, which `json.dumps` writes (`Infinity`, `-Infinity`, `NaN`
/// for the non-finite): the shortest digits that read back to the same float (Rust's `{:e}`
/// gives the same ones), positional from 1e-4 up to 1e16 with at least one digit after the
/// point, scientific outside with a signed exponent of at least two digits.
pub(crate) fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i64 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(magnitude) => ("-", magnitude),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if value == 0.0 {
        return format!("{sign}0.0");
    }
    if !(-4..16).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        return format!(
            "{sign}{first}{point}{rest}e{exponent_sign}{:02}",
            exponent.abs()
        );
    }
    if exponent < 0 {
        let zeros = "0".repeat(usize::try_from(-exponent - 1).unwrap_or(0));
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = usize::try_from(exponent + 1).unwrap_or(1);
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        let (int_part, fraction) = digits.split_at(int_len);
        format!("{sign}{int_part}.{fraction}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_spelled_as_python_repr_spells_them() {
        for (value, repr) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (2.0, "2.0"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (0.0001, "0.0001"),
            (1e-05, "1e-05"),
            (1.5e-05, "1.5e-05"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (-1.5e300, "-1.5e+300"),
            (0.012345678901234568, "0.012345678901234568"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(python_float_repr(value), repr, "{value}");
        }
    }

    #[test]
    fn nonfinite_tokens_are_numbers_outside_strings_only() {
        let value = parse(r#"{"a": [Infinity, -Infinity, NaN, 1e-05], "Infinity": "NaN", "a": 2}"#)
            .unwrap();
        let members = value.as_object().unwrap();
        // A repeated name: the first one's place, the last one's value.
        assert_eq!(members[0], ("a".to_owned(), Value::Number("2".to_owned())));
        assert_eq!(member(members, "Infinity").unwrap().as_str(), Some("NaN"));
        let array = parse("[Infinity, -Infinity, NaN]").unwrap();
        let Value::Array(items) = &array else {
            panic!("{array:?}")
        };
        assert_eq!(items[0].as_f64(), Some(f64::INFINITY));
        assert_eq!(items[1].as_f64(), Some(f64::NEG_INFINITY));
        assert!(items[2].as_f64().unwrap().is_nan());
        assert!(array.has_nonfinite());
        for bad in [
            "{",
            "[1,]",
            "01",
            "1.",
            "-",
            "\"a",
            "{\"a\" 1}",
            "Inf",
            "1 2",
            "[nan]",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn layouts_are_json_dumps_ones() {
        let value = parse("{\"b\":[1,{}],\"a\":{\"c\":\"\u{e9}\\n\",\"d\":[]},\"e\":NaN}").unwrap();
        assert_eq!(
            write(&value, Layout::Compact),
            r#"{"b":[1,{}],"a":{"c":"\u00e9\n","d":[]},"e":NaN}"#
        );
        assert_eq!(
            write(&value, Layout::Default),
            r#"{"b": [1, {}], "a": {"c": "\u00e9\n", "d": []}, "e": NaN}"#
        );
        assert_eq!(
            write(&value, Layout::Indent(4)),
            "{\n    \"b\": [\n        1,\n        {}\n    ],\n    \"a\": {\n        \"c\": \"\\u00e9\\n\",\n        \"d\": []\n    },\n    \"e\": NaN\n}"
        );
        let mut out = String::new();
        write_string(&mut out, "\u{7f}\u{1}\u{1f600}/");
        assert_eq!(out, r#""\u007f\u0001\ud83d\ude00/""#);
    }
}
