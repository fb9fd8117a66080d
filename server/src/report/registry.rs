//! Stats fields declared once: each part names each of its Stats fields in one entry of a
//! `stats_registry!`, and from that entry come the counter the part adds to (a field of the
//! registry's struct), the fill of the Stats response (`FillStats`) and the field's row in the
//! Prometheus text (`StatsRegistry::metrics`, which `ops::metrics` writes). A new counter is
//! one entry in its part's registry and one field in the proto; `tests/stats_declared_once.rs`
//! counts that every Stats field is declared in exactly those two places.
//!
//! Two forms. A struct of cells, the counters kept where they are counted, each entry a field
//! read into the Stats field of its name, or of the name after `as`:
//!
//! ```text
//! stats_registry! {
//!     /// What the tier counted.
//!     #[derive(Default)]
//!     pub struct TierCounters {
//!         /// Doc comments stay with the field.
//!         pub written: AtomicU64 as snapshots_written => counter(18, "Snapshots written."),
//!         pub reason: Mutex<String> as last_snapshot_error => not_exported,
//!         /// Not a Stats field: the owner reads it into one of its values.
//!         pub startup_ms: AtomicU64 => internal,
//!     }
//! }
//! ```
//!
//! And an owner's values, what it computes rather than counts: the statements of
//! `fn fill_stats` run first (one lock for several values), then the cell structs it
//! `include`s are read, then each value:
//!
//! ```text
//! stats_registry! {
//!     /// The tier's Stats fields.
//!     impl FillStats for Tier {
//!         fn fill_stats(tier, stats) {
//!             let (entries, state) = tier.under_one_lock();
//!         }
//!         include TierCounters = tier.counters;
//!         fields {
//!             entries = entries as u64 => gauge(42, "Entries in the cache."),
//!             cluster_state = state, absent "off".to_owned() => not_exported,
//!         }
//!     }
//! }
//! ```
//!
//! After `=>`, how the field is exported: `not_exported`; or `counter`, `gauge` (unsigned,
//! saturating at `i64::MAX`), `signed_gauge` or `gauge_family` (labelled samples, which its
//! `via` reads from the whole Stats), each `(place, "help")`, where `place` is the
//! row's place in the metrics text (the text is a contract with dashboards, pinned byte for
//! byte in server/testdata/metrics.txt; a new row takes the next free place), then optionally
//! `named "metric_name"` (the Stats field's name otherwise) and `via f`, a function of the
//! field's value for a metric that is not the value itself. `absent` is a value's value when
//! its owner is not configured (`FillStats::fill_stats_absent`).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

pub use tunecache_proto::v1::StatsResponse;

/// How a metric is read from one scrape's Stats.
#[derive(Clone, Copy, Debug)]
pub enum Read {
    Counter(fn(&StatsResponse) -> u64),
    /// A gauge of an unsigned Stats field; saturates at `i64::MAX`.
    Gauge(fn(&StatsResponse) -> u64),
    /// A gauge that may be negative (a -1 "never"/"off").
    SignedGauge(fn(&StatsResponse) -> i64),
    /// A family of gauges, one per label set (e.g. per namespace), read from the whole
    /// Stats: a repeated field's elements become its samples.
    GaugeFamily(fn(&StatsResponse) -> Vec<(Labels, i64)>),
}

