//! The `tunecache.v1.TuneCache` gRPC service: turns requests into store calls and store
//! state into responses. Validation happens here, before anything reaches the writer.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tunecache_proto::v1::{self, tune_cache_server::TuneCache};

use crate::coord::{Coordinator, Resolution, ResolveCall, DEFAULT_LEASE, MAX_LEASE, MAX_WAIT};
use crate::error::Error;
use crate::model::entry::{CacheKey, KeyView};
use crate::model::validate::{self, CheckedKey};
use crate::rpc::stats::FillStats;
use crate::snapshot::SnapshotHandle;
use crate::store::scan::InView;
use crate::store::Store;
use crate::tuner::TunerHandle;
use crate::views::{self, Plan, Views};
use crate::wire::encoded::EncodedEntries;
use crate::wire::lookup_request::{self, LookupKeys};
use crate::wire::record_request::CheckedRecord;
use crate::wire::stored::StoredEntry;
use prost::bytes::Bytes;
use prost::Message;
use tokio_stream::StreamExt;

/// Request counters reported by Stats.
#[derive(Default)]
pub struct RequestCounters {
    pub lookups: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub records: AtomicU64,
    pub entries_stored: AtomicU64,
    pub entries_unchanged: AtomicU64,
}

impl FillStats for RequestCounters {
    fn fill_stats(&self, stats: &mut v1::StatsResponse) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        stats.lookups = load(&self.lookups);
        stats.hits = load(&self.hits);
        stats.misses = load(&self.misses);
        stats.records = load(&self.records);
        stats.entries_stored = load(&self.entries_stored);
        stats.entries_unchanged = load(&self.entries_unchanged);
    }
}

pub struct TuneCacheService {
    store: Store,
    coordinator: Arc<Coordinator>,
    tuner: TunerHandle,
    counters: Arc<RequestCounters>,
    node_name: String,
    started: Instant,
    /// `None` without `--shared-dir`.
    snapshots: Option<SnapshotHandle>,
    /// Connection limits and their counters, for Stats; `None` until the daemon sets them.
    connection_limits: Option<Arc<crate::ops::limits::ConnectionLimits>>,
    /// `None` without `--cluster-url`.
    cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Request limits and their counters, for Stats; `None` until the daemon sets them.
    request_limits: Option<Arc<crate::ops::request_limits::RequestLimits>>,
    /// What the previous run's last publish at shutdown did (from the state directory).
    previous_shutdown: String,
    /// Who may run a scope Forget (`--admin-uid`, `--admin-gid`).
    admins: crate::ops::access::AccessPolicy,
    forgets_refused: AtomicU64,
    /// The node's job views: what a read with a view answers.
    views: Arc<Views>,
}

/// A Lookup read from its request: answered already, or a view's answers still to pin.
pub enum LookupAnswer {
    Ready(EncodedEntries),
    InView { view: String, plan: Plan },
}

impl TuneCacheService {
    pub fn new(
        store: Store,
        coordinator: Arc<Coordinator>,
        tuner: TunerHandle,
        node_name: String,
        views: Arc<Views>,
    ) -> Self {
        TuneCacheService {
            views,
            store,
            coordinator,
            tuner,
            counters: Arc::default(),
            node_name,
            started: Instant::now(),
            snapshots: None,
            connection_limits: None,
            cluster: None,
            request_limits: None,
            previous_shutdown: String::new(),
            admins: crate::ops::access::AccessPolicy::owner_and_root(),
            forgets_refused: AtomicU64::new(0),
        }
    }

    /// Who may run a scope Forget.
    pub fn with_admins(mut self, admins: crate::ops::access::AccessPolicy) -> Self {
        self.admins = admins;
        self
    }

    /// Reports what the previous run's last publish at shutdown did.
    pub fn with_previous_shutdown(mut self, outcome: String) -> Self {
        self.previous_shutdown = outcome;
        self
    }

