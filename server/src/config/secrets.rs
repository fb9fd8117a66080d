//! Secrets read from files (the shared-directory key, the cluster key): read only if the file
//! is private, as ssh reads a private key, since anyone who can read a key can forge what
//! every node accepts. The rule itself (`read_private_file`) is the bundle crate's, which reads
//! a bundle's signing key by it too.

use tunecache_bundle::private_file::read_private_file;

use crate::model::shared_key::SharedKey;

/// A shared key from its file: private (`read_private_file`), one line (the line end is not
/// part of the key), long enough.
pub(super) fn read_shared_key(path: &std::path::Path) -> Result<SharedKey, String> {
    let text = read_private_file(path)?;
    let trimmed = text.strip_suffix(b"\n").unwrap_or(&text);
    let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
    SharedKey::new(trimmed)
}
