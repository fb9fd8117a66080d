//! Who is charged for the blobs live entries name, as one pure type: every live entry that a
//! uid of this node recorded charges that uid, in full, for each distinct blob it names, for
//! as long as it is the live entry of its key. Nobody else's act adds to a uid's charge: an
//! entry of another uid, the tuner's or a tier's that replaces it, or a Forget, only ends it.
//! Entries from the tiers and the tuner are charged to nobody (the store's own bound holds
//! them). No I/O and no clock; the adapter (`artifacts::Artifacts`) tells it what the
//! Records asked, what the change feed made live and what a collection scan found.
//!
//! Entries are known by hashes of their key and result (`EntryIds`), keyed with this
//! process's random keys, so no uid can aim a collision at another's entry and the map holds
//! no copies of keys.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use crate::model::entry::{KeyView, ResultView};

/// An entry as the charges know it: its key's hash and its result's (without the Forget
/// epoch, which the store stamps on a Record after it was asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryIds {
    pub key: u64,
    pub result: u64,
}

/// A live entry a uid recorded, naming blobs.
#[derive(Debug)]
struct Charged {
    uid: u32,
    result: u64,
    digests: Vec<(String, u64)>,
}

/// One uid's charge: each distinct digest its live entries name, with its size and how many
/// of them name it.
#[derive(Debug, Default)]
struct UidCharge {
    bytes: u64,
    digests: HashMap<String, (u64, u32)>,
}

/// Makes `EntryIds`, with keys of this process's own (a clone makes the same ids).
#[derive(Clone, Debug, Default)]
pub struct EntryHasher(RandomState);

impl EntryHasher {
    /// The ids of an entry.
    pub fn ids(&self, key: &KeyView<'_>, result: &ResultView<'_>) -> EntryIds {
        EntryIds {
            key: self
                .0
                .hash_one((key.namespace, key.op, key.device, key.problem, key.rank)),
            result: self.0.hash_one((
                result.config,
                result.time_us.to_bits(),
                result.tuned_by,
                result.tuned_at_unix_ms,
                result.artifacts.encoded(),
            )),
        }
    }
}

#[derive(Debug, Default)]
pub struct Charges {
    hasher: EntryHasher,
    entries: HashMap<u64, Charged>,
    by_uid: HashMap<u32, UidCharge>,
    /// Records asked and not yet answered: which uid asked for each entry, so that the change
    /// feed, which names no uid, can tell whose Record made it live.
    pending: HashMap<EntryIds, Vec<u32>>,
    /// Keys charged since the scan in progress began: kept when that scan's result arrives.
    since_scan: HashSet<u64>,
}

impl Charges {
    /// What the ids of entries are made with.
    pub fn hasher(&self) -> &EntryHasher {
        &self.hasher
    }

    /// `uid` asks a Record of entry `ids` (one naming blobs); `answered` ends it.
    pub fn asked(&mut self, uid: u32, ids: EntryIds) {
        self.pending.entry(ids).or_default().push(uid);
    }

    pub fn answered(&mut self, uid: u32, ids: EntryIds) {
        if let Some(uids) = self.pending.get_mut(&ids) {
            if let Some(at) = uids.iter().position(|&asker| asker == uid) {
                uids.swap_remove(at);
            }
            if uids.is_empty() {
                self.pending.remove(&ids);
            }
        }
    }

