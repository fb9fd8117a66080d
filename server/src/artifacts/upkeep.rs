//! The store's background work: hashing the blobs a previous run left (a blob that does not
//! hash to its name is dropped, to be fetched again), then, every so often and after every
//! Forget, finding the digests the live entries name (ending the charges of entries no longer
//! live) and deleting blobs no entry has named for the grace period.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::index::Check;
use super::{add, disk, Artifacts};
use crate::store::Store;

/// The longest time between two collection scans.
const MAX_SCAN_INTERVAL: Duration = Duration::from_secs(60);
const MIN_SCAN_INTERVAL: Duration = Duration::from_millis(100);

impl Artifacts {
    /// Starts the upkeep task on the daemon's tasks.
    pub fn start_upkeep(self: &Arc<Self>, store: Store) {
        let this = self.clone();
        self.tasks.spawn(async move {
            this.verify_found().await;
            let grace = Duration::from_millis(crate::sync::lock(&this.index).limits().grace_ms);
            let interval = (grace / 4).clamp(MIN_SCAN_INTERVAL, MAX_SCAN_INTERVAL);
            loop {
                this.scan_and_collect(&store).await;
                tokio::select! {
                    () = this.tasks.stopping() => return,
                    () = tokio::time::sleep(interval) => {}
                    () = this.rescan.notified() => {}
                }
            }
        });
    }

    /// Hashes every blob held unverified (found at start).
    async fn verify_found(&self) {
        let unverified: Vec<(String, u64)> = {
            let index = crate::sync::lock(&self.index);
            index
                .digests()
                .filter_map(|digest| {
                    let blob = index.blob(digest)?;
                    (blob.check == Check::Unverified).then(|| (digest.to_owned(), blob.size))
                })
                .collect()
        };
        for (digest, size) in unverified {
            if self.tasks.is_stopping() {
                return;
            }
            let path = self.dir.path_of(&digest);
            match Self::blocking("verifying a blob", move || disk::hash_file(&path)).await {
                Ok((received, len)) if received == digest && len == size => {
                    crate::sync::lock(&self.index).verified(&digest);
                }
                _ => self.drop_corrupt(&digest).await,
            }
        }
    }

    /// One collection pass: the digests the cache's entries name now replace what the index
    /// knew, and the entries naming them what the charges knew; then what no entry names and
    /// is past its grace period is deleted.
    pub(super) async fn scan_and_collect(&self, store: &Store) {
        let hasher = {
            let mut index = crate::sync::lock(&self.index);
            index.scan_started();
            // Nothing charged: no entry's ids are needed.
            (!index.charges().is_idle()).then(|| index.charges().hasher().clone())
        };
        let entries = store.current();
        let scanned = tokio::task::spawn_blocking(move || {
            let mut named = HashMap::new();
            let mut live = HashMap::new();
            for entry in entries.iter() {
                let (key, result) = entry.views();
                if result.artifacts.is_empty() {
                    continue;
                }
                for artifact in result.artifacts.iter() {
                    named.insert(artifact.sha256.to_owned(), artifact.size);
                }
                if let Some(hasher) = &hasher {
                    let ids = hasher.ids(&key, &result);
                    live.insert(ids.key, ids.result);
                }
            }
            (named, live)
        })
        .await;
        let Ok((named, live)) = scanned else {
            return;
        };
        let expired_names = std::mem::take(&mut *crate::sync::lock(&self.expired_names));
        let unnamed = expired_names
            .iter()
            .filter(|digest| !named.contains_key(*digest))
            .count();
        add(&self.counters.unnamed_by_expiry, unnamed as u64);
        let collectable = {
            let mut index = crate::sync::lock(&self.index);
            index.scan_finished(named, &live);
            index.collectable(self.now_ms())
        };
        if !collectable.is_empty() {
            self.collect(collectable).await;
        }
    }
}
