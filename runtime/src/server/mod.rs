//! The two HTTP servers: the function's port and the admin port, their routers and
//! layers, and graceful shutdown. A request's own steps are in [`function`].

mod function;
mod stream_tail;

use crate::tenant::Tenant;
use crate::traces;
use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{StatusCode, header};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tower_http::trace::TraceLayer;
use tracing::Span;
use wasmless_edge::LocalPort;
use wasmless_host::metrics::Metrics;
use wasmless_outbound::CallLog;

/// What every request of the function's port (or the pool's ports) shares.
#[derive(Clone)]
pub struct FunctionState {
    pub routes: Routes,
    uploads: Arc<Uploads>,
}

/// Which Function a request is for.
#[derive(Clone)]
pub enum Routes {
    /// A dedicated runtime: every request, whatever the port.
    Single(Arc<Tenant>),
    /// The pool: the Function whose listener accepted the connection, while it serves.
    Pool(Arc<crate::pool::Pool>),
    /// Revisions of one Function: the one its tag names, or the next in its shares.
    Split(Arc<crate::split::Revisions>),
}

/// The tenant [`route`] chose for a request, for every layer inside it.
fn routed<B>(request: &http::Request<B>) -> Option<&Arc<Tenant>> {
    request.extensions().get::<Arc<Tenant>>()
}

fn local_port<B>(request: &http::Request<B>) -> LocalPort {
    request.extensions().get::<LocalPort>().copied().unwrap_or_default()
}

/// Request bodies being received: a budget of bytes of its own, apart from the
/// concurrency permits, and a time limit on each.
pub struct Uploads {
    budget: Arc<Semaphore>,
    budget_bytes: u32,
    read_timeout: Duration,
}

impl Uploads {
    /// `budget_bytes` is capped at 4 GiB (what one reservation can hold).
    pub fn new(budget_bytes: u64, read_timeout: Duration) -> Self {
        let budget_bytes = u32::try_from(budget_bytes).unwrap_or(u32::MAX).max(1);
        Self {
            budget: Arc::new(Semaphore::new(budget_bytes as usize)),
            budget_bytes,
            read_timeout,
        }
    }

    pub fn from_config(config: &crate::Config) -> Self {
        Self::new(config.upload_budget, config.body_read_timeout)
    }
}

impl FunctionState {
    pub fn new(routes: Routes, uploads: Uploads) -> Self {
        Self {
            routes,
            uploads: Arc::new(uploads),
        }
    }
}

/// Every path and method goes to the handler. Outermost first: which Function (and
/// revision) the request is for, the request's trace span (when tracing is on), one log
/// line per request, then the request metrics.
pub fn function_router(state: FunctionState) -> Router {
    let router = Router::new()
        .fallback(function::serve_function)
        .layer(middleware::from_fn(record_metrics))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(move |request: &Request| {
                    let tenant = routed(request);
                    let function = tenant.map_or("", |tenant| &tenant.function);
                    let digest = tenant.and_then(|tenant| {
                        let loaded = tenant.handler.load();
                        loaded.as_ref().map(|handler| handler.digest).or(tenant.pinned)
                    });
                    let span = tracing::info_span!(
                        "request",
                        function = %function,
                        revision = tenant.and_then(|tenant| tenant.revision.as_deref()),
                        method = %request.method(),
                        path = %request.uri().path(),
                        digest = %digest.map(|digest| digest.to_string()).unwrap_or_default(),
                        trace_id = tracing::field::Empty,
                        span_id = tracing::field::Empty,
                    );
                    // Every line of the request (its own, the handler's output) joins its trace.
                    if let Some(ids) = request.extensions().get::<traces::TraceIds>() {
                        span.record("trace_id", tracing::field::display(ids.trace_id));
                        span.record("span_id", tracing::field::display(ids.span_id));
                    }
                    span
                })
                .on_request(())
                .on_response(|response: &Response, latency: Duration, _span: &Span| {
                    // A stream's line is written at its end (stream_tail).
                    if response
                        .extensions()
                        .get::<wasmless_host::handler::Streamed>()
                        .is_some()
                    {
                        return;
                    }
                    let calls = response.extensions().get::<Arc<CallLog>>();
                    let outbound_calls = calls.map_or(0, |log| log.calls());
                    if outbound_calls == 0 {
                        tracing::info!(
                            status = response.status().as_u16(),
                            latency_ms = latency.as_secs_f64() * 1000.0,
                            "request"
                        );
                    } else {
                        tracing::info!(
                            status = response.status().as_u16(),
                            latency_ms = latency.as_secs_f64() * 1000.0,
                            outbound_calls,
                            outbound_ms = calls.map_or(0.0, |log| log.millis()),
                            "request"
                        );
                    }
                })
                .on_failure(()),
        );
    router
        .layer(middleware::from_fn_with_state(state.clone(), route))
        .with_state(state)
}

