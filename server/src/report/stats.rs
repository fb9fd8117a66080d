//! Who fills the Stats response: each owner of a counter or gauge fills its own fields, and the
//! Stats handler asks every owner in turn. The fills are written by each part's
//! `stats_registry!` (`registry`): a new counter is a proto field and one entry there.

use std::sync::Arc;

use tunecache_proto::v1::StatsResponse;

/// An owner of Stats fields.
pub trait FillStats {
    /// Writes this owner's fields into `stats`. Cheap: no I/O, short locks only.
    fn fill_stats(&self, stats: &mut StatsResponse);

    /// The owner's fields when it is not configured; left at their defaults unless the owner
    /// says otherwise (the cluster tier reports "off").
    fn fill_stats_absent(_stats: &mut StatsResponse)
    where
        Self: Sized,
    {
    }
}

impl<T: FillStats> FillStats for Option<T> {
    fn fill_stats(&self, stats: &mut StatsResponse) {
        match self {
            Some(owner) => owner.fill_stats(stats),
            None => T::fill_stats_absent(stats),
        }
    }
}

impl<T: FillStats> FillStats for Arc<T> {
    fn fill_stats(&self, stats: &mut StatsResponse) {
        (**self).fill_stats(stats);
    }

    fn fill_stats_absent(stats: &mut StatsResponse) {
        T::fill_stats_absent(stats);
    }
}
