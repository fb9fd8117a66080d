//! The crate's one parser of Python literals and their string escapes. [`parse`] checks that
//! text is a Python literal that `ast.literal_eval` accepts, the way TensorRT-LLM's `load_cache`
//! reads every key (`str()` of a tuple) and tactic (`repr()` of the tactic) back; it only
//! recognises, it never builds the value. [`repr_str`] reads one string literal as `repr()` writes
//! it and decodes it: import takes the custom op name from a key with it.
//!
//! Accepted, as by `ast.literal_eval`: strings and bytes (any prefix of `r`, `u`, `b`, implicit
//! concatenation, triple quotes), integers (with `0x`/`0o`/`0b` and `_`), floats, imaginary
//! numbers and `a+bj`, unary `+`/`-`, `True`, `False`, `None`, `...`, tuples, lists, dicts,
//! sets and `set()`.

/// What the top-level value is, as far as the loader cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiteralKind {
    /// A tuple; `first_is_str` when its first element is a (non-bytes) string.
    Tuple {
        first_is_str: bool,
    },
    Str,
    Other,
}

/// The kind of the literal in `text`, or why `ast.literal_eval(text)` would raise.
pub fn parse(text: &str) -> Result<LiteralKind, String> {
    let mut parser = Parser::new(text);
    let kind = parser.expression()?;
    parser.skip_space();
    if parser.at != parser.bytes.len() {
        return Err(format!(
            "unexpected {:?} at byte {} of a Python literal",
            parser.rest_preview(),
            parser.at
        ));
    }
    Ok(kind)
}

/// The string literal at the start of `text`, decoded, and the text after its closing quote. It
/// is read as Python's `repr()` of a str writes one: a `'` or `"` quote (never tripled), no
/// prefix, and only the escapes `repr()` writes (`\\`, `\'`, `\"`, `\n`, `\r`, `\t`, `\xXX`,
/// `\uXXXX`, `\UXXXXXXXX`); any other escape is refused rather than guessed at. Characters
/// between the quotes, line breaks included, are taken as they are.
pub fn repr_str(text: &str) -> Result<(String, &str), String> {
    let mut parser = Parser::new(text);
    let quote = match parser.peek() {
        Some(quote @ (b'\'' | b'"')) => quote,
        _ => return parser.error("expected a quoted string"),
    };
    let form = Quoting {
        quote,
        triple: false,
        raw: false,
        is_bytes: false,
    };
    let mut value = String::new();
    parser.string_body(form, Some(&mut value))?;
    Ok((value, &text[parser.at..]))
}

/// Deeper nesting than this is refused (Python's own parser stops near 200 too).
const MAX_DEPTH: usize = 200;

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    depth: usize,
}

/// How one string literal is quoted and prefixed.
#[derive(Debug, Clone, Copy)]
struct Quoting {
    quote: u8,
    /// `'''` or `"""`: it ends at three quotes and may span lines.
    triple: bool,
    /// `r` prefix: a backslash escapes nothing (but still keeps the quote after it).
    raw: bool,
    /// `b` prefix: ASCII only, and no `\u`, `\U` or `\N` escapes.
    is_bytes: bool,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text,
            bytes: text.as_bytes(),
            at: 0,
            depth: 0,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn rest_preview(&self) -> String {
        let end = (self.at + 12).min(self.bytes.len());
        String::from_utf8_lossy(&self.bytes[self.at..end]).into_owned()
    }

