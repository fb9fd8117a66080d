//! Assembles a running daemon from a `Config` and a bound socket: opens the store, builds
//! each part from its settings (each starts its background tasks on the daemon's one
//! `Tasks`), serves TuneCache with health and reflection, and shuts down in order when told
//! to: drains calls, publishes what is new, stops every task of every part and waits until
//! each has ended, then flushes the journal. `bind` makes the socket from the `Config`;
//! tests bind their own.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;
use tonic::transport::Server;
use tunecache_proto::limits::MAX_MESSAGE_BYTES;
use tunecache_proto::v1::tune_cache_server::TuneCacheServer;

use crate::config::Config;
use crate::coord::Coordinator;
use crate::error::{Error, Result};
use crate::ops::admission::Admission;
use crate::ops::limits::ConnectionLimits;
use crate::ops::listener::SocketGuard;
use crate::rpc::service::{ServiceParts, TuneCacheService};
use crate::store::Store;
use crate::tasks::Tasks;
use crate::tiers::{Tier, Tiers, SHUTDOWN_PUBLISH_LIMIT};

/// How long in-flight calls may take to finish after a shutdown signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(7);

/// The socket the daemon serves on, and the guard that removes it (if the daemon made it)
/// when dropped.
pub struct BoundSocket {
    listener: tokio::net::UnixListener,
    guard: SocketGuard,
}

impl BoundSocket {
    /// The path of the socket.
    pub fn path(&self) -> &std::path::Path {
        self.guard.path()
    }
}

/// Binds the socket `config` names, or adopts the one systemd passed (socket activation).
/// Must run inside the tokio runtime.
pub fn bind(config: &Config) -> Result<BoundSocket> {
    let (listener, guard) =
        crate::ops::listener::listen(&config.socket_path(), config.socket_group.as_deref())?;
    Ok(BoundSocket { listener, guard })
}

/// A peer that does not answer an HTTP/2 ping within this is closed.
const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

fn log_replay(
    report: &crate::journal::ReplayReport,
    state_dir: &std::path::Path,
    took: Duration,
    tombstones: usize,
) {
    if let Some((offset, len)) = report.torn_tail {
        tracing::warn!(
            offset,
            bytes = len,
            "journal: truncated a torn tail (a write cut short by a crash)"
        );
    }
    for skipped in &report.skipped {
        tracing::warn!(
            offset = skipped.offset,
            bytes = skipped.len,
            reason = skipped.reason,
            "journal: skipped a damaged stretch in {}",
            state_dir.display()
        );
    }
    match &report.kept_copy {
        Some(Ok(kept)) => tracing::warn!("journal: the damaged file is kept as {}", kept.display()),
        Some(Err(why)) => tracing::warn!("journal: {why}; starting without it"),
        None => {}
    }
    tracing::info!(
        frames = report.frames,
        entries = report.entries,
        tombstones,
        took_ms = took.as_millis() as u64,
        "journal replayed"
    );
}

/// The HTTP/2 server with the settings of `config`.
fn server_builder(config: &Config) -> Server {
    let mut builder = Server::builder()
        .http2_keepalive_interval(config.http2_keepalive())
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        .initial_stream_window_size(config.http2_window_bytes)
        .initial_connection_window_size(config.http2_window_bytes)
        .max_frame_size(config.http2_max_frame_bytes)
        .http2_adaptive_window(Some(config.http2_adaptive_window));
    if let Some(age) = config.max_connection_age() {
        // The grace outlasts the longest Resolve wait, so no call in flight is cut.
        builder = builder
            .max_connection_age(age)
            .max_connection_age_grace(crate::coord::MAX_WAIT + HTTP2_KEEPALIVE_TIMEOUT);
    }
    builder
}

/// Reflection over TuneCache and health, for both reflection versions grpcurl may ask.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tunecache_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// Runs the daemon on `socket` until `shutdown` resolves, then drains calls, stops its
/// tasks, flushes the journal and removes the socket. Returns only once every task any part
/// started has ended, also when it fails to start.
pub async fn run(
    config: Config,
    socket: BoundSocket,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let tasks = Tasks::new();
    let served = serve(config, socket, shutdown, &tasks).await;
    // Already done on a clean stop; after a failed start, the parts started so far.
    tasks.stop_and_wait().await;
    served
}

