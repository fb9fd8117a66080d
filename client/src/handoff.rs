//! The descriptor handoff, client side (the wire format is `tunecache_proto::handoff`): on the
//! daemon's node a held blob is taken as a read-only descriptor of the daemon's file instead of
//! a GetArtifact stream, so reading it costs what reading a local file costs.
//!
//! The daemon hands only a file it hashed whole to the digest as that very file, mode 0444
//! and its own, and writes blobs only by renaming new files in, so the client does not hash
//! the bytes again: it checks the size the entry names against the file's. A rank of the
//! daemon's own uid can still change the file; `TUNECACHE_VERIFY=1` hashes every handed copy
//! (`crate::handed`). It trusts the answering daemon as it trusts
//! its gRPC answers: the socket's peer must be a uid this client trusts (`SO_PEERCRED`, as for
//! the gRPC socket). A blob the node lacks but an entry there names is fetched from the tiers
//! by the daemon before it answers. Anything but a descriptor (no such socket, an older daemon,
//! a blob the node could not get, a refusal, an error) leaves the caller on GetArtifact, which
//! always works and says why a blob cannot be had. `TUNECACHE_HANDOFF=0` turns the handoff off.
//!
//! A process keeps one connection per handoff socket ([`take_kept`], [`keep`]), shared by
//! every `Client` and clone in it, so a rank taking many blobs connects (and is checked by
//! the daemon) once, not once per blob. A call that finds it in use by another call connects
//! one of its own for the exchange; only one stays. A connection is kept by the process that
//! made it: a child after `fork` makes its own, never sharing its parent's exchanges.
//!
//! The exchanges block: run them on the blocking pool.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tunecache_proto::handoff::{request, Answer, MAX_ANSWER_BYTES};

/// The environment variable that turns the handoff off when it is `0`.
pub const HANDOFF_ENV: &str = "TUNECACHE_HANDOFF";

/// The environment variable that makes the client hash every handed blob's copy when it is
/// `1` ([`crate::Client::verify_handoffs`]).
pub const VERIFY_ENV: &str = "TUNECACHE_VERIFY";

/// Whether the environment asks for handed copies to be hashed (`TUNECACHE_VERIFY=1`).
pub fn verify_from_env() -> bool {
    verify_requested(std::env::var(VERIFY_ENV).ok().as_deref())
}

fn verify_requested(value: Option<&str>) -> bool {
    value.is_some_and(|value| value.trim() == "1")
}

/// The handoff socket beside the gRPC socket `socket`, unless `TUNECACHE_HANDOFF=0`.
pub fn socket_for(socket: &Path) -> Option<PathBuf> {
    match std::env::var(HANDOFF_ENV) {
        Ok(value) if value.trim() == "0" => None,
        _ => Some(tunecache_proto::handoff::socket_path(socket)),
    }
}

/// One connection to the handoff socket.
pub struct Handoff {
    stream: UnixStream,
    /// The process that connected it (`std::process::id`).
    owner: u32,
}

/// The connections kept between calls: at most one per handoff socket, idle.
fn kept() -> &'static Mutex<HashMap<PathBuf, Handoff>> {
    static KEPT: OnceLock<Mutex<HashMap<PathBuf, Handoff>>> = OnceLock::new();
    KEPT.get_or_init(Mutex::default)
}

/// The connection this process keeps to the handoff socket at `path`, taken out for one
/// exchange (give it back with [`keep`]); `None` when none is kept or another call has it.
pub(crate) fn take_kept(path: &Path) -> Option<Handoff> {
    let handoff = kept().lock().ok()?.remove(path)?;
    // Made before a fork by the parent: its exchanges are the parent's.
    (handoff.owner == std::process::id()).then_some(handoff)
}

/// Keeps `handoff` for the next call on the socket at `path`, unless one is kept there already
/// (then it is closed).
pub(crate) fn keep(path: &Path, handoff: Handoff) {
    if let Ok(mut kept) = kept().lock() {
        kept.entry(path.to_path_buf()).or_insert(handoff);
    }
}

