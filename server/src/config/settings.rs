//! The typed settings each part starts with (snapshot, cluster, artifacts, tuner, views,
//! request limits), made from the flags and checked: a key file that is missing or not
//! private stops the start, naming its flag.

use std::time::Duration;

use super::secrets::read_shared_key;
use super::{Config, TunerSetting};

/// `--max-request-bytes-per-uid` by default: this many messages of the largest size.
const DEFAULT_UID_MESSAGES: usize = 4;

impl Config {
    /// The snapshot module's settings; `None` when the daemon runs without `--shared-dir`.
    /// The key file is read here, so a missing or short key stops the start, naming the flag.
    pub(crate) fn snapshot_settings(
        &self,
    ) -> crate::Result<Option<crate::snapshot::SnapshotSettings>> {
        let Some(dir) = self.shared_dir.clone() else {
            return Ok(None);
        };
        let key = match &self.shared_dir_key_file {
            None => None,
            Some(path) => Some(read_shared_key(path).map_err(|why| {
                crate::Error::SharedDirUnsafe(format!(
                    "--shared-dir-key-file {}: {why}",
                    path.display()
                ))
            })?),
        };
        // This daemon's own files always count: it reads its own segments back at start.
        let mut writer_uids = vec![nix::unistd::geteuid().as_raw()];
        for uid in &self.shared_dir_writer_uid {
            if !writer_uids.contains(uid) {
                writer_uids.push(*uid);
            }
        }
        Ok(Some(crate::snapshot::SnapshotSettings {
            state_dir: self.state_dir(),
            key,
            writer_uids,
            dir,
            node: self.node_name(),
            interval: self.snapshot_interval(),
            fsync: self.snapshot_fsync,
            max_file_bytes: self.snapshot_max_file_bytes,
            compact_segments: self.snapshot_compact_segments.max(1),
            public: self.shared_dir_public,
        }))
    }

    /// How the store judges last use: retention, the bounds (entries; with the cluster tier,
    /// the bytes its entries take in Redis), the system's clock.
    pub(crate) fn lifecycle_settings(&self) -> crate::Result<crate::store::LifecycleSettings> {
        let on_cluster = self
            .cluster_url
            .as_deref()
            .is_some_and(|url| !url.is_empty());
        let max_bytes = if on_cluster && self.cluster_max_mib > 0 {
            crate::cluster::memory::entry_budget_bytes(
                self.cluster_max_mib,
                self.cluster_stream_max_len.max(1),
            )
            .map_err(crate::Error::ClusterConfig)?
        } else {
            0
        };
        Ok(crate::store::LifecycleSettings {
            retention: crate::model::lifecycle::Retention::new(
                self.retain_days,
                self.retain.iter().cloned(),
            ),
            max_entries: self.max_entries,
            max_bytes,
            overhead_bytes: crate::cluster::memory::ENTRY_OVERHEAD_BYTES,
            counted_artifact_bytes: self.cluster_max_artifact_bytes,
            clock: crate::model::lifecycle::Clock::system(),
            flush_every: std::time::Duration::from_millis(self.lifecycle_flush_ms.max(10)),
        })
    }

    /// The bundle tier's settings (`--bundle`, `--bundle-trust-key`, `--replay`).
    pub(crate) fn bundle_settings(&self) -> crate::bundles::BundleSettings {
        crate::bundles::BundleSettings {
            files: self.bundle.clone(),
            trust_keys: self.bundle_trust_key.clone(),
            replay: self.replay,
        }
    }

    /// The cluster tier's settings, checked; `None` without `--cluster-url`.
    pub(crate) fn cluster_settings(
        &self,
    ) -> crate::Result<Option<crate::cluster::ClusterSettings>> {
        let Some(url) = self.cluster_url.as_deref().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let mut settings = crate::cluster::ClusterSettings::new(
            url,
            self.cluster_password_file.as_deref(),
            self.cluster_tls_ca_file.as_deref(),
            self.cluster_prefix.clone(),
            Duration::from_millis(self.cluster_timeout_ms.max(1)),
            Duration::from_millis(self.cluster_lease_ms.max(300)),
            self.node_name(),
        )?;
        settings.publish_queue = self.cluster_publish_queue.max(1);
        settings.stream_max_len = self.cluster_stream_max_len.max(1);
        settings.audit_interval = Duration::from_secs(self.cluster_audit_secs.max(1));
        settings.clock_offset_ms = self.cluster_clock_offset_ms;
        settings.state_dir = Some(self.state_dir());
        settings.checkpoint_every = self.cluster_checkpoint_every;
        settings.checkpoint_check = Duration::from_millis(self.cluster_checkpoint_check_ms.max(10));
        settings.blob_limit_bytes = self.cluster_max_artifact_bytes;
        if let Some(path) = &self.cluster_key_file {
            settings.key = Some(read_shared_key(path).map_err(|why| {
                crate::Error::ClusterConfig(format!("--cluster-key-file {}: {why}", path.display()))
            })?);
        }
        Ok(Some(settings))
    }

    /// The artifact store's settings. One uid's share defaults to a quarter of the store
    /// only when users other than the daemon's own and root may call it.
    pub fn artifact_settings(&self) -> crate::artifacts::ArtifactSettings {
        let others_allowed = !self.allow_uid.is_empty() || !self.allow_gid.is_empty();
        self.artifacts.settings(self.state_dir(), others_allowed)
    }

    /// The tuner's settings; `None` with `--tuner off`.
    pub(crate) fn tuner_settings(&self) -> Option<crate::tuner::SupervisorConfig> {
        let worker_path = match self.tuner_setting() {
            TunerSetting::Off => return None,
            TunerSetting::Worker(path) => path,
        };
        Some(crate::tuner::SupervisorConfig {
            worker_path,
            backend: self.tuner_backend,
            job_timeout: std::time::Duration::from_secs(self.tuner_job_timeout.max(1)),
            queue_capacity: self.tuner_queue.max(1),
            device: self.tuner_device,
            worker_args: Vec::new(),
        })
    }

    /// `--view-idle-secs` and `--max-view-pins`.
    pub(crate) fn view_settings(&self) -> crate::views::ViewSettings {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        crate::views::ViewSettings {
            idle: Duration::from_secs(self.view_idle_secs.max(1)),
            max_pins: count(self.max_view_pins),
            max_pins_per_uid: count(self.max_view_pins_per_uid),
            max_views_per_uid: count(self.max_views_per_uid),
        }
    }

    /// The request limits of `--max-message-bytes` and `--max-request-bytes-per-uid`.
    pub(crate) fn request_limits(
        &self,
    ) -> crate::Result<crate::ops::request_limits::RequestLimits> {
        let max_message = usize::try_from(self.max_message_bytes).unwrap_or(usize::MAX);
        let per_uid = self
            .max_request_bytes_per_uid
            .map_or(max_message.saturating_mul(DEFAULT_UID_MESSAGES), |bytes| {
                usize::try_from(bytes).unwrap_or(usize::MAX)
            });
        crate::ops::request_limits::RequestLimits::new(max_message, per_uid)
    }
}
