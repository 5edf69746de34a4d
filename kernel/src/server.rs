//! Assembles the kernel: store, hub, registry, scheduler and gRPC services; recovers what was in
//! flight when the kernel last stopped; serves until shutdown, then drains within a bound.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kernel_proto::v1::admin_service_server::AdminServiceServer;
use kernel_proto::v1::approval_service_server::ApprovalServiceServer;
use kernel_proto::v1::hosted_service_server::HostedServiceServer;
use kernel_proto::v1::registry_service_server::RegistryServiceServer;
use kernel_proto::v1::run_service_server::RunServiceServer;
use kernel_proto::v1::tool_call_service_server::ToolCallServiceServer;
use kernel_proto::v1::worker_service_server::WorkerServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tracing::{info, warn};

use crate::auth::{Guarded, Keys};
use crate::config::Config;
use crate::error::KernelError;
use crate::governance::Governance;
use crate::grpc::{AdminApi, ApprovalApi, HostedApi, Kernel, RegistryApi, RunApi, ToolCallApi, WorkerApi};
use crate::hub::Hub;
use crate::lifecycle::Lifecycle;
use crate::model::{StepRecord, StepStatus};
use crate::registry::Registry;
use crate::scheduler::Scheduler;
use crate::store::{Database, DbLock, LeaseLoss, LossOutcome, Store};

/// Finds what was pending or leased when the kernel last stopped, returning the calls to queue
/// again. Connection state did not survive the restart, so every lease is gone: a started
/// `safe_to_retry` call is queued again, a started `at_most_once` call becomes indeterminate.
/// It runs before the scheduler starts, so the scheduler's in-flight scan never races it.
/// Among replicas (`replicated`) only the waiting calls are queued: a lease is lost by the owner of
/// its run's shard, once the heartbeat finds its replica dead (or gone without a row), and this
/// replica owns no shard yet.
async fn recover(store: &Store, replicated: bool) -> Result<Vec<StepRecord>, KernelError> {
    let steps = store.reads.in_flight_steps().await?;
    let steps = steps
        .into_iter()
        .filter(|step| !replicated || step.status == StepStatus::Pending);
    let mut queue = Vec::new();
    let mut indeterminate = 0;
    let mut losses = Vec::new();
    for step in steps {
        match step.status {
            StepStatus::Pending => queue.push(step),
            // A running step names its dispatch; one that does not is held by none to lose.
            StepStatus::Running => losses.extend(step.dispatch_id.clone().map(|dispatch_id| {
                store.lose_lease(LeaseLoss {
                    dispatch_id,
                    attempt: step.attempts,
                    reason: "kernel restarted".into(),
                })
            })),
            _ => {}
        }
    }
    // All at once, so the writer folds them into a few transactions instead of one each.
    for outcome in futures_util::future::join_all(losses).await {
        match outcome? {
            LossOutcome::Requeued(step) => queue.push(step),
            LossOutcome::Indeterminate(_) => indeterminate += 1,
            LossOutcome::NotHeld => {}
        }
    }
    if !queue.is_empty() || indeterminate > 0 {
        info!(
            requeued = queue.len(),
            indeterminate, "recovered calls in flight at the last stop"
        );
    }
    Ok(queue)
}

/// Serves until the kernel drains, lets the calls running on workers finish within `drain`
/// (none when a task failed), then shuts down and gives open streams [`STREAMS_GRACE`] to end. The router (and with it every service's handle on the store)
/// is dropped on return.
async fn serve(
    router: tonic::transport::server::Router,
    listener: TcpListener,
    stopping: Stopping,
    drain: Duration,
) -> Result<(), KernelError> {
    let Stopping {
        lifecycle,
        scheduler,
        health,
    } = stopping;
    let shutdown = lifecycle.shutdown().clone();
    let server =
        // Nagle would hold every small response for the peer's delayed ACK (about 40 ms a call).
        router.serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown.clone().cancelled_owned(),
        );
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => {
            // The listener failed while serving: nothing reaches the kernel any more.
            let error = result.err().map_or_else(|| "ended".to_owned(), |e| e.to_string());
            lifecycle.shutdown().cancel();
            return Err(KernelError::Unavailable(format!("the gRPC listener stopped: {error}")));
        }
        _ = lifecycle.draining().cancelled() => {}
    }
    let deadline = tokio::time::Instant::now() + drain;
    let drained = async {
        set_not_serving(&health).await;
        if lifecycle.failure().is_none() {
            info!(
                drain_ms = drain.as_millis() as u64,
                "draining: new turns and sessions refused, running calls finish"
            );
            if tokio::time::timeout_at(deadline, scheduler.quiesce()).await.is_err() {
                warn!(
                    "calls still running at the drain timeout; they are settled as after a crash when the kernel is back"
                );
            }
        }
    };
    // The server goes on accepting meanwhile: health checks and the refusals of new work are
    // answered on new connections too.
    tokio::select! {
        result = &mut server => {
            let error = result.err().map_or_else(|| "ended".to_owned(), |e| e.to_string());
            lifecycle.shutdown().cancel();
            return Err(KernelError::Unavailable(format!("the gRPC listener stopped while draining: {error}")));
        }
        _ = drained => {}
    }
    info!("shutting down");
    shutdown.cancel();
    // Their last messages are on their way; a client that does not read them (its connection
    // unpolled, so it never acknowledges the server's goodbye) must not hold the kernel.
    match tokio::time::timeout(STREAMS_GRACE, &mut server).await {
        Ok(result) => result.map_err(|e| KernelError::Unavailable(format!("server: {e}")))?,
        Err(_) => warn!("streams still open after the drain timeout; closing them"),
    }
    Ok(())
}

