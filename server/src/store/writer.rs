//! The writer thread: the one owner of every mutation and of the journal.
//!
//! It takes the commands queued by `admission` in order, merges every write that has queued
//! up meanwhile into one group (group commit), and has `plan` decide what the group or a
//! Forget does. What it does itself is only the effects: append the plan's records to the
//! journal in one write, then publish the new versions, tell the change feed, and answer the
//! callers; when the append fails, every caller of the group gets the error and nothing is
//! published. Compaction, repair and the journal's health are its idle work (`upkeep`).

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::error::{Error, Result};
use crate::journal::Journal;
use crate::model::entry::Origin;
use crate::model::forget::ForgetClock;
use crate::model::lifecycle::Day;
use crate::wire::stored::EntryMap;

use super::expiry::{still_expires, Expiring};
use super::plan::{
    plan_forgets, plan_group, ApplyOutcome, ForgetCommand, ForgetState, Incoming, Today, Write,
};
use super::{Shared, Source, UseChange};
use crate::wire::stored::StoredEntry;

/// After a failed compaction, wait this long before the first retry, doubling on each
/// further failure up to `upkeep`'s `COMPACT_RETRY_MAX`.
pub(super) const COMPACT_RETRY_MIN: Duration = Duration::from_secs(1);
/// Most write requests merged into one group commit.
const MAX_GROUP: usize = 1024;
/// Most Forgets planned and journalled together: a Record queued behind them waits for at
/// most this many (each O(log n) plus what it matches).
const MAX_FORGET_BATCH: usize = 256;

pub(super) enum WriteCommand {
    Apply {
        entries: Vec<Incoming>,
        origin: Origin,
        source: Source,
        reply: oneshot::Sender<Result<ApplyOutcome>>,
        /// This request's share of the write queue, given back when the writer takes it.
        _queued: OwnedSemaphorePermit,
    },
    /// A Forget asked here, or tombstones learned from other nodes.
    Forget {
        forget: ForgetCommand,
        reply: oneshot::Sender<Result<u32>>,
    },
    /// Last uses raised by reads (`Store::flush_uses`): journal them, tell the feed.
    Uses {
        uses: Vec<StoredEntry>,
        reply: oneshot::Sender<Result<()>>,
    },
    /// A batch of a sweep (`Store::expire`): drop what still expires; answers how many.
    /// `last`: the sweep's last batch.
    Expire {
        expiring: Vec<Expiring>,
        last: bool,
        reply: oneshot::Sender<u64>,
    },
    /// Finish what is queued before this, then sync the journal (`Store::sync_journal`).
    Sync { reply: oneshot::Sender<Result<()>> },
    /// Finish what is queued before this, sync, and stop. Handles still held elsewhere
    /// (by connections that outlive the shutdown) then get `WriterGone`.
    Stop,
}

type Reply = oneshot::Sender<Result<ApplyOutcome>>;
type ForgetReply = oneshot::Sender<Result<u32>>;

/// State of the writer thread: the journal and what it needs to decide on compaction.
pub(super) struct Writer {
    pub(super) journal: Journal,
    pub(super) shared: Arc<Shared>,
    /// Estimated journal bytes the live entries would take after a compaction.
    pub(super) live_bytes: u64,
    /// After a failed compaction (e.g. a full disk), wait before trying again.
    pub(super) compact_not_before: Instant,
    /// The wait after the next failed compaction.
    pub(super) compact_retry: Duration,
    /// While the journal refuses appends: when to try repairing it next.
    pub(super) repair_not_before: Instant,
    /// The last compaction and append failure causes, so a repeating cause is logged once.
    pub(super) compaction_failure: Option<String>,
    pub(super) write_failure: Option<String>,
    /// Entry bytes written since the heap was last trimmed.
    pub(super) written_since_trim: u64,
    /// Stamps Forgets; moved past every stamp and epoch the node learns.
    pub(super) clock: ForgetClock,
    /// When a sweep's last batch but one came (`WriteCommand::Expire`): compaction waits for
    /// its end, or for a sweep that stopped sending (the daemon stopping) to be long gone.
    pub(super) sweep_batch_at: Option<Instant>,
}

