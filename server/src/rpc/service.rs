//! The `tunecache.v1.TuneCache` gRPC service: turns requests into calls of the parts below
//! and their answers into responses. Reads (Lookup, Scan, Resolve) go through `views`, with
//! or without a job view; Record through the coordinator, which completes leases; Forget to
//! the store. Validation happens here, before anything reaches the writer. Each RPC has one
//! door: the routes (`routes`) and the generated service's bodies call the same functions.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tunecache_proto::v1::{self, tune_cache_server::TuneCache};

use crate::artifacts::Artifacts;
use crate::coord::{Coordinator, ResolveCall, DEFAULT_LEASE, MAX_LEASE, MAX_WAIT};
use crate::error::Error;
use crate::model::entry::CacheKey;
use crate::model::names::{self, ViewId};
use crate::model::validate::{self, CheckedKey, InvalidField};
use crate::rpc::off_runtime::off_runtime_if_large;
use crate::snapshot::SnapshotHandle;
use crate::store::Store;
use crate::tuner::TunerHandle;
use crate::views::{LookupPlan, Views};
use crate::wire::encoded::EncodedEntries;
use crate::wire::lookup_request::{self, LookupKeys};
use crate::wire::record_request::{self, CheckedRecord};
use prost::bytes::Bytes;
use prost::Message;
use tokio_stream::StreamExt;

mod stats;

pub(crate) use stats::stats_metrics;
use stats::RequestCounters;

/// Everything the service is built from: the daemon's parts, each already built, and the
/// settings only the service uses. The service is built whole from it (`TuneCacheService::new`);
/// nothing is set on it afterwards.
pub struct ServiceParts {
    pub store: Store,
    pub coordinator: Arc<Coordinator>,
    pub tuner: TunerHandle,
    pub node_name: String,
    /// Every read goes through the node's job views, with or without a view.
    pub views: Arc<Views>,
    /// The node's blob store: PutArtifact, GetArtifact, StatArtifacts and the Record check.
    pub artifacts: Arc<Artifacts>,
    /// `None` without `--shared-dir`: the Snapshot RPC and the snapshot Stats fields.
    pub snapshots: Option<SnapshotHandle>,
    /// `None` without `--cluster-url`: the cluster tier's Stats fields.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// `None` without `--bundle`: the bundle tier's Stats fields.
    pub bundles: Option<Arc<crate::bundles::Bundles>>,
    /// The doors' connection limits, whose counters Stats reports.
    pub connection_limits: Arc<crate::ops::limits::ConnectionLimits>,
    /// The request limits, whose counters Stats reports.
    pub request_limits: Arc<crate::ops::request_limits::RequestLimits>,
    /// What the previous run's last publish at shutdown did (from the state directory).
    pub previous_shutdown: String,
    /// Who may run a scope Forget (`--admin-uid`, `--admin-gid`).
    pub admins: crate::ops::access::AccessPolicy,
    /// Exact-key Forgets one uid may ask per minute (`--max-exact-forgets-per-uid`).
    pub exact_forgets_per_minute: u32,
}

pub struct TuneCacheService {
    store: Store,
    coordinator: Arc<Coordinator>,
    tuner: TunerHandle,
    counters: Arc<RequestCounters>,
    node_name: String,
    started: Instant,
    snapshots: Option<SnapshotHandle>,
    connection_limits: Arc<crate::ops::limits::ConnectionLimits>,
    cluster: Option<Arc<crate::cluster::Cluster>>,
    bundles: Option<Arc<crate::bundles::Bundles>>,
    request_limits: Arc<crate::ops::request_limits::RequestLimits>,
    previous_shutdown: String,
    admins: crate::ops::access::AccessPolicy,
    /// The per-uid budget of exact-key Forgets and its log.
    exact_forgets: crate::ops::forget_budget::ExactForgets,
    /// One Forget at a time per uid (`forget_turns`).
    forget_turns: crate::ops::forget_turns::ForgetTurns,
    views: Arc<Views>,
    artifacts: Arc<Artifacts>,
}

impl TuneCacheService {
    /// The service over `parts`, complete.
    pub fn new(parts: ServiceParts) -> Self {
        let ServiceParts {
            store,
            coordinator,
            tuner,
            node_name,
            views,
            artifacts,
            snapshots,
            cluster,
            bundles,
            connection_limits,
            request_limits,
            previous_shutdown,
            admins,
            exact_forgets_per_minute,
        } = parts;
        TuneCacheService {
            store,
            coordinator,
            tuner,
            counters: Arc::default(),
            node_name,
            started: Instant::now(),
            snapshots,
            connection_limits,
            cluster,
            bundles,
            request_limits,
            previous_shutdown,
            admins,
            exact_forgets: crate::ops::forget_budget::ExactForgets::new(exact_forgets_per_minute),
            forget_turns: Default::default(),
            views,
            artifacts,
        }
    }
}

