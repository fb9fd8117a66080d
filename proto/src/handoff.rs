//! The descriptor handoff's wire format, shared by the daemon and the clients: a rank on the
//! daemon's node asks for a held blob by digest on the handoff socket, beside the gRPC socket,
//! and is handed a read-only descriptor of the daemon's verified file (`SCM_RIGHTS`), so the
//! blob's bytes never pass through HTTP/2 framing or a second copy in either process.
//!
//! One connection carries any number of exchanges, one at a time:
//! - the request is the digest, 64 lowercase hex digits, and a newline (65 bytes);
//! - the answer is one line: `held <size>` with the descriptor attached to its first byte;
//!   `not-held` when this node does not hold the blob and could not get it now (no entry here
//!   names it, or the tiers did not supply it within the daemon's wait: a blob an entry names
//!   is fetched before the answer; the client then calls GetArtifact, which says why); or `refused <why>`, after which the daemon closes the
//!   connection. Whatever the answer, GetArtifact stays the one way that always works, so a
//!   client falls back to it on anything but `held`.

use std::path::{Path, PathBuf};

use crate::artifact::{check_digest, Refusal, DIGEST_HEX_LEN};

/// What is appended to the gRPC socket's path to name the handoff socket.
pub const SOCKET_SUFFIX: &str = ".handoff";
/// The bytes of one request: a digest and a newline.
pub const REQUEST_BYTES: usize = DIGEST_HEX_LEN + 1;
/// The longest answer line, newline included; a longer `refused` reason is cut.
pub const MAX_ANSWER_BYTES: usize = 256;

/// The handoff socket that serves beside the gRPC socket at `socket`.
pub fn socket_path(socket: &Path) -> PathBuf {
    let mut path = socket.as_os_str().to_owned();
    path.push(SOCKET_SUFFIX);
    PathBuf::from(path)
}

/// The request for blob `digest`, which must pass [`check_digest`].
pub fn request(digest: &str) -> Result<Vec<u8>, Refusal> {
    check_digest(digest)?;
    let mut line = Vec::with_capacity(REQUEST_BYTES);
    line.extend_from_slice(digest.as_bytes());
    line.push(b'\n');
    Ok(line)
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    #[error("a request ends with a newline")]
    NoNewline,
    #[error("digest: {0}")]
    Digest(Refusal),
}

/// The digest a request asks for.
pub fn parse_request(line: &[u8; REQUEST_BYTES]) -> Result<&str, BadRequest> {
    let (digest, newline) = line.split_at(DIGEST_HEX_LEN);
    if newline != b"\n" {
        return Err(BadRequest::NoNewline);
    }
    // Not UTF-8 cannot be hex either: the check below names the first bad byte.
    let digest = std::str::from_utf8(digest).map_err(|error| {
        BadRequest::Digest(Refusal::DigestByte(
            digest[error.valid_up_to()],
            error.valid_up_to(),
        ))
    })?;
    check_digest(digest).map_err(BadRequest::Digest)?;
    Ok(digest)
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A descriptor of the blob's file comes with this line; the file is `size` bytes.
    Held { size: u64 },
    /// Not on this node now: use GetArtifact.
    NotHeld,
    /// The caller may not, or the request is bad; the connection ends.
    Refused(String),
}

impl Answer {
    /// The answer's line, newline included, at most [`MAX_ANSWER_BYTES`].
    pub fn encode(&self) -> Vec<u8> {
        let mut line = match self {
            Answer::Held { size } => format!("held {size}"),
            Answer::NotHeld => "not-held".to_owned(),
            Answer::Refused(why) => {
                // One line, within the bound, cut at a character boundary.
                let why: String = why
                    .chars()
                    .map(|c| if c == '\n' { ' ' } else { c })
                    .collect();
                let mut line = format!("refused {why}");
                let mut end = (MAX_ANSWER_BYTES - 1).min(line.len());
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                line.truncate(end);
                line
            }
        }
        .into_bytes();
        line.push(b'\n');
        line
    }

    /// Reads an answer line (without its newline).
    pub fn parse(line: &[u8]) -> Option<Answer> {
        let line = std::str::from_utf8(line).ok()?;
        if line == "not-held" {
            return Some(Answer::NotHeld);
        }
        if let Some(why) = line.strip_prefix("refused ") {
            return Some(Answer::Refused(why.to_owned()));
        }
        let size = line.strip_prefix("held ")?;
        // A plain decimal: no sign, no leading zero but for 0 itself.
        if size.is_empty()
            || !size.bytes().all(|b| b.is_ascii_digit())
            || (size.len() > 1 && size.starts_with('0'))
        {
            return None;
        }
        Some(Answer::Held {
            size: size.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn the_socket_sits_beside_the_grpc_socket() {
        assert_eq!(
            socket_path(Path::new("/run/tunecache/tunecache.sock")),
            Path::new("/run/tunecache/tunecache.sock.handoff")
        );
    }

    #[test]
    fn a_request_round_trips_and_a_bad_one_is_named() {
        let line: [u8; REQUEST_BYTES] = request(DIGEST).unwrap().try_into().unwrap();
        assert_eq!(parse_request(&line), Ok(DIGEST));
        assert!(request("ABC").is_err());
        let mut upper = line;
        upper[3] = b'F';
        assert_eq!(
            parse_request(&upper),
            Err(BadRequest::Digest(Refusal::DigestByte(b'F', 3)))
        );
        let mut no_newline = line;
        no_newline[DIGEST_HEX_LEN] = b' ';
        assert_eq!(parse_request(&no_newline), Err(BadRequest::NoNewline));
        let mut not_utf8 = line;
        not_utf8[5] = 0xff;
        assert_eq!(
            parse_request(&not_utf8),
            Err(BadRequest::Digest(Refusal::DigestByte(0xff, 5)))
        );
    }

    #[test]
    fn answers_round_trip_and_stay_one_bounded_line() {
        for answer in [
            Answer::Held { size: 0 },
            Answer::Held { size: u64::MAX },
            Answer::NotHeld,
            Answer::Refused("uid 1000 may not call TuneCache".to_owned()),
        ] {
            let line = answer.encode();
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(Answer::parse(&line[..line.len() - 1]), Some(answer));
        }
        let long = Answer::Refused(format!("a\nb{}", "é".repeat(400))).encode();
        assert!(long.len() <= MAX_ANSWER_BYTES);
        assert_eq!(long.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(std::str::from_utf8(&long).is_ok());
    }

    #[test]
    fn malformed_answers_are_none() {
        for bad in [
            &b"held"[..],
            b"held ",
            b"held -1",
            b"held 01",
            b"held 1 ",
            b"held 18446744073709551616",
            b"ok 5",
            b"\xff",
        ] {
            assert_eq!(
                Answer::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