pub(super) fn run_writer(
    journal: Journal,
    commands: mpsc::Receiver<WriteCommand>,
    shared: Arc<Shared>,
    clock: ForgetClock,
) {
    let live_bytes = shared.counters.journal_live_bytes.load(Ordering::Relaxed);
    let mut writer = Writer {
        journal,
        shared,
        live_bytes,
        compact_not_before: Instant::now(),
        compact_retry: COMPACT_RETRY_MIN,
        repair_not_before: Instant::now(),
        compaction_failure: None,
        write_failure: None,
        written_since_trim: 0,
        clock,
        sweep_batch_at: None,
    };
    writer.note_health();
    loop {
        let first = if let Some(wait) = writer.idle_work_wait() {
            match commands.recv_timeout(wait) {
                Ok(command) => command,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    writer.idle_work();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match commands.recv() {
                Ok(command) => command,
                Err(_) => break,
            }
        };
        // Group commit: everything queued meanwhile goes into one version and one append;
        // a run of Forgets likewise, in order with the writes around it.
        let mut group = Vec::new();
        let mut forgets = Vec::new();
        let mut stop = false;
        let mut next_command = Some(first);
        while let Some(command) = next_command.take() {
            match command {
                WriteCommand::Apply {
                    entries,
                    origin,
                    source,
                    reply,
                    ..
                } => {
                    writer.flush_forgets(&mut forgets);
                    group.push((
                        Write {
                            entries,
                            origin,
                            source,
                        },
                        reply,
                    ));
                }
                WriteCommand::Forget { forget, reply } => {
                    writer.flush_group(&mut group);
                    forgets.push((forget, reply));
                }
                WriteCommand::Uses { uses, reply } => {
                    writer.flush_group(&mut group);
                    writer.flush_forgets(&mut forgets);
                    let _ = reply.send(writer.journal_uses(uses));
                }
                WriteCommand::Expire {
                    expiring,
                    last,
                    reply,
                } => {
                    writer.flush_group(&mut group);
                    writer.flush_forgets(&mut forgets);
                    // No compaction in the middle of a sweep: the journal would be rewritten
                    // with what is about to go, holding Records up for the whole rewrite.
                    writer.sweep_batch_at = (!last).then(Instant::now);
                    let _ = reply.send(writer.expire(expiring));
                    if last {
                        writer.compact_if_due();
                    }
                }
                WriteCommand::Sync { reply } => {
                    writer.flush_group(&mut group);
                    writer.flush_forgets(&mut forgets);
                    let _ = reply.send(writer.journal.sync());
                }
                WriteCommand::Stop => {
                    stop = true;
                    break;
                }
            }
            if group.len() < MAX_GROUP && forgets.len() < MAX_FORGET_BATCH {
                next_command = commands.try_recv().ok();
            }
        }
        writer.flush_forgets(&mut forgets);
        if !group.is_empty() {
            writer.apply_group(group);
            writer.compact_if_due();
        }
        if stop {
            break;
        }
    }
    if let Err(error) = writer.journal.sync() {
        tracing::warn!(%error, "final journal sync failed");
    }
}

impl Writer {
    /// Plans a group of write requests, journals its records in one append, publishes, then
    /// acknowledges each request.
    fn apply_group(&mut self, group: Vec<(Write, Reply)>) {
        self.journal.check_path();
        self.repair_if_needed();
        let (writes, replies): (Vec<Write>, Vec<Reply>) = group.into_iter().unzip();
        let map = self.shared.map.load_full();
        let own = self.shared.own.load_full();
        let tombstones = self.shared.tombstones.load_full();
        let lifecycle = self.shared.lifecycle.load();
        let today = Today {
            day: lifecycle.clock.today(),
            retention: lifecycle.retention.clone(),
        };
        let plan = plan_group(&map, &own, &tombstones, &today, writes);
        self.shared
            .counters
            .entries_expired_on_arrival
            .fetch_add(plan.expired_on_arrival, Ordering::Relaxed);
        self.clock.observe(plan.highest_epoch);
        self.written_since_trim += plan.bytes_in;

        if !plan.records.is_empty() || !plan.uses.is_empty() {
            let uses: Vec<(StoredEntry, Day, Origin)> = plan
                .uses
                .iter()
                .map(|(used, origin)| (used.entry.clone(), used.day, *origin))
                .collect();
            if let Err(error) = self.journal.append_changes(&plan.records, &uses) {
                self.refuse_all(error, replies);
                return;
            }
            if self.write_failure.take().is_some() {
                tracing::info!("journal appends succeed again");
            }
            self.note_health();
            self.live_bytes = self
                .live_bytes
                .saturating_add(plan.live_bytes_added)
                .saturating_sub(plan.live_bytes_removed);
            if let Some(own) = plan.own {
                self.shared.own.store(Arc::new(own));
            }
            self.shared.map.store(Arc::new(plan.map));
            self.shared
                .counters
                .last_use_updates_written
                .fetch_add(plan.uses.len() as u64, Ordering::Relaxed);
            let uses: Vec<UseChange> = plan.uses.into_iter().map(|(used, _)| used).collect();
            let listeners = crate::sync::read(&self.shared.listeners);
            for listener in listeners.iter() {
                if !plan.changes.is_empty() {
                    listener.entries_changed(&plan.changes);
                }
                if !uses.is_empty() {
                    listener.used(&uses);
                }
            }
        }
        for (reply, outcome) in replies.into_iter().zip(plan.outcomes) {
            let _ = reply.send(Ok(outcome));
        }
        self.publish_journal_sizes();
    }

    /// A failed append: noted for health, and every caller of the batch gets its cause
    /// (nothing of the batch was applied).
    fn refuse_all<T>(&mut self, error: Error, replies: Vec<oneshot::Sender<Result<T>>>) {
        self.note_write_failure(&error);
        self.note_health();
        let cause = match error {
            Error::JournalWrite(cause) => cause,
            other => Arc::new(other),
        };
        for reply in replies {
            let _ = reply.send(Err(Error::JournalWrite(Arc::clone(&cause))));
        }
    }

    /// Applies the writes gathered so far, if any.
    fn flush_group(&mut self, group: &mut Vec<(Write, Reply)>) {
        if !group.is_empty() {
            self.apply_group(std::mem::take(group));
        }
    }

    /// Applies the Forgets gathered so far, if any.
    fn flush_forgets(&mut self, forgets: &mut Vec<(ForgetCommand, ForgetReply)>) {
        if !forgets.is_empty() {
            self.apply_forgets(std::mem::take(forgets));
        }
    }

    /// Plans a run of Forgets (asked here, or learned) as one, journals their tombstones in
    /// one append, then publishes and tells the feed. Answers each caller the entries its
    /// Forget dropped from the cache; when the append fails, each gets the error.
    fn apply_forgets(&mut self, forgets: Vec<(ForgetCommand, ForgetReply)>) {
        self.journal.check_path();
        self.repair_if_needed();
        let (commands, replies): (Vec<ForgetCommand>, Vec<ForgetReply>) =
            forgets.into_iter().unzip();
        let map = self.shared.map.load_full();
        let own = self.shared.own.load_full();
        let tombstones = self.shared.tombstones.load_full();
        let own_tombstones = self.shared.own_tombstones.load_full();
        let state = ForgetState {
            map: &map,
            own: &own,
            tombstones: &tombstones,
            own_tombstones: &own_tombstones,
        };
        let now = crate::model::entry::unix_now_ms();
        let plan = plan_forgets(state, &mut self.clock, now, commands);
        if plan.records.is_empty() {
            for reply in replies {
                let _ = reply.send(Ok(0));
            }
            return;
        }
        if let Err(error) = self.journal.append_tombstones(&plan.records) {
            self.refuse_all(error, replies);
            return;
        }
        self.note_health();
        // The tombstones stay live (a compaction keeps them), or every Record after a flood
        // of Forgets would find the journal twice its live data and rewrite it.
        self.live_bytes = self
            .live_bytes
            .saturating_sub(plan.freed_bytes)
            .saturating_add(plan.tombstone_bytes);
        let counters = &self.shared.counters;
        counters
            .forgets_received
            .fetch_add(plan.told.len() as u64, Ordering::Relaxed);
        counters
            .forget_entries_dropped
            .fetch_add(u64::from(plan.dropped), Ordering::Relaxed);
        counters
            .tombstones_held
            .store(plan.tombstones.len() as u64, Ordering::Relaxed);
        self.publish_journal_sizes();
        self.shared.tombstones.store(Arc::new(plan.tombstones));
        self.shared
            .own_tombstones
            .store(Arc::new(plan.own_tombstones));
        self.shared.own.store(Arc::new(plan.own));
        self.shared.map.store(Arc::new(plan.map));
        let listeners = crate::sync::read(&self.shared.listeners);
        for listener in listeners.iter() {
            listener.forgotten(&plan.told);
        }
        for (reply, answer) in replies.into_iter().zip(plan.answers) {
            let _ = reply.send(Ok(answer));
        }
    }

    /// Journals the last uses reads raised, then tells the feed (`Source::Read`). A failed
    /// append loses only those marks: the entries stay, and are marked again when read.
    fn journal_uses(&mut self, uses: Vec<StoredEntry>) -> Result<()> {
        self.journal.check_path();
        self.repair_if_needed();
        // The cache's entry now: a read may have marked one a write has since replaced.
        let map = self.shared.map.load_full();
        let uses: Vec<(StoredEntry, Day, Origin)> = uses
            .into_iter()
            .filter_map(|used| {
                let held = map.get_view(&used.key())?;
                let day = used.last_use().max(held.last_use());
                held.raise_last_use(day);
                Some((held.clone(), day, Origin::Own))
            })
            .collect();
        if uses.is_empty() {
            return Ok(());
        }
        if let Err(error) = self.journal.append_changes(&[], &uses) {
            self.note_write_failure(&error);
            self.note_health();
            return Err(error);
        }
        self.shared
            .counters
            .last_use_updates_written
            .fetch_add(uses.len() as u64, Ordering::Relaxed);
        self.publish_journal_sizes();
        let told: Vec<UseChange> = uses
            .into_iter()
            .map(|(entry, day, _)| UseChange {
                entry,
                day,
                source: Source::Read,
            })
            .collect();
        let listeners = crate::sync::read(&self.shared.listeners);
        for listener in listeners.iter() {
            listener.used(&told);
        }
        Ok(())
    }

    /// Drops the entries of a sweep's batch that still expire (`still_expires`) from the
    /// cache and the own contributions, then tells the feed. Nothing is journalled: their
    /// last uses are, so a replay finds them expired again, and a compaction leaves them out.
    fn expire(&mut self, expiring: Vec<Expiring>) -> u64 {
        let today = self.shared.lifecycle.load().clock.today();
        let current = self.shared.map.load_full();
        let own_current = self.shared.own.load_full();
        let mut map = EntryMap::clone(&current);
        let mut own = EntryMap::clone(&own_current);
        let mut gone = Vec::new();
        for expiring in &expiring {
            if !still_expires(&map, expiring, today) {
                continue;
            }
            if let Some(entry) = map.remove(&expiring.entry) {
                self.live_bytes = self
                    .live_bytes
                    .saturating_sub(entry.encoded_len_estimate() as u64);
                gone.push(entry);
            }
            own.remove(&expiring.entry);
        }
        if gone.is_empty() {
            return 0;
        }
        self.shared.own.store(Arc::new(own));
        self.shared.map.store(Arc::new(map));
        self.shared
            .counters
            .entries_expired
            .fetch_add(gone.len() as u64, Ordering::Relaxed);
        self.publish_journal_sizes();
        let listeners = crate::sync::read(&self.shared.listeners);
        for listener in listeners.iter() {
            listener.expired(&gone);
        }
        gone.len() as u64
    }

    /// The journal's size and its live part, for Stats.
    pub(super) fn publish_journal_sizes(&self) {
        let counters = &self.shared.counters;
        counters
            .journal_bytes
            .store(self.journal.len(), Ordering::Relaxed);
        counters
            .journal_live_bytes
            .store(self.live_bytes, Ordering::Relaxed);
    }
}