impl Handoff {
    /// Connects to the handoff socket at `path` within `timeout`; `None` when nothing answers
    /// there in time (no socket, a stopped daemon, a full backlog), or a uid not in `trusted`
    /// answers. The caller then streams instead.
    pub async fn connect(path: &Path, trusted: &[u32], timeout: Duration) -> Option<Handoff> {
        let connected = tokio::time::timeout(timeout, tokio::net::UnixStream::connect(path)).await;
        let stream = connected.ok()?.ok()?.into_std().ok()?;
        // The exchanges block (on the blocking pool), each bounded by the timeouts below.
        stream.set_nonblocking(false).ok()?;
        let uid = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
            .ok()?
            .uid();
        if !trusted.contains(&uid) {
            return None;
        }
        // An answer may wait on the daemon fetching a cold blob from the tiers (as long as a
        // GetArtifact that names no wait); a write never waits on more than the socket.
        let fetch = Duration::from_millis(u64::from(tunecache_proto::artifact::DEFAULT_WAIT_MS));
        stream.set_read_timeout(Some(timeout + fetch)).ok()?;
        stream.set_write_timeout(Some(timeout)).ok()?;
        Some(Handoff {
            stream,
            owner: std::process::id(),
        })
    }

    /// Asks for blob `digest`: its file, positioned at its first byte, and its size, if the
    /// daemon holds it (and it is `size` bytes, when given). `Ok(None)`: use GetArtifact. An
    /// error means this connection is done with. Blocking.
    pub fn open(&mut self, digest: &str, size: Option<u64>) -> io::Result<Option<(File, u64)>> {
        let line = request(digest).map_err(|refusal| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("digest: {refusal}"))
        })?;
        self.stream.write_all(&line)?;
        let (answer, file) = self.receive()?;
        match (answer, file) {
            (Answer::Held { size: held }, Some(file)) => {
                let on_disk = file.metadata()?.len();
                if on_disk != held || size.is_some_and(|named| named != held) {
                    // Not the blob the entry names: GetArtifact says what is wrong.
                    return Ok(None);
                }
                Ok(Some((file, held)))
            }
            (Answer::Held { .. }, None) => {
                Err(io::Error::other("a held answer came without a descriptor"))
            }
            (Answer::NotHeld, _) => Ok(None),
            (Answer::Refused(why), _) => Err(io::Error::other(format!("refused: {why}"))),
        }
    }

    /// Reads one answer line and the descriptor that came with its first byte.
    fn receive(&mut self) -> io::Result<(Answer, Option<File>)> {
        let mut line = [0u8; MAX_ANSWER_BYTES];
        let mut space = nix::cmsg_space!(std::os::fd::RawFd);
        let (mut filled, file) = {
            let mut iov = [IoSliceMut::new(&mut line)];
            let message = recvmsg::<()>(
                self.stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(io::Error::from)?;
            let mut file = None;
            for cmsg in message.cmsgs().map_err(io::Error::from)? {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for fd in fds {
                        // SAFETY: the kernel just installed `fd` in this process for us, and
                        // nothing else owns it; every one is closed unless kept.
                        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                        if file.is_none() {
                            file = Some(File::from(owned));
                        }
                    }
                }
            }
            if message.flags.contains(MsgFlags::MSG_CTRUNC) {
                return Err(io::Error::other("the descriptor was cut off"));
            }
            (message.bytes, file)
        };
        if filled == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // The rest of the line, if it came in pieces.
        while !line[..filled].contains(&b'\n') {
            if filled == line.len() {
                return Err(io::Error::other("an answer line too long"));
            }
            let n = self.stream.read(&mut line[filled..])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            filled += n;
        }
        let end = line[..filled]
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(filled);
        let answer = Answer::parse(&line[..end])
            .ok_or_else(|| io::Error::other("an answer this client does not know"))?;
        Ok((answer, file))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_tunecache_verify_1_asks_for_verification() {
        for (value, asked) in [(None, false), (Some("0"), false), (Some(""), false)] {
            assert_eq!(super::verify_requested(value), asked, "{value:?}");
        }
        assert!(super::verify_requested(Some("1")));
        assert!(super::verify_requested(Some(" 1\n")));
    }
}
