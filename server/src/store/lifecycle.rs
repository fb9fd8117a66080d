//! The store's side of the lifecycle (`model::lifecycle`, docs/lifecycle.md): marking the
//! entries ranks read, writing those marks once a day, and expiring what is unused.
//!
//! - A read (`Store::touch`) raises its entries' last use to today, in place (an atomic in
//!   each entry), and queues the entries it raised: once per entry and day, so the queue and
//!   everything written from it grow with the distinct entries read, never with the reads.
//! - `Store::flush_uses` hands the queue to the writer, which journals the day of each and
//!   tells the feed (`ChangeListener::used`), so the tiers carry it to the other nodes.
//! - `Store::sweep` plans on a blocking thread (`expiry` holds the rules), from one version of the cache, which entries
//!   are expired (`plan_expiry`: older than their retention, or past `--max-entries` by
//!   least recent use) and has the writer drop them in batches, each re-checked there against
//!   a use that came meanwhile, so a sweep of a million entries never holds a Record up for
//!   more than one batch. Nothing is journalled for them: their last use is, and a replay
//!   meets them expired again; the next compaction leaves them out.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::model::lifecycle::Day;
use crate::tasks::Tasks;
use crate::wire::stored::StoredEntry;

use super::expiry::{
    plan_expiry, usage, Expiring, Expiry, LifecycleSettings, Usage, UsageBy, EXPIRY_BATCH,
};
use super::writer::WriteCommand;
use super::Store;

/// How often a sweep runs, besides at start and just after each day begins (UTC).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// The lifecycle's background task: journals marked uses every `flush_every`, sweeps every
/// `SWEEP_INTERVAL` and when the day changes, and journals the last marks at shutdown.
pub fn start_upkeep(store: Store, tasks: &Tasks) {
    let stopping = tasks.stop_token();
    tasks.spawn(async move {
        let mut swept_day = store.today();
        let mut next_sweep = tokio::time::Instant::now() + SWEEP_INTERVAL;
        // Entries held after the last sweep: a bound is checked again only once more came.
        let mut held_after_sweep = store.len();
        loop {
            tokio::select! {
                () = stopping.cancelled() => break,
                () = tokio::time::sleep(store.lifecycle().flush_every) => {}
            }
            if let Err(error) = store.flush_uses().await {
                tracing::warn!(%error, "could not journal last uses; reads mark them again");
            }
            let today = store.today();
            // Entries learned since the last sweep (a tier's bootstrap after the sweep at
            // start, a burst of new keys) may take the cache past a bound: cut it now. At most
            // one walk of the cache per tick, and only while it grows.
            if today != swept_day
                || tokio::time::Instant::now() >= next_sweep
                || (store.len() > held_after_sweep && store.maybe_past_a_bound())
            {
                swept_day = today;
                next_sweep = tokio::time::Instant::now() + SWEEP_INTERVAL;
                // What the sweep judged: entries that arrive while it runs are judged by the
                // next one.
                let judged = store.len();
                let expired = match store.sweep().await {
                    Ok(0) => 0,
                    Ok(expired) => {
                        tracing::info!(expired, "expired entries no rank used");
                        expired
                    }
                    Err(error) => {
                        tracing::warn!(%error, "expiry sweep failed; retried later");
                        0
                    }
                };
                held_after_sweep = judged.saturating_sub(expired as usize);
            }
        }
        let _ = store.flush_uses().await;
    });
}

impl Store {
    /// Sets how the store judges last use (the daemon's flags; a test's clock).
    pub fn set_lifecycle(&self, settings: LifecycleSettings) {
        self.shared.lifecycle.store(Arc::new(settings));
    }

    pub fn lifecycle(&self) -> Arc<LifecycleSettings> {
        self.shared.lifecycle.load_full()
    }

    /// Whether the cache may hold more than a bound allows, now that it holds more entries
    /// than after the last sweep: past `--max-entries`, or, with `--cluster-max-mib`, maybe
    /// past its bytes (only a walk can tell: the sweep then decides exactly). Never a walk.
    pub fn maybe_past_a_bound(&self) -> bool {
        let settings = self.lifecycle();
        (settings.max_entries > 0 && self.len() as u64 > settings.max_entries)
            || settings.max_bytes > 0
    }

    /// Today, by the store's clock.
    pub fn today(&self) -> Day {
        self.shared.lifecycle.load().clock.today()
    }

