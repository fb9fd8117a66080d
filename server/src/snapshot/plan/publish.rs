//! What a publish writes, and when and how this node's segments are compacted.
//!
//! A publish writes one new segment holding the own contributions and the tombstones of this
//! node's Forgets that its segments do not hold yet, and the uses this node made of keys
//! since the last one (`used`), under the next sequence number; uses alone make a segment. The name
//! is recorded (state directory) before the segment exists, so a crash between the two never
//! leaves a segment of this node that its record does not know. Past the bound, the own
//! segments are folded into one covering all their numbers, which is renamed in before the
//! segments it replaces are removed; never while another writer uses this node's name or a
//! segment this node did not write lies inside that range, since the compacted segment would
//! hide it from readers. A compaction holds what is published, each entry with its last use
//! as the own contributions know it now, and no `used` list: uses were transient facts, and
//! the days they raised go out with the entries of their owners' next compactions.

use std::sync::Arc;

use crate::model::forget::Tombstone;
use crate::model::tombstones::Tombstones;
use crate::snapshot::segments::SegmentName;
use crate::wire::stored::{EntryMap, StoredEntry};

use super::not_ours::NotOurs;
use super::own::OwnSegments;

/// Compaction also runs when the own segments hold more than twice the live entries, once
/// they hold at least this many.
pub const COMPACT_MIN_ENTRIES: usize = 10_000;

/// One segment to write: its name, and what it holds.
pub struct SegmentPlan {
    pub segment: SegmentName,
    pub entries: EntryMap,
    /// Uses of keys made here (never in a compaction).
    pub used: EntryMap,
    pub tombstones: Vec<Tombstone>,
}

impl OwnSegments {
    /// What Forgets removed no longer counts as published (a compaction leaves it out):
    /// `published` is pruned with `all`, the tombstones known, once per version of them.
    pub fn prune(&mut self, all: Arc<Tombstones>) {
        if self
            .pruned_with
            .as_ref()
            .is_some_and(|pruned| Arc::ptr_eq(pruned, &all))
        {
            return;
        }
        for tombstone in all.iter() {
            self.published.remove_dropped_by(&tombstone);
        }
        self.pruned_with = Some(all);
    }

    /// What expiry dropped no longer counts as published (a compaction leaves it out; a
    /// later Record of the same result publishes it again).
    pub fn expired(&mut self, entries: &[StoredEntry]) {
        for entry in entries {
            if self.published.contains(entry) {
                self.published.remove(entry);
            }
        }
    }

    /// The next segment: of `own` (the own contributions) and `own_tombstones` (the
    /// tombstones of Forgets made here), what the segments do not hold yet, and `used` (uses
    /// made here since the last segment) but for the keys whose entry it holds anyway (the
    /// entry carries its day); `None` when that is nothing. Its name is taken: `segments` lists it and `next_seq` is past it, so the
    /// record written next knows it. Then exactly one of `unreserve`, `not_written` or
    /// `written`.
    ///
    /// It holds the next number alone, or, after own segments vanished (`republish_from`),
    /// every number from the lowest one recorded on: it holds everything then, like a
    /// compaction, so a reader that never read this node takes it first and finds no gap.
    /// Not while another writer uses this name or a segment this node did not write lies in
    /// that range, which the segment would hide.
    pub fn plan_publish(
        &mut self,
        node: &str,
        own: &EntryMap,
        used: &EntryMap,
        own_tombstones: &Tombstones,
        not_ours: &NotOurs,
    ) -> Option<SegmentPlan> {
        let entries: EntryMap = own
            .iter()
            .filter(|entry| !self.published.contains(entry))
            .cloned()
            .collect();
        let tombstones: Vec<Tombstone> = own_tombstones
            .iter()
            .filter(|tombstone| !self.published_tombstones.subsumes(tombstone))
            .collect();
        let used: EntryMap = used
            .iter()
            .filter(|entry| !entries.contains(entry))
            .cloned()
            .collect();
        if entries.is_empty() && tombstones.is_empty() && used.is_empty() {
            return None;
        }
        let first = self
            .republish_from
            .filter(|&from| !self.name_conflict && !not_ours.within((from, self.next_seq)))
            .unwrap_or(self.next_seq);
        let segment = self.take_name(node, first, self.next_seq, not_ours)?;
        self.segments.push(segment.clone());
        Some(SegmentPlan {
            segment,
            entries,
            used,
            tombstones,
        })
    }

