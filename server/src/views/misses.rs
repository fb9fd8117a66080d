//! The replay misses (issue 52, docs/bundles.md): the keys a read asked in replay (a Resolve
//! with `replay`, or any Lookup or Resolve of a daemon started with `--replay`) that had no
//! answer, kept per view of a uid, with how often and when each was asked. It is the list
//! staging must tune next, which `ListMisses` (`tunecache misses`) answers.
//!
//! The rules are this plain type, tested without a runtime; `views::replay` is its adapter.
//! Every part is bounded, and a uid's bounds are its own: keys per view, keys and views per
//! uid. A key past a bound is counted in its view's `left_out` (or the uid's, when even the
//! view could not be kept), never listed, and never takes another uid's room.

use std::collections::{BTreeMap, HashMap};

use crate::model::entry::CacheKey;

/// The bounds of the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissCaps {
    /// Keys listed per view (the "say 10,000 keys").
    pub keys_per_view: usize,
    /// Keys listed per uid, across its views.
    pub keys_per_uid: usize,
    /// Views with misses per uid.
    pub views_per_uid: usize,
}

pub const DEFAULT_MISS_CAPS: MissCaps = MissCaps {
    keys_per_view: 10_000,
    keys_per_uid: 50_000,
    views_per_uid: 64,
};

/// One missed key: how many reads missed it, the first and the last (unix ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missed {
    pub count: u64,
    pub first_unix_ms: i64,
    pub last_unix_ms: i64,
}

/// One view's misses (the view "" holds the reads in no view).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewMisses {
    pub keys: BTreeMap<CacheKey, Missed>,
    /// Missed keys not listed: past a bound.
    pub left_out: u64,
}

/// Which bound a miss hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundHit {
    KeysPerView,
    KeysPerUid,
    ViewsPerUid,
}

/// What `record` did with a miss: what the adapter logs, each at most once per listed key or
/// per uid and bound, so that the log is as bounded as the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The key's first miss in its view: listed now.
    Listed,
    /// A listed key missed again: counted.
    Again,
    /// Past a bound: counted in `left_out`; `first` the first time the uid hits that bound.
    LeftOut { bound: BoundHit, first: bool },
}

/// What a uid holds in the list.
#[derive(Debug, Default)]
struct UidShare {
    keys: usize,
    /// Misses of views it had no room to keep.
    views_left_out: u64,
    /// The bounds already reported for it.
    reported: Vec<BoundHit>,
}

/// The node's replay misses, per (uid, view).
#[derive(Debug)]
pub struct MissLog {
    caps: MissCaps,
    views: BTreeMap<(u32, String), ViewMisses>,
    uids: HashMap<u32, UidShare>,
}

impl MissLog {
    pub fn new(caps: MissCaps) -> MissLog {
        MissLog {
            caps,
            views: BTreeMap::new(),
            uids: HashMap::new(),
        }
    }

    /// `uid` asked `key` in `view` at `now_unix_ms` and had no answer.
    pub fn record(&mut self, uid: u32, view: &str, key: &CacheKey, now_unix_ms: i64) -> Recorded {
        let caps = self.caps;
        let share = self.uids.entry(uid).or_default();
        let place = (uid, view.to_owned());
        if !self.views.contains_key(&place) {
            let held = self
                .views
                .range((uid, String::new())..)
                .take_while(|((owner, _), _)| *owner == uid)
                .count();
            if held >= caps.views_per_uid {
                share.views_left_out += 1;
                return left_out(share, BoundHit::ViewsPerUid);
            }
        }
        let misses = self.views.entry(place).or_default();
        if let Some(missed) = misses.keys.get_mut(key) {
            missed.count += 1;
            missed.last_unix_ms = missed.last_unix_ms.max(now_unix_ms);
            return Recorded::Again;
        }
        let bound = if misses.keys.len() >= caps.keys_per_view {
            Some(BoundHit::KeysPerView)
        } else if share.keys >= caps.keys_per_uid {
            Some(BoundHit::KeysPerUid)
        } else {
            None
        };
        if let Some(bound) = bound {
            misses.left_out += 1;
            return left_out(share, bound);
        }
        share.keys += 1;
        misses.keys.insert(
            key.clone(),
            Missed {
                count: 1,
                first_unix_ms: now_unix_ms,
                last_unix_ms: now_unix_ms,
            },
        );
        Recorded::Listed
    }

