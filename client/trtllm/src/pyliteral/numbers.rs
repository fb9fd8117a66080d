//! Python number literals: integers (decimal, `0x`, `0o`, `0b`, `_` separators), floats and
//! imaginary numbers.

use super::Parser;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Number {
    Real,
    Imaginary,
}

impl Parser<'_> {
    pub(super) fn number(&mut self) -> Result<Number, String> {
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