/// Finds the request's Function, or the revision of it a split chooses, once for every
/// layer inside: a pool port nobody serves any more, or a tag no revision has, is a 404.
/// A split's answers say which revision gave them; a pooled Function's that moved to its
/// pods close their connection.
async fn route(State(state): State<FunctionState>, mut request: Request, next: Next) -> Response {
    let tenant = match &state.routes {
        Routes::Single(tenant) => tenant.clone(),
        Routes::Pool(pool) => match bound_tenant(pool, &request) {
            Some(tenant) => tenant,
            None => {
                return (
                    StatusCode::NOT_FOUND,
                    [(header::CONNECTION, "close")],
                    "no function is served on this connection any more (it left the pool, or its port); connect again\n",
                )
                    .into_response();
            }
        },
        Routes::Split(split) => match split.choose(request.headers()) {
            Ok(tenant) => tenant,
            Err(unknown) => return (StatusCode::NOT_FOUND, format!("{unknown}\n")).into_response(),
        },
    };
    let revision = tenant.revision.clone();
    let close =
        matches!(state.routes, Routes::Pool(_)) && tenant.served_by_pods.load(std::sync::atomic::Ordering::Relaxed);
    request.extensions_mut().insert(tenant);
    // Not a layer of its own: with tracing off, or the collector down, a request pays
    // one atomic load for tracing, not a layer's boxed future.
    let mut response = if traces::make_request_span() {
        trace_request(request, next).await
    } else {
        next.run(request).await
    };
    if let Some(value) = revision.and_then(|revision| http::HeaderValue::from_str(&revision).ok()) {
        response.headers_mut().insert(crate::split::REVISION_HEADER, value);
    }
    // A pooled Function that moved to its own pods: the client's next connection goes
    // through its Service again, to them.
    if close {
        response
            .headers_mut()
            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    response
}

/// The pooled Function a request's connection is bound to: the one whose listener
/// accepted it, never whoever has that port since.
fn bound_tenant(pool: &crate::pool::Pool, request: &Request) -> Option<Arc<Tenant>> {
    pool.tenant_on(request.extensions().get::<wasmless_edge::AcceptedOn>()?)
}

/// The server span of a request, following OpenTelemetry's HTTP conventions, continuing
/// the caller's trace (`traceparent`), with the Function and its module's digest: in the
/// pool, several Functions share the process, so these are the span's, not the resource's.
async fn trace_request(mut request: Request, next: Next) -> Response {
    let tenant = routed(&request).cloned();
    let function: &str = tenant.as_ref().map_or("", |tenant| &tenant.function);
    let revision = tenant.as_ref().and_then(|tenant| tenant.revision.clone());
    let digest = tenant.as_ref().and_then(|tenant| {
        let loaded = tenant.handler.load();
        loaded.as_ref().map(|handler| handler.digest).or(tenant.pinned)
    });
    let method = request.method().as_str();
    let span = tracing::info_span!(
        target: traces::TARGET,
        "request",
        otel.name = method,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        url.path = request.uri().path(),
        url.scheme = "http",
        server.port = local_port(&request).0,
        network.protocol.version = version_name(request.version()),
        user_agent.original = request.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()),
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        faas.name = function,
        faas.version = revision.as_deref(),
        wasmless.module.digest = digest.map(tracing::field::display),
    );
    traces::continue_from(&span, request.headers());
    if let Some(ids) = traces::TraceIds::of(&span) {
        request.extensions_mut().insert(ids);
    }
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    // A server's span is in error for 5xx only: a 4xx is the client's.
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", status.as_str());
    }
    response
}