    /// Reports the cluster tier's state in Stats.
    pub fn with_cluster(mut self, cluster: Arc<crate::cluster::Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Reports the connection limits and their counters in Stats.
    pub fn with_connection_limits(
        mut self,
        limits: Arc<crate::ops::limits::ConnectionLimits>,
    ) -> Self {
        self.connection_limits = Some(limits);
        self
    }

    /// Reports the request limits and their counters in Stats.
    pub fn with_request_limits(
        mut self,
        limits: Arc<crate::ops::request_limits::RequestLimits>,
    ) -> Self {
        self.request_limits = Some(limits);
        self
    }

    /// Serves the Snapshot RPC and the snapshot Stats fields from `snapshots`.
    pub fn with_snapshots(mut self, snapshots: SnapshotHandle) -> Self {
        self.snapshots = Some(snapshots);
        self
    }
}

/// Scan responses, each chunk already in wire form.
pub type EncodedScanStream = Pin<Box<dyn Stream<Item = Result<EncodedEntries, Status>> + Send>>;

impl TuneCacheService {
    /// Lookup from the request's bytes (the Lookup route), answered as encoded `Entry`
    /// records: each hit is the caller's own key with the stored result, written straight
    /// from the map. The keys are read in place where the request allows (`lookup_request`).
    /// In a view, the keys' answers are planned here and pinned by `finish_lookup`.
    pub fn lookup_bytes(&self, request: &Bytes) -> Result<LookupAnswer, Status> {
        let checked = lookup_request::checked_keys(request)?;
        let view = views::checked_name("view", &checked.view)?;
        Ok(match (checked.keys, view) {
            (LookupKeys::InPlace(keys), None) => {
                LookupAnswer::Ready(self.lookup_views(keys.iter().map(CheckedKey::view)))
            }
            (LookupKeys::Decoded(keys), None) => {
                LookupAnswer::Ready(self.lookup_views(keys.iter().map(CacheKey::view)))
            }
            (LookupKeys::InPlace(keys), Some(view)) => {
                self.plan_in_view(view, keys.iter().map(CheckedKey::view))
            }
            (LookupKeys::Decoded(keys), Some(view)) => {
                self.plan_in_view(view, keys.iter().map(CacheKey::view))
            }
        })
    }

    /// Lookup of a decoded request (the bare generated server), answered as `lookup_bytes`.
    pub async fn lookup_encoded(
        &self,
        request: Request<v1::LookupRequest>,
    ) -> Result<EncodedEntries, Status> {
        let request = request.into_inner();
        let view = views::checked_name("view", &request.view)?;
        let keys = validate::keys(request.keys)?;
        let answer = match view {
            None => LookupAnswer::Ready(self.lookup_views(keys.iter().map(CacheKey::view))),
            Some(view) => self.plan_in_view(view, keys.iter().map(CacheKey::view)),
        };
        Ok(self.finish_lookup(answer).await)
    }

    /// A Lookup in `view`: each key's pin, or the cache's winner as the candidate to pin.
    fn plan_in_view<'k>(
        &self,
        view: String,
        keys: impl ExactSizeIterator<Item = KeyView<'k>> + Clone,
    ) -> LookupAnswer {
        let map = self.store.current();
        let current = map.get_each(keys.clone());
        let plan = self.views.plan(&view, keys.zip(current));
        LookupAnswer::InView { view, plan }
    }

    /// The Lookup's hits: a view's candidates pinned first (through the cluster tier when
    /// on, within its timeout), with the Lookup counters.
    pub async fn finish_lookup(&self, answer: LookupAnswer) -> EncodedEntries {
        match answer {
            LookupAnswer::Ready(hits) => hits,
            LookupAnswer::InView { view, plan } => {
                let asked = plan.len();
                let settled = self.views.settle(&view, plan).await;
                let found: Vec<&StoredEntry> = settled.iter().flatten().collect();
                let hits = EncodedEntries::from_entries(&found);
                count(&self.counters.lookups, asked);
                count(&self.counters.hits, hits.len());
                count(&self.counters.misses, asked - hits.len());
                hits
            }
        }
    }

