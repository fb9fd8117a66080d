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
    /// A Lookup by `uid` of checked `keys` in `view` (none: the cache's winners as they
    /// are), read from the current version without waiting: the hits in request order, or,
    /// in a view, what `finish_lookup` pins and answers. On a replaying daemon the bundles
    /// answer their keys, and the keys nothing answers are listed as misses. Runs on the
    /// blocking pool for a large request.
    pub fn plan_lookup<'k>(
        &self,
        uid: u32,
        view: Option<ViewId>,
        keys: impl ExactSizeIterator<Item = KeyView<'k>> + Clone,
    ) -> LookupPlan {
        let map = self.store.current();
        if !self.replay.daemon_replays() {
            return match view {
                None => {
                    let hits = map.get_many(keys);
                    // What a read finds is used (`lifecycle`).
                    self.store.touch(hits.iter().copied());
                    LookupPlan::Ready(EncodedEntries::from_entries(&hits))
                }
                Some(view) => {
                    let current = map.get_each(keys.clone());
                    self.store.touch(current.iter().flatten().copied());
                    let plan = self.plan(&view, keys.zip(current));
                    LookupPlan::InView { view, plan }
                }
            };
        }
        let current: Vec<Option<&StoredEntry>> = keys
            .clone()
            .zip(map.get_each(keys.clone()))
            .map(|(key, cached)| self.replay.bundled(&key).or(cached))
            .collect();
        self.store.touch(current.iter().flatten().copied());
        let view_name = view.as_ref().map_or("", |view| view.name.as_str());
        for (key, found) in keys.clone().zip(&current) {
            if found.is_none() {
                self.replay.missed(uid, view_name, &key.to_key());
            }
        }
        match view {
            None => {
                let hits: Vec<&StoredEntry> = current.into_iter().flatten().collect();
                LookupPlan::Ready(EncodedEntries::from_entries(&hits))
            }
            Some(view) => {
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
        let views = Arc::clone(self);
        match view {
            None if !self.replay.daemon_replays() => {
                scan::spawn(store, filter, AsStored, &self.tasks)
            }
            None => scan::spawn(store, filter, Bundled { views }, &self.tasks),
            Some(name) => scan::spawn(store, filter, ScanInView { views, name }, &self.tasks),
        }
    }

    /// A Resolve: the view's pin when it has one; else the coordinator's answer, and in a
    /// view the result that fills the miss is pinned (the first pin wins, so every waiter of
    /// the view, on every node, gets the same one). A lease carries its view (the
    /// coordinator keeps it), so the holder's Record pins what it produced (`ChangeFeed`).
    pub async fn resolve(&self, call: ResolveCall) -> Result<Resolution> {
        if call.replay || self.replay.daemon_replays() {
            return Ok(self.resolve_in_replay(call).await);
        }
        let Some(view) = call.view.clone() else {
            let key = call.key.clone();
            let resolution = self.coordinator.resolve(call).await?;
            if matches!(resolution, Resolution::Hit(_)) {
                self.touch_key(&key);
            }
            return Ok(resolution);
        };
        self.touch_key(&call.key);
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

    /// A Resolve in replay: answered at once from what is here, never a lease and never a
    /// wait. A bundled key (on a replaying daemon) answers the bundle's result; another
    /// answers the view's pin or the cache's winner (pinned in the view); nothing else is
    /// a miss, listed.
    async fn resolve_in_replay(&self, call: ResolveCall) -> Resolution {
        if let Some(bundled) = self.replay.bundled(&call.key.view()) {
            return Resolution::Hit(bundled.result().to_result());
        }
        let found = match &call.view {
            Some(view) => self.read_one(view, &call.key).await,
            None => self.store.current().get(&call.key).cloned(),
        };
        self.store.touch(found.iter());
        match found {
            Some(entry) => Resolution::Hit(entry.result().to_result()),
            None => {
                let view = call.view.as_ref().map_or("", |view| view.name.as_str());
                self.replay.missed(call.uid, view, &call.key);
                Resolution::Miss(self.replay.miss_reason().to_owned())
            }
        }
    }
}

impl Views {
    /// Marks the cache's entry of `key`, if it holds one, used (`lifecycle`).
    fn touch_key(&self, key: &crate::model::entry::CacheKey) {
        self.store.touch(self.store.current().get(key));
    }
}

/// A plain Scan's chunks on a replaying daemon: the bundles answer their keys.
struct Bundled {
    views: Arc<Views>,
}

impl ChunkReader for Bundled {
    type Planned = EncodedEntries;

    fn plan(&self, step: Step<'_>) -> EncodedEntries {
        let merged = self.views.replay.overlay_step(&step);
        let merged: Vec<&StoredEntry> = merged.iter().collect();
        EncodedEntries::from_entries(&merged)
    }

    async fn finish(&self, planned: EncodedEntries) -> EncodedEntries {
        planned
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
        // On a replaying daemon the bundles answer their keys first; the view pins what
        // they answer.
        let merged = self.views.replay.overlay_step(&step);
        let chosen: Vec<&StoredEntry> = merged.iter().collect();
        self.views.scan_plan(
            pins,
            &chosen,
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
