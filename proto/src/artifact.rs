//! What an artifact is, for every side of the contract: the rules of its name and digest,
//! the chunking of its streams and the defaults of its limits. The daemon validates with
//! these, and the clients (Rust, and Python through the binding) check with the same ones
//! before they send.

/// Longest artifact name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Most artifacts one result may name.
pub const MAX_PER_RESULT: usize = 64;
/// Most content bytes in one `ArtifactChunk`.
pub const CHUNK_BYTES: usize = 1024 * 1024;
/// Hex digits of a SHA-256 digest.
pub const DIGEST_HEX_LEN: usize = 64;
/// `--max-artifact-bytes` unless set: the largest blob a node stores.
pub const DEFAULT_MAX_ARTIFACT_BYTES: u64 = 256 * 1024 * 1024;
/// `--artifact-store-mib` unless set: the node's store, in MiB.
pub const DEFAULT_STORE_MIB: u64 = 10_240;
/// `--artifact-grace-secs` unless set: how long an unreferenced blob is kept.
pub const DEFAULT_GRACE_SECS: u64 = 3_600;
/// `--cluster-max-artifact-bytes` unless set: the largest blob kept in Redis.
pub const DEFAULT_CLUSTER_MAX_ARTIFACT_BYTES: u64 = 64 * 1024 * 1024;
/// GetArtifact's `wait_ms` when 0: how long a fetch from the tiers below may take.
pub const DEFAULT_WAIT_MS: u32 = 30_000;

/// `ErrorInfo.reason` of an upload refused by a blob-store limit (RESOURCE_EXHAUSTED); its
/// `metadata["flag"]` names the flag, and a `QuotaFailure` violation has the flag as subject.
pub const LIMIT_REASON: &str = "ARTIFACT_LIMIT";

/// Why a name or digest is refused (the reason of an INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("must not be empty")]
    Empty,
    #[error("{0} bytes, at most {MAX_NAME_BYTES}")]
    NameTooLong(usize),
    #[error("\"{0}\" is not a file name (\".\" and \"..\" are refused)")]
    DotName(String),
    #[error("byte {0:#04x} at {1}: only [A-Za-z0-9._-] is allowed")]
    NameByte(u8, usize),
    #[error("{0} characters, a SHA-256 digest is {DIGEST_HEX_LEN} lowercase hex digits")]
    DigestLength(usize),
    #[error("byte {0:#04x} at {1}: a digest is lowercase hex")]
    DigestByte(u8, usize),
}

/// Checks an artifact's name: 1-128 bytes of `[A-Za-z0-9._-]`, not `.` or `..`. Such a name is
/// a plain file name on every file system: no separator, no parent, nothing to escape.
pub fn check_name(name: &str) -> Result<(), Refusal> {
    if name.is_empty() {
        return Err(Refusal::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Refusal::NameTooLong(name.len()));
    }
    if name == "." || name == ".." {
        return Err(Refusal::DotName(name.to_owned()));
    }
    match name
        .bytes()
        .enumerate()
        .find(|(_, b)| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
    {
        Some((at, byte)) => Err(Refusal::NameByte(byte, at)),
        None => Ok(()),
    }
}

/// Checks a digest's text: 64 lowercase hex digits, so that one blob has one spelling (and
/// one file name).
pub fn check_digest(digest: &str) -> Result<(), Refusal> {
    if digest.len() != DIGEST_HEX_LEN {
        return Err(Refusal::DigestLength(digest.len()));
    }
    match digest
        .bytes()
        .enumerate()
        .find(|(_, b)| !matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        Some((at, byte)) => Err(Refusal::DigestByte(byte, at)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_file_names() {
        for good in [
            "a",
            "source.cu",
            "wrapper_compiled.so",
            "x-1.2_3",
            &"n".repeat(128),
        ] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        assert_eq!(check_name(""), Err(Refusal::Empty));
        assert_eq!(check_name(&"n".repeat(129)), Err(Refusal::NameTooLong(129)));
        assert_eq!(check_name("."), Err(Refusal::DotName(".".into())));
        assert_eq!(check_name(".."), Err(Refusal::DotName("..".into())));
        assert_eq!(check_name("../x"), Err(Refusal::NameByte(b'/', 2)));
        assert_eq!(check_name("a b"), Err(Refusal::NameByte(b' ', 1)));
        assert_eq!(check_name("é"), Err(Refusal::NameByte(0xc3, 0)));
        assert_eq!(check_name("a\0"), Err(Refusal::NameByte(0, 1)));
    }

    #[test]
    fn digests_have_one_spelling() {
        let good = "0123456789abcdef".repeat(4);
        assert_eq!(check_digest(&good), Ok(()));
        assert_eq!(check_digest(""), Err(Refusal::DigestLength(0)));
        assert_eq!(check_digest(&good[1..]), Err(Refusal::DigestLength(63)));
        let upper = good.to_uppercase();
        assert_eq!(check_digest(&upper), Err(Refusal::DigestByte(b'A', 10)));
        assert_eq!(
            check_digest(&format!("{}g", &good[1..])),
            Err(Refusal::DigestByte(b'g', 63))
        );
    }
}