/// How long open streams get to end once the kernel shuts down.
const STREAMS_GRACE: Duration = Duration::from_secs(1);

/// What a drain needs besides the router.
struct Stopping {
    lifecycle: Lifecycle,
    scheduler: Scheduler,
    health: tonic_health::server::HealthReporter,
}

/// Every service the kernel serves, as gRPC health names them ("" is the whole server).
async fn set_not_serving(health: &tonic_health::server::HealthReporter) {
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    health.set_not_serving::<RunServiceServer<RunApi>>().await;
    health.set_not_serving::<ToolCallServiceServer<ToolCallApi>>().await;
    health.set_not_serving::<HostedServiceServer<HostedApi>>().await;
    health.set_not_serving::<WorkerServiceServer<WorkerApi>>().await;
    health.set_not_serving::<RegistryServiceServer<RegistryApi>>().await;
    health.set_not_serving::<ApprovalServiceServer<ApprovalApi>>().await;
    health.set_not_serving::<AdminServiceServer<AdminApi>>().await;
}

/// How often expired cache entries are purged, and at most how many per write, so a large backlog
/// never holds the writer for long.
const PURGE_EVERY: Duration = Duration::from_secs(60);
const PURGE_BATCH: usize = 1_000;

/// Deletes expired cache entries (read_only results and `ctx.cache`) at start and then every
/// [`PURGE_EVERY`]: reads skip them already; this keeps the database from growing with them.
async fn purge_expired_caches(store: Store, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PURGE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut purged = 0;
        // Fewer than a batch means neither cache had more expired entries.
        loop {
            match store.purge_expired(PURGE_BATCH).await {
                Ok(count) => {
                    purged += count;
                    if count < PURGE_BATCH || shutdown.is_cancelled() {
                        break;
                    }
                }
                Err(error) => {
                    warn!(%error, "expired cache entries not purged");
                    break;
                }
            }
        }
        if purged > 0 {
            info!(purged, "expired cache entries purged");
        }
    }
}

/// Reloads the policy file and the auth file on every SIGHUP; a file that does not load leaves
/// what it would have replaced in force.
async fn reload_on_sighup(governance: Governance, keys: Option<Arc<Keys>>, shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        warn!("cannot listen for SIGHUP; reload the policy through AdminService.ReloadPolicy");
        // Not a failure of the kernel: it serves on without reloads.
        return shutdown.cancelled().await;
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = hangup.recv() => {
                // Errors are logged by each reload.
                let _ = governance.reload();
                if let Some(keys) = &keys {
                    let _ = keys.reload();
                }
            }
        }
    }
}

