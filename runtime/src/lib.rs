//! `wasmless-runtime`: loads a WebAssembly handler, verifies its digest, compiles it
//! once, and serves each HTTP request from a fresh instance behind axum, with a JSON
//! log line and Prometheus metrics per request. With `--pool`, the same for many
//! Functions in one process, each on its own port ([`pool`]).
//!
//! What runs a handler is the `wasmless-host` crate's; this one serves it.
//!
//! Read top to bottom: [`serve`] makes the engine once (`wasmless_host::loader`), the Function it
//! serves ([`tenant`]: module source, digests, limits, env, outbound policy) or the
//! pool of them, starts the admin and function servers ([`server`], and the `wasmless-edge` crate) and
//! watches for a replaced module ([`reload`]) or a changed pool table.

pub mod config;
pub mod logging;
pub mod pool;
mod reload;
pub mod server;
pub mod split;
pub mod tenant;
pub mod traces;
pub mod traffic;
pub mod traffic_files;

pub use config::Config;

use server::{FunctionState, Readiness};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tenant::Tenant;
use tokio::net::TcpListener;
use wasmless_host::loader::{self, ModuleError};
use wasmless_host::metrics::Metrics;
use wasmless_host::module_source::LoadError;
use wasmless_host::precompiled;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Outbound(#[from] wasmless_outbound::OutboundConfigError),
    #[error("--code needs --code-digest sha256:<hex>: compiled code is native code and never loaded unpinned")]
    UnpinnedCode,
    #[error(
        "--code needs the module's digest (--module-digest, or the digest file beside the module) to check what the code was compiled from"
    )]
    CodeWithoutModuleDigest,
    #[error("no module to serve: give --module (or --pool with a directory of Functions)")]
    NoModule,
    #[error(transparent)]
    PoolTable(#[from] pool::table::TableError),
    #[error(transparent)]
    PoolApi(#[from] pool::api::ApiError),
    #[error(transparent)]
    Traces(#[from] traces::TracesError),
    #[error("{0}")]
    PoolShares(String),
    #[error("--traffic-file {file}: {problem}")]
    TrafficFile { file: std::path::PathBuf, problem: String },
}

/// What the `wasmless-runtime` binary (and `wasmless serve`) runs: the JSON log and, when
/// an OTLP endpoint is configured, the trace exporter set up; [`serve`] until SIGTERM; the
/// last spans sent.
pub async fn run(config: Config) -> Result<(), ServeError> {
    let traces = traces::Traces::start(config.otlp_endpoint.as_deref(), &config.function, "wasmless-runtime")?;
    let _logs = logging::init(traces.as_ref());
    let served = serve(config, shutdown_signal(), |_| {}).await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    served
}

/// Where the servers listen, known once they are bound (ports may be 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    pub function: SocketAddr,
    pub admin: SocketAddr,
}

/// Serves `config` until `shutdown` resolves, then serves on for `--drain-delay` (not
/// ready, closing every keep-alive connection after its next response), stops accepting
/// and lets requests in flight finish (for at most `--shutdown-grace`). `on_bound` hears the addresses once serving.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
    on_bound: impl FnOnce(Bound) + Send,
) -> Result<(), ServeError> {
    let metrics = Arc::new(match config.pool {
        Some(_) => Metrics::new_pool(&config.function),
        None => Metrics::new(&config.function),
    });
    let readiness = Readiness::default();
    let pool_slot = server::PoolSlot::default();
    // rustls needs a process default provider for the clients that take it (kube's, the
    // OCI client's): ring, the one the workspace links.
    let _ = rustls::crypto::ring::default_provider().install_default();

    // The admin port comes up first, so probes get an answer while the module loads.
    let admin_listener = bind(config.admin_addr()).await?;
    let admin_addr = admin_listener.local_addr()?;
    let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin = tokio::spawn(
        axum::serve(
            admin_listener,
            // The peer's address: `/pool` tells the network less than the pod itself.
            server::admin_router(metrics.clone(), readiness.clone(), pool_slot.clone())
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = admin_stopped.await;
        })
        .into_future(),
    );

    let starting = async {
        match &config.pool {
            Some(source) => serve_many(&config, &metrics, source, admin_addr.port(), &pool_slot).await,
            None if config.traffic.is_some() || !config.traffic_file.is_empty() => {
                serve_revisions(&config, &metrics, admin_addr.port()).await
            }
            None => serve_one(&config, &metrics, admin_addr.port()).await,
        }
    };
    let mut shutdown = std::pin::pin!(shutdown);
    // A pod told to stop before it serves (one waiting for its Function's first build)
    // has nothing to drain.
    let (routes, listeners, function_addr) = tokio::select! {
        started = starting => started?,
        () = &mut shutdown => {
            tracing::info!("stopped before serving");
            let _ = stop_admin.send(());
            let _ = admin.await;
            return Ok(());
        }
    };
    let state = FunctionState::new(routes, server::Uploads::from_config(&config));
    let (phase_tx, phase) = tokio::sync::watch::channel(wasmless_edge::Phase::Serving);
    // A serving thread per usable core (the cgroup's CPU quota counted).
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut server = tokio::spawn(wasmless_edge::serve(
        listeners,
        server::function_router(state),
        config.edge_limits(),
        metrics,
        phase,
        threads,
    ));
    readiness.set(true);
    tracing::info!(function = %config.function, address = %function_addr, admin = %admin_addr, "serving");
    on_bound(Bound {
        function: function_addr,
        admin: admin_addr,
    });

    tokio::select! {
        result = &mut server => {
            // The serving threads only return once told to: this is a panic, or a
            // thread that could not start.
            result.map_err(std::io::Error::other)??;
        }
        () = &mut shutdown => drain_and_close(&config, &readiness, &phase_tx, server).await?,
    }
    let _ = stop_admin.send(());
    let _ = admin.await;
    Ok(())
}

