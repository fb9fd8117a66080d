//! The reads of the cache, with or without a job view: Lookup, Scan and Resolve. Without a
//! view they answer the cache's winner (and the coordinator's, for Resolve) as they are; in
//! a view they answer its pins, and pin what they answer for the first time (`Views::pin`).

use std::sync::Arc;

use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::coord::{Resolution, ResolveCall};
use crate::error::Result;
use crate::model::entry::KeyView;
use crate::store::scan::{self, AsStored, ChunkReader, ScanFilter, Step};
use crate::wire::encoded::EncodedEntries;
use crate::wire::stored::StoredEntry;

use super::{Plan, ViewId, Views};

/// A Lookup read under one version of the cache: answered already, or a view's answers
/// still to pin (`Views::finish_lookup`).
pub enum LookupPlan {
    Ready(EncodedEntries),
    InView { view: ViewId, plan: Plan },
}

impl Views {
    /// A Lookup of checked `keys` in `view` (none: the cache's winners as they are), read
    /// from the current version without waiting: the hits in request order, or, in a view,
    /// what `finish_lookup` pins and answers. Runs on the blocking pool for a large request.
    pub fn plan_lookup<'k>(
        &self,
        view: Option<ViewId>,
        keys: impl ExactSizeIterator<Item = KeyView<'k>> + Clone,
    ) -> LookupPlan {
        let map = self.store.current();
        match view {
            None => LookupPlan::Ready(EncodedEntries::from_entries(&map.get_many(keys))),
            Some(view) => {
                let current = map.get_each(keys.clone());
                let plan = self.plan(&view, keys.zip(current));
                LookupPlan::InView { view, plan }
            }
        }
    }

    /// The Lookup's hits: a view's candidates pinned first (through the cluster tier when
    /// on, within its timeout).
    pub async fn finish_lookup(&self, plan: LookupPlan) -> EncodedEntries {
        match plan {
            LookupPlan::Ready(hits) => hits,
            LookupPlan::InView { view, plan } => {
                let settled = self.settle(&view, plan).await;
                let found: Vec<&StoredEntry> = settled.iter().flatten().collect();
                EncodedEntries::from_entries(&found)
            }
        }
    }

    /// A Scan of `filter` in `view` (none: the cache's entries as they are), as a stream of
    /// encoded chunks (`store::scan`). In a view each chunk answers the view's pins (also of
    /// keys the cache lacks) and pins the rest.
    pub fn scan(
        self: &Arc<Self>,
        filter: ScanFilter,
        view: Option<ViewId>,
    ) -> ReceiverStream<Result<EncodedEntries, Status>> {
        let store = self.store.clone();
        match view {
            None => scan::spawn(store, filter, AsStored, &self.tasks),
            Some(name) => scan::spawn(
                store,
                filter,
                ScanInView {
                    views: Arc::clone(self),
                    name,
                },
                &self.tasks,
            ),
        }
    }

    /// A Resolve: the view's pin when it has one; else the coordinator's answer, and in a
    /// view the result that fills the miss is pinned (the first pin wins, so every waiter of
    /// the view, on every node, gets the same one). A lease carries its view (the
    /// coordinator keeps it), so the holder's Record pins what it produced (`ChangeFeed`).
    pub async fn resolve(&self, call: ResolveCall) -> Result<Resolution> {
        let Some(view) = call.view.clone() else {
            return self.coordinator.resolve(call).await;
        };
        if let Some(pinned) = self.read_one(&view, &call.key).await {
            return Ok(Resolution::Hit(pinned.result().to_result()));
        }
        let key = call.key.clone();
        Ok(match self.coordinator.resolve(call).await? {
            Resolution::Hit(result) => {
                let produced = StoredEntry::new(&key, &result);
                match self.pin_produced(&view, produced).await {
                    Some(pinned) => Resolution::Hit(pinned.result().to_result()),
                    None => Resolution::Hit(result),
                }
            }
            other => other,
        })
    }
}

/// A Scan's chunks in a job view: each chunk merged with the view's pins, in key order.
struct ScanInView {
    views: Arc<Views>,
    name: ViewId,
}

impl ChunkReader for ScanInView {
    type Planned = Plan;

    fn plan(&self, step: Step<'_>) -> Plan {
        let filter = step.filter;
        let pins = self.views.pins_of(&self.name);
        self.views.scan_plan(
            pins,
            step.chosen,
            step.start,
            step.last,
            |entry| filter.in_namespace(entry),
            |entry| filter.matches(entry),
        )
    }

    async fn finish(&self, plan: Plan) -> EncodedEntries {
        let settled = self.views.settle(&self.name, plan).await;
        let chosen: Vec<&StoredEntry> = settled.iter().flatten().collect();
        EncodedEntries::from_entries(&chosen)
    }
}
