//! Python string and bytes literals: prefixes, quoting (single, triple, raw), implicit
//! concatenation, and escapes, checked as Python checks them or decoded as `repr()` writes them.

use super::Parser;

/// How one string literal is quoted and prefixed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quoting {
    pub(super) quote: u8,
    /// `'''` or `"""`: it ends at three quotes and may span lines.
    pub(super) triple: bool,
    /// `r` prefix: a backslash escapes nothing (but still keeps the quote after it).
    pub(super) raw: bool,
    /// `b` prefix: ASCII only, and no `\u`, `\U` or `\N` escapes.
    pub(super) is_bytes: bool,
}

impl Parser<'_> {
    /// One or more adjacent string literals; true for str, false for bytes. Mixing is an error.
    pub(super) fn strings(&mut self) -> Result<bool, String> {
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
    /// literal stands for to `decoded` and refuses escapes it does not decode (see
    /// [`repr_str`](super::repr_str)).
    pub(super) fn string_body(
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
}

pub(super) fn is_string_prefix(prefix: &[u8]) -> bool {
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
