//! `wasmless-runtime`: loads one WebAssembly handler, verifies its digest, compiles it
//! once, and serves each HTTP request from a fresh instance behind axum, with a JSON
//! log line and Prometheus metrics per request.
//!
//! Read top to bottom: [`serve`] loads the module ([`module_source`], [`loader`]),
//! starts the admin and function servers ([`server`]) and watches for a replaced
//! module ([`reload`]).

pub mod abi;
pub mod clocks;
pub mod compile;
pub mod config;
pub mod edge;
pub mod engine;
pub mod handler;
pub mod limits;
pub mod loader;
pub mod logging;
pub mod metrics;
pub mod module_source;
pub mod oci;
pub mod outbound;
pub mod precompiled;
mod reload;
pub mod server;
pub mod snapshot;

pub use config::Config;

use loader::{Loader, ModuleError};
use metrics::Metrics;
use module_source::{LoadError, ModuleSource};
use server::{FunctionState, Readiness};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpListener;

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
    Outbound(#[from] outbound::OutboundConfigError),
    #[error("--code needs --code-digest sha256:<hex>: compiled code is native code and never loaded unpinned")]
    UnpinnedCode,
    #[error(
        "--code needs the module's digest (--module-digest, or the digest file beside the module) to check what the code was compiled from"
    )]
    CodeWithoutModuleDigest,
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
    let metrics = Arc::new(Metrics::new(&config.function));
    let readiness = Readiness::default();

    // The admin port comes up first, so probes get an answer while the module loads.
    let admin_listener = bind(config.admin_addr()).await?;
    let admin_addr = admin_listener.local_addr()?;
    let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin = tokio::spawn(
        axum::serve(admin_listener, server::admin_router(metrics.clone(), readiness.clone()))
            .with_graceful_shutdown(async {
                let _ = admin_stopped.await;
            })
            .into_future(),
    );

    let source = ModuleSource::parse(&config.module);
    let expected = source.known_digest(config.module_digest).await;
    // Calls to this runtime's own admin port are refused: the port as bound (it may be 0).
    let outbound = outbound::OutboundConfig {
        admin_port: admin_addr.port(),
        ..config.outbound()?
    };
    let outbound = Arc::new(outbound::Outbound::new(&outbound, metrics.clone())?);
    let (loader, handler) = load_first(&config, &source, expected, &metrics, outbound).await?;

    let listener = bind(config.listen_addr()).await?;
    let function_addr = listener.local_addr()?;
    let state = FunctionState::new(
        handler,
        loader,
        metrics.clone(),
        &config.function,
        function_addr.port(),
        server::Uploads::from_config(&config),
    );
    if !config.watch_interval.is_zero() {
        tokio::spawn(reload::watch(
            source,
            config.module_digest,
            config.watch_interval,
            state.clone(),
        ));
    }
    let (phase_tx, phase) = tokio::sync::watch::channel(edge::Phase::Serving);
    // A serving thread per usable core (the cgroup's CPU quota counted).
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut server = tokio::spawn(edge::serve(
        listener,
        server::function_router(state),
        edge::EdgeLimits::from_config(&config),
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
        () = shutdown => drain_and_close(&config, &readiness, &phase_tx, server).await?,
    }
    let _ = stop_admin.send(());
    let _ = admin.await;
    Ok(())
}

/// The handler of the first module: the builder's code first (a new pod: nothing to
/// compile), then this node's cache (a restart), then the module itself, compiled here.
async fn load_first(
    config: &Config,
    source: &ModuleSource,
    expected: Option<wasmless_artifact::Digest>,
    metrics: &Arc<Metrics>,
    outbound: Arc<outbound::Outbound>,
) -> Result<(Arc<Loader>, handler::LoadedHandler), ServeError> {
    // A new pod's code is read, verified and decompressed on other threads while this one
    // makes the engine: neither needs the other, and each takes milliseconds.
    let started = Instant::now();
    let code = match &config.code {
        Some(code) => {
            let module = expected.ok_or(ServeError::CodeWithoutModuleDigest)?;
            let code_digest = config.code_digest.ok_or(ServeError::UnpinnedCode)?;
            let code = precompiled::CodeSource::parse(code);
            let loading = tokio::spawn({
                let code = code.clone();
                async move { code.load_code(code_digest).await }
            });
            Some((code, module, loading))
        }
        None => None,
    };
    let loader = Arc::new(Loader::new(
        limits::RequestLimits::from_config(config),
        config.handler_env(std::env::vars()),
        &config.function,
        metrics.clone(),
        outbound,
        config.cache_dir.clone(),
    )?);
    tracing::debug!(engine_ms = started.elapsed().as_secs_f64() * 1000.0, "engine made");
    let mut handler = None;
    if let Some((code, module, loading)) = code {
        let loaded = loading
            .await
            .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked.into_panic()));
        handler = loader.load_precompiled(&code, loaded, module, started).await?;
    }
    if handler.is_none()
        && let Some(digest) = expected
    {
        handler = loader.load_cached(digest).await;
    }
    let handler = match handler {
        Some(handler) => handler,
        // The digest read above is the one to check against; no second read of the digest file.
        None => loader.load(source.load(expected).await?).await?,
    };
    Ok((loader, handler))
}

/// After the shutdown signal: serve on, not ready, through the drain delay; then stop
/// accepting and give requests in flight the shutdown grace.
async fn drain_and_close(
    config: &Config,
    readiness: &Readiness,
    phase: &tokio::sync::watch::Sender<edge::Phase>,
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
    let _ = phase.send(edge::Phase::Draining);
    tokio::time::sleep(config.drain_delay).await;
    tracing::info!("drain delay over: no longer accepting connections");
    let _ = phase.send(edge::Phase::Closing);
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