    /// The hits of validated keys, in request order, with the Lookup counters.
    fn lookup_views<'k>(
        &self,
        keys: impl ExactSizeIterator<Item = KeyView<'k>> + Clone,
    ) -> EncodedEntries {
        let asked = keys.len();
        let map = self.store.current();
        let hits = EncodedEntries::from_entries(&map.get_many(keys));
        count(&self.counters.lookups, asked);
        count(&self.counters.hits, hits.len());
        count(&self.counters.misses, asked - hits.len());
        hits
    }

    /// Record of validated entries (the Record route decodes and checks them).
    pub async fn record_checked(
        &self,
        record: CheckedRecord,
    ) -> Result<v1::RecordResponse, Status> {
        count(&self.counters.records, 1);
        let outcome = self
            .coordinator
            .record(record.entries, &record.lease_id)
            .await?;
        count(&self.counters.entries_stored, outcome.stored as usize);
        count(&self.counters.entries_unchanged, outcome.unchanged as usize);
        if !record.lease_id.is_empty() {
            // A lease granted in a view: what its Record produced is that view's pin. In the
            // background: the Record's reply never waits for Redis.
            let views = Arc::clone(&self.views);
            let lease_id = record.lease_id;
            tokio::spawn(async move { views.lease_recorded(&lease_id).await });
        }
        Ok(v1::RecordResponse {
            stored: outcome.stored,
            unchanged: outcome.unchanged,
        })
    }

    /// Scan, answered as chunks of encoded `Entry` records.
    pub fn scan_encoded(
        &self,
        request: Request<v1::ScanRequest>,
    ) -> Result<EncodedScanStream, Status> {
        let v1::ScanRequest {
            namespace,
            device,
            rank,
            view,
        } = request.into_inner();
        let view = views::checked_name("view", &view)?.map(|name| InView {
            views: Arc::clone(&self.views),
            name,
        });
        // In chunks, each from the version current at the time: a client that stops reading
        // holds a chunk, not a version of the cache (see `scan`).
        let filter = crate::store::scan::ScanFilter {
            namespace,
            device,
            rank,
        };
        Ok(Box::pin(crate::store::scan::spawn(
            self.store.clone(),
            filter,
            view,
        )))
    }
}

impl TuneCacheService {
    /// PERMISSION_DENIED for an administrator's act (a scope Forget, EndView), naming who
    /// may.
    fn not_admin(&self, uid: Option<u32>) -> Status {
        Error::NotAdmin {
            uid: uid.map_or_else(|| "unknown".to_owned(), |uid| uid.to_string()),
            admins: self.admins.uid_list(),
        }
        .into()
    }
}

/// The calling process, from the Unix socket's peer credentials.
fn caller_pid<T>(request: &Request<T>) -> Option<i32> {
    crate::ops::access::peer_credentials(request).and_then(|cred| cred.pid())
}

