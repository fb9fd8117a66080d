//! How the CLI says why it failed: the error and its causes on one line, each said once
//! (a transport error prints its source and the source is its cause too, so a plain chain
//! would say it twice).

/// An error and its causes on one line, each cause said once: a cause whose text the line
/// already holds (a wrapper that prints its source, as transport errors do) is left out.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        // A wrapper's text that ends with the cause's own: only the part before it is new.
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    dedupe_repeats(&text)
}

/// `a: a: b: b` as `a: b`: the same part twice in a row is said once.
fn dedupe_repeats(text: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in text.split(": ") {
        if parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn an_error_says_each_cause_once() {
        #[derive(Debug)]
        struct Io;
        impl std::fmt::Display for Io {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Permission denied (os error 13)")
            }
        }
        impl std::error::Error for Io {}
        // A transport error that prints its source, wrapped by one that prints it again.
        #[derive(Debug)]
        struct Transport(Io);
        impl std::fmt::Display for Transport {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "transport error: {}", self.0)
            }
        }
        impl std::error::Error for Transport {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = anyhow::Error::new(Transport(Io)).context("cannot reach tunecached at /s");
        assert_eq!(
            one_line(&error),
            "cannot reach tunecached at /s: transport error: Permission denied (os error 13)"
        );
        let repeated = anyhow::anyhow!("transport error: transport error: x: x");
        assert_eq!(one_line(&repeated), "transport error: x");
    }
}
