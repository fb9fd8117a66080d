//! The writer's rules as a pure step: from the current versions (the cache, this node's own
//! contributions, the tombstones) and a group of writes or one Forget, what changes, what
//! the journal appends, what the feed is told, and what each caller is answered.
//!
//! Nothing here touches the journal, a thread or a runtime: the writer (`writer`) takes a
//! plan and only does its effects (append the records, publish the versions, tell the feed,
//! answer the callers), or, when the append fails, drops the plan and answers the error, so a
//! batch is applied whole or not at all. The versions are persistent maps: a plan's next
//! version shares everything it did not change with the current one.
//!
//! The rules:
//! - one merge rule (`model::merge`) decides the cache's winner, and, separately, this
//!   node's own best per key: an own result is kept as a contribution even when a learned one
//!   beats it in the cache, so compaction of this node's segments never loses it;
//! - this node's own new results (a Record, its tuner) get their epoch here, a client's is
//!   ignored: live after every Forget of the key the node knows, and level with its winner;
//! - everything else coming in (learned, read from segments) is dropped when a tombstone held
//!   removes it, so no replica brings a forgotten entry back;
//! - a Forget asked here with `only_if` applies only while the key's winner still has that
//!   config and time; a learned tombstone that adds nothing is not journalled or told.

use crate::model::entry::{CacheKey, KeyView, Origin, ResultView, TunedResult};
use crate::model::forget::{record_epoch, ForgetAsk, ForgetClock, Tombstone};
use crate::model::lifecycle::{arriving_day, Day, Retention};
use crate::model::merge::{merge_read, MergeOutcome};
use crate::model::tombstones::Tombstones;
use crate::wire::stored::{EntryMap, StoredEntry};

use super::feed::{Change, ForgetChange, Source, UseChange};

/// One entry of a write. Decoded entries (a Record, the tuner, the cluster tier) are encoded
/// by the writer only when they win; entries read from the shared directory arrive already
/// in stored form, so a load holds each entry once (the allocation the cache keeps), never a
/// decoded copy beside it. Each comes with the last use its source knew (`model::lifecycle`;
/// a stored entry holds its own).
pub(crate) enum Incoming {
    Decoded(CacheKey, TunedResult, Day),
    Stored(StoredEntry),
}

impl Incoming {
    pub(crate) fn views(&self) -> (KeyView<'_>, ResultView<'_>) {
        match self {
            Incoming::Decoded(key, result, _) => (key.view(), result.view()),
            Incoming::Stored(entry) => entry.views(),
        }
    }

    /// The last use its source knew.
    fn last_use(&self) -> Day {
        match self {
            Incoming::Decoded(_, _, day) => *day,
            Incoming::Stored(entry) => entry.last_use(),
        }
    }

    fn set_forget_epoch(&mut self, epoch: u64) {
        match self {
            Incoming::Decoded(_, result, _) => result.forget_epoch = epoch,
            Incoming::Stored(entry) => {
                let day = entry.last_use();
                let (key, result) = entry.to_pair();
                *self = Incoming::Decoded(
                    key,
                    TunedResult {
                        forget_epoch: epoch,
                        ..result
                    },
                    day,
                );
            }
        }
    }

    /// Its stored form, last used on `day`.
    fn into_stored(self, day: Day) -> StoredEntry {
        match self {
            Incoming::Decoded(key, result, _) => StoredEntry::new(&key, &result),
            Incoming::Stored(entry) => entry,
        }
        .with_last_use(day)
    }
}

/// Decoded entries with no last use known: the day of the write gives them theirs.
pub(crate) fn decoded(entries: Vec<(CacheKey, TunedResult)>) -> Vec<Incoming> {
    entries
        .into_iter()
        .map(|(key, result)| Incoming::Decoded(key, result, 0))
        .collect()
}

/// The lifecycle rules a plan applies, as of its day.
#[derive(Clone, Debug)]
pub(crate) struct Today {
    pub day: Day,
    pub retention: Retention,
}