fn count(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

type ScanStream = Pin<Box<dyn Stream<Item = Result<v1::ScanResponse, Status>> + Send>>;

#[tonic::async_trait]
impl TuneCache for TuneCacheService {
    async fn lookup(
        &self,
        request: Request<v1::LookupRequest>,
    ) -> Result<Response<v1::LookupResponse>, Status> {
        // Served by `wire::WireRoutes`; the bare generated server decodes the same bytes back.
        let encoded = self.lookup_encoded(request).await?;
        v1::LookupResponse::decode(encoded.into_bytes())
            .map(Response::new)
            .map_err(|error| Error::from(error).into())
    }

    async fn record(
        &self,
        request: Request<v1::RecordRequest>,
    ) -> Result<Response<v1::RecordResponse>, Status> {
        // Served by `wire::WireRoutes` from the request's bytes; the same checks here.
        let request = request.into_inner();
        let record = CheckedRecord {
            entries: validate::entries(request.entries)?,
            lease_id: request.lease_id,
        };
        self.record_checked(record).await.map(Response::new)
    }

    type ScanStream = ScanStream;

    async fn scan(
        &self,
        request: Request<v1::ScanRequest>,
    ) -> Result<Response<Self::ScanStream>, Status> {
        // Served by `wire::WireRoutes`; the bare generated server decodes the same bytes back.
        let chunks = self.scan_encoded(request)?.map(|chunk| {
            v1::ScanResponse::decode(chunk?.into_bytes()).map_err(|error| Error::from(error).into())
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let mut stats = v1::StatsResponse {
            node_name: self.node_name.clone(),
            previous_shutdown_publish: self.previous_shutdown.clone(),
            daemon_pid: std::process::id(),
            daemon_uid: nix::unistd::geteuid().as_raw(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            ..Default::default()
        };
        let owners: [&dyn FillStats; 8] = [
            &self.counters,
            &self.store,
            &self.coordinator,
            &self.tuner,
            &self.connection_limits,
            &self.request_limits,
            &self.snapshots,
            &self.cluster,
        ];
        self.views.fill_stats(&mut stats);
        for owner in owners {
            owner.fill_stats(&mut stats);
        }
        stats.forgets_refused = self.forgets_refused.load(Ordering::Relaxed);
        Ok(Response::new(stats))
    }

    async fn resolve(
        &self,
        request: Request<v1::ResolveRequest>,
    ) -> Result<Response<v1::ResolveResponse>, Status> {
        let caller_pid = caller_pid(&request);
        let request = request.into_inner();
        let key = validate::key("key", request.key)?;
        let view = views::checked_name("view", &request.view)?;
        if let Some(view) = &view {
            if let Some(pinned) = self.views.read_one(view, &key).await {
                return Ok(Response::new(
                    Resolution::Hit(pinned.result().to_result()).into(),
                ));
            }
        }
        let lease = match request.lease_ms {
            0 => DEFAULT_LEASE,
            ms => Duration::from_millis(u64::from(ms)).min(MAX_LEASE),
        };
        let call = ResolveCall {
            key,
            wait: Duration::from_millis(u64::from(request.wait_ms)).min(MAX_WAIT),
            can_tune: request.can_tune,
            lease,
            caller_pid,
        };
        let key = call.key.clone();
        let resolution = self.coordinator.resolve(call).await?;
        let Some(view) = view else {
            return Ok(Response::new(resolution.into()));
        };
        // In a view, the result that fills the miss is pinned (the first pin wins, so every
        // waiter of the view, on every node, gets the same one); a lease's result is pinned
        // by its holder's Record.
        let resolution = match resolution {
            Resolution::Hit(result) => {
                let produced = StoredEntry::new(&key, &result);
                match self.views.pin_produced(&view, produced).await {
                    Some(pinned) => Resolution::Hit(pinned.result().to_result()),
                    None => Resolution::Hit(result),
                }
            }
            Resolution::TuneHere {
                lease_id,
                expires_in,
            } => {
                self.views.lease_granted(&lease_id, &view, &key);
                Resolution::TuneHere {
                    lease_id,
                    expires_in,
                }
            }
            miss @ Resolution::Miss(_) => miss,
        };
        Ok(Response::new(resolution.into()))
    }

    async fn snapshot(
        &self,
        _request: Request<v1::SnapshotRequest>,
    ) -> Result<Response<v1::SnapshotResponse>, Status> {
        let snapshots = self.snapshots.as_ref().ok_or(Error::NoSharedDir)?;
        Ok(Response::new(snapshots.snapshot_now().await?))
    }

    async fn devices(
        &self,
        _request: Request<v1::DevicesRequest>,
    ) -> Result<Response<v1::DevicesResponse>, Status> {
        Ok(Response::new(v1::DevicesResponse {
            devices: self.tuner.devices(),
        }))
    }

    async fn list_views(
        &self,
        _request: Request<v1::ListViewsRequest>,
    ) -> Result<Response<v1::ListViewsResponse>, Status> {
        let views = self
            .views
            .list()
            .into_iter()
            .map(|view| v1::ViewInfo {
                name: view.name,
                pins: view.pins as u64,
                idle_ms: view.idle.as_millis() as u64,
            })
            .collect();
        Ok(Response::new(v1::ListViewsResponse { views }))
    }

    async fn end_view(
        &self,
        request: Request<v1::EndViewRequest>,
    ) -> Result<Response<v1::EndViewResponse>, Status> {
        let credentials = crate::ops::access::peer_credentials(&request);
        let uid = credentials.map(|c| c.uid());
        let admin = self.admins.allows_caller(&request).await;
        let name = request.into_inner().name;
        let Some(name) = views::checked_name("name", &name)? else {
            return Err(Status::invalid_argument("name: required (the view to end)"));
        };
        if !admin {
            return Err(self.not_admin(uid));
        }
        let ended = self.views.end(&name).await;
        tracing::info!(view = %name, ?uid, pins = ?ended, "view ended by an operator");
        Ok(Response::new(v1::EndViewResponse {
            ended: ended.is_some(),
            pins_dropped: ended.unwrap_or(0) as u64,
        }))
    }

    async fn forget(
        &self,
        request: Request<v1::ForgetRequest>,
    ) -> Result<Response<v1::ForgetResponse>, Status> {
        let credentials = crate::ops::access::peer_credentials(&request);
        let uid = credentials.map(|c| c.uid());
        let pid = credentials.and_then(|c| c.pid());
        let admin = self.admins.allows_caller(&request).await;
        let ask = validate::forget(request.into_inner())?;
        let scope = ask.scope.to_string();
        let is_scope = ask.only_if.is_none();
        if is_scope && !admin {
            self.forgets_refused.fetch_add(1, Ordering::Relaxed);
            return Err(self.not_admin(uid));
        }
        let forgotten = self.store.forget(ask).await?;
        if is_scope {
            // An administrator's act: logged, with who asked, once per Forget.
            tracing::warn!(%scope, ?uid, ?pid, forgotten, "Forget of a scope");
        } else if forgotten > 0 {
            tracing::info!(%scope, ?uid, ?pid, "Forget of one key: its winner was reported broken");
        }
        Ok(Response::new(v1::ForgetResponse { forgotten }))
    }
}