/// Runs the kernel until `stop` is cancelled, then drains (see [`crate::lifecycle`]).
/// `on_listening` receives the bound address. A long-lived task that ends while the kernel serves
/// stops it too, and `run` returns its [`crate::lifecycle::TaskFailure`].
pub async fn run(
    config: Config,
    stop: CancellationToken,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), KernelError> {
    let lifecycle = Lifecycle::new(stop);
    let shutdown = lifecycle.shutdown().clone();
    // A policy file that does not load stops the kernel before it touches anything.
    let governance = Governance::load(config.policy.as_deref(), config.unit_prices.clone())?;
    // So do TLS files that do not load.
    let mut server = crate::tls::server_builder(&config)?;
    // And an auth file that does not load, or a non-loopback address without one or --insecure.
    let keys = crate::auth::load(config.auth_file.as_deref(), config.listen, config.insecure)?;
    if let Some(mcp) = config.mcp_listen {
        check_mcp_listen(&config, mcp)?;
    }
    if let Some(http) = config.http_listen {
        check_exposed(&config, "--http-listen", http)?;
    }
    // One kernel per database, claimed before anything reads or writes it; then the port, so a
    // kernel that cannot serve creates no database.
    // (On PostgreSQL the writer's connection holds the claim, as an advisory lock.)
    let db_lock = match &config.db {
        Database::Sqlite(path) => Some(DbLock::acquire(path)?),
        Database::Postgres(_) => None,
    };
    let listener = bind(config.listen).await?;
    let advertised = match &config.advertise {
        Some(address) => address.clone(),
        None => listener
            .local_addr()
            .map_err(|e| KernelError::Unavailable(e.to_string()))?
            .to_string(),
    };
    let hub = Hub::default();
    let (store, writer) = Store::open_database(
        &config.db,
        (config.durability, config.postgres_bounds()),
        (hub.clone(), crate::clock::Clock::wall()),
    )
    .await?;
    lifecycle.watch("store writer", writer.ended());
    let traces = match &config.otlp_endpoint {
        Some(endpoint) => {
            let (sink, exporting) = crate::traces::start(endpoint, store.reads.clone())?;
            hub.on_commit_trace(sink);
            Some(exporting)
        }
        None => None,
    };
    let registry = Registry::load(store.reads.tools().await?);
    registry.know_agents(&store.reads.agents().await?);
    let replicated = matches!(config.db, Database::Postgres(_));
    let scheduler_config = crate::scheduler::SchedulerConfig {
        replicated,
        policy: crate::scheduler::PolicySource::policy(governance.clone()),
        ..config.scheduler()
    };
    let recovered = recover(&store, replicated).await?;
    let (scheduler, scheduling) = Scheduler::new(scheduler_config, store.clone(), shutdown.clone());
    lifecycle.spawn("scheduler", scheduling);
    for step in recovered {
        scheduler.enqueue(step);
    }

    let mut link = None;
    if let Database::Postgres(url) = &config.db {
        let owned = crate::cluster::shards::ShardMap::default();
        // A write waits for its shard's owner at most as long as a dead owner's shards take to move.
        let ttl = scheduler.config().lease_ttl;
        let links =
            crate::cluster::link::Links::new(store.clone(), owned.clone(), (ttl * 2, ttl), link_tls(&config)?).await?;
        store.set_router(Arc::new(links.clone()));
        link = Some(links.clone());
        let moves = links.moves();
        lifecycle.spawn(
            "cluster heartbeat",
            crate::cluster::heartbeat(
                store.clone(),
                (scheduler.clone(), registry.clone()),
                (advertised.clone(), owned, links),
                (lifecycle.draining().clone(), shutdown.clone()),
            ),
        );
        let feed =
            crate::cluster::feed::Feed::new(store.clone(), (hub.clone(), scheduler.clone(), registry.clone()), moves);
        let target = crate::store::postgres::Target::new(url, config.postgres_bounds())?;
        lifecycle.spawn("cluster feed", feed.run(target, shutdown.clone()));
    }

    let kernel = Kernel {
        store: store.clone(),
        hub,
        registry,
        scheduler,
        governance: governance.clone(),
        draining: lifecycle.draining().clone(),
        shutdown: shutdown.clone(),
        default_timeout_ms: config.default_tool_timeout_ms,
        limits: config.limits(),
        sessions: Arc::new(tokio::sync::Semaphore::new(config.max_sessions)),
        started_at: store.clock().now_millis(),
        address: advertised.into(),
        keys: keys.clone(),
        receipt_key: receipt_key(&config)?,
        secret_key: secret_key(&config)?,
    };

    // grpcurl and many tools still ask for v1alpha reflection; serve both.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(kernel_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| KernelError::Unavailable(format!("reflection: {e}")))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| KernelError::Unavailable(format!("reflection: {e}")))?;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<RunServiceServer<RunApi>>().await;
    health_reporter
        .set_serving::<ToolCallServiceServer<ToolCallApi>>()
        .await;
    health_reporter.set_serving::<HostedServiceServer<HostedApi>>().await;
    health_reporter.set_serving::<WorkerServiceServer<WorkerApi>>().await;
    health_reporter
        .set_serving::<RegistryServiceServer<RegistryApi>>()
        .await;
    health_reporter
        .set_serving::<ApprovalServiceServer<ApprovalApi>>()
        .await;
    health_reporter.set_serving::<AdminServiceServer<AdminApi>>().await;
    lifecycle.spawn("reload", reload_on_sighup(governance, keys.clone(), shutdown.clone()));
    lifecycle.spawn("cache purge", purge_expired_caches(store.clone(), shutdown.clone()));
    if let Some(retain) = config.retain_finished {
        info!(
            retain_ms = retain.as_millis() as u64,
            "finished runs are deleted past the retention"
        );
        lifecycle.spawn(
            "retention",
            crate::retention::retain_finished(store.clone(), retain, shutdown.clone()),
        );
    }

    if let Some(after_ms) = config.abandon_runs_after_ms {
        info!(after_ms, "idle external runs are failed as abandoned");
        lifecycle.spawn(
            "abandon",
            crate::abandon::abandon_idle_runs(store.clone(), Duration::from_millis(after_ms), shutdown.clone()),
        );
    }

    let addr = listener
        .local_addr()
        .map_err(|e| KernelError::Unavailable(e.to_string()))?;
    info!(%addr, db = %config.db, schema = Store::schema_version(), replica = store.replica(), "listening");
    if let Some(mcp) = config.mcp_listen {
        let idle = Duration::from_millis(config.mcp_session_idle_timeout_ms);
        let authenticate = keys.is_some();
        // The resource its tokens are for, as the auth file names it when it starts.
        let resource = keys.as_ref().and_then(|keys| {
            keys.current()
                .oauth()
                .map(|oauth| kernel_mcp::serve::ProtectedResource {
                    resource: oauth.audience().to_owned(),
                    authorization_servers: vec![oauth.issuer().to_owned()],
                })
        });
        lifecycle.spawn(
            "mcp listener",
            serve_mcp(mcp, addr, (idle, authenticate, resource), shutdown.clone()).await?,
        );
    }
    if let Some(http) = config.http_listen {
        lifecycle.spawn(
            "http listener",
            crate::http::serve(http, kernel.clone(), shutdown.clone()).await?,
        );
    }
    on_listening(addr);

    // A message over this is refused by tonic before it is decoded.
    let max_message = config.max_message_bytes;
    let stopping = Stopping {
        lifecycle: lifecycle.clone(),
        scheduler: kernel.scheduler.clone(),
        health: health_reporter,
    };
    let link = link.map(|links| {
        kernel_proto::replica::link_service_server::LinkServiceServer::new(crate::cluster::link::LinkApi(links))
            .max_decoding_message_size(usize::MAX)
    });
    let router = server
        .add_optional_service(link)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(Guarded::new(
            RunServiceServer::new(RunApi(kernel.clone())).max_decoding_message_size(max_message),
            keys.clone(),
        ))
        .add_service(Guarded::new(
            ToolCallServiceServer::new(ToolCallApi(kernel.clone())).max_decoding_message_size(max_message),
            keys.clone(),
        ))
        .add_service(Guarded::new(
            InterceptedService::new(
                WorkerServiceServer::new(WorkerApi(kernel.clone())).max_decoding_message_size(max_message),
                crate::tls::WorkerGate::new(&config),
            ),
            keys.clone(),
        ))
        .add_service(Guarded::new(
            // A hosted handler is a worker: the same client certificate admits both.
            InterceptedService::new(
                HostedServiceServer::new(HostedApi(kernel.clone())).max_decoding_message_size(max_message),
                crate::tls::WorkerGate::new(&config),
            ),
            keys.clone(),
        ))
        .add_service(Guarded::new(
            ApprovalServiceServer::new(ApprovalApi(kernel.clone())).max_decoding_message_size(max_message),
            keys.clone(),
        ))
        .add_service(Guarded::new(
            AdminServiceServer::new(AdminApi(kernel.clone())).max_decoding_message_size(max_message),
            keys.clone(),
        ))
        .add_service(Guarded::new(
            RegistryServiceServer::new(RegistryApi(kernel)).max_decoding_message_size(max_message),
            keys,
        ));
    serve(
        router,
        listener,
        stopping,
        Duration::from_millis(config.drain_timeout_ms),
    )
    .await?;
    if replicated {
        crate::cluster::hand_back(&store).await;
    }
    // Streams a client stopped reading may still hold the store; the writer need not wait for them.
    store.stop_writer();
    drop(store);
    let drain = Duration::from_millis(config.drain_timeout_ms);
    // Give the writer its last batch: every command already queued commits before it exits.
    let join = tokio::task::spawn_blocking(move || writer.join());
    if tokio::time::timeout(drain, join).await.is_err() {
        warn!("store writer did not finish within the drain timeout");
    }
    if let Some(traces) = traces {
        traces.finish(drain).await;
    }
    drop(db_lock);
    match lifecycle.failure() {
        Some(failure) => Err(KernelError::Unavailable(failure.to_string())),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

/// How this replica dials the others' links: as they serve, with TLS when it does (trusting its
/// own certificate, and showing it where the replicas ask for client certificates), plaintext
/// otherwise.
fn link_tls(config: &Config) -> Result<Option<tonic::transport::ClientTlsConfig>, KernelError> {
    let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
        return Ok(None);
    };
    let read = |path: &std::path::PathBuf| {
        std::fs::read(path).map_err(|e| KernelError::invalid("--tls-cert", format!("{}: {e}", path.display())))
    };
    let (cert, key) = (read(cert)?, read(key)?);
    Ok(Some(
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&cert))
            .identity(tonic::transport::Identity::from_pem(cert, key)),
    ))
}