/// The labels of one sample of a `GaugeFamily`.
pub type Labels = Vec<(&'static str, String)>;

/// One row of the metrics text: its place in the text, the name (after the `tunecache_`
/// prefix), its HELP line and how to read it.
#[derive(Debug)]
pub struct Metric {
    pub place: u32,
    pub name: &'static str,
    pub help: &'static str,
    pub read: Read,
}

/// A registry: the metric rows of its Stats fields.
pub trait StatsRegistry {
    /// Adds this registry's rows, and those of the registries it includes, to `rows`.
    fn metrics(rows: &mut Vec<&'static Metric>);
}

/// A field of a registry's struct, read into its Stats field.
pub trait StatsCell {
    type Value;
    fn read(&self) -> Self::Value;
}

impl StatsCell for AtomicU64 {
    type Value = u64;
    fn read(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

impl StatsCell for AtomicI64 {
    type Value = i64;
    fn read(&self) -> i64 {
        self.load(Ordering::Relaxed)
    }
}

impl StatsCell for AtomicBool {
    type Value = bool;
    fn read(&self) -> bool {
        self.load(Ordering::Relaxed)
    }
}

/// A count kept under its owner's lock, read from a copy.
impl StatsCell for u64 {
    type Value = u64;
    fn read(&self) -> u64 {
        *self
    }
}

/// A text (a reason, a state) kept for Stats; a poisoned lock is taken over.
impl StatsCell for Mutex<String> {
    type Value = String;
    fn read(&self) -> String {
        self.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// A cell shared with whoever counts into it.
impl<T: StatsCell> StatsCell for Arc<T> {
    type Value = T::Value;
    fn read(&self) -> T::Value {
        (**self).read()
    }
}

/// A Stats field a counter or gauge reads as it is.
pub trait UnsignedMetric {
    fn metric_value(&self) -> u64;
}

impl UnsignedMetric for u64 {
    fn metric_value(&self) -> u64 {
        *self
    }
}

impl UnsignedMetric for u32 {
    fn metric_value(&self) -> u64 {
        u64::from(*self)
    }
}

/// 1 while true.
impl UnsignedMetric for bool {
    fn metric_value(&self) -> u64 {
        u64::from(*self)
    }
}

/// A Stats field a signed gauge reads as it is.
pub trait SignedMetric {
    fn metric_value(&self) -> i64;
}

impl SignedMetric for i64 {
    fn metric_value(&self) -> i64 {
        *self
    }
}

/// Declares Stats fields once; see the module's documentation for the two forms.
macro_rules! stats_registry {
    // A struct of cells.
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_attr:meta])*
                $field_vis:vis $field:ident : $ty:ty $(as $stat:ident)?
                    => $kind:ident $(($($args:tt)*))?
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        $vis struct $name {
            $(
                $(#[$field_attr])*
                $field_vis $field: $ty,
            )*
        }

        impl $crate::report::FillStats for $name {
            fn fill_stats(&self, stats: &mut $crate::report::registry::StatsResponse) {
                let cells = self;
                $(
                    $crate::report::registry::stats_registry!(
                        @cell stats cells $field $(as $stat)?; $kind
                    );
                )*
            }
        }

        impl $crate::report::registry::StatsRegistry for $name {
            fn metrics(rows: &mut Vec<&'static $crate::report::registry::Metric>) {
                $(
                    $crate::report::registry::stats_registry!(
                        @row rows [$field $(as $stat)?] $kind $(($($args)*))?
                    );
                )*
            }
        }
    };

    // An owner's values, and the cell structs it fills from.
    (
        $(#[$attr:meta])*
        impl FillStats for $owner:ty {
            fn fill_stats($me:ident, $stats:ident) { $($prelude:tt)* }
            $(include $sub:ty = $sub_at:expr;)*
            fields {
                $(
                    $(#[$value_attr:meta])*
                    $stat:ident = $value:expr $(, absent $absent:expr)?
                        => $kind:ident $(($($args:tt)*))?
                ),* $(,)?
            }
        }
    ) => {
        $(#[$attr])*
        impl $crate::report::FillStats for $owner {
            fn fill_stats(&self, $stats: &mut $crate::report::registry::StatsResponse) {
                let $me = self;
                $($prelude)*
                $(
                    <$sub as $crate::report::FillStats>::fill_stats(&$sub_at, $stats);
                )*
                $(
                    $stats.$stat = $value;
                )*
            }

            fn fill_stats_absent($stats: &mut $crate::report::registry::StatsResponse) {
                let _ = &$stats;
                $($(
                    $stats.$stat = $absent;
                )?)*
            }
        }

        impl $crate::report::registry::StatsRegistry for $owner {
            fn metrics(rows: &mut Vec<&'static $crate::report::registry::Metric>) {
                $(
                    <$sub as $crate::report::registry::StatsRegistry>::metrics(rows);
                )*
                $(
                    $crate::report::registry::stats_registry!(
                        @metric rows $stat $kind $(($($args)*))?
                    );
                )*
            }
        }
    };

    // A cell's fill: the field into the Stats field of its name (or the `as` name).
    (@cell $stats:ident $cells:ident $field:ident; internal) => {};
    (@cell $stats:ident $cells:ident $field:ident as $stat:ident; $kind:ident) => {
        $stats.$stat = $crate::report::registry::StatsCell::read(&$cells.$field);
    };
    (@cell $stats:ident $cells:ident $field:ident; $kind:ident) => {
        $stats.$field = $crate::report::registry::StatsCell::read(&$cells.$field);
    };

    // A cell's row, under its Stats name.
    (@row $rows:ident [$field:ident as $stat:ident] $($spec:tt)*) => {
        $crate::report::registry::stats_registry!(@metric $rows $stat $($spec)*);
    };
    (@row $rows:ident [$field:ident] $($spec:tt)*) => {
        $crate::report::registry::stats_registry!(@metric $rows $field $($spec)*);
    };

    // A field's row, if it is exported.
    (@metric $rows:ident $stat:ident not_exported) => {};
    (@metric $rows:ident $stat:ident internal) => {};
    (@metric $rows:ident $stat:ident $kind:ident (
        $place:literal, $help:literal $(, named $name:literal)? $(, via $via:expr)? $(,)?
    )) => {{
        static ROW: $crate::report::registry::Metric = $crate::report::registry::Metric {
            place: $place,
            name: $crate::report::registry::stats_registry!(@name $stat $($name)?),
            help: $help,
            read: $crate::report::registry::stats_registry!(@read $kind $stat $($via)?),
        };
        $rows.push(&ROW);
    }};

    (@name $stat:ident) => { stringify!($stat) };
    (@name $stat:ident $name:literal) => { $name };

    (@read counter $stat:ident) => {
        $crate::report::registry::Read::Counter(
            |s: &$crate::report::registry::StatsResponse| {
                $crate::report::registry::UnsignedMetric::metric_value(&s.$stat)
            },
        )
    };
    (@read counter $stat:ident $via:expr) => {
        $crate::report::registry::Read::Counter(
            |s: &$crate::report::registry::StatsResponse| ($via)(&s.$stat),
        )
    };
    (@read gauge $stat:ident) => {
        $crate::report::registry::Read::Gauge(
            |s: &$crate::report::registry::StatsResponse| {
                $crate::report::registry::UnsignedMetric::metric_value(&s.$stat)
            },
        )
    };
    (@read gauge $stat:ident $via:expr) => {
        $crate::report::registry::Read::Gauge(
            |s: &$crate::report::registry::StatsResponse| ($via)(&s.$stat),
        )
    };
    (@read signed_gauge $stat:ident) => {
        $crate::report::registry::Read::SignedGauge(
            |s: &$crate::report::registry::StatsResponse| {
                $crate::report::registry::SignedMetric::metric_value(&s.$stat)
            },
        )
    };
    (@read gauge_family $stat:ident $via:expr) => {
        $crate::report::registry::Read::GaugeFamily($via)
    };
    (@read signed_gauge $stat:ident $via:expr) => {
        $crate::report::registry::Read::SignedGauge(
            |s: &$crate::report::registry::StatsResponse| ($via)(&s.$stat),
        )
    };
}

pub(crate) use stats_registry;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::FillStats;

    stats_registry! {
        /// Cells of every kind, one not a Stats field.
        #[derive(Default)]
        struct Cells {
            lookups: AtomicU64 => counter(2, "Lookups."),
            waiting: AtomicU64 as waiters => gauge(1, "Waiters.", named "resolve_waiters"),
            journal_unwritable: Mutex<String> => signed_gauge(
                3,
                "1 while unwritable.",
                via |why: &String| i64::from(!why.is_empty())
            ),
            last_snapshot_unix_ms: Arc<AtomicI64> => not_exported,
            scratch: AtomicU64 => internal,
        }
    }

    struct Owner {
        cells: Cells,
        entries: usize,
    }

    stats_registry! {
        impl FillStats for Owner {
            fn fill_stats(owner, stats) {
                let doubled = owner.entries * 2;
            }
            include Cells = owner.cells;
            fields {
                /// A value the owner computes.
                entries = doubled as u64 => gauge(4, "Entries."),
                cluster_state = "on".to_owned(), absent "off".to_owned() => not_exported,
                records = owner.cells.scratch.read() + 1 => not_exported,
            }
        }
    }

    #[test]
    fn one_entry_declares_the_cell_its_fill_and_its_row() {
        let owner = Owner {
            cells: Cells::default(),
            entries: 4,
        };
        owner.cells.lookups.store(7, Ordering::Relaxed);
        owner.cells.waiting.store(3, Ordering::Relaxed);
        *owner.cells.journal_unwritable.lock().unwrap() = "full".to_owned();
        owner
            .cells
            .last_snapshot_unix_ms
            .store(-5, Ordering::Relaxed);
        owner.cells.scratch.store(10, Ordering::Relaxed);
        let mut stats = StatsResponse::default();
        owner.fill_stats(&mut stats);
        assert_eq!(stats.lookups, 7);
        assert_eq!(stats.waiters, 3);
        assert_eq!(stats.journal_unwritable, "full");
        assert_eq!(stats.last_snapshot_unix_ms, -5);
        assert_eq!(stats.entries, 8);
        assert_eq!(stats.cluster_state, "on");
        assert_eq!(
            stats.records, 11,
            "an internal cell is read only by its owner"
        );

        let mut absent = StatsResponse::default();
        Option::<Owner>::None.fill_stats(&mut absent);
        assert_eq!(absent.cluster_state, "off");

        let mut rows = Vec::new();
        Owner::metrics(&mut rows);
        let shown: Vec<(u32, &str)> = rows.iter().map(|row| (row.place, row.name)).collect();
        assert_eq!(
            shown,
            vec![
                (2, "lookups"),
                (1, "resolve_waiters"),
                (3, "journal_unwritable"),
                (4, "entries")
            ]
        );
        let read: Vec<i64> = rows
            .iter()
            .map(|row| match row.read {
                Read::Counter(read) | Read::Gauge(read) => read(&stats) as i64,
                Read::SignedGauge(read) => read(&stats),
                Read::GaugeFamily(read) => read(&stats).iter().map(|(_, value)| value).sum(),
            })
            .collect();
        assert_eq!(read, vec![7, 3, 1, 8]);
    }
}
