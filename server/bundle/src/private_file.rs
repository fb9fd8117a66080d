//! Secrets read from files (the daemon's shared-directory and cluster keys, a bundle's signing
//! key): read only if the file is private, as ssh reads a private key, since anyone who can
//! read a key can forge what it vouches for.

/// Reads a secret (a key file) only if it is private, as ssh reads a private key: the opened
/// file (`fstat`, so no rename can slip another file in between) must be owned by this
/// process's uid or root and give group and others no access. A key that other users can read
/// is no secret: any of them could MAC or sign, and so forge, what the key vouches for.
pub fn read_private_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
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
pub fn private_file_refusal(owner: u32, mode: u32, me: u32) -> Option<String> {
    let mode = mode & 0o7777;
    let problem = if owner != me && owner != 0 {
        format!("it belongs to uid {owner}, not to this process's uid {me} or root")
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
         (owned by {owners}, chmod 600), since anyone who can read it can forge what it vouches \
         for"
    ))
}

#[cfg(test)]
mod tests {
    use super::private_file_refusal;

    #[test]
    fn a_key_file_is_used_only_when_private_as_ssh_requires() {
        // Owned by the process's uid or root, no bits for group or others.
        for (owner, mode) in [(1001, 0o100600), (1001, 0o400), (0, 0o600), (0, 0o400)] {
            assert_eq!(
                private_file_refusal(owner, mode, 1001),
                None,
                "{owner} {mode:o}"
            );
        }
        for (owner, mode, names) in [
            (1001, 0o644, "mode 0644"),
            (1001, 0o640, "mode 0640"),
            (1001, 0o604, "mode 0604"),
            (1001, 0o620, "mode 0620"),
            (0, 0o100644, "owner uid 0, mode 0644"),
            (1002, 0o600, "belongs to uid 1002"),
        ] {
            let why = private_file_refusal(owner, mode, 1001)
                .unwrap_or_else(|| panic!("{owner} {mode:o} was accepted"));
            assert!(why.contains(names), "{why}");
        }
        let why = private_file_refusal(1002, 0o600, 0).unwrap();
        assert!(why.contains("owned by root, chmod 600"), "{why}");
    }
}
