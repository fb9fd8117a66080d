//! The follower's start-up (issue 38): the stream places saved beside the journal, restored
//! and saved again (the shards' checkpoints are `checkpoints`).

use super::*;

impl Follower {
    /// Takes the places saved in the state directory, if the journal replayed whole and they
    /// were made under this prefix; the first connection checks them against Redis.
    pub(super) async fn restore_places(&mut self) {
        let Some(dir) = self.cluster.places.state_dir.clone() else {
            return;
        };
        let prefix = self.cluster.prefix().to_owned();
        let read = tokio::task::spawn_blocking(move || places::read(&dir, &prefix)).await;
        let saved = match read {
            Ok(Ok(Some(saved))) => saved,
            Ok(Ok(None)) => return,
            Ok(Err(why)) => {
                tracing::warn!(%why, "cluster tier: saved stream places unusable; reading every shard");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cluster tier: reading the saved stream places failed");
                return;
            }
        };
        if !self.cluster.places.trusted {
            tracing::warn!(
                "cluster tier: the journal was damaged; not trusting the saved stream places"
            );
            return;
        }
        self.places = Some(
            saved
                .shards
                .iter()
                .map(|p| Place {
                    id: p.id.clone(),
                    seq: p.seq,
                })
                .collect(),
        );
        self.epoch = Some(saved.epoch);
        self.restored = true;
    }

    /// The start is over: the places are saved, then Stats and one log line say what it
    /// cost.
    pub(super) async fn finish_start(&mut self) {
        if self.start_done {
            return;
        }
        self.start_done = true;
        self.save_places(true).await;
        let counters = &self.cluster.counters;
        let reread = self.reread_at_start.iter().filter(|&&r| r).count() as u64;
        counters.shards_reread.fetch_add(reread, Ordering::Relaxed);
        let restored = self.restored && counters.places_restored.load(Ordering::Relaxed) > 0;
        let resumed = if restored || counters.checkpoints_loaded.load(Ordering::Relaxed) > 0 {
            SHARDS as u64 - reread
        } else {
            0
        };
        counters
            .shards_resumed
            .fetch_add(resumed, Ordering::Relaxed);
        let elapsed = self.started.elapsed();
        counters
            .startup_ms
            .store(elapsed.as_millis() as u64, Ordering::Relaxed);
        let (commands, bytes) = super::super::link::startup_done();
        counters.startup_commands.store(commands, Ordering::Relaxed);
        counters.startup_bytes.store(bytes, Ordering::Relaxed);
        self.cluster
            .observed
            .bootstrapped
            .store(true, Ordering::Relaxed);
        tracing::info!(
            restored_places = self.restored,
            shards_resumed = resumed,
            shards_read_again = reread,
            checkpoints_loaded = counters.checkpoints_loaded.load(Ordering::Relaxed),
            redis_commands = commands,
            redis_bytes = bytes,
            elapsed_ms = elapsed.as_millis() as u64,
            "cluster tier: start done"
        );
    }

    /// The places now, as the file holds them; `None` before there are any.
    pub(super) fn saved_form(&self) -> Option<(Vec<Place>, SavedPlaces)> {
        let (current, epoch) = (self.places.as_ref()?, self.epoch.as_ref()?);
        let saved = SavedPlaces::new(
            self.cluster.prefix(),
            epoch,
            current
                .iter()
                .map(|p| SavedPlace {
                    id: p.id.clone(),
                    seq: p.seq,
                })
                .collect(),
        );
        Some((current.clone(), saved))
    }

    /// Saves the places (at most every `PERSIST_EVERY`, when they moved, or at once with
    /// `now`): the entries of every message behind them were applied, and the journal is
    /// synced before the file claims them (`Cluster::save_places`). Also hands them to the
    /// last save at shutdown.
    pub(super) async fn save_places(&mut self, now: bool) {
        let Some(dir) = self.cluster.places.state_dir.clone() else {
            return;
        };
        if self.cluster.places.unsafe_to_save.load(Ordering::Relaxed) {
            if self.saved.take().is_some() || now {
                let _ = tokio::task::spawn_blocking(move || places::remove(&dir)).await;
            }
            *crate::sync::lock(&self.cluster.places.latest) = None;
            return;
        }
        let Some((current, saved)) = self.saved_form() else {
            return;
        };
        *crate::sync::lock(&self.cluster.places.latest) = Some(saved.clone());
        if self.saved.as_ref() == Some(&current)
            || (!now && self.saved_at.elapsed() < PERSIST_EVERY)
        {
            return;
        }
        self.saved_at = Instant::now();
        match self.cluster.save_places(saved).await {
            Ok(()) => self.saved = Some(current),
            Err(why) => tracing::debug!(%why, "cluster tier: stream places not saved"),
        }
    }
}
