//! The grammar of a Python literal's values: a sum `real ± imaginary`, signs, atoms (numbers,
//! strings, names), and the containers, tuples, lists, dicts and sets, nested at most
//! [`MAX_DEPTH`] deep.

use super::numbers::Number;
use super::strings::is_string_prefix;
use super::{LiteralKind, Parser};

/// Deeper nesting than this is refused (Python's own parser stops near 200 too).
const MAX_DEPTH: usize = 200;

impl Parser<'_> {
    /// `unary ( ('+'|'-') unary )?`: the binary form is only valid as `real ± imaginary`.
    pub(super) fn expression(&mut self) -> Result<LiteralKind, String> {
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
}