    fn skip_space(&mut self) {
        // Inside brackets Python also allows newlines; at top level literal_eval strips
        // leading spaces and tabs. Both are accepted here.
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0c')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.skip_space();
        if self.peek() == Some(byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn error<T>(&self, what: &str) -> Result<T, String> {
        if self.at >= self.bytes.len() {
            Err(format!("{what}: the text ends early"))
        } else {
            Err(format!(
                "{what} at byte {} ({:?})",
                self.at,
                self.rest_preview()
            ))
        }
    }

    /// `unary ( ('+'|'-') unary )?`: the binary form is only valid as `real ± imaginary`.
    fn expression(&mut self) -> Result<LiteralKind, String> {
        let (kind, left_number) = self.unary()?;
        self.skip_space();
        if matches!(self.peek(), Some(b'+' | b'-')) && left_number.is_some() {
            self.at += 1;
            let (_, right_number) = self.unary()?;
            return match (left_number, right_number) {
                (Some(Number::Real), Some(Number::Imaginary)) => Ok(LiteralKind::Other),
                _ => Err("only `real + imaginary` is a literal sum".to_owned()),
            };
        }
        Ok(kind)
    }

    fn unary(&mut self) -> Result<(LiteralKind, Option<Number>), String> {
        self.skip_space();
        if matches!(self.peek(), Some(b'+' | b'-')) {
            self.at += 1;
            let (_, number) = self.unary()?;
            return match number {
                Some(number) => Ok((LiteralKind::Other, Some(number))),
                None => Err("a sign must be followed by a number".to_owned()),
            };
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<(LiteralKind, Option<Number>), String> {
        self.skip_space();
        let Some(first) = self.peek() else {
            return self.error("expected a value");
        };
        match first {
            b'(' | b'[' | b'{' => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(format!("nested deeper than {MAX_DEPTH}"));
                }
                self.at += 1;
                let kind = match first {
                    b'(' => self.tuple()?,
                    b'[' => self.sequence(b']').map(|_| LiteralKind::Other)?,
                    _ => self.braces()?,
                };
                self.depth -= 1;
                Ok((kind, None))
            }
            b'0'..=b'9' | b'.' => {
                if self.bytes[self.at..].starts_with(b"...") {
                    self.at += 3;
                    return Ok((LiteralKind::Other, None));
                }
                let number = self.number()?;
                Ok((LiteralKind::Other, Some(number)))
            }
            b'\'' | b'"' => self
                .strings()
                .map(|is_str| (Self::string_kind(is_str), None)),
            _ if first.is_ascii_alphabetic() || first == b'_' => {
                let start = self.at;
                while self
                    .peek()
                    .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    self.at += 1;
                }
                let word = &self.bytes[start..self.at];
                if matches!(self.peek(), Some(b'\'' | b'"')) && is_string_prefix(word) {
                    self.at = start;
                    return self
                        .strings()
                        .map(|is_str| (Self::string_kind(is_str), None));
                }
                match word {
                    b"True" | b"False" | b"None" => Ok((LiteralKind::Other, None)),
                    b"set" => {
                        if self.eat(b'(') && self.eat(b')') {
                            Ok((LiteralKind::Other, None))
                        } else {
                            self.error("only `set()` is a literal call")
                        }
                    }
                    _ => {
                        self.at = start;
                        self.error("a name is not a literal")
                    }
                }
            }
            _ => self.error("expected a value"),
        }
    }

    fn string_kind(is_str: bool) -> LiteralKind {
        if is_str {
            LiteralKind::Str
        } else {
            LiteralKind::Other
        }
    }

    /// After `(`: `()`, `(x)` (just x), `(x,)`, `(x, y, ...)`.
    fn tuple(&mut self) -> Result<LiteralKind, String> {
        if self.eat(b')') {
            return Ok(LiteralKind::Tuple {
                first_is_str: false,
            });
        }
        let first = self.expression()?;
        if self.eat(b')') {
            return Ok(first);
        }
        if !self.eat(b',') {
            return self.error("expected ',' or ')' in a tuple");
        }
        self.sequence(b')')?;
        Ok(LiteralKind::Tuple {
            first_is_str: first == LiteralKind::Str,
        })
    }

    /// Comma-separated expressions up to `close`, a trailing comma allowed.
    fn sequence(&mut self, close: u8) -> Result<(), String> {
        loop {
            if self.eat(close) {
                return Ok(());
            }
            self.expression()?;
            if self.eat(close) {
                return Ok(());
            }
            if !self.eat(b',') {
                return self.error("expected ',' between elements");
            }
        }
    }

    /// After `{`: a dict or a set (`{}` is a dict).
    fn braces(&mut self) -> Result<LiteralKind, String> {
        if self.eat(b'}') {
            return Ok(LiteralKind::Other);
        }
        self.expression()?;
        let is_dict = self.eat(b':');
        if is_dict {
            self.expression()?;
        }
        loop {
            if self.eat(b'}') {
                return Ok(LiteralKind::Other);
            }
            if !self.eat(b',') {
                return self.error("expected ',' between elements");
            }
            if self.eat(b'}') {
                return Ok(LiteralKind::Other);
            }
            self.expression()?;
            if is_dict {
                if !self.eat(b':') {
                    return self.error("expected ':' in a dict");
                }
                self.expression()?;
            }
        }
    }

    /// One or more adjacent string literals; true for str, false for bytes. Mixing is an error.
    fn strings(&mut self) -> Result<bool, String> {
        let mut kind: Option<bool> = None;
        loop {
            self.skip_space();
            let start = self.at;
            while self.peek().is_some_and(|b| b.is_ascii_alphabetic()) {
                self.at += 1;
            }
            let prefix = &self.bytes[start..self.at];
            if !matches!(self.peek(), Some(b'\'' | b'"')) || !is_string_prefix(prefix) {
                self.at = start;
                return match kind {
                    Some(is_str) => Ok(is_str),
                    None => self.error("expected a string"),
                };
            }
            let lower: Vec<u8> = prefix.iter().map(u8::to_ascii_lowercase).collect();
            let is_bytes = lower.contains(&b'b');
            let raw = lower.contains(&b'r');
            if kind.is_some_and(|is_str| is_str == is_bytes) {
                return Err("cannot mix bytes and str literals".to_owned());
            }
            kind = Some(!is_bytes);
            let quote = self.bytes[self.at];
            let form = Quoting {
                quote,
                triple: self.bytes[self.at..].starts_with(&[quote, quote, quote]),
                raw,
                is_bytes,
            };
            self.string_body(form, None)?;
        }
    }

    /// At the opening quote: the body of one string literal, through its closing quote. Checking
    /// (`decoded` is `None`) refuses what Python refuses; decoding appends the characters the
    /// literal stands for to `decoded` and refuses escapes it does not decode (see [`repr_str`]).
    fn string_body(
        &mut self,
        form: Quoting,
        mut decoded: Option<&mut String>,
    ) -> Result<(), String> {
        let quote = form.quote;
        self.at += if form.triple { 3 } else { 1 };
        // Start of the text not yet copied to `decoded`; always at a char boundary.
        let mut copied_from = self.at;
        loop {
            let Some(byte) = self.peek() else {
                return self.error("unterminated string");
            };
            if form.is_bytes && !byte.is_ascii() {
                return Err("bytes literals may only hold ASCII characters".to_owned());
            }
            if byte == quote {
                let close = if !form.triple {
                    1
                } else if self.bytes[self.at..].starts_with(&[quote, quote, quote]) {
                    3
                } else {
                    0
                };
                if close > 0 {
                    if let Some(out) = decoded.as_deref_mut() {
                        out.push_str(&self.text[copied_from..self.at]);
                    }
                    self.at += close;
                    return Ok(());
                }
            } else if (byte == b'\n' || byte == b'\r') && !form.triple && decoded.is_none() {
                return self.error("newline in a single-quoted string");
            } else if byte == b'\\' {
                if let Some(out) = decoded.as_deref_mut() {
                    out.push_str(&self.text[copied_from..self.at]);
                }
                self.at += 1;
                if self.peek().is_none() {
                    return self.error("unterminated string");
                }
                if !form.raw {
                    self.escape(form.is_bytes, decoded.as_deref_mut())?;
                    copied_from = self.at;
                    continue;
                }
            }
            self.at += 1;
        }
    }

    /// At the byte after a backslash (not raw): checks the escapes Python refuses and, when
    /// decoding, appends the character the escape stands for.
    fn escape(&mut self, is_bytes: bool, decoded: Option<&mut String>) -> Result<(), String> {
        let escaped = self.bytes[self.at];
        let hex_digits = match escaped {
            b'x' => 2,
            b'u' if !is_bytes => 4,
            b'U' if !is_bytes => 8,
            _ => {
                match decoded {
                    Some(out) => {
                        let Some(c) = one_letter_escape(escaped) else {
                            let other = self.text[self.at..].chars().next().unwrap_or_default();
                            return self.error(&format!("unsupported escape \\{other}"));
                        };
                        out.push(c);
                        self.at += 1;
                    }
                    None if escaped == b'N' && !is_bytes => self.named_escape()?,
                    // Any other escaped character (a multi-byte one included) stands for itself
                    // or is a known one-letter escape.
                    None => self.at += utf8_width(escaped),
                }
                return Ok(());
            }
        };
        self.at += 1;
        let Some(digits) = self
            .text
            .get(self.at..self.at + hex_digits)
            .filter(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            return self.error("truncated \\x, \\u or \\U escape");
        };
        // Python refuses a \U escape past the last code point ("illegal Unicode character");
        // a lone surrogate (\ud800) it keeps in a str.
        if escaped == b'U' && u32::from_str_radix(digits, 16).map_or(true, |c| c > 0x10FFFF) {
            return self.error("\\U escape past U+10FFFF (Python: illegal Unicode character)");
        }
        if let Some(out) = decoded {
            let c = u32::from_str_radix(digits, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| {
                    format!("escape \\{} {digits} is not a character", escaped as char)
                })?;
            out.push(c);
        }
        self.at += hex_digits;
        Ok(())
    }

    /// At the `N` of `\N{name}`: checks its shape (the name is not looked up).
    fn named_escape(&mut self) -> Result<(), String> {
        self.at += 1;
        if self.peek() != Some(b'{') {
            return self.error("\\N needs {name}");
        }
        while self.peek().is_some_and(|b| b != b'}') {
            self.at += 1;
        }
        if self.peek().is_none() {
            return self.error("unterminated \\N{...}");
        }
        self.at += 1;
        Ok(())
    }

    fn number(&mut self) -> Result<Number, String> {
        let start = self.at;
        let rest = &self.bytes[self.at..];
        if rest.len() > 1 && rest[0] == b'0' && matches!(rest[1] | 0x20, b'x' | b'o' | b'b') {
            let radix = match rest[1] | 0x20 {
                b'x' => 16,
                b'o' => 8,
                _ => 2,
            };
            self.at += 2;
            self.digits(radix, true)?;
            return self.end_of_number(start, Number::Real);
        }
        let integer_digits = self.digits(10, false)?;
        let mut is_float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            is_float = true;
            let fraction_digits = self.digits(10, false)?;
            if integer_digits == 0 && fraction_digits == 0 {
                return self.error("a lone '.' is not a number");
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits(10, false)? == 0 {
                return self.error("exponent without digits");
            }
            is_float = true;
        }
        if matches!(self.peek(), Some(b'j' | b'J')) {
            self.at += 1;
            return self.end_of_number(start, Number::Imaginary);
        }
        let text = &self.bytes[start..self.at];
        // Python refuses `012` (but accepts `00` and `0_0`).
        if !is_float
            && text.len() > 1
            && text[0] == b'0'
            && text.iter().any(|&b| b != b'0' && b != b'_')
        {
            return Err("leading zeros in a decimal integer are not allowed".to_owned());
        }
        self.end_of_number(start, Number::Real)
    }

    fn end_of_number(&mut self, start: usize, number: Number) -> Result<Number, String> {
        if self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            self.at = start;
            return self.error("invalid number");
        }
        Ok(number)
    }

