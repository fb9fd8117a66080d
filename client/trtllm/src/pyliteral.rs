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

mod numbers;
mod strings;
mod values;

use strings::Quoting;

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

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    depth: usize,
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
