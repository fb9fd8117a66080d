//! Opening the store: the journal's replay into the first versions, and the writer's start.
//!
//! Replay applies every journalled entry through the same merge as the writer
//! (`plan::merge_into`), then every tombstone (the merge rule does not depend on the order),
//! so the cache, the own contributions and the tombstones come back as they were
//! acknowledged. Damage replay skipped is written out clean at once, best effort.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{mpsc, Arc};

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::journal::{FsyncPolicy, Journal, ReplayProgress, ReplayReport};
use crate::model::entry::Origin;
use crate::model::forget::ForgetClock;
use crate::model::lifecycle::{plausible_day, Clock};
use crate::model::tombstones::Tombstones;
use crate::wire::stored::{EntryMap, StoredEntry};

use super::admission::{DEFAULT_WRITE_QUEUE_BYTES, QUEUE_UNIT_BYTES};
use super::plan::merge_into;
use super::upkeep::{held_tombstones, live_entries};
use super::writer::run_writer;
use super::{Shared, Store, StoreCounters, StoreGuard, DEFAULT_FORGET_RETENTION};

impl Store {
    /// Opens the store in `state_dir`: replays the journal (blocking; call it off the async
    /// runtime) and starts the writer thread.
    pub fn open(
        state_dir: &std::path::Path,
        fsync: FsyncPolicy,
    ) -> Result<(StoreGuard, ReplayReport)> {
        Store::open_with_queue(state_dir, fsync, DEFAULT_WRITE_QUEUE_BYTES)
    }

    /// `open`, with at most `queue_bytes` of writes waiting for the writer.
    pub fn open_with_queue(
        state_dir: &std::path::Path,
        fsync: FsyncPolicy,
        queue_bytes: u64,
    ) -> Result<(StoreGuard, ReplayReport)> {
        Store::open_reporting(state_dir, fsync, queue_bytes, &ReplayProgress::default())
    }

    /// `open_with_queue`, telling `progress` how far the replay has got.
    pub fn open_reporting(
        state_dir: &std::path::Path,
        fsync: FsyncPolicy,
        queue_bytes: u64,
        progress: &ReplayProgress,
    ) -> Result<(StoreGuard, ReplayReport)> {
        let queue_units = u32::try_from(queue_bytes.div_ceil(QUEUE_UNIT_BYTES))
            .unwrap_or(u32::MAX)
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        let mut map = EntryMap::new();
        let mut own = EntryMap::new();
        // The cache's estimated journal bytes, kept as entries go in (a walk of the map after
        // would read every entry again, out of order).
        let mut live_bytes = 0u64;
        // Days are checked against the system's clock: a test's clock is set afterwards.
        let today = Clock::system().today();
        let replayed = Journal::open_reporting(state_dir, fsync, progress, |entry, origin, day| {
            // Checked as a day from elsewhere: one journalled before lifecycle existed
            // starts its life today.
            let day = plausible_day(day, today);
            // Found by the entry itself: its interned vocabulary compares by pointer.
            let current = map.get_entry(&entry);
            // Replay only adds entries, and an own entry is added to the cache too unless
            // the cache holds its key already: a key the cache lacks, own lacks as well.
            let own_current = match (origin, current) {
                (Origin::Own, Some(_)) => own.get_entry(&entry),
                _ => None,
            };
            let merged = merge_into(current, own_current, || entry.result(), origin);
            let day = day.max(current.map_or(0, StoredEntry::last_use));
            if !merged.in_cache {
                if let Some(current) = current {
                    current.raise_last_use(day);
                }
            }
            if merged.in_cache || merged.own {
                let entry = entry.with_last_use(day);
                if merged.own {
                    own.insert(entry.clone());
                }
                if merged.in_cache {
                    live_bytes += entry.encoded_len_estimate() as u64;
                    live_bytes -= current.map_or(0, StoredEntry::encoded_len_estimate) as u64;
                    map.insert(entry);
                }
            }
        });
        let (mut journal, mut report) = replayed?;
        for (key, day, _) in std::mem::take(&mut report.last_uses) {
            let day = plausible_day(day, today);
            for held in [map.get(&key), own.get(&key)].into_iter().flatten() {
                held.raise_last_use(day);
            }
        }
        progress.applying_forgets();
        let mut clock = ForgetClock::default();
        let mut tombstones = Tombstones::default();
        let mut own_tombstones = Tombstones::default();
        for (tombstone, origin) in std::mem::take(&mut report.tombstones) {
            clock.observe(tombstone.stamp);
            if origin == Origin::Own {
                own_tombstones.insert(tombstone.clone());
            }
            tombstones.insert(tombstone);
        }
        live_bytes -= map.remove_dropped_by_any(&tombstones);
        own.remove_dropped_by_any(&tombstones);
        clock.observe(report.highest_epoch);
        if !report.skipped.is_empty() {
            // Damage was skipped: write the journal clean so it is not met again. Best effort
            // (a full disk must not stop the start): the writer retries, and appends after the
            // damage are safe meanwhile, as replay skips it.
            let held = held_tombstones(&tombstones, &own_tombstones);
            if let Err(error) = journal.rewrite(live_entries(&map, &own), &held) {
                tracing::warn!(
                    %error,
                    "journal: could not rewrite the damaged journal clean; will retry"
                );
            }
        }
        let live_bytes = live_bytes + tombstones.encoded_len_estimate() as u64;
        let shared = Arc::new(Shared {
            map: ArcSwap::from_pointee(map),
            own: ArcSwap::from_pointee(own),
            counters: StoreCounters::default(),
            listeners: Default::default(),
            fsync,
            queue_room: Arc::new(Semaphore::new(queue_units as usize)),
            queue_units,
            logged: Default::default(),
            tombstones: ArcSwap::from_pointee(tombstones),
            own_tombstones: ArcSwap::from_pointee(own_tombstones),
            forget_retention_ms: AtomicI64::new(DEFAULT_FORGET_RETENTION.as_millis() as i64),
            lifecycle: Default::default(),
            pending_uses: Default::default(),
            namespace_usage: Default::default(),
        });
        shared
            .counters
            .tombstones_held
            .store(shared.tombstones.load().len() as u64, Ordering::Relaxed);
        shared
            .counters
            .journal_bytes
            .store(journal.len(), Ordering::Relaxed);
        shared
            .counters
            .journal_live_bytes
            .store(live_bytes, Ordering::Relaxed);

        let (writes, commands) = mpsc::channel();
        let writer_shared = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("tunecache-writer".into())
            .spawn(move || run_writer(journal, commands, writer_shared, clock))
            .map_err(|e| Error::io("starting the writer thread", state_dir, e))?;
        let store = Store { shared, writes };
        Ok((
            StoreGuard {
                store: Some(store),
                writer: Some(writer),
            },
            report,
        ))
    }
}