/// Scan responses, each chunk already in wire form.
pub type EncodedScanStream = Pin<Box<dyn Stream<Item = Result<EncodedEntries, Status>> + Send>>;

/// ListViews' page when the request asks for no size.
const DEFAULT_LIST_PAGE: usize = 1_000;

/// A ListViews cursor (`next`, `<uid>/<name>`) read back.
fn parse_cursor(cursor: &str) -> Result<ViewId, Status> {
    let parsed = cursor.split_once('/').and_then(|(uid, name)| {
        Some(ViewId {
            uid: uid.parse().ok()?,
            name: name.to_owned(),
        })
    });
    parsed.ok_or_else(|| {
        InvalidField::new("after", "not a cursor a ListViews response gave (`next`)").into()
    })
}

/// The view named in a request's `field`, as `uid`'s (a view belongs to the uid reading in
/// it): `None` when the request names none.
fn view_of(uid: u32, field: &str, name: &str) -> Result<Option<ViewId>, Status> {
    Ok(names::view_name(field, name)?.map(|name| ViewId { uid, name }))
}

/// A Lookup request's keys read from its bytes and planned in `uid`'s view of the name it
/// gives (none: the cache's winners): how many keys it asked for, and what
/// `Views::finish_lookup` answers. The keys are read in place where the request allows
/// (`lookup_request`).
fn plan_lookup(views: &Views, uid: u32, request: &Bytes) -> Result<(usize, LookupPlan), Status> {
    let checked = lookup_request::checked_keys(request)?;
    let view = view_of(uid, "view", &checked.view)?;
    Ok(match checked.keys {
        LookupKeys::InPlace(keys) => (
            keys.len(),
            views.plan_lookup(uid, view, keys.iter().map(CheckedKey::view)),
        ),
        LookupKeys::Decoded(keys) => (
            keys.len(),
            views.plan_lookup(uid, view, keys.iter().map(CacheKey::view)),
        ),
    })
}

impl TuneCacheService {
    /// Lookup, from the request's bytes, answered as encoded `Entry` records: each hit is the
    /// caller's own key with the stored result (in a view, the view's pin), written straight
    /// from the map, with the Lookup counters.
    pub async fn lookup(&self, uid: u32, request: Bytes) -> Result<EncodedEntries, Status> {
        let views = Arc::clone(&self.views);
        let (asked, plan) =
            off_runtime_if_large(request, move |bytes| plan_lookup(&views, uid, bytes)).await?;
        let hits = self.views.finish_lookup(plan).await;
        count(&self.counters.lookups, asked);
        count(&self.counters.hits, hits.len());
        count(&self.counters.misses, asked - hits.len());
        Ok(hits)
    }

    /// Record by `uid`, from the request's bytes.
    pub async fn record_bytes(
        &self,
        uid: u32,
        request: Bytes,
    ) -> Result<v1::RecordResponse, Status> {
        let record = off_runtime_if_large(request, record_request::checked).await?;
        self.record_checked(uid, record).await
    }

    /// Record of validated entries, through the coordinator (it completes the lease named).
    async fn record_checked(
        &self,
        uid: u32,
        record: CheckedRecord,
    ) -> Result<v1::RecordResponse, Status> {
        count(&self.counters.records, 1);
        // Every blob the batch names must be servable here before any of it is applied; the
        // entries it makes live are charged to `uid` (docs/artifacts.md, "Who is charged").
        let charges = self.artifacts.check_record(uid, &record.entries)?;
        let coordinator = Arc::clone(&self.coordinator);
        let CheckedRecord { entries, lease_id } = record;
        let outcome = charges
            .hold_while(async move { coordinator.record(entries, &lease_id).await })
            .await?;
        count(&self.counters.entries_stored, outcome.stored as usize);
        count(&self.counters.entries_unchanged, outcome.unchanged as usize);
        Ok(v1::RecordResponse {
            stored: outcome.stored,
            unchanged: outcome.unchanged,
        })
    }

    /// Scan, answered as chunks of encoded `Entry` records, each read from the version
    /// current at the time: a client that stops reading holds a chunk, not a version of the
    /// cache (see `store::scan`).
    pub fn scan_encoded(
        &self,
        uid: u32,
        request: v1::ScanRequest,
    ) -> Result<EncodedScanStream, Status> {
        let v1::ScanRequest {
            namespace,
            device,
            rank,
            view,
        } = request;
        let view = view_of(uid, "view", &view)?;
        let filter = crate::store::scan::ScanFilter {
            namespace,
            device,
            rank,
        };
        Ok(Box::pin(self.views.scan(filter, view)))
    }
}