/// Counts of a batch applied through the merge rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// Entries that were new or beat the stored result.
    pub stored: u32,
    /// Entries that did not beat the stored result; nothing was written for them.
    pub unchanged: u32,
}

/// Which of the two versions an incoming result replaces the key's entry in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Merged {
    /// It beats the cache's winner: readers see it.
    pub in_cache: bool,
    /// It is this node's own and beats its own best for the key: it is published.
    pub own: bool,
}

/// The one merge of an incoming result against the key's entry in the cache (`current`) and
/// in this node's own contributions (`own_current`, which only an own result is merged
/// against), as the writer and the journal's replay both apply it. The caller looks each up
/// once and uses it for everything else it needs of the key; `result` is read only when a
/// held entry must be beaten.
pub(crate) fn merge_into<'r>(
    current: Option<&StoredEntry>,
    own_current: Option<&StoredEntry>,
    result: impl Fn() -> ResultView<'r>,
    origin: Origin,
) -> Merged {
    let own_replace = origin == Origin::Own
        && merge_read(own_current.map(StoredEntry::result), &result) == MergeOutcome::Replace;
    let in_cache = merge_read(current.map(StoredEntry::result), &result) == MergeOutcome::Replace;
    Merged {
        in_cache,
        own: own_replace,
    }
}

/// One write request of a group commit: its entries, and their provenance (for the journal
/// and for the change feed).
pub(crate) struct Write {
    pub entries: Vec<Incoming>,
    pub origin: Origin,
    pub source: Source,
}

/// What a group of writes does, if its records reach the journal.
pub(crate) struct GroupPlan {
    /// The cache's next version.
    pub map: EntryMap,
    /// The own contributions' next version, when they changed.
    pub own: Option<EntryMap>,
    /// What the feed is told, in order.
    pub changes: Vec<Change>,
    /// What the journal appends, all in one append.
    pub records: Vec<(StoredEntry, Origin)>,
    /// Each write's answer, in the group's order.
    pub outcomes: Vec<ApplyOutcome>,
    /// Estimated journal bytes the live entries gain and lose (a compaction's size).
    pub live_bytes_added: u64,
    pub live_bytes_removed: u64,
    /// Entry bytes the group brought in, changed or not (what its requests left on the heap).
    pub bytes_in: u64,
    /// The highest epoch among the entries kept: the writer's clock moves past it.
    pub highest_epoch: u64,
    /// Keys whose last use the group raised without changing their entry (a Record of the
    /// result already held, a use another node reported): the journal appends them, the
    /// feed is told (`ChangeListener::used`).
    pub uses: Vec<(UseChange, Origin)>,
    /// Entries from other nodes already expired when they arrived, dropped.
    pub expired_on_arrival: u64,
}