fn version_name(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// Counts the request under its Function's (and revision's) name.
async fn record_metrics(request: Request, next: Next) -> Response {
    let Some(metrics) = routed(&request).map(|tenant| tenant.metrics().clone()) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let in_flight = metrics.in_flight();
    let method = request.method().clone();
    let trace = request.extensions().get::<traces::TraceIds>().copied();
    let started = Instant::now();
    let response = next.run(request).await;
    // The duration is to the response's head, for a stream too, so that a stream held
    // open for minutes does not swamp the histogram; a stream stays in flight to its end.
    metrics.observe_request(&method, response.status().as_u16(), started.elapsed(), trace.as_ref());
    match response.extensions().get::<wasmless_host::handler::Streamed>().cloned() {
        Some(streamed) => stream_tail::follow(response, streamed, started, in_flight),
        None => response,
    }
}

/// The pool, once made (the admin port is up before it): its readiness and `/pool`.
pub type PoolSlot = Arc<std::sync::OnceLock<Arc<crate::pool::Pool>>>;

/// Readiness: true once a module is loaded, false again when shutdown starts.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// `/metrics`, `/healthz`, `/readyz`, and for a pool `/pool`: each Function's port and
/// state, so its writer (the operator) can tell when a Function is live in the pool.
pub fn admin_router(metrics: Arc<Metrics>, readiness: Readiness, pool: PoolSlot) -> Router {
    let pool_for_ready = pool.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || async move {
                // Off the async workers: a pool's thousand Functions' series, and the
                // kernel's walk of the process's memory (metrics/process_memory.rs), take
                // milliseconds that requests on this worker would wait for.
                let metrics = metrics.clone();
                let text = tokio::task::spawn_blocking(move || metrics.encode())
                    .await
                    .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked.into_panic()));
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                if pool_for_ready.get().is_some_and(|pool| !pool.table_read()) {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not ready: the pool's table has not been read whole yet\n",
                    )
                } else if readiness.get() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not ready: no module loaded, or shutting down\n",
                    )
                }
            }),
        )
        .route(
            "/pool",
            get(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                match pool.get() {
                    Some(pool) => axum::Json(pool_answer(pool.status(), peer.ip())).into_response(),
                    None => (StatusCode::NOT_FOUND, "not a pool: this runtime serves one Function\n").into_response(),
                }
            }),
        )
}

/// What `GET /pool` tells `peer`. The operator asks it only whether a Function listens on
/// its port before routing the Function to the pool, and that is all the network is told
/// (`{"functions": {"<name>": {"port": N, "listening": true}}}`): any pod of the cluster
/// reaches the admin port (Prometheus must), and so does a pooled handler through a
/// Function's Service, and neither should learn why a neighbour's entry or load failed
/// (those messages name Secrets and registries) or which neighbours are loaded. The
/// whole status goes to someone inside the pod (`kubectl port-forward`, `kubectl exec`),
/// whose peer is exactly 127.0.0.1 or ::1: not the rest of 127.0.0.0/8, whence a mesh's
/// sidecar relays everyone's requests (Istio's 127.0.0.6), and handlers cannot call the
/// admin port on loopback (`outbound::policy`). The failures are in the log as well.
fn pool_answer(
    functions: std::collections::BTreeMap<String, crate::pool::FunctionStatus>,
    peer: std::net::IpAddr,
) -> serde_json::Value {
    let peer = peer.to_canonical();
    if peer == std::net::Ipv4Addr::LOCALHOST || peer == std::net::Ipv6Addr::LOCALHOST {
        return serde_json::json!({ "functions": functions });
    }
    let listening: serde_json::Map<String, serde_json::Value> = functions
        .into_iter()
        .filter(|(_, status)| status.listening)
        .map(|(name, status)| (name, serde_json::json!({ "port": status.port, "listening": true })))
        .collect();
    serde_json::json!({ "functions": listening })
}