    /// Marks `entries` used today: raises each one's last use, and queues those it raised
    /// for the writer (once per entry and day). Never waits on the writer or the disk.
    pub fn touch<'a>(&self, entries: impl IntoIterator<Item = &'a StoredEntry>) {
        let today = self.today();
        let raised: Vec<StoredEntry> = entries
            .into_iter()
            .filter(|entry| entry.raise_last_use(today))
            .cloned()
            .collect();
        if !raised.is_empty() {
            crate::sync::lock(&self.shared.pending_uses).extend(raised);
        }
    }

    /// Has the writer journal the uses marked so far and tell the feed; returns how many.
    pub async fn flush_uses(&self) -> Result<usize> {
        let uses = std::mem::take(&mut *crate::sync::lock(&self.shared.pending_uses));
        if uses.is_empty() {
            return Ok(0);
        }
        let count = uses.len();
        let (reply, done) = oneshot::channel();
        self.writes
            .send(WriteCommand::Uses { uses, reply })
            .map_err(|_| Error::WriterGone)?;
        done.await.map_err(|_| Error::WriterGone)??;
        Ok(count)
    }

    /// Pauses sweeps (`Some(why)`: Stats `expiry_paused` says why) or lets them run again.
    /// The cluster tier pauses them while this node's clock is off from Redis's: a day
    /// judged by a wrong clock would expire, here and in Redis, what other nodes still use.
    pub fn set_expiry_paused(&self, why: Option<String>) {
        *crate::sync::lock(&self.shared.counters.expiry_paused) = why.unwrap_or_default();
    }

    /// Why sweeps are paused; `None` while they run.
    pub fn expiry_paused(&self) -> Option<String> {
        let why = crate::sync::lock(&self.shared.counters.expiry_paused);
        (!why.is_empty()).then(|| why.clone())
    }

    /// Expires what is unused now (`plan_expiry`), in batches the writer takes between
    /// writes, then counts what is left per namespace; none while paused
    /// (`set_expiry_paused`). Returns the entries expired.
    pub async fn sweep(&self) -> Result<u64> {
        if self.expiry_paused().is_some() {
            return Ok(0);
        }
        let map = self.current();
        let settings = self.lifecycle();
        let today = settings.clock.today();
        let expires = settings.retention.expires_anything()
            || (settings.max_entries > 0 && map.len() as u64 > settings.max_entries)
            || settings.max_bytes > 0;
        let expired = if expires {
            let planned = tokio::task::spawn_blocking(move || plan_expiry(&map, &settings, today));
            match planned.await {
                Ok(expiring) => self.expire(expiring).await?,
                // Only a panic in the plan gets here; the next sweep plans again.
                Err(error) => {
                    tracing::error!(%error, "planning the expiry sweep failed");
                    0
                }
            }
        } else {
            0
        };
        // What is left, per namespace, for Stats and the metrics (a walk of the cache: here,
        // at most hourly, never per Stats call).
        let map = self.current();
        let now_ms = self.lifecycle().clock.now_ms();
        if let Ok(groups) =
            tokio::task::spawn_blocking(move || usage(&map, UsageBy::Namespace, today)).await
        {
            self.shared
                .namespace_usage
                .store(Arc::new((now_ms, groups)));
        }
        Ok(expired)
    }

    /// The usage per namespace as of the last sweep, and when it was counted (0: never).
    pub fn namespace_usage(&self) -> Arc<(i64, std::collections::BTreeMap<String, Usage>)> {
        self.shared.namespace_usage.load_full()
    }

    /// Has the writer drop `expiring`, in batches of `EXPIRY_BATCH`; returns how many went.
    pub async fn expire(&self, expiring: Vec<Expiring>) -> Result<u64> {
        let mut expired = 0;
        let bound = expiring.iter().filter(|e| e.why == Expiry::Bound).count();
        let batches = expiring.len().div_ceil(EXPIRY_BATCH);
        for (n, batch) in expiring.chunks(EXPIRY_BATCH).enumerate() {
            let (reply, done) = oneshot::channel();
            self.writes
                .send(WriteCommand::Expire {
                    expiring: batch.to_vec(),
                    last: n + 1 == batches,
                    reply,
                })
                .map_err(|_| Error::WriterGone)?;
            expired += done.await.map_err(|_| Error::WriterGone)?;
        }
        if bound > 0 && self.shared.logged.first("bound") {
            let settings = self.lifecycle();
            tracing::warn!(
                max_entries = settings.max_entries,
                max_bytes = settings.max_bytes,
                expired = bound,
                "the cache holds more than --max-entries, or its entries more bytes than \
                 --cluster-max-mib leaves them: its least recently used entries expire early \
                 (logged once; Stats counts them in entries_expired_by_bound)"
            );
        }
        let counters = &self.shared.counters;
        counters
            .entries_expired_by_bound
            .fetch_add(bound.min(expired as usize) as u64, Ordering::Relaxed);
        Ok(expired)
    }
}
