//! The interned vocabulary of stored entries: namespace, op and device, shared by every
//! entry that has them (a cache has a few dozen distinct values of each).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, OnceLock};

use crate::model::entry::KeyView;

/// One interned (namespace, op, device): shared by every entry that has it.
#[derive(Debug)]
pub struct Vocab {
    pub(super) namespace: Box<str>,
    pub(super) op: Box<str>,
    pub(super) device: Box<str>,
}

impl Vocab {
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    pub(super) fn cmp_strs(&self, namespace: &str, op: &str, device: &str) -> Ordering {
        (*self.namespace)
            .cmp(namespace)
            .then_with(|| (*self.op).cmp(op))
            .then_with(|| (*self.device).cmp(device))
    }
}

/// The interning table. A value no entry uses any more is dropped at the next sweep, which
/// runs when the table has doubled since the last one: a hostile stream of distinct names
/// costs what the entries holding them cost, not more.
pub(super) struct Interner {
    hasher: RandomState,
    pub(super) by_hash: HashMap<u64, Vec<Arc<Vocab>>>,
    len: usize,
    sweep_at: usize,
}

pub(super) const MIN_SWEEP_AT: usize = 1024;

pub(super) fn interner() -> &'static Mutex<Interner> {
    static INTERNER: OnceLock<Mutex<Interner>> = OnceLock::new();
    INTERNER.get_or_init(|| {
        Mutex::new(Interner {
            hasher: RandomState::new(),
            by_hash: HashMap::new(),
            len: 0,
            sweep_at: MIN_SWEEP_AT,
        })
    })
}

/// The shared `Vocab` for these three values (the same `Arc` for equal values while any
/// entry holds it).
pub fn intern(namespace: &str, op: &str, device: &str) -> Arc<Vocab> {
    let mut table = crate::sync::lock(interner());
    let hash = table.hasher.hash_one((namespace, op, device));
    if let Some(found) = table.find(hash, namespace, op, device) {
        return Arc::clone(found);
    }
    if table.len >= table.sweep_at {
        table.by_hash.retain(|_, bucket| {
            bucket.retain(|v| Arc::strong_count(v) > 1);
            !bucket.is_empty()
        });
        table.len = table.by_hash.values().map(Vec::len).sum();
        table.sweep_at = (2 * table.len).max(MIN_SWEEP_AT);
    }
    let vocab = Arc::new(Vocab {
        namespace: namespace.into(),
        op: op.into(),
        device: device.into(),
    });
    table
        .by_hash
        .entry(hash)
        .or_default()
        .push(Arc::clone(&vocab));
    table.len += 1;
    vocab
}

/// The vocabularies a bulk reader (the journal's replay) met last, checked before the
/// interner: the entries of a frame mostly share a few, so most entries are interned by
/// comparing three short strings, with no hash and no lock. Holding them keeps them from a
/// sweep only while the reader lives.
#[derive(Default)]
pub struct RecentVocabs {
    recent: Vec<Arc<Vocab>>,
}

/// How many a `RecentVocabs` holds: a frame rarely mixes more ops and devices than this.
const RECENT_VOCABS: usize = 8;

impl RecentVocabs {
    /// The shared `Vocab` for these three values, as `intern` gives it.
    pub fn intern(&mut self, namespace: &str, op: &str, device: &str) -> Arc<Vocab> {
        let found = self
            .recent
            .iter()
            .position(|v| v.cmp_strs(namespace, op, device) == Ordering::Equal);
        if let Some(at) = found {
            return Arc::clone(&self.recent[at]);
        }
        let vocab = intern(namespace, op, device);
        if self.recent.len() == RECENT_VOCABS {
            self.recent.remove(0);
        }
        self.recent.push(Arc::clone(&vocab));
        vocab
    }
}

impl Interner {
    /// The interned value equal to these three, if any.
    fn find(&self, hash: u64, namespace: &str, op: &str, device: &str) -> Option<&Arc<Vocab>> {
        self.by_hash.get(&hash).and_then(|bucket| {
            bucket
                .iter()
                .find(|v| v.cmp_strs(namespace, op, device) == Ordering::Equal)
        })
    }
}

/// The interned `Vocab` of each run of consecutive keys with equal (namespace, op, device),
/// with the run's length, found under one lock of the interner (a Lookup's keys mostly share
/// a few). `None` for values never interned: every stored entry holds its interned `Vocab`
/// (a sweep drops only values no entry holds), so no entry has them.
pub(super) fn find_vocab_runs<'k>(
    keys: impl Iterator<Item = KeyView<'k>>,
) -> Vec<(Option<Arc<Vocab>>, usize)> {
    let table = crate::sync::lock(interner());
    let mut runs: Vec<(Option<Arc<Vocab>>, usize)> = Vec::new();
    let mut run_names = None;
    for key in keys {
        let names = (key.namespace, key.op, key.device);
        if let (Some((_, len)), true) = (runs.last_mut(), run_names == Some(names)) {
            *len += 1;
            continue;
        }
        let hash = table.hasher.hash_one(names);
        let vocab = table
            .find(hash, key.namespace, key.op, key.device)
            .map(Arc::clone);
        runs.push((vocab, 1));
        run_names = Some(names);
    }
    runs
}

pub(super) fn cmp_vocab(a: &Arc<Vocab>, b: &Arc<Vocab>) -> Ordering {
    if Arc::ptr_eq(a, b) {
        Ordering::Equal
    } else {
        a.cmp_strs(&b.namespace, &b.op, &b.device)
    }
}