/// Refuses an MCP listener the kernel cannot serve safely: beside TLS on gRPC (its bridge speaks
/// plaintext to the kernel), or on a non-loopback address with no keys to require.
fn check_mcp_listen(config: &Config, mcp: SocketAddr) -> Result<(), KernelError> {
    if config.tls_cert.is_some() {
        return Err(KernelError::invalid(
            "--mcp-listen",
            "not yet with --tls-cert: serve MCP beside a TLS kernel with `kernelctl --addr https://... --tls-ca CA \
             mcp serve --listen ADDR`",
        ));
    }
    check_exposed(config, "--mcp-listen", mcp)
}

/// Refuses a listener on a non-loopback address with no keys to require, unless --insecure.
fn check_exposed(config: &Config, flag: &str, addr: SocketAddr) -> Result<(), KernelError> {
    if !addr.ip().is_loopback() && config.auth_file.is_none() && !config.insecure {
        return Err(KernelError::invalid(
            flag,
            format!(
                "{addr} is not a loopback address; give --auth-file to require API keys, or --insecure to serve it \
                 without authentication"
            ),
        ));
    }
    Ok(())
}

/// Binds `listen` for MCP clients and returns what serves the kernel's tools there (`/mcp`),
/// bridged to this kernel's own gRPC address `grpc` like any agent, so validation, policy,
/// approvals and keys apply as for one.
async fn serve_mcp(
    listen: SocketAddr,
    grpc: SocketAddr,
    (session_idle, authenticate, resource): (Duration, bool, Option<kernel_mcp::serve::ProtectedResource>),
    shutdown: CancellationToken,
) -> Result<impl std::future::Future<Output = Result<(), String>> + Send + 'static, KernelError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| KernelError::Unavailable(format!("cannot listen on {listen} (--mcp-listen): {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| KernelError::Unavailable(e.to_string()))?;
    // An unspecified address (0.0.0.0) is reached on loopback from inside.
    let ip = if grpc.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        grpc.ip()
    };
    let bridge = kernel_mcp::serve::Bridge {
        kernel: format!("http://{}", SocketAddr::new(ip, grpc.port())),
        session_idle: Some(session_idle),
        authenticate,
        resource,
        ..Default::default()
    };
    info!(addr = %bound, path = "/mcp", "mcp listening");
    Ok(async move { kernel_mcp::serve::serve_http(bridge, listener, shutdown).await })
}

