//! Comparing two sets of entries (two bundles, or a bundle and what a daemon serves): the keys
//! only one side has, and the keys whose results differ in what a rank would use (config,
//! time_us, artifacts). Who tuned a result and when are not compared: the same result
//! re-recorded elsewhere is no change.

use crate::format::key_order;
use crate::Entry;

/// A key both sides hold with different results.
#[derive(Debug, Clone, PartialEq)]
pub struct Changed {
    pub a: Entry,
    pub b: Entry,
    /// Of `"config"`, `"time_us"`, `"artifacts"`, in that order.
    pub fields: Vec<&'static str>,
}

/// What [`diff`] found, each list in key order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Diff {
    pub only_in_a: Vec<Entry>,
    pub only_in_b: Vec<Entry>,
    pub different: Vec<Changed>,
}

impl Diff {
    /// Whether the two sides hold the same results.
    pub fn is_empty(&self) -> bool {
        self.only_in_a.is_empty() && self.only_in_b.is_empty() && self.different.is_empty()
    }
}

fn compare(a: &Entry, b: &Entry) -> std::cmp::Ordering {
    match (&a.key, &b.key) {
        (Some(a), Some(b)) => key_order(a, b),
        (a, b) => a.is_some().cmp(&b.is_some()),
    }
}

/// The fields of the results of `a` and `b` that differ.
fn changed_fields(a: &Entry, b: &Entry) -> Vec<&'static str> {
    let (Some(a), Some(b)) = (&a.result, &b.result) else {
        return if a.result == b.result {
            Vec::new()
        } else {
            vec!["config", "time_us", "artifacts"]
        };
    };
    let mut fields = Vec::new();
    if a.config != b.config {
        fields.push("config");
    }
    // Bit for bit: a time that prints the same but is another double is another result.
    if a.time_us.to_bits() != b.time_us.to_bits() {
        fields.push("time_us");
    }
    if a.artifacts != b.artifacts {
        fields.push("artifacts");
    }
    fields
}

/// Compares the entries of `a` and `b` by key.
pub fn diff(mut a: Vec<Entry>, mut b: Vec<Entry>) -> Diff {
    a.sort_by(compare);
    b.sort_by(compare);
    let mut found = Diff::default();
    let mut b = b.into_iter().peekable();
    for entry_a in a {
        while let Some(entry_b) = b.next_if(|entry_b| compare(entry_b, &entry_a).is_lt()) {
            found.only_in_b.push(entry_b);
        }
        match b.next_if(|entry_b| compare(entry_b, &entry_a).is_eq()) {
            Some(entry_b) => {
                let fields = changed_fields(&entry_a, &entry_b);
                if !fields.is_empty() {
                    found.different.push(Changed {
                        a: entry_a,
                        b: entry_b,
                        fields,
                    });
                }
            }
            None => found.only_in_a.push(entry_a),
        }
    }
    found.only_in_b.extend(b);
    found
}