    /// Whether the change feed must tell this type about live entries at all: some Record is
    /// in progress or some entry is charged.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.entries.is_empty()
    }

    /// Entry `ids`, naming `digests`, is now the live entry of its key. It is charged to the
    /// uid whose Record asked for it, if one is in progress; otherwise (a tier, the tuner)
    /// to nobody. Either way the key's previous charge ends.
    pub fn live(&mut self, ids: EntryIds, digests: impl Iterator<Item = (String, u64)>) {
        self.uncharge(ids.key);
        let Some(&uid) = self.pending.get(&ids).and_then(|uids| uids.first()) else {
            return;
        };
        let mut digests: Vec<(String, u64)> = digests.collect();
        if digests.is_empty() {
            return;
        }
        digests.sort();
        digests.dedup_by(|a, b| a.0 == b.0);
        let charge = self.by_uid.entry(uid).or_default();
        for (digest, size) in &digests {
            let named = charge.digests.entry(digest.clone()).or_insert((*size, 0));
            if named.1 == 0 {
                charge.bytes += named.0;
            }
            named.1 += 1;
        }
        self.since_scan.insert(ids.key);
        self.entries.insert(
            ids.key,
            Charged {
                uid,
                result: ids.result,
                digests,
            },
        );
    }

    fn uncharge(&mut self, key: u64) {
        let Some(charged) = self.entries.remove(&key) else {
            return;
        };
        let Some(charge) = self.by_uid.get_mut(&charged.uid) else {
            return;
        };
        for (digest, _) in &charged.digests {
            if let Some(named) = charge.digests.get_mut(digest) {
                named.1 -= 1;
                if named.1 == 0 {
                    charge.bytes -= named.0;
                    charge.digests.remove(digest);
                }
            }
        }
        if charge.digests.is_empty() {
            self.by_uid.remove(&charged.uid);
        }
    }

    /// A collection scan begins: what is charged from now on is kept when it ends.
    pub fn scan_started(&mut self) {
        self.since_scan.clear();
    }

    /// A collection scan's result: the live entries that name blobs, key to result. A charged
    /// entry no longer live (forgotten, or replaced by a change the feed did not tell) ends.
    pub fn scan_finished(&mut self, live: &HashMap<u64, u64>) {
        let gone: Vec<u64> = self
            .entries
            .iter()
            .filter(|(key, charged)| {
                live.get(*key) != Some(&charged.result) && !self.since_scan.contains(*key)
            })
            .map(|(key, _)| *key)
            .collect();
        for key in gone {
            self.uncharge(key);
        }
    }

    /// The bytes of the distinct blobs `uid`'s live entries name.
    pub fn bytes_of(&self, uid: u32) -> u64 {
        self.by_uid.get(&uid).map_or(0, |charge| charge.bytes)
    }

    /// Whether `uid`'s live entries name `digest` (so an upload of it adds nothing).
    pub fn names(&self, uid: u32, digest: &str) -> bool {
        self.by_uid
            .get(&uid)
            .is_some_and(|charge| charge.digests.contains_key(digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::artifacts::ArtifactList;
    use crate::model::entry::{CacheKey, TunedResult};
    use crate::model::testing::{self, key};
    use tunecache_proto::v1;

    const MIB: u64 = 1024 * 1024;

    fn digest(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    fn result(time_us: f64, blobs: &[u8]) -> TunedResult {
        TunedResult {
            artifacts: ArtifactList::from_wire(
                blobs
                    .iter()
                    .map(|&n| v1::Artifact {
                        name: format!("f{n}"),
                        sha256: digest(n),
                        size: u64::from(n) * MIB,
                    })
                    .collect(),
            ),
            ..testing::result(time_us)
        }
    }

    /// The change feed's report that `(key, result)` is live.
    fn live(charges: &mut Charges, key: &CacheKey, result: &TunedResult) {
        let ids = charges.hasher().ids(&key.view(), &result.view());
        let digests: Vec<(String, u64)> = result
            .artifacts
            .view()
            .iter()
            .map(|a| (a.sha256.to_owned(), a.size))
            .collect();
        charges.live(ids, digests.into_iter());
    }

    /// `uid` Records `(key, result)` and it becomes live.
    fn record(charges: &mut Charges, uid: u32, key: &CacheKey, result: &TunedResult) {
        let ids = charges.hasher().ids(&key.view(), &result.view());
        charges.asked(uid, ids);
        live(charges, key, result);
        charges.answered(uid, ids);
    }

    #[test]
    fn a_uid_is_charged_once_for_each_distinct_blob_its_live_entries_name() {
        let mut charges = Charges::default();
        record(&mut charges, 1, &key("a"), &result(1.0, &[1, 2]));
        record(&mut charges, 1, &key("b"), &result(1.0, &[2, 3]));
        assert_eq!(charges.bytes_of(1), 6 * MIB);
        assert!(charges.names(1, &digest(3)));
        // Another uid naming the same blob is charged in full too; uid 1 is not relieved.
        record(&mut charges, 2, &key("c"), &result(1.0, &[3]));
        assert_eq!(
            (charges.bytes_of(1), charges.bytes_of(2)),
            (6 * MIB, 3 * MIB)
        );
        assert!(!charges.is_idle());
    }

    #[test]
    fn a_replaced_entry_moves_the_charge_to_the_new_recorder_or_to_nobody() {
        let mut charges = Charges::default();
        record(&mut charges, 1, &key("a"), &result(5.0, &[1]));
        record(&mut charges, 1, &key("b"), &result(5.0, &[2]));
        // Beaten by uid 2's better result: uid 2 is charged, uid 1 no longer.
        record(&mut charges, 2, &key("a"), &result(1.0, &[4]));
        assert_eq!(
            (charges.bytes_of(1), charges.bytes_of(2)),
            (2 * MIB, 4 * MIB)
        );
        // Beaten by an entry from a tier (no Record asked for it): charged to nobody.
        live(&mut charges, &key("b"), &result(1.0, &[2]));
        assert_eq!(charges.bytes_of(1), 0);
        // A Record that names no blob ends its key's charge as well.
        record(&mut charges, 2, &key("a"), &result(0.5, &[]));
        assert_eq!(charges.bytes_of(2), 0);
        assert!(charges.is_idle());
    }

    #[test]
    fn an_entry_live_without_a_record_in_progress_is_charged_to_nobody() {
        let mut charges = Charges::default();
        let (k, r) = (key("a"), result(1.0, &[1]));
        let ids = charges.hasher().ids(&k.view(), &r.view());
        charges.asked(1, ids);
        charges.answered(1, ids);
        // The Record was answered unchanged; the same entry arriving later from a tier is
        // nobody's.
        live(&mut charges, &k, &r);
        assert_eq!(charges.bytes_of(1), 0);
        // The Forget epoch is not part of the ids: the store stamps it after the Record asks.
        let mut stamped = r.clone();
        stamped.forget_epoch = 9;
        assert_eq!(charges.hasher().ids(&k.view(), &stamped.view()), ids);
    }

    #[test]
    fn a_scan_ends_the_charges_of_entries_no_longer_live_but_keeps_newer_ones() {
        let mut charges = Charges::default();
        let (ka, ra) = (key("a"), result(1.0, &[1]));
        let (kb, rb) = (key("b"), result(1.0, &[2]));
        record(&mut charges, 1, &ka, &ra);
        charges.scan_started();
        // Recorded while the scan ran, from a version it did not read.
        record(&mut charges, 1, &kb, &rb);
        // The scan found neither: a was forgotten.
        charges.scan_finished(&HashMap::new());
        assert_eq!(charges.bytes_of(1), 2 * MIB);
        // The next scan finds b live with the result charged: kept; with another: ended.
        let b = charges.hasher().ids(&kb.view(), &rb.view());
        charges.scan_started();
        charges.scan_finished(&HashMap::from([(b.key, b.result)]));
        assert_eq!(charges.bytes_of(1), 2 * MIB);
        charges.scan_started();
        charges.scan_finished(&HashMap::from([(b.key, b.result ^ 1)]));
        assert_eq!(charges.bytes_of(1), 0);
        assert!(charges.is_idle());
    }
}