/// Binds the gRPC port, saying what to do when another process holds it.
async fn bind(addr: SocketAddr) -> Result<TcpListener, KernelError> {
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => format!(" (another kernel? use --listen {}:0 for a free port)", addr.ip()),
            _ => String::new(),
        };
        KernelError::Unavailable(format!("cannot listen on {addr}: {e}{hint}"))
    })
}

/// The key receipts are signed with: `--receipt-key`, else the one beside a SQLite file (each
/// created when missing); none on PostgreSQL without the flag.
fn receipt_key(config: &Config) -> Result<Option<Arc<ed25519_dalek::SigningKey>>, KernelError> {
    let Some(path) = config
        .receipt_key
        .clone()
        .or_else(|| crate::receipts::default_path(&config.db))
    else {
        return Ok(None);
    };
    crate::receipts::load_or_create(&path)
        .map(|key| Some(Arc::new(key)))
        .map_err(|why| KernelError::invalid("--receipt-key", why))
}

/// The key secret fields are kept with: `--secret-key`, else the one beside a SQLite file (each
/// created when missing); none on PostgreSQL without the flag.
fn secret_key(config: &Config) -> Result<Option<Arc<crate::secrets::SecretKey>>, KernelError> {
    let Some(path) = (config.secret_key.clone()).or_else(|| crate::key_file::beside(&config.db, ".secret-key")) else {
        return Ok(None);
    };
    crate::secrets::SecretKey::load_or_create(&path)
        .map(|key| Some(Arc::new(key)))
        .map_err(|why| KernelError::invalid("--secret-key", why))
}