    /// Digits of `radix` with single `_` separators; returns how many digits.
    fn digits(&mut self, radix: u32, required: bool) -> Result<usize, String> {
        let mut count = 0;
        let mut last_underscore = false;
        while let Some(byte) = self.peek() {
            if byte == b'_' && count > 0 && !last_underscore {
                last_underscore = true;
            } else if (byte as char).is_digit(radix) {
                count += 1;
                last_underscore = false;
            } else {
                break;
            }
            self.at += 1;
        }
        if last_underscore || (required && count == 0) {
            return self.error("malformed digits");
        }
        Ok(count)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Number {
    Real,
    Imaginary,
}

fn is_string_prefix(prefix: &[u8]) -> bool {
    let lower: Vec<u8> = prefix.iter().map(u8::to_ascii_lowercase).collect();
    matches!(lower.as_slice(), b"" | b"r" | b"u" | b"b" | b"br" | b"rb")
}

/// What the escapes `repr()` writes besides `\x`, `\u` and `\U` stand for.
fn one_letter_escape(escaped: u8) -> Option<char> {
    match escaped {
        b'\\' => Some('\\'),
        b'\'' => Some('\''),
        b'"' => Some('"'),
        b'n' => Some('\n'),
        b'r' => Some('\r'),
        b't' => Some('\t'),
        _ => None,
    }
}

fn utf8_width(first: u8) -> usize {
    match first {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_repr_and_str_of_tuples_write() {
        for text in [
            "-1",
            "0",
            "1_000",
            "0x1F",
            "1e-3",
            "5e-324",
            "1.5j",
            "-1+2j",
            "True",
            "None",
            "...",
            "'a\\'b'",
            "\"it's\"",
            "b'\\x00\\xff'",
            "rb'\\d'",
            "'a' 'b'",
            "'caf\u{e9} \\u00e9 \\N{DASH}'",
            "(128, 'tile \"a\"')",
            "{'tile': (64, 128), 'stages': 3}",
            "[1, [2, (3,)]]",
            "{1, 2}",
            "set()",
        ] {
            assert!(parse(text).is_ok(), "{text}: {:?}", parse(text));
        }
        assert_eq!(
            parse("('trtllm::gemm', 'R', ((1, 4096),), 0)"),
            Ok(LiteralKind::Tuple { first_is_str: true })
        );
        assert_eq!(
            parse("(1, 'x')"),
            Ok(LiteralKind::Tuple {
                first_is_str: false
            })
        );
        assert_eq!(parse("('x')"), Ok(LiteralKind::Str));
        assert_eq!(parse("42"), Ok(LiteralKind::Other));
    }

    #[test]
    fn refuses_what_literal_eval_refuses() {
        for text in [
            "",
            "abc",
            "Tactic(3)",
            "1 + 2",
            "012",
            "1__0",
            "0x",
            "'open",
            "(1, 2",
            "[1 2]",
            "{'a' 1}",
            "'a' b'b'",
            "b'\u{e9}'",
            "'\\x4'",
            "1 2",
            "-'a'",
            "1if",
        ] {
            assert!(parse(text).is_err(), "{text:?} was accepted");
        }
        let deep = "(".repeat(500) + &")".repeat(500);
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn repr_str_decodes_what_repr_writes_and_refuses_the_rest() {
        assert_eq!(
            repr_str(r#"'it\'s \"x\"\t\x41\u00e9\U0001F600', 1)"#),
            Ok(("it's \"x\"\tA\u{e9}\u{1f600}".to_owned(), ", 1)"))
        );
        assert_eq!(repr_str("\"it's\")"), Ok(("it's".to_owned(), ")")));
        // Taken as they are, where checking would refuse them.
        assert_eq!(repr_str("'a\nb'"), Ok(("a\nb".to_owned(), "")));
        assert!(parse("'a\nb'").is_err());
        assert_eq!(repr_str("'''x'''"), Ok((String::new(), "'x'''")));
        for text in [
            "x'",
            "'open",
            r"'trailing\",
            r"'\q'",
            r"'\N{DASH}'",
            r"'\x4'",
            r"'\ud800'",
            r"'\U00110000'",
        ] {
            assert!(repr_str(text).is_err(), "{text:?}");
        }
        // Checking accepts every escape Python does.
        assert!(parse(r"'\q \ud800 \N{DASH}'").is_ok());
        // ...and refuses what it refuses: a code point past U+10FFFF.
        assert!(parse(r"'\U00110000'").is_err());
        assert!(parse(r"'\U0010FFFF'").is_ok());
    }
}
