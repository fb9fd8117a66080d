//! Where this daemon lives: its socket, its state directory and its node name (with the node
//! id kept in the state directory), from the flags, then the directories systemd made for the
//! service (`$RUNTIME_DIRECTORY`, `$STATE_DIRECTORY`), then the defaults every client uses.

use std::path::PathBuf;

use super::Config;

impl Config {
    /// `--socket`/`$TUNECACHE_SOCKET`, then `$RUNTIME_DIRECTORY/tunecache.sock` (systemd's
    /// `RuntimeDirectory=`), then the XDG/tmp default every client uses.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .or_else(|| runtime_directory().map(|dir| dir.join("tunecache.sock")))
            .unwrap_or_else(tunecache_proto::socket_path::fallback_socket_path)
    }

    /// `--state-dir`/`$TUNECACHE_STATE_DIR`, then `$STATE_DIRECTORY` (systemd's
    /// `StateDirectory=`), then the XDG default.
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        if let Some(dir) = state_directory() {
            return dir;
        }
        if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir).join("tunecache");
        }
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        match home {
            Some(home) => PathBuf::from(home).join(".local/state/tunecache"),
            // SAFETY: getuid has no preconditions and cannot fail.
            None => PathBuf::from(format!("/tmp/tunecache-{}/state", unsafe {
                libc::getuid()
            })),
        }
    }

    /// `--node-name`, else the hostname (cut to the name rule) and this state directory's
    /// node id (`ensure_node_id` makes it at start).
    pub fn node_name(&self) -> String {
        if let Some(name) = &self.node_name {
            return name.clone();
        }
        let host: String = nix::unistd::gethostname()
            .ok()
            .and_then(|name| name.into_string().ok())
            .unwrap_or_else(|| "localhost".to_owned())
            .chars()
            .map(|c| {
                if crate::model::names::node_name_char(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(48)
            .collect();
        let host = host.trim_start_matches(['.', '-']);
        let host = if host.is_empty() { "node" } else { host };
        match std::fs::read_to_string(self.state_dir().join(NODE_ID_FILE)) {
            Ok(id) if check_node_id(id.trim()) => format!("{host}-{}", id.trim()),
            _ => host.to_owned(),
        }
    }

    /// Without `--node-name`, makes sure the state directory has a node id (8 random hex
    /// digits, made once), so two daemons on one host never share a default name.
    pub fn ensure_node_id(&self) -> crate::Result<()> {
        if self.node_name.is_some() {
            return Ok(());
        }
        let path = self.state_dir().join(NODE_ID_FILE);
        match std::fs::read_to_string(&path) {
            Ok(id) if check_node_id(id.trim()) => return Ok(()),
            _ => {}
        }
        let mut bytes = [0u8; 4];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .map_err(|e| crate::Error::io("reading", std::path::Path::new("/dev/urandom"), e))?;
        let id = format!("{:08x}\n", u32::from_le_bytes(bytes));
        std::fs::write(&path, id).map_err(|e| crate::Error::io("writing the node id", &path, e))
    }
}

/// The first directory of a `$STATE_DIRECTORY`-style variable (systemd separates several
/// `StateDirectory=` entries with colons).
fn first_directory(variable: &str) -> Option<PathBuf> {
    let value = std::env::var_os(variable)?;
    let value = value.to_str()?;
    value
        .split(':')
        .find(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

/// The state-directory file holding this daemon's node id.
const NODE_ID_FILE: &str = "node-id";

fn check_node_id(id: &str) -> bool {
    id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `StateDirectory=`'s directory, when the daemon runs as a systemd service that sets one.
pub(super) fn state_directory() -> Option<PathBuf> {
    first_directory("STATE_DIRECTORY")
}

/// `RuntimeDirectory=`'s directory, when the daemon runs as a systemd service that sets one.
fn runtime_directory() -> Option<PathBuf> {
    first_directory("RUNTIME_DIRECTORY")
}
