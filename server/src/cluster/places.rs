//! This node's place in each shard's stream, kept in its state directory
//! (`cluster-places.json`), so that a restarted node reads only what is new instead of every
//! entry again.
//!
//! A place says "every message of the shard up to this sequence number is in this node's
//! cache". It must never claim more than the journal holds, so the file is written (a
//! temporary file, fsynced, renamed) only after `Store::sync_journal` returned for every
//! entry those messages brought: the journal is synced first, the claim written second, so
//! after any crash or power loss the file is at most as new as the journal. A run in which
//! the store refused a learned batch (a full disk) writes none, and removes the old one.
//! The file also names the prefix and the Redis data lifetime (the epoch marker) it was made
//! under; on start the follower checks both against Redis and reads each shard's stream from
//! its place, and a shard whose place is gone (trimmed past, started over) is read again.
//! The audit after start compares every shard with Redis anyway and repairs anything else.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsx::atomic;

use super::keys::SHARDS;
use crate::error::{TierError, TierResult};

const FILE: &str = "cluster-places.json";
const FORMAT: &str = "tunecache-cluster-places";
const VERSION: u32 = 1;

/// One shard's place: the last message id read and the sequence number it carried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedPlace {
    pub id: String,
    pub seq: u64,
}

/// What the file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedPlaces {
    format: String,
    version: u32,
    pub prefix: String,
    /// The epoch marker of the Redis data lifetime the places belong to.
    pub epoch: String,
    pub shards: Vec<SavedPlace>,
}

impl SavedPlaces {
    pub fn new(prefix: &str, epoch: &str, shards: Vec<SavedPlace>) -> SavedPlaces {
        SavedPlaces {
            format: FORMAT.to_owned(),
            version: VERSION,
            prefix: prefix.to_owned(),
            epoch: epoch.to_owned(),
            shards,
        }
    }

    /// Parses the file's bytes; why not when it is not a places file of this prefix.
    pub fn parse(bytes: &[u8], prefix: &str) -> TierResult<SavedPlaces> {
        let saved: SavedPlaces = serde_json::from_slice(bytes)
            .map_err(|e| TierError::refused(format!("unreadable: {e}")))?;
        if saved.format != FORMAT || saved.version != VERSION {
            return Err(TierError::refused(format!(
                "format {:?} version {}, not {FORMAT:?} {VERSION}",
                saved.format, saved.version
            )));
        }
        if saved.prefix != prefix {
            return Err(TierError::refused(format!(
                "made under prefix {:?}, not {prefix:?}",
                saved.prefix
            )));
        }
        if saved.shards.len() != SHARDS {
            return Err(TierError::refused(format!(
                "{} shards, not {SHARDS}",
                saved.shards.len()
            )));
        }
        if saved.shards.iter().any(|p| p.id.len() > 64) {
            return Err(TierError::refused(
                "a message id longer than any Redis makes",
            ));
        }
        Ok(saved)
    }
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Reads the saved places (blocking); `Ok(None)` when there are none.
pub fn read(state_dir: &Path, prefix: &str) -> TierResult<Option<SavedPlaces>> {
    match std::fs::read(path(state_dir)) {
        Ok(bytes) => SavedPlaces::parse(&bytes, prefix).map(Some),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(TierError::Io {
            context: "reading the stream places".to_owned(),
            path: path(state_dir),
            source: error,
        }),
    }
}

/// Writes the places atomically (blocking): a temporary file, synced when `sync`, renamed
/// over the old one, the directory synced.
pub fn write(state_dir: &Path, places: &SavedPlaces, sync: bool) -> std::io::Result<()> {
    let target = path(state_dir);
    let temporary = state_dir.join(format!("{FILE}.tmp"));
    let bytes = serde_json::to_vec(places).map_err(std::io::Error::other)?;
    atomic::write_whole(&target, &bytes, atomic::resume_point(&temporary, sync))
}

/// Removes the saved places (blocking), so a start reads every shard again.
pub fn remove(state_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path(state_dir)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SavedPlaces {
        let shards = (0..SHARDS as u64)
            .map(|s| SavedPlace {
                id: format!("17000000000{s}-0"),
                seq: s * 10,
            })
            .collect();
        SavedPlaces::new("tc:", "00ff00ff00ff00ff", shards)
    }

    #[test]
    fn places_read_back_as_written_and_only_under_their_prefix() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), "tc:"), Ok(None));
        write(dir.path(), &sample(), true).unwrap();
        assert_eq!(read(dir.path(), "tc:"), Ok(Some(sample())));
        assert!(read(dir.path(), "other:").is_err());
        std::fs::write(path(dir.path()), b"{\"format\":").unwrap();
        assert!(read(dir.path(), "tc:").is_err());
        let mut short = sample();
        short.shards.pop();
        let bytes = serde_json::to_vec(&short).unwrap();
        assert!(SavedPlaces::parse(&bytes, "tc:").is_err());
        remove(dir.path()).unwrap();
        assert_eq!(read(dir.path(), "tc:"), Ok(None));
    }
}
