//! The artifact store's flags, and the store's typed settings made from them.

use std::path::PathBuf;

const MIB: u64 = 1024 * 1024;

/// `--max-artifact-bytes`, `--artifact-store-mib` and the bounds within it (flattened into
/// `Config`).
#[derive(Clone, Debug, clap::Args)]
pub struct ArtifactFlags {
    /// Largest artifact blob (PutArtifact) this node stores, in bytes; a larger one is
    /// refused RESOURCE_EXHAUSTED from its first chunk.
    #[arg(
        long,
        env = "TUNECACHE_MAX_ARTIFACT_BYTES",
        default_value_t = tunecache_proto::artifact::DEFAULT_MAX_ARTIFACT_BYTES,
        value_name = "BYTES"
    )]
    pub max_artifact_bytes: u64,

    /// The node's artifact store, in MiB: an upload or a fetch from the tiers that would pass
    /// it first collects unreferenced blobs past their grace period, else is refused
    /// RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "TUNECACHE_ARTIFACT_STORE_MIB",
        default_value_t = tunecache_proto::artifact::DEFAULT_STORE_MIB,
        value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..=1 << 30)
    )]
    pub artifact_store_mib: u64,

    /// One uid's share of the store, in MiB: the blobs its live entries name and its uploads
    /// no entry names yet; past it, its uploads are refused (default: a quarter of
    /// --artifact-store-mib when --allow-uid or --allow-gid admits other users, else all of
    /// it).
    #[arg(
        long,
        env = "TUNECACHE_ARTIFACT_STORE_MIB_PER_UID",
        value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..=1 << 30)
    )]
    pub artifact_store_mib_per_uid: Option<u64>,

    /// One uid's uploads that no live entry names yet, in MiB (default: a quarter of
    /// --artifact-store-mib), so that no caller can fill the store for the others.
    #[arg(
        long,
        env = "TUNECACHE_ARTIFACT_UNREFERENCED_MIB_PER_UID",
        value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(1..=1 << 30)
    )]
    pub artifact_unreferenced_mib_per_uid: Option<u64>,

    /// Seconds a blob no live entry names is kept (an upload waiting for its Record, an
    /// entry beaten or forgotten) before it is deleted.
    #[arg(
        long,
        env = "TUNECACHE_ARTIFACT_GRACE_SECS",
        default_value_t = tunecache_proto::artifact::DEFAULT_GRACE_SECS,
        value_name = "SECS"
    )]
    pub artifact_grace_secs: u64,
}

impl ArtifactFlags {
    /// The store's settings, in `state_dir`. `others_allowed`: callers other than the
    /// daemon's own uid and root may use the daemon, so one uid's share defaults to a
    /// quarter of the store; with no other user there is nobody to keep a share for.
    pub fn settings(
        &self,
        state_dir: PathBuf,
        others_allowed: bool,
    ) -> crate::artifacts::ArtifactSettings {
        let store_bytes = self.artifact_store_mib.saturating_mul(MIB);
        let quarter = store_bytes / 4;
        let bytes = |mib: Option<u64>, default: u64| mib.map_or(default, |mib| mib * MIB);
        crate::artifacts::ArtifactSettings {
            state_dir,
            limits: crate::artifacts::Limits {
                max_blob_bytes: self.max_artifact_bytes,
                store_bytes,
                store_bytes_per_uid: bytes(
                    self.artifact_store_mib_per_uid,
                    if others_allowed { quarter } else { store_bytes },
                ),
                unreferenced_bytes_per_uid: bytes(self.artifact_unreferenced_mib_per_uid, quarter),
                grace_ms: self.artifact_grace_secs.saturating_mul(1000),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::Config;

    fn limits(args: &[&str]) -> crate::artifacts::Limits {
        let mut argv = vec!["tunecached"];
        argv.extend_from_slice(args);
        Config::parse_from(argv).artifact_settings().limits
    }

    #[test]
    fn one_uid_gets_a_quarter_of_the_store_when_other_users_are_allowed() {
        let alone = limits(&["--artifact-store-mib", "64"]);
        assert_eq!(
            (
                alone.store_bytes,
                alone.store_bytes_per_uid,
                alone.unreferenced_bytes_per_uid
            ),
            (64 << 20, 64 << 20, 16 << 20)
        );
        for others in [["--allow-uid", "4242"], ["--allow-gid", "4242"]] {
            let shared = limits(&[&["--artifact-store-mib", "64"][..], &others[..]].concat());
            assert_eq!(shared.store_bytes_per_uid, 16 << 20, "{others:?}");
        }
        let set = limits(&[
            "--artifact-store-mib",
            "64",
            "--artifact-store-mib-per-uid",
            "8",
        ]);
        assert_eq!(set.store_bytes_per_uid, 8 << 20);
    }
}
