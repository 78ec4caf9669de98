//! The two HTTP servers: the function's port and the admin port, their routers and
//! layers, and graceful shutdown.

use crate::handler::{Connection, LoadedHandler};
use crate::loader::Loader;
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
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

/// What every request of the function's port shares.
#[derive(Clone)]
pub struct FunctionState {
    pub handler: Arc<ArcSwap<LoadedHandler>>,
    pub loader: Arc<Loader>,
    pub metrics: Arc<Metrics>,
    pub function: Arc<str>,
    permits: Arc<Semaphore>,
    local_port: u16,
}

impl FunctionState {
    pub fn new(
        handler: LoadedHandler,
        loader: Arc<Loader>,
        metrics: Arc<Metrics>,
        function: &str,
        local_port: u16,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(loader.limits().max_concurrency as usize));
        Self {
            handler: Arc::new(ArcSwap::from_pointee(handler)),
            loader,
            metrics,
            function: function.into(),
            permits,
            local_port,
        }
    }
}

/// Every path and method goes to the handler. Outermost first: one log line per
/// request, then the request metrics.
pub fn function_router(state: FunctionState) -> Router {
    let span_state = state.clone();
    Router::new()
        .fallback(serve_function)
        .layer(middleware::from_fn_with_state(state.clone(), record_metrics))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(move |request: &Request| {
                    tracing::info_span!(
                        "request",
                        function = %span_state.function,
                        method = %request.method(),
                        path = %request.uri().path(),
                        digest = %span_state.handler.load().digest,
                    )
                })
                .on_request(())
                .on_response(|response: &Response, latency: Duration, _span: &Span| {
                    tracing::info!(
                        status = response.status().as_u16(),
                        latency_ms = latency.as_secs_f64() * 1000.0,
                        "request"
                    );
                })
                .on_failure(()),
        )
        .with_state(state)
}

async fn record_metrics(State(state): State<FunctionState>, request: Request, next: Next) -> Response {
    let _in_flight = state.metrics.in_flight();
    let method = request.method().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    state
        .metrics
        .observe_request(&method, response.status().as_u16(), started.elapsed());
    response
}

async fn serve_function(
    State(state): State<FunctionState>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let Ok(permit) = state.permits.clone().try_acquire_owned() else {
        let limit = state.loader.limits().max_concurrency;
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            format!("too busy: this function serves at most {limit} requests at once; retry\n"),
        )
            .into_response();
    };
    let limit = state.loader.limits().max_request_body;
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over this function's {limit}-byte limit\n"),
        )
            .into_response()
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(body) => body,
        Err(error) if is_length_limit(&error) => return too_large(),
        Err(error) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {error}\n"),
            )
                .into_response();
        }
    };

    let handler = state.handler.load_full();
    let connection = Connection {
        remote,
        local_port: state.local_port,
    };
    match handler
        .invoke(http::Request::from_parts(parts, body), connection, permit)
        .await
    {
        Ok(response) => response,
        Err(failure) => {
            state.metrics.count_trap(failure.kind());
            tracing::error!(kind = failure.kind(), failure = ?failure, "handler failed");
            (failure.status(), failure.public_message()).into_response()
        }
    }
}

fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if current.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = current.source();
    }
    false
}

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

pub fn admin_router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.encode(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                if readiness.get() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not ready: no module loaded, or shutting down\n",
                    )
                }
            }),
        )
}