    /// The record could not be written: the name is not taken after all.
    pub fn unreserve(&mut self) {
        self.next_seq = self.before_reserve;
        self.segments.pop();
    }

    /// The segment was not written; the record may list it meanwhile, which is harmless (it
    /// only ever protects). Its number is used by the next try, unless another writer of this
    /// name had taken it (`name_taken`): then numbering goes past it and compaction stops, as
    /// it would cover the other writer's numbers. Returns whether that conflict is new (it is
    /// warned about once).
    pub fn not_written(&mut self, name_taken: bool) -> bool {
        self.segments.pop();
        if !name_taken {
            self.next_seq = self.before_reserve;
            return false;
        }
        !std::mem::replace(&mut self.name_conflict, true)
    }

    /// The segment is in place: what it holds is published.
    pub fn written(&mut self, plan: SegmentPlan) {
        self.republish_from = None;
        // Uses count as what the segments hold: all of them are garbage once read, and only a
        // compaction takes them out of the directory.
        self.entries_in_segments += plan.entries.len() + plan.used.len();
        for entry in plan.entries.iter() {
            self.published.insert(entry.clone());
        }
        for tombstone in plan.tombstones {
            self.published_tombstones.insert(tombstone);
        }
    }

    /// Whether the own segments are due for compaction: more of them than `max_segments`, or
    /// at least `COMPACT_MIN_ENTRIES` entries and uses in them and more than twice the live
    /// entries.
    /// Never while another writer uses this node's name, or while a segment it did not
    /// write lies inside their range.
    pub fn compaction_due(&self, max_segments: usize, not_ours: &NotOurs) -> bool {
        if self.name_conflict || self.range().is_some_and(|range| not_ours.within(range)) {
            return false;
        }
        self.segments.len() > max_segments
            || (self.entries_in_segments >= COMPACT_MIN_ENTRIES
                && self.entries_in_segments > 2 * self.published.len())
    }

    /// The compaction: one segment covering every number of the own segments, holding what
    /// is published, each entry as `own` (the own contributions) holds it when it holds the
    /// same result: the allocation whose day the store raises, so the compaction carries the
    /// latest use this node knows. Its name is taken (`segments` lists it) for the record
    /// written next; then `compaction_unrecorded` or, once it is in place, `compacted`.
    pub fn plan_compaction(
        &mut self,
        node: &str,
        own: &EntryMap,
        not_ours: &NotOurs,
    ) -> Option<SegmentPlan> {
        let (first, last) = self.range()?;
        let segment = SegmentName {
            node: node.to_owned(),
            first,
            last,
        };
        // Already recorded (a compaction whose removals were cut short) it is this node's
        // own; otherwise a name another user holds is not taken.
        let segment = if self.segments.contains(&segment) {
            self.before_reserve = self.next_seq;
            segment
        } else {
            let segment = self.take_name(node, first, last, not_ours)?;
            self.segments.push(segment.clone());
            segment
        };
        let entries = self
            .published
            .iter()
            .map(|entry| {
                own.get_view(&entry.key())
                    .filter(|held| held.same_entry(entry))
                    .unwrap_or(entry)
                    .clone()
            })
            .collect();
        Some(SegmentPlan {
            segment,
            entries,
            used: EntryMap::new(),
            tombstones: self.published_tombstones.iter().collect(),
        })
    }

    /// The compaction could not be recorded: the segments stay as they are.
    pub fn compaction_unrecorded(&mut self, plan: &SegmentPlan) {
        self.segments.retain(|s| *s != plan.segment);
        self.next_seq = self.before_reserve;
    }

    /// The compacted segment is in place: it is the only own segment now. Returns the ones it
    /// replaces, for the I/O to remove (what it cannot, the next load removes as leftovers).
    pub fn compacted(&mut self, plan: &SegmentPlan) -> Vec<SegmentName> {
        let replaced = std::mem::replace(&mut self.segments, vec![plan.segment.clone()])
            .into_iter()
            .filter(|old| *old != plan.segment)
            .collect();
        self.entries_in_segments = plan.entries.len();
        replaced
    }
}

