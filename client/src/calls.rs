//! The unary calls (and Scan, read to the end): each sends one request with this client's
//! deadline and view, asking again while the daemon is still opening ([`crate::opening`]).

use tunecache_proto::v1;

use crate::{opening, Client, Result, DEFAULT_SCAN_TIMEOUT};

impl Client {
    /// Looks keys up in this client's view; returns the hits only, in request order.
    pub async fn lookup(&self, keys: Vec<v1::Key>) -> Result<Vec<v1::Entry>> {
        let message = v1::LookupRequest {
            keys,
            view: self.view.clone(),
        };
        let answer = opening::call(message, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.lookup(request).await }
        });
        Ok(answer.await?.into_inner().hits)
    }

    /// Records results; the daemon keeps, per key, the best under its merge rule.
    pub async fn record(&self, entries: Vec<v1::Entry>) -> Result<v1::RecordResponse> {
        self.record_with_lease(entries, String::new()).await
    }

    /// Records results that complete the lease `Resolve` handed out.
    pub async fn record_with_lease(
        &self,
        entries: Vec<v1::Entry>,
        lease_id: String,
    ) -> Result<v1::RecordResponse> {
        let message = v1::RecordRequest { entries, lease_id };
        let answer = opening::call(message, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.record(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Every entry matching the filter (empty = everything), read chunk by chunk, in this
    /// client's view.
    pub async fn scan(&self, namespace: &str, device: &str) -> Result<Vec<v1::Entry>> {
        self.scan_with(v1::ScanRequest {
            namespace: namespace.to_owned(),
            device: device.to_owned(),
            rank: None,
            // scan_with fills in this client's view.
            view: String::new(),
        })
        .await
    }

    /// What rank `rank` loads at start: the shared entries and its own, of one namespace
    /// (and device, unless empty), in this client's view.
    pub async fn scan_for_rank(
        &self,
        namespace: &str,
        device: &str,
        rank: u32,
    ) -> Result<Vec<v1::Entry>> {
        self.scan_with(v1::ScanRequest {
            namespace: namespace.to_owned(),
            device: device.to_owned(),
            rank: Some(rank),
            // scan_with fills in this client's view.
            view: String::new(),
        })
        .await
    }

    /// Scan with any filter the contract offers, in the filter's view, or this client's when the
    /// filter names none.
    pub async fn scan_with(&self, mut filter: v1::ScanRequest) -> Result<Vec<v1::Entry>> {
        if filter.view.is_empty() {
            filter.view.clone_from(&self.view);
        }
        let answer = opening::call(filter, DEFAULT_SCAN_TIMEOUT, |request| {
            let mut inner = self.inner.clone();
            async move { inner.scan(request).await }
        });
        let mut stream = answer.await?.into_inner();
        let mut entries = Vec::new();
        while let Some(chunk) = stream.message().await? {
            entries.extend(chunk.entries);
        }
        Ok(entries)
    }

    /// The node's tuning devices; `fingerprint` is the `Key.device` the node tuner answers.
    pub async fn devices(&self) -> Result<Vec<v1::Device>> {
        let answer = opening::call(v1::DevicesRequest {}, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.devices(request).await }
        });
        Ok(answer.await?.into_inner().devices)
    }

    pub async fn stats(&self) -> Result<v1::StatsResponse> {
        let answer = opening::call(v1::StatsRequest {}, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.stats(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Publishes this node's new contributions to the shared directory now.
    pub async fn snapshot(&self) -> Result<v1::SnapshotResponse> {
        let answer = opening::call(v1::SnapshotRequest {}, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.snapshot(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Ends the lease `Resolve` handed out without a result (a Record with the lease and no
    /// entries), so the next waiter that can tune gets it at once.
    pub async fn give_up_lease(&self, lease_id: String) -> Result<v1::RecordResponse> {
        self.record_with_lease(Vec::new(), lease_id).await
    }

    /// Forgets results on every node (see `ForgetRequest`): a scope (an administrator's act),
    /// or one exact key `only_if` its winner is still the given result. Answers how many
    /// entries this node dropped.
    pub async fn forget(&self, forget: v1::ForgetRequest) -> Result<u32> {
        let answer = opening::call(forget, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.forget(request).await }
        });
        Ok(answer.await?.into_inner().forgotten)
    }

    /// The views this node holds (every uid's for an administrator, else the caller's own),
    /// in (uid, name) order, read page by page.
    pub async fn list_views(&self) -> Result<Vec<v1::ViewInfo>> {
        let mut views = Vec::new();
        let mut after = String::new();
        loop {
            let message = v1::ListViewsRequest { limit: 0, after };
            let answer = opening::call(message, self.timeout, |request| {
                let mut inner = self.inner.clone();
                async move { inner.list_views(request).await }
            });
            let page = answer.await?.into_inner();
            views.extend(page.views);
            if page.next.is_empty() {
                return Ok(views);
            }
            after = page.next;
        }
    }

    /// Ends the view `name` on this node (and, with the cluster tier, in Redis): its pins are
    /// dropped and the next read in it pins afresh. An administrator's act.
    pub async fn end_view(&self, name: &str) -> Result<v1::EndViewResponse> {
        let message = v1::EndViewRequest {
            name: name.to_owned(),
        };
        let answer = opening::call(message, self.timeout, |request| {
            let mut inner = self.inner.clone();
            async move { inner.end_view(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// What the node's cache holds, grouped `by` "namespace" (or empty), "device" or "op":
    /// entries, their bytes, the artifact bytes they name and their last-use ages, with the
    /// daemon's retention and bound (docs/lifecycle.md). The daemon walks the whole cache, so
    /// this waits as long as a Scan may.
    pub async fn usage(&self, by: &str) -> Result<v1::UsageResponse> {
        let message = v1::UsageRequest { by: by.to_owned() };
        let answer = opening::call(message, DEFAULT_SCAN_TIMEOUT, |request| {
            let mut inner = self.inner.clone();
            async move { inner.usage(request).await }
        });
        Ok(answer.await?.into_inner())
    }

    /// Expires on every node what has not been used for `prune.unused_for_days` (each key
    /// forgotten only while its result is still the one judged), or with `dry_run` lists what
    /// would be. An administrator's act: anyone else gets PERMISSION_DENIED. The daemon forgets
    /// the keys in batches, so this waits as long as a Scan may.
    pub async fn prune(&self, prune: v1::PruneRequest) -> Result<v1::PruneResponse> {
        let answer = opening::call(prune, DEFAULT_SCAN_TIMEOUT, |request| {
            let mut inner = self.inner.clone();
            async move { inner.prune(request).await }
        });
        Ok(answer.await?.into_inner())
    }
}