impl TuneCacheService {
    /// PERMISSION_DENIED for an administrator's act (a scope Forget, EndView, Prune),
    /// naming it and who may.
    fn not_admin(&self, act: &'static str, instead: &'static str, uid: Option<u32>) -> Status {
        Error::NotAdmin {
            act,
            instead,
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

/// The calling uid, from the Unix socket's peer credentials; without them (never on the
/// daemon's socket, whose access check refuses such callers) a uid no user has.
pub(crate) fn caller_uid<T>(request: &Request<T>) -> u32 {
    crate::ops::access::peer_credentials(request).map_or(u32::MAX, |cred| cred.uid())
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
        // Served by `routes::WireRoutes` from the request's bytes; the bare generated server
        // takes the same door, from the same bytes.
        let uid = caller_uid(&request);
        let bytes = Bytes::from(request.into_inner().encode_to_vec());
        let encoded = self.lookup(uid, bytes).await?;
        v1::LookupResponse::decode(encoded.into_bytes())
            .map(Response::new)
            .map_err(|error| Error::from(error).into())
    }

    async fn record(
        &self,
        request: Request<v1::RecordRequest>,
    ) -> Result<Response<v1::RecordResponse>, Status> {
        // Served by `routes::WireRoutes`; the same door here.
        let uid = caller_uid(&request);
        let bytes = Bytes::from(request.into_inner().encode_to_vec());
        self.record_bytes(uid, bytes).await.map(Response::new)
    }

    type ScanStream = ScanStream;

    async fn scan(
        &self,
        request: Request<v1::ScanRequest>,
    ) -> Result<Response<Self::ScanStream>, Status> {
        // Served by `routes::WireRoutes`; the same door, its chunks decoded back.
        let uid = caller_uid(&request);
        let chunks = self.scan_encoded(uid, request.into_inner())?.map(|chunk| {
            v1::ScanResponse::decode(chunk?.into_bytes()).map_err(|error| Error::from(error).into())
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        Ok(Response::new(self.stats_now()))
    }

    async fn resolve(
        &self,
        request: Request<v1::ResolveRequest>,
    ) -> Result<Response<v1::ResolveResponse>, Status> {
        let caller_pid = caller_pid(&request);
        let uid = caller_uid(&request);
        let request = request.into_inner();
        let key = validate::key("key", request.key)?;
        let view = view_of(uid, "view", &request.view)?;
        let lease = match request.lease_ms {
            0 => DEFAULT_LEASE,
            ms => Duration::from_millis(u64::from(ms)).min(MAX_LEASE),
        };
        count(&self.counters.resolves, 1);
        let call = ResolveCall {
            key,
            wait: Duration::from_millis(u64::from(request.wait_ms)).min(MAX_WAIT),
            can_tune: request.can_tune,
            lease,
            caller_pid,
            uid,
            replay: request.replay,
            view,
        };
        Ok(Response::new(self.views.resolve(call).await?.into()))
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
        request: Request<v1::ListViewsRequest>,
    ) -> Result<Response<v1::ListViewsResponse>, Status> {
        let uid = caller_uid(&request);
        // An administrator sees every uid's views; anyone else the caller's own.
        let only = (!self.admins.allows_caller(&request).await).then_some(uid);
        let v1::ListViewsRequest { limit, after } = request.into_inner();
        let after = match after.as_str() {
            "" => None,
            cursor => Some(parse_cursor(cursor)?),
        };
        let limit = match limit {
            0 => DEFAULT_LIST_PAGE,
            n => n as usize,
        };
        let (page, more) = self.views.list(only, after.as_ref(), limit);
        let next = match (more, page.last()) {
            (true, Some(last)) => last.id.shared_name(),
            _ => String::new(),
        };
        let views = page
            .into_iter()
            .map(|view| v1::ViewInfo {
                name: view.id.name,
                pins: view.pins as u64,
                idle_ms: view.idle.as_millis() as u64,
                uid: view.id.uid,
            })
            .collect();
        Ok(Response::new(v1::ListViewsResponse { views, next }))
    }

    async fn end_view(
        &self,
        request: Request<v1::EndViewRequest>,
    ) -> Result<Response<v1::EndViewResponse>, Status> {
        let credentials = crate::ops::access::peer_credentials(&request);
        let uid = credentials.map(|c| c.uid());
        let admin = self.admins.allows_caller(&request).await;
        let name = request.into_inner().name;
        let Some(name) = names::view_name("name", &name)? else {
            return Err(InvalidField::new("name", "required (the view to end)").into());
        };
        if !admin {
            return Err(self.not_admin("EndView", "", uid));
        }
        let ended = self.views.end(&name).await;
        tracing::info!(view = %name, ?uid, ended = ?ended, "view ended by an operator (every uid's of that name)");
        Ok(Response::new(v1::EndViewResponse {
            ended: ended.is_some(),
            pins_dropped: ended.map_or(0, |(_, pins)| pins) as u64,
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
            self.counters
                .forgets_refused
                .fetch_add(1, Ordering::Relaxed);
            return Err(self.not_admin(
                "a scope Forget",
                "; a Forget of one key with only_if is open to every caller",
                uid,
            ));
        }
        // Without credentials the access check has refused the call already.
        let budget_uid = uid.unwrap_or(u32::MAX);
        if !is_scope {
            // Open to every allowed caller, so bounded per uid; logged once a minute per uid
            // (`forget_budget`), not once per key.
            self.exact_forgets.admit(budget_uid, &scope)?;
        }
        let forgotten = {
            let _turn = self.forget_turns.take(budget_uid).await;
            self.store.forget(ask).await?
        };
        if is_scope {
            // An administrator's act: logged, with who asked, once per Forget.
            tracing::warn!(%scope, ?uid, ?pid, forgotten, "Forget of a scope");
        } else {
            self.exact_forgets.forgotten(budget_uid, forgotten);
        }
        Ok(Response::new(v1::ForgetResponse { forgotten }))
    }

    async fn put_artifact(
        &self,
        request: Request<tonic::Streaming<v1::ArtifactChunk>>,
    ) -> Result<Response<v1::PutArtifactResponse>, Status> {
        let uid = caller_uid(&request);
        super::artifacts::put(&self.artifacts, uid, request.into_inner())
            .await
            .map(Response::new)
    }

    type GetArtifactStream = super::artifacts::ArtifactStream;

    async fn get_artifact(
        &self,
        request: Request<v1::GetArtifactRequest>,
    ) -> Result<Response<Self::GetArtifactStream>, Status> {
        super::artifacts::get(&self.artifacts, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn stat_artifacts(
        &self,
        request: Request<v1::StatArtifactsRequest>,
    ) -> Result<Response<v1::StatArtifactsResponse>, Status> {
        let missing = self.artifacts.missing(&request.into_inner().sha256)?;
        Ok(Response::new(v1::StatArtifactsResponse { missing }))
    }

    async fn usage(
        &self,
        request: Request<v1::UsageRequest>,
    ) -> Result<Response<v1::UsageResponse>, Status> {
        // Walks the whole cache: on the blocking pool, off the runtime's workers.
        let store = self.store.clone();
        let request = request.into_inner();
        tokio::task::spawn_blocking(move || super::lifecycle::usage_of(&store, request))
            .await
            .map_err(|e| Status::internal(format!("usage: {e}")))?
            .map(Response::new)
    }

    async fn prune(
        &self,
        request: Request<v1::PruneRequest>,
    ) -> Result<Response<v1::PruneResponse>, Status> {
        if !self.admins.allows_caller(&request).await {
            return Err(self.not_admin(
                "Prune",
                "; `tunecache du` shows what is unused",
                caller_uid(&request).into(),
            ));
        }
        super::lifecycle::prune(&self.store, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_misses(
        &self,
        request: Request<v1::ListMissesRequest>,
    ) -> Result<Response<v1::ListMissesResponse>, Status> {
        let uid = caller_uid(&request);
        // An administrator sees every uid's misses; anyone else the caller's own.
        let only = (!self.admins.allows_caller(&request).await).then_some(uid);
        let view = request.into_inner().view;
        let view = names::view_name("view", &view)?;
        let views = self
            .views
            .replay()
            .list(only, view.as_deref())
            .into_iter()
            .map(|(uid, view, misses)| v1::ViewMisses {
                view,
                uid,
                keys: misses
                    .keys
                    .into_iter()
                    .map(|(key, missed)| v1::MissedKey {
                        key: Some(key.into()),
                        count: missed.count,
                        first_unix_ms: missed.first_unix_ms,
                        last_unix_ms: missed.last_unix_ms,
                    })
                    .collect(),
                left_out: misses.left_out,
            })
            .collect();
        Ok(Response::new(v1::ListMissesResponse { views }))
    }
}