#[cfg(test)]
mod tests {
    use super::super::own::tests::{entry, forget_all, listing, seg};
    use super::*;

    fn loaded(next_seq: u64) -> OwnSegments {
        OwnSegments {
            loaded: true,
            next_seq,
            ..OwnSegments::default()
        }
    }

    fn problems(map: &EntryMap) -> Vec<String> {
        map.iter().map(|e| e.key().problem.to_owned()).collect()
    }

    #[test]
    fn a_publish_holds_only_what_the_segments_do_not_hold_yet() {
        let mut own = loaded(1);
        let map: EntryMap = [entry("p1", 1.0), entry("p2", 1.0)].into_iter().collect();
        let none = Tombstones::default();
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &none, &NotOurs::default())
            .unwrap();
        assert_eq!(plan.segment, seg(1, 1));
        assert_eq!(problems(&plan.entries), vec!["p1", "p2"]);
        assert!(plan.tombstones.is_empty());
        own.written(plan);
        assert_eq!(own.published.len(), 2);
        assert_eq!(own.entries_in_segments, 2);
        // Nothing new: nothing to write, and no number taken.
        assert!(own
            .plan_publish("me", &map, &EntryMap::new(), &none, &NotOurs::default())
            .is_none());
        assert_eq!((own.next_seq, own.segments.len()), (2, 1));

