//! Secrets read from files (the shared-directory key, the cluster key): read only if the file
//! is private, as ssh reads a private key, since anyone who can read a key can forge what
//! every node accepts.

use crate::model::shared_key::SharedKey;

/// A shared key from its file: private (`read_private_file`), one line (the line end is not
/// part of the key), long enough.
pub(super) fn read_shared_key(path: &std::path::Path) -> Result<SharedKey, String> {
    let text = read_private_file(path)?;
    let trimmed = text.strip_suffix(b"\n").unwrap_or(&text);
    let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
    SharedKey::new(trimmed)
}

/// Reads a secret (a key file) only if it is private, as ssh reads a private key: the opened
/// file (`fstat`, so no rename can slip another file in between) must be owned by this
/// process's uid or root and give group and others no access. A key that other users can read
/// is no secret: any of them could MAC, and so forge, files every node accepts.
pub(crate) fn read_private_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let metadata = file.metadata().map_err(|e| e.to_string())?;
    let me = nix::unistd::geteuid().as_raw();
    if let Some(why) = private_file_refusal(metadata.uid(), metadata.mode(), me) {
        return Err(why);
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// Why a secret file owned by `owner` with `mode` may not be used by uid `me`; `None` when it
/// is private (ssh's rule for a private key).
pub(super) fn private_file_refusal(owner: u32, mode: u32, me: u32) -> Option<String> {
    let mode = mode & 0o7777;
    let problem = if owner != me && owner != 0 {
        format!("it belongs to uid {owner}, not to this daemon's uid {me} or root")
    } else if mode & 0o077 != 0 {
        "group or others may access it".to_owned()
    } else {
        return None;
    };
    let owners = if me == 0 {
        "root".to_owned()
    } else {
        format!("uid {me} or root")
    };
    Some(format!(
        "owner uid {owner}, mode {mode:04o}: refused, {problem}; a key must be private \
         (owned by {owners}, chmod 600), since anyone who can read it can forge files every \
         node accepts"
    ))
}