/// Plans a group of writes, applied one after the other: a later write of the group meets
/// what the earlier ones stored.
pub(crate) fn plan_group(
    map: &EntryMap,
    own: &EntryMap,
    tombstones: &Tombstones,
    today: &Today,
    group: Vec<Write>,
) -> GroupPlan {
    let mut plan = GroupPlan {
        map: map.clone(),
        own: None,
        changes: Vec::new(),
        records: Vec::new(),
        outcomes: Vec::with_capacity(group.len()),
        live_bytes_added: 0,
        live_bytes_removed: 0,
        bytes_in: 0,
        highest_epoch: 0,
        uses: Vec::new(),
        expired_on_arrival: 0,
    };
    let mut own_next = own.clone();
    for Write {
        entries,
        origin,
        source,
    } in group
    {
        let mut outcome = ApplyOutcome::default();
        let stamps_epoch = matches!(source, Source::Record { .. } | Source::Tuner);
        for mut incoming in entries {
            // The key's entries, each looked up once (the B-tree's walks were most of a
            // merge's time): setting the epoch below changes the result, not the key.
            let (key, _) = incoming.views();
            let current = plan.map.get_view(&key);
            let own_current = (origin == Origin::Own || stamps_epoch)
                .then(|| own_next.get_view(&key))
                .flatten();
            if stamps_epoch {
                let held = |entry: Option<&StoredEntry>| {
                    entry.map_or(0, |entry| entry.result().forget_epoch)
                };
                let winner = held(current).max(held(own_current));
                let epoch = record_epoch(tombstones.floor(&key), winner);
                incoming.set_forget_epoch(epoch);
            } else {
                let (key, result) = incoming.views();
                if tombstones.drops(&key, &result) {
                    outcome.unchanged += 1;
                    continue;
                }
            }
            let (key, result) = incoming.views();
            // A write of this node's (a Record, its tuner) is a use today; a result from
            // elsewhere brings the last use its source knew, checked like any value read from
            // another node. So do this node's own segments read back at start: taking them as
            // used today would revive, at every restart, what expired meanwhile.
            let local_write = origin == Origin::Own && stamps_epoch;
            let held = current.map_or(0, StoredEntry::last_use);
            let day = if local_write {
                today.day.max(held)
            } else {
                arriving_day(incoming.last_use(), held, today.day)
            };
            let retention = &today.retention;
            if !local_write
                && retention.entry_expired(key.namespace, day, result.tuned_at_unix_ms, today.day)
            {
                outcome.unchanged += 1;
                plan.expired_on_arrival += 1;
                continue;
            }
            plan.highest_epoch = plan.highest_epoch.max(result.forget_epoch);
            let merged = merge_into(current, own_current, || result, origin);
            let old_result_bytes =
                current.map(|entry| entry.result().encoded_len_estimate() as u64);
            let key_bytes = key.encoded_len_estimate() as u64;
            let result_bytes = result.encoded_len_estimate() as u64;
            plan.bytes_in += key_bytes + result_bytes;
            if !merged.in_cache {
                outcome.unchanged += 1;
            }
            if !merged.in_cache {
                // The cache's result stays; the use this write stands for raises its day.
                if let Some(current) = current.filter(|current| current.raise_last_use(day)) {
                    let used = UseChange {
                        entry: current.clone(),
                        day,
                        source: source.clone(),
                    };
                    plan.uses.push((used, origin));
                }
            }
            if !(merged.in_cache || merged.own) {
                continue;
            }
            // One allocation, shared by the cache, the own contributions and the journal.
            let entry = incoming.into_stored(day);
            plan.changes.push(Change {
                entry: entry.clone(),
                source: source.clone(),
                in_cache: merged.in_cache,
                own: merged.own,
            });
            if merged.in_cache {
                plan.live_bytes_added += key_bytes + result_bytes;
                plan.live_bytes_removed += old_result_bytes.map_or(0, |r| key_bytes + r);
                plan.map.insert(entry.clone());
                outcome.stored += 1;
            }
            if merged.own {
                own_next.insert(entry.clone());
                plan.records.push((entry, Origin::Own));
            } else {
                plan.records.push((entry, Origin::Learned));
            }
        }
        plan.outcomes.push(outcome);
    }
    if !own_next.ptr_eq(own) {
        plan.own = Some(own_next);
    }
    plan
}

/// A Forget for the writer: asked of this node, or tombstones learned from elsewhere.
pub(crate) enum ForgetCommand {
    Ask(ForgetAsk),
    Learned(Vec<Tombstone>, Source, Origin),
}

/// The versions a Forget is planned against.
pub(crate) struct ForgetState<'a> {
    pub map: &'a EntryMap,
    pub own: &'a EntryMap,
    pub tombstones: &'a Tombstones,
    pub own_tombstones: &'a Tombstones,
}

/// What a Forget does, if its tombstones reach the journal.
pub(crate) struct ForgetPlan {
    pub map: EntryMap,
    pub own: EntryMap,
    pub tombstones: Tombstones,
    pub own_tombstones: Tombstones,
    /// The tombstones the journal appends, with their provenance.
    pub records: Vec<(Tombstone, Origin)>,
    /// What the feed is told: one per record.
    pub told: Vec<ForgetChange>,
    /// Entries dropped from the cache: the caller's answer.
    pub dropped: u32,
    /// Estimated journal bytes of the entries dropped.
    pub freed_bytes: u64,
    /// Per Forget planned, in order: the entries it dropped (its caller's answer).
    pub answers: Vec<u32>,
    /// Estimated journal bytes of the tombstones journalled: live until compacted away.
    pub tombstone_bytes: u64,
}