type Serving = (
    server::Routes,
    tokio::sync::watch::Receiver<wasmless_edge::Listeners>,
    SocketAddr,
);

/// The engine every Function of this process runs on, with the node's code store if given.
fn engine_host(config: &Config) -> Result<loader::EngineHost, ServeError> {
    let store = config.code_store.clone().map(wasmless_host::code_store::CodeStore::new);
    Ok(loader::EngineHost::new(&config.request_limits(), config.cache_dir.clone())?.with_code_store(store))
}

/// A dedicated runtime: its one Function loaded before the port opens, and the module
/// file watched for a replacement.
async fn serve_one(config: &Config, metrics: &Arc<Metrics>, admin_port: u16) -> Result<Serving, ServeError> {
    // A new pod's code is read and verified on other threads while the engine is made.
    let started = Instant::now();
    let code = tenant::fetch_code(config);
    let engine = engine_host(config)?;
    tracing::debug!(engine_ms = started.elapsed().as_secs_f64() * 1000.0, "engine made");
    let tenant = Tenant::new(
        &engine,
        config,
        metrics.clone(),
        admin_port,
        config.process_env().into_iter(),
    )?;
    tenant.use_prefetched(code);
    let tenant = Arc::new(tenant);
    tenant.handler().await?;

    let listener = bind(config.listen_addr()).await?;
    let function_addr = listener.local_addr()?;
    if !config.watch_interval.is_zero() {
        tokio::spawn(reload::watch(config.watch_interval, tenant.clone()));
    }
    let listeners: wasmless_edge::Listeners = Arc::new(vec![Arc::new(listener.into_std()?)]);
    // The sender is dropped: the one listener never changes.
    let (_, listeners) = tokio::sync::watch::channel(listeners);
    Ok((server::Routes::Single(tenant), listeners, function_addr))
}

/// A dedicated runtime serving revisions of its Function side by side (`--traffic`, or
/// the `--traffic-file`s, which are then followed), each a tenant of its own on one engine,
/// all loaded before the port opens.
async fn serve_revisions(config: &Config, metrics: &Arc<Metrics>, admin_port: u16) -> Result<Serving, ServeError> {
    let engine = engine_host(config)?;
    let (revisions, applied) = match &config.traffic {
        Some(traffic) => (
            split::Revisions::load(engine, config, metrics.clone(), admin_port, traffic).await?,
            None,
        ),
        None => {
            let (revisions, applied) =
                first_revisions(&config.traffic_file, engine, config, metrics, admin_port).await?;
            (revisions, Some(applied))
        }
    };
    let revisions = Arc::new(revisions);
    if let Some(applied) = applied {
        tokio::spawn(revisions.clone().follow(config.traffic_file.clone(), applied));
    }

    let listener = bind(config.listen_addr()).await?;
    let function_addr = listener.local_addr()?;
    let listeners: wasmless_edge::Listeners = Arc::new(vec![Arc::new(listener.into_std()?)]);
    let (_, listeners) = tokio::sync::watch::channel(listeners);
    Ok((server::Routes::Split(revisions), listeners, function_addr))
}