async fn serve(
    mut config: Config,
    socket: BoundSocket,
    shutdown: impl Future<Output = ()> + Send + 'static,
    tasks: &Tasks,
) -> Result<()> {
    let nofile = crate::ops::limits::raise_nofile_limit();
    let state_dir = config.state_dir();
    // The socket is served before the state directory is touched: until the daemon is open,
    // every TuneCache call is answered UNAVAILABLE at once with what it is doing (locking the
    // state directory, then how far the replay has got: `opening`), and health says
    // NOT_SERVING, so no caller waits on a connection nobody answers.
    let progress = Arc::new(crate::journal::ReplayProgress::default());
    let (opening, door) = crate::ops::opening::closed({
        let progress = Arc::clone(&progress);
        Arc::new(move || progress.describe())
    });
    let connection_limits = Arc::new(ConnectionLimits::new(
        nofile,
        usize::try_from(config.max_connections_per_uid).unwrap_or(usize::MAX),
        config.preface_timeout(),
    ));
    let peer_check = crate::ops::access::PeerCheck::new(crate::ops::access::AccessPolicy::new(
        &config.allow_uid,
        &config.allow_gid,
    )?);
    // Every door (gRPC here, the descriptor handoff below) is admitted by these same parts.
    let admission = Admission::new(
        connection_limits.clone(),
        peer_check,
        crate::ops::idle::ActivityClock::default(),
    );
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_not_serving::<TuneCacheServer<TuneCacheService>>()
        .await;
    let BoundSocket {
        listener,
        guard: socket_guard,
    } = socket;
    let mut server = AbortOnDropHandle::new(tokio::spawn(
        server_builder(&config)
            .add_service(health_service)
            .add_service(reflection().build_v1()?)
            .add_service(reflection().build_v1alpha()?)
            // The peer check guards TuneCache only; health and reflection stay open (see
            // `access`).
            .add_service(admission.check().clone().guard(opening))
            .serve_with_incoming_shutdown(
                admission.incoming(listener),
                tasks.stop_token().cancelled_owned(),
            ),
    ));

    // Before the journal is opened: a second daemon on this state directory stops here. The
    // node's name is settled here too, once (a default one reads or makes the state
    // directory's id), before anything uses it. Both touch the disk: off the runtime.
    let (state_lock, previous_shutdown, node_name) = {
        let (dir, socket_path, config) = (
            state_dir.clone(),
            socket_guard.path().to_path_buf(),
            config.clone(),
        );
        tokio::task::spawn_blocking(move || -> Result<_> {
            let lock = crate::ops::state_lock::StateLock::acquire(&dir, &socket_path)?;
            let previous = lock.previous_shutdown();
            config.ensure_node_id()?;
            Ok((lock, previous, config.node_name()))
        })
        .await
        .map_err(|e| Error::io("locking", &state_dir, std::io::Error::other(e)))??
    };
    crate::model::names::check_node_name(&node_name).map_err(Error::InvalidNodeName)?;
    config.node_name = Some(node_name);

    let fsync = config.fsync;
    let open_dir = state_dir.clone();
    let write_queue_bytes = config.write_queue_mib * 1024 * 1024;
    let replay_started = std::time::Instant::now();
    let (store_guard, report) = {
        let progress = Arc::clone(&progress);
        tokio::task::spawn_blocking(move || {
            Store::open_reporting(&open_dir, fsync, write_queue_bytes, &progress)
        })
        .await
        .map_err(|e| Error::io("opening the store", &state_dir, std::io::Error::other(e)))??
    };
    let store = store_guard.store();
    log_replay(
        &report,
        &state_dir,
        replay_started.elapsed(),
        store.tombstones().len(),
    );
    // What no rank used within its retention expires before anything is served: a node back
    // after months serves none of what expired meanwhile (docs/lifecycle.md).
    store.set_lifecycle(config.lifecycle_settings()?);
    let expired = store.sweep().await?;
    if expired > 0 {
        tracing::info!(
            expired,
            "expired entries no rank used within their retention"
        );
    }
    // The bundles, verified whole before anything of them is served: one that fails stops
    // the start here, naming the file, the part and the reason. Every byte is read, so off
    // the runtime, while the socket answers UNAVAILABLE.
    let bundles = {
        let settings = config.bundle_settings();
        tokio::task::spawn_blocking(move || crate::bundles::Bundles::open(&settings))
            .await
            .map_err(|e| Error::io("verifying bundles", &state_dir, std::io::Error::other(e)))??
            .map(Arc::new)
    };
    let tuner = crate::tuner::start(config.tuner_settings()).await;
    // The tiers below the store, built from their settings: no connection is made and no
    // shared file touched here, so Redis being down or the shared directory hung delays
    // nothing. Each one's blob fetching side is ready for the artifact store, opened with
    // them; each tier then starts with that store.
    let cluster = config.cluster_settings()?.map(|mut settings| {
        // Stream places saved beside a journal that replay found damaged may claim more
        // than the store holds now: read every shard again instead.
        settings.places_trusted = report.skipped.is_empty();
        crate::cluster::Unstarted::new(settings)
    });
    let snapshots = config
        .snapshot_settings()?
        .map(crate::snapshot::Unstarted::new)
        .transpose()?;
    let blob_sources = bundles
        .iter()
        .map(crate::bundles::Bundles::blob_source)
        .chain(
            snapshots
                .iter()
                .map(crate::snapshot::Unstarted::blob_source),
        )
        .chain(cluster.iter().map(crate::cluster::Unstarted::blob_source))
        .collect();
    let artifact_settings = config.artifact_settings();
    let artifacts = {
        let tasks = tasks.clone();
        tokio::task::spawn_blocking(move || {
            crate::artifacts::Artifacts::open(&artifact_settings, blob_sources, &tasks)
        })
        .await
        .map_err(|e| {
            Error::io(
                "opening the artifact store",
                &state_dir,
                std::io::Error::other(e),
            )
        })??
    };
    let cluster = cluster.map(|cluster| cluster.start(store.clone(), artifacts.clone(), tasks));
    let coordinator = Coordinator::new(
        store.clone(),
        tuner.clone(),
        cluster.clone(),
        tasks,
        usize::try_from(config.max_leases_per_pid).unwrap_or(usize::MAX),
    );
    // Stored results, from any writer, wake the coordinator's waiters.
    store.add_change_listener(coordinator.clone());
    let request_limits = Arc::new(config.request_limits()?);
    request_limits.log();
    let max_request_bytes = request_limits.max_message_bytes();
    // With --replay the bundles' entries answer their keys (none without a bundle: every
    // read is still in replay).
    let replayed = config.replay.then(|| {
        bundles
            .as_ref()
            .map_or_else(Default::default, |bundles| bundles.entry_map())
    });
    let replay = crate::views::Replay::new(replayed, crate::views::misses::DEFAULT_MISS_CAPS);
    let views = crate::views::Views::new(
        config.view_settings(),
        store.clone(),
        coordinator.clone(),
        cluster.clone(),
        replay,
        tasks,
    );
    // Blobs named by any entry that reaches the cache are kept and fetched on demand.
    store.add_change_listener(artifacts.clone());
    artifacts.start_upkeep(store.clone());
    // The bundles' entries are one more source, merged by the usual rule; learned, so never
    // republished (every node has the bundle).
    if let Some(bundles) = &bundles {
        crate::bundles::merge_into(bundles, &store).await?;
    }
    store.set_forget_retention(Duration::from_secs(
        u64::from(config.forget_retention_days) * 24 * 3600,
    ));
    // Snapshots: the handle does no filesystem I/O here, so a hung shared directory cannot
    // delay serving; at shutdown its task ends with every other, never waiting on the I/O
    // thread.
    let snapshots = snapshots
        .map(|snapshots| snapshots.start(store.clone(), artifacts.clone(), tasks))
        .transpose()?;
    // Marked uses journalled and told to the tiers, and the sweeps after the first: started
    // once every tier listens, so each hears of every use and expiry.
    crate::store::lifecycle::start_upkeep(store.clone(), tasks);
    // Every tier, in `tiers::TIER_ORDER`: what the daemon asks of each goes through this list.
    let tiers = Tiers::new(
        snapshots
            .iter()
            .map(|snapshots| Arc::new(snapshots.clone()) as Arc<dyn Tier>)
            .chain(
                bundles
                    .iter()
                    .map(|bundles| bundles.clone() as Arc<dyn Tier>),
            )
            .chain(
                cluster
                    .iter()
                    .map(|cluster| cluster.clone() as Arc<dyn Tier>),
            ),
    );
    let service = TuneCacheService::new(ServiceParts {
        store: store.clone(),
        coordinator,
        tuner: tuner.clone(),
        node_name: config.node_name(),
        views,
        artifacts: artifacts.clone(),
        snapshots: snapshots.clone(),
        cluster: cluster.clone(),
        bundles,
        connection_limits: connection_limits.clone(),
        request_limits: request_limits.clone(),
        previous_shutdown,
        admins: crate::ops::access::AccessPolicy::new(&config.admin_uid, &config.admin_gid)?,
        exact_forgets_per_minute: config.max_exact_forgets_per_uid,
    });
    let service = Arc::new(service);
    // Open: every call from now on reaches the service. The idle time counts from here, not
    // from before the replay.
    let activity = admission.activity().clone();
    activity.touch();
    // Admitted calls pass the request limits as their messages are read (`request_limits`);
    // tonic's own decoding limit, the same, stays as a backstop.
    door.open(crate::ops::idle::Touching::new(
        crate::ops::request_limits::Limited::new(
            crate::rpc::routes::WireRoutes::new(
                TuneCacheServer::from_arc(Arc::clone(&service))
                    .max_decoding_message_size(max_request_bytes)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
                Arc::clone(&service),
                max_request_bytes,
                MAX_MESSAGE_BYTES,
            ),
            request_limits,
        ),
        activity.clone(),
    ));
    health_reporter
        .set_serving::<TuneCacheServer<TuneCacheService>>()
        .await;
    tiers.report_health(&health_reporter, tasks);
    // --- Deployment: access check, idle timer, metrics, systemd. ---
    let probe = {
        let service = Arc::clone(&service);
        crate::report::StatsProbe::new(move || service.stats_now())
    };
    if let Some(metrics_addr) = &config.metrics_addr {
        let metrics_listener = crate::ops::metrics::bind(metrics_addr).await?;
        tasks.spawn(crate::ops::metrics::serve(
            metrics_listener,
            probe.clone(),
            crate::rpc::service::stats_metrics(),
            tasks.clone(),
        ));
    }
    let idle_exit = crate::ops::idle::exit_when_idle(
        config.exit_when_idle(),
        activity.clone(),
        probe.clone(),
        config
            .job_markers
            .clone()
            .map(crate::ops::jobs_here::JobMarkers::new),
    );
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = idle_exit => {}
        }
    };
    // Ranks on this node may take a held blob as a descriptor instead of a stream. A daemon
    // that cannot bind that socket serves without it: clients then use GetArtifact.
    let _handoff_guard = start_handoff(socket_guard.path(), &artifacts, &admission, tasks);
    // --- end deployment block ---

    tracing::info!(
        socket = %socket_guard.path().display(),
        state_dir = %state_dir.display(),
        entries = store.len(),
        "tunecached serving"
    );

    // The listener is bound and the server task accepting: tell systemd (no-op elsewhere).
    crate::ops::systemd::notify_ready(&probe).await;
    tasks.spawn(crate::ops::systemd::report_status(
        probe,
        tasks.stop_token(),
    ));
    tokio::select! {
        result = &mut server => {
            tasks.stop();
            result.map_err(|e| Error::io("serving", socket_guard.path(), std::io::Error::other(e)))??;
        }
        () = shutdown => {
            tracing::info!("shutting down: draining in-flight calls");
            crate::ops::systemd::notify_stopping();
            tasks.stop();
            match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
                Ok(result) => {
                    result.map_err(|e| Error::io("serving", socket_guard.path(), std::io::Error::other(e)))??;
                }
                Err(_) => {
                    tracing::warn!("calls still in flight after {DRAIN_TIMEOUT:?}; closing anyway");
                    server.abort();
                }
            }
        }
    }
    // What this node has not published yet goes out now, within a short bound, so a job's
    // results reach the other nodes when it ends, not when the next job starts here.
    let outcome = tiers.publish_at_shutdown(SHUTDOWN_PUBLISH_LIMIT).await;
    tracing::info!(outcome = %outcome, "last publish at shutdown");
    let state_lock = tokio::task::spawn_blocking(move || {
        state_lock.record_shutdown(&outcome);
        state_lock
    })
    .await
    .ok();
    tuner.shutdown().await;
    // Every part's tasks (the last publish above may have started some: a lease release).
    tasks.stop_and_wait().await;
    drop(tiers);
    drop(snapshots);
    drop(store);
    // Flushing the journal may block on the disk; keep it off the runtime's workers.
    let _ = tokio::task::spawn_blocking(move || store_guard.shutdown()).await;
    drop(socket_guard);
    tracing::info!("tunecached stopped");
    drop(state_lock);
    Ok(())
}

/// Binds the descriptor handoff's socket beside `socket` and serves it on `tasks`; `None`
/// (logged) when it cannot be bound.
fn start_handoff(
    socket: &std::path::Path,
    artifacts: &Arc<crate::artifacts::Artifacts>,
    admission: &Admission,
    tasks: &Tasks,
) -> Option<crate::ops::listener::SocketGuard> {
    let path = tunecache_proto::handoff::socket_path(socket);
    match crate::ops::listener::bind_beside(socket, &path) {
        Ok((listener, guard)) => {
            tasks.spawn(crate::handoff::serve(
                artifacts.clone(),
                listener,
                admission.clone(),
                tasks.clone(),
            ));
            tracing::info!(socket = %path.display(), "serving the artifact descriptor handoff");
            Some(guard)
        }
        Err(error) => {
            tracing::warn!(
                %error,
                "no artifact descriptor handoff: ranks on this node stream blobs by GetArtifact"
            );
            None
        }
    }
}