/// Plans a Forget. A Forget asked here is stamped from `clock` at `now_unix_ms` (only when it
/// applies); the clock moves past every stamp learned. `None`: nothing to do, answered 0 with
/// nothing journalled (`only_if` no longer names the winner, or nothing new was learned).
#[cfg(test)]
pub(crate) fn plan_forget(
    state: ForgetState<'_>,
    clock: &mut ForgetClock,
    now_unix_ms: i64,
    forget: ForgetCommand,
) -> Option<ForgetPlan> {
    let plan = plan_forgets(state, clock, now_unix_ms, [forget]);
    (!plan.records.is_empty()).then_some(plan)
}

/// Plans Forgets queued together as one: each applied after the ones before it (an
/// `only_if` is checked against what they left), their tombstones journalled in one append.
/// Each costs O(log n) plus what it matches (`Tombstones`, `EntryMap::remove_dropped_by`).
pub(crate) fn plan_forgets(
    state: ForgetState<'_>,
    clock: &mut ForgetClock,
    now_unix_ms: i64,
    forgets: impl IntoIterator<Item = ForgetCommand>,
) -> ForgetPlan {
    let mut plan = ForgetPlan {
        map: state.map.clone(),
        own: state.own.clone(),
        tombstones: state.tombstones.clone(),
        own_tombstones: state.own_tombstones.clone(),
        records: Vec::new(),
        told: Vec::new(),
        dropped: 0,
        freed_bytes: 0,
        answers: Vec::new(),
        tombstone_bytes: 0,
    };
    for forget in forgets {
        let dropped = plan.add(clock, now_unix_ms, forget);
        plan.answers.push(dropped);
    }
    plan
}

impl ForgetPlan {
    /// Adds one Forget to the plan; returns the entries it dropped from the cache.
    fn add(&mut self, clock: &mut ForgetClock, now_unix_ms: i64, forget: ForgetCommand) -> u32 {
        let (new, source, origin) = match forget {
            ForgetCommand::Ask(ask) => {
                if let Some((config, time_us)) = &ask.only_if {
                    let winner = ask
                        .scope
                        .exact_key()
                        .and_then(|key| self.map.get(&key).map(|entry| entry.result().to_result()));
                    let same = winner.is_some_and(|w| &w.config == config && w.time_us == *time_us);
                    if !same {
                        return 0;
                    }
                }
                let tombstone = Tombstone {
                    scope: ask.scope,
                    stamp: clock.tick(now_unix_ms),
                };
                (vec![tombstone], Source::Forget, Origin::Own)
            }
            ForgetCommand::Learned(learned, source, origin) => (learned, source, origin),
        };
        let mut answer = 0u32;
        for tombstone in new {
            clock.observe(tombstone.stamp);
            let own_new = origin == Origin::Own && self.own_tombstones.insert(tombstone.clone());
            // Nothing new (it, or a wider and newer one, is held): nothing to drop or tell.
            if !self.tombstones.insert(tombstone.clone()) && !own_new && source != Source::Forget {
                continue;
            }
            let dropped = self.map.remove_dropped_by(&tombstone);
            self.own.remove_dropped_by(&tombstone);
            self.freed_bytes += dropped
                .iter()
                .map(|entry| entry.encoded_len_estimate() as u64)
                .sum::<u64>();
            let dropped = u32::try_from(dropped.len()).unwrap_or(u32::MAX);
            answer = answer.saturating_add(dropped);
            self.tombstone_bytes += tombstone.scope.encoded_len_estimate() as u64;
            self.records.push((tombstone.clone(), origin));
            self.told.push(ForgetChange {
                tombstone,
                source: source.clone(),
                dropped,
            });
        }
        self.dropped = self.dropped.saturating_add(answer);
        answer
    }
}

#[cfg(test)]
mod tests;