        // A faster result for p2, and a Forget made here.
        let map: EntryMap = [entry("p1", 1.0), entry("p2", 0.5)].into_iter().collect();
        let mut forgets = Tombstones::default();
        forgets.insert(forget_all(7));
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &NotOurs::default())
            .unwrap();
        assert_eq!(plan.segment, seg(2, 2));
        assert_eq!(problems(&plan.entries), vec!["p2"]);
        assert_eq!(plan.tombstones, vec![forget_all(7)]);
        own.written(plan);
        assert_eq!(own.entries_in_segments, 3);
        assert!(own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &NotOurs::default())
            .is_none());
        // A tombstone the published ones subsume is nothing new either.
        let mut older = Tombstones::default();
        older.insert(forget_all(5));
        assert!(own
            .plan_publish("me", &map, &EntryMap::new(), &older, &NotOurs::default())
            .is_none());
    }

    #[test]
    fn what_forgets_removed_no_longer_counts_as_published() {
        let mut own = loaded(2);
        own.published = [entry("p1", 1.0)].into_iter().collect();
        let mut all = Tombstones::default();
        all.insert(forget_all(7));
        let all = Arc::new(all);
        own.prune(Arc::clone(&all));
        assert!(own.published.is_empty());
        // The same version of the tombstones is not walked again.
        own.published = [entry("p1", 1.0)].into_iter().collect();
        own.prune(Arc::clone(&all));
        assert_eq!(own.published.len(), 1);
        own.prune(Arc::new((*all).clone()));
        assert!(own.published.is_empty());
    }

    #[test]
    fn a_failed_publish_gives_its_number_back_unless_another_writer_took_it() {
        let map: EntryMap = [entry("p1", 1.0)].into_iter().collect();
        let none = Tombstones::default();
        let mut own = loaded(4);
        own.segments = vec![seg(1, 3)];
        assert!(own
            .plan_publish("me", &map, &EntryMap::new(), &none, &NotOurs::default())
            .is_some());
        assert_eq!((own.next_seq, own.segments.len()), (5, 2));
        own.unreserve();
        assert_eq!((own.next_seq, own.segments.clone()), (4, vec![seg(1, 3)]));

        assert!(own
            .plan_publish("me", &map, &EntryMap::new(), &none, &NotOurs::default())
            .is_some());
        assert!(!own.not_written(false));
        assert_eq!((own.next_seq, own.segments.clone()), (4, vec![seg(1, 3)]));
        assert!(own.published.is_empty(), "nothing counts as published");

        assert!(own
            .plan_publish("me", &map, &EntryMap::new(), &none, &NotOurs::default())
            .is_some());
        assert!(own.not_written(true), "a new conflict");
        assert_eq!((own.next_seq, own.segments.clone()), (5, vec![seg(1, 3)]));
        assert!(own.name_conflict);
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &none, &NotOurs::default())
            .unwrap();
        assert_eq!(plan.segment, seg(5, 5), "past the taken number");
        assert!(!own.not_written(true), "warned about once");
    }

    #[test]
    fn after_own_segments_vanished_the_next_publish_holds_everything_from_the_lowest_number() {
        let map: EntryMap = [entry("p1", 1.0)].into_iter().collect();
        let mut forgets = Tombstones::default();
        forgets.insert(forget_all(7));
        let none = NotOurs::default();
        let mut own = loaded(2);
        own.segments = vec![seg(1, 1)];
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &none)
            .unwrap();
        own.written(plan);
        assert!(own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &none)
            .is_none());
        // Its segments were deleted; the node's record started at 1.
        own.forget_vanished(&listing(&[]));
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &none)
            .unwrap();
        assert_eq!(plan.segment, seg(1, 3), "a fresh reader takes it at once");
        assert_eq!(problems(&plan.entries), vec!["p1"]);
        assert_eq!(plan.tombstones, vec![forget_all(7)], "the Forget again");
        // Not written: the next try covers the same numbers.
        own.not_written(false);
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &none)
            .unwrap();
        assert_eq!(plan.segment, seg(1, 3));
        own.written(plan);
        assert_eq!(own.republish_from, None);
        let map: EntryMap = [entry("p1", 1.0), entry("p2", 1.0)].into_iter().collect();
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &none)
            .unwrap();
        assert_eq!(plan.segment, seg(4, 4), "then one number per publish again");

        // A segment under this name it did not write lies in the range: not hidden.
        let mut inside = NotOurs::default();
        inside.take_unread(&[], &listing(&[(2, 2)]));
        let mut own = loaded(3);
        own.segments = vec![seg(1, 1)];
        own.forget_vanished(&listing(&[]));
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &inside)
            .unwrap();
        assert_eq!(plan.segment, seg(3, 3));
        // Nor over another writer of this name.
        let mut own = loaded(3);
        own.segments = vec![seg(1, 1)];
        own.forget_vanished(&listing(&[]));
        own.name_conflict = true;
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &forgets, &none)
            .unwrap();
        assert_eq!(plan.segment, seg(3, 3));
    }

    #[test]
    fn uses_count_toward_a_compaction_which_leaves_them_out() {
        let mut own = loaded(1);
        let none = Tombstones::default();
        let used: EntryMap = (0..COMPACT_MIN_ENTRIES)
            .map(|i| entry(&format!("u{i}"), 1.0))
            .collect();
        let plan = own
            .plan_publish("me", &EntryMap::new(), &used, &none, &NotOurs::default())
            .unwrap();
        assert_eq!(plan.used.len(), COMPACT_MIN_ENTRIES);
        own.written(plan);
        // No entry of this node's is live: segments of uses alone are all garbage once read.
        assert!(own.compaction_due(64, &NotOurs::default()));
    }

    #[test]
    fn compaction_is_due_past_the_bounds_and_never_over_another_writers_numbers() {
        let mut own = loaded(5);
        own.segments = (1..=4).map(|n| seg(n, n)).collect();
        let none = NotOurs::default();
        assert!(!own.compaction_due(4, &none));
        assert!(own.compaction_due(3, &none));
        // Many entries, most of them superseded.
        own.entries_in_segments = COMPACT_MIN_ENTRIES;
        own.published = (0..COMPACT_MIN_ENTRIES / 2 - 1)
            .map(|i| entry(&format!("p{i}"), 1.0))
            .collect();
        assert!(own.compaction_due(64, &none));
        own.published.insert(entry("one more", 1.0));
        assert!(
            !own.compaction_due(64, &none),
            "exactly twice the live ones"
        );
        own.entries_in_segments = COMPACT_MIN_ENTRIES - 1;
        own.published = EntryMap::new();
        assert!(!own.compaction_due(64, &none), "too few to bother");

        // A segment under this name it did not write, inside the range; one before it is an
        // earlier state directory's, and no obstacle.
        let other = OwnSegments::default();
        let mut own = loaded(9);
        own.segments = (5..=8).map(|n| seg(n, n)).collect();
        let mut before = NotOurs::default();
        before.take_unread(&other.segments, &listing(&[(2, 2)]));
        let mut inside = NotOurs::default();
        inside.take_unread(&other.segments, &listing(&[(6, 6)]));
        assert!(own.compaction_due(3, &before));
        assert!(!own.compaction_due(3, &inside));
        own.name_conflict = true;
        assert!(!own.compaction_due(3, &before));
    }

    #[test]
    fn a_compaction_covers_every_own_number_and_replaces_the_segments_it_covers() {
        let mut own = loaded(5);
        own.segments = vec![seg(2, 2), seg(1, 1), seg(3, 4)];
        own.published = [entry("p1", 1.0), entry("p2", 1.0)].into_iter().collect();
        own.published_tombstones.insert(forget_all(7));
        own.entries_in_segments = 9;
        let plan = own
            .plan_compaction("me", &EntryMap::new(), &NotOurs::default())
            .unwrap();
        assert_eq!(plan.segment, seg(1, 4));
        assert_eq!(problems(&plan.entries), vec!["p1", "p2"]);
        assert_eq!(plan.tombstones, vec![forget_all(7)]);
        assert!(
            own.segments.contains(&seg(1, 4)),
            "recorded before it is written"
        );
        own.compaction_unrecorded(&plan);
        assert_eq!(own.segments, vec![seg(2, 2), seg(1, 1), seg(3, 4)]);

        let plan = own
            .plan_compaction("me", &EntryMap::new(), &NotOurs::default())
            .unwrap();
        let mut replaced = own.compacted(&plan);
        replaced.sort();
        assert_eq!(replaced, vec![seg(1, 1), seg(2, 2), seg(3, 4)]);
        assert_eq!(own.segments, vec![seg(1, 4)]);
        assert_eq!(own.entries_in_segments, 2);
        assert_eq!(own.next_seq, 5);
        assert!(OwnSegments::default()
            .plan_compaction("me", &EntryMap::new(), &NotOurs::default())
            .is_none());
    }

    #[test]
    fn uses_alone_make_a_segment_and_a_compaction_carries_days_but_no_uses() {
        let mut own = loaded(1);
        let p1 = entry("p1", 1.0);
        let map: EntryMap = [p1.clone()].into_iter().collect();
        let none = Tombstones::default();
        let plan = own
            .plan_publish("me", &map, &EntryMap::new(), &none, &NotOurs::default())
            .unwrap();
        own.written(plan);
        // A key learned from elsewhere was read here, and so was p1: uses alone make a
        // segment; the entry of a key a segment publishes carries its day itself.
        let learned = entry("q1", 2.0).with_last_use(20_010);
        let used: EntryMap = [learned, p1.clone()].into_iter().collect();
        let plan = own
            .plan_publish("me", &map, &used, &none, &NotOurs::default())
            .unwrap();
        assert_eq!(plan.segment, seg(2, 2));
        assert!(plan.entries.is_empty());
        assert_eq!(problems(&plan.used), vec!["p1", "q1"]);
        own.written(plan);
        assert_eq!(own.published.len(), 1, "uses are never published entries");
        let faster = entry("p1", 0.5);
        let map: EntryMap = [faster.clone()].into_iter().collect();
        let used: EntryMap = [faster].into_iter().collect();
        let plan = own
            .plan_publish("me", &map, &used, &none, &NotOurs::default())
            .unwrap();
        assert_eq!(problems(&plan.entries), vec!["p1"]);
        assert!(
            plan.used.is_empty(),
            "each key once: the entry carries the use"
        );
        own.written(plan);

        // The store raised p1's day in its own copy (read back at start, say): a
        // compaction holds the entry as the own contributions do, with that day.
        let held = entry("p1", 0.5).with_last_use(20_020);
        let own_map: EntryMap = [held].into_iter().collect();
        let plan = own
            .plan_compaction("me", &own_map, &NotOurs::default())
            .unwrap();
        assert_eq!(plan.segment, seg(1, 3));
        assert!(plan.used.is_empty());
        let days: Vec<u32> = plan.entries.iter().map(StoredEntry::last_use).collect();
        assert_eq!(days, vec![20_020]);

        // What expired is no longer published: a compaction leaves it out.
        let expired: Vec<StoredEntry> = own.published.iter().cloned().collect();
        own.expired(&expired);
        assert!(own.published.is_empty());
    }
}