/// The revisions `files` name first (the highest generation among them), loaded, and the
/// routes they were read from. No routes yet, or an empty list (`[]`: the pod of a new
/// Function, started while its first build runs), is waited on, the port closed and the
/// pod not ready, until the operator names a revision. Routes whose revisions do not load
/// are tried again every [`split::FOLLOW_INTERVAL`] for [`split::LOAD_RETRIES`] times (a
/// Role just widened may refuse a read for a moment), then every
/// [`split::SLOW_RETRY_INTERVAL`] and whenever the files change: a pod given routes for
/// another pod template's mounts (its Function's routes ConfigMap is written for the newest
/// one) waits, not ready, for the operator to write its own.
async fn first_revisions(
    files: &[std::path::PathBuf],
    engine: loader::EngineHost,
    config: &Config,
    metrics: &Arc<Metrics>,
    admin_port: u16,
) -> Result<(split::Revisions, String), ServeError> {
    let mut waited = false;
    let mut failed: Option<(String, u32, std::time::Instant)> = None;
    loop {
        let read = traffic_files::read_all(files)
            .await
            .map_err(|(file, error)| ServeError::TrafficFile {
                file,
                problem: error.to_string(),
            })?;
        let (chosen, problems) = traffic_files::choose(&read);
        let chosen = match chosen {
            Some(chosen) if !chosen.names_no_revision() => chosen,
            None if !problems.is_empty() => {
                return Err(ServeError::TrafficFile {
                    file: files.first().cloned().unwrap_or_default(),
                    problem: problems.join("; "),
                });
            }
            _ => {
                if !std::mem::replace(&mut waited, true) {
                    tracing::info!(files = %traffic_files::describe(files), "no revision to serve yet: waiting for the first build");
                }
                tokio::time::sleep(split::FOLLOW_INTERVAL).await;
                continue;
            }
        };
        if let Some((routes, attempts, at)) = &failed
            && *routes == chosen.routes
            && (*attempts < split::LOAD_RETRIES && at.elapsed() < split::FOLLOW_INTERVAL
                || *attempts >= split::LOAD_RETRIES && at.elapsed() < split::SLOW_RETRY_INTERVAL)
        {
            tokio::time::sleep(split::FOLLOW_INTERVAL).await;
            continue;
        }
        for problem in &problems {
            tracing::warn!(%problem, "a traffic file passed over");
        }
        let traffic = traffic::Traffic::parse(chosen.routes.trim()).map_err(|problem| ServeError::TrafficFile {
            file: chosen.file.clone(),
            problem,
        })?;
        match split::Revisions::load(engine.clone(), config, metrics.clone(), admin_port, &traffic).await {
            Ok(revisions) => {
                tracing::info!(file = %chosen.file.display(), generation = chosen.generation, "serving the routes of this traffic file");
                return Ok((revisions, chosen.routes));
            }
            Err(error) => {
                let attempts = match &failed {
                    Some((routes, attempts, _)) if *routes == chosen.routes => attempts + 1,
                    _ => 1,
                };
                match attempts == split::LOAD_RETRIES {
                    true => {
                        tracing::error!(file = %chosen.file.display(), %error, "the first revisions cannot be loaded: not ready, trying again now and then and whenever the routes change")
                    }
                    false => {
                        tracing::warn!(file = %chosen.file.display(), %error, attempts, "the first revisions cannot be loaded yet; trying again")
                    }
                }
                failed = Some((chosen.routes, attempts, std::time::Instant::now()));
            }
        }
    }
}

/// The pool: its table followed from `source` (each Function's port open, nothing loaded
/// until its first request).
async fn serve_many(
    config: &Config,
    metrics: &Arc<Metrics>,
    source: &pool::source::TableSource,
    admin_port: u16,
    slot: &server::PoolSlot,
) -> Result<Serving, ServeError> {
    pool::check_shares(config).map_err(ServeError::PoolShares)?;
    precompiled::run_nothing_in_place();
    // The pool maps its Functions' code from files it alone holds open: as its process
    // is not dumpable, no other process of its user reaches them (or its memory) through
    // /proc.
    if let Err(error) = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable) {
        tracing::warn!(%error, "cannot make the pool's process undumpable");
    }
    let engine = engine_host(config)?.mapping_code();
    let (pool, listeners) = pool::Pool::new(engine, metrics.clone(), config, admin_port);
    let _ = slot.set(pool.clone());
    pool.release_idle_code(config.pool_release_code_after);
    let interval = if config.watch_interval.is_zero() {
        Duration::from_secs(1)
    } else {
        config.watch_interval
    };
    source.follow(pool.clone(), interval).await?;
    Ok((server::Routes::Pool(pool), listeners, SocketAddr::new(config.bind, 0)))
}

/// After the shutdown signal: serve on, not ready, through the drain delay; then stop
/// accepting and give requests in flight the shutdown grace.
async fn drain_and_close(
    config: &Config,
    readiness: &Readiness,
    phase: &tokio::sync::watch::Sender<wasmless_edge::Phase>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
) -> Result<(), ServeError> {
    // Endpoints are removed asynchronously: keep serving while load balancers
    // catch up with the readiness that just went false.
    readiness.set(false);
    tracing::info!(
        drain_delay_seconds = config.drain_delay.as_secs_f64(),
        grace_seconds = config.shutdown_grace.as_secs_f64(),
        "shutting down: serving on through the drain delay, then finishing requests in flight"
    );
    let _ = phase.send(wasmless_edge::Phase::Draining);
    tokio::time::sleep(config.drain_delay).await;
    tracing::info!("drain delay over: no longer accepting connections");
    let _ = phase.send(wasmless_edge::Phase::Closing);
    match tokio::time::timeout(config.shutdown_grace, server).await {
        Ok(result) => result.map_err(std::io::Error::other)??,
        Err(_) => tracing::warn!("shutdown grace ran out with requests still in flight"),
    }
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