    /// The views' misses in (uid, view) order: `uid`'s only, or every uid's (`None`, an
    /// administrator), of the view named `view` only when it is given. A uid's misses of
    /// views it had no room for are added to the `left_out` of its first view listed.
    pub fn list(&self, uid: Option<u32>, view: Option<&str>) -> Vec<(u32, String, ViewMisses)> {
        let mut listed: Vec<(u32, String, ViewMisses)> = self
            .views
            .iter()
            .filter(|((owner, name), _)| {
                uid.is_none_or(|uid| uid == *owner) && view.is_none_or(|view| view == name)
            })
            .map(|((owner, name), misses)| (*owner, name.clone(), misses.clone()))
            .collect();
        if view.is_none() {
            let mut seen = std::collections::HashSet::new();
            for (owner, _, misses) in &mut listed {
                if seen.insert(*owner) {
                    misses.left_out += self.uids.get(owner).map_or(0, |share| share.views_left_out);
                }
            }
        }
        listed
    }
}

/// A miss left out at `bound`, and whether it is the first time the uid hits it.
fn left_out(share: &mut UidShare, bound: BoundHit) -> Recorded {
    let first = !share.reported.contains(&bound);
    if first {
        share.reported.push(bound);
    }
    Recorded::LeftOut { bound, first }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testing::key;

    const SMALL: MissCaps = MissCaps {
        keys_per_view: 3,
        keys_per_uid: 5,
        views_per_uid: 2,
    };

    #[test]
    fn a_key_missed_again_is_counted_with_its_first_and_last_time() {
        let mut log = MissLog::new(SMALL);
        assert_eq!(log.record(1, "job", &key("a"), 100), Recorded::Listed);
        assert_eq!(log.record(1, "job", &key("a"), 300), Recorded::Again);
        assert_eq!(log.record(1, "job", &key("a"), 200), Recorded::Again);
        let listed = log.list(Some(1), None);
        assert_eq!(listed.len(), 1);
        let (uid, view, misses) = &listed[0];
        assert_eq!((*uid, view.as_str()), (1, "job"));
        assert_eq!(
            misses.keys.get(&key("a")),
            Some(&Missed {
                count: 3,
                first_unix_ms: 100,
                last_unix_ms: 300
            })
        );
        assert_eq!(misses.left_out, 0);
    }

    #[test]
    fn keys_past_a_views_bound_are_counted_left_out_and_reported_once() {
        let mut log = MissLog::new(SMALL);
        for n in 0..3 {
            assert_eq!(
                log.record(1, "job", &key(&format!("k{n}")), 1),
                Recorded::Listed
            );
        }
        let past = |first| Recorded::LeftOut {
            bound: BoundHit::KeysPerView,
            first,
        };
        assert_eq!(log.record(1, "job", &key("k3"), 1), past(true));
        assert_eq!(log.record(1, "job", &key("k4"), 1), past(false));
        // A listed key still counts its misses.
        assert_eq!(log.record(1, "job", &key("k0"), 2), Recorded::Again);
        let (_, _, misses) = &log.list(Some(1), Some("job"))[0];
        assert_eq!(misses.keys.len(), 3);
        assert_eq!(misses.left_out, 2);
        assert_eq!(misses.keys[&key("k0")].count, 2);
    }

    #[test]
    fn one_uid_past_its_bounds_takes_no_room_of_another() {
        let mut log = MissLog::new(SMALL);
        for n in 0..3 {
            log.record(1, "a", &key(&format!("a{n}")), 1);
            log.record(1, "b", &key(&format!("b{n}")), 1);
        }
        // Uid 1 holds 5 keys: its sixth is left out, and a third view has no room.
        let (_, _, b) = &log.list(Some(1), Some("b"))[0];
        assert_eq!((b.keys.len(), b.left_out), (2, 1));
        assert_eq!(
            log.record(1, "c", &key("c0"), 1),
            Recorded::LeftOut {
                bound: BoundHit::ViewsPerUid,
                first: true
            }
        );
        assert_eq!(log.list(Some(1), Some("c")), vec![]);
        // Uid 2 still has all its room.
        for n in 0..3 {
            assert_eq!(
                log.record(2, "c", &key(&format!("c{n}")), 1),
                Recorded::Listed
            );
        }
        let (_, _, c) = &log.list(Some(2), None)[0];
        assert_eq!((c.keys.len(), c.left_out), (3, 0));
        // The view uid 1 could not keep is counted in its listing.
        let total_left_out: u64 = log
            .list(Some(1), None)
            .iter()
            .map(|(_, _, m)| m.left_out)
            .sum();
        assert_eq!(total_left_out, 2);
    }

    #[test]
    fn a_uid_lists_only_its_own_views_and_an_administrator_every_uids() {
        let mut log = MissLog::new(SMALL);
        log.record(1, "job", &key("a"), 1);
        log.record(2, "job", &key("b"), 1);
        let mine: Vec<u32> = log
            .list(Some(2), None)
            .iter()
            .map(|(uid, _, _)| *uid)
            .collect();
        assert_eq!(mine, vec![2]);
        let all: Vec<u32> = log
            .list(None, Some("job"))
            .iter()
            .map(|(uid, _, _)| *uid)
            .collect();
        assert_eq!(all, vec![1, 2]);
    }
}
