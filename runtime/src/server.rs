//! The two HTTP servers: the function's port and the admin port, their routers and
//! layers, and graceful shutdown.

use crate::handler::{Connection, LoadedHandler};
use crate::loader::Loader;
use crate::metrics::{Metrics, Refusal};
use crate::outbound::CallLog;
use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
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
    uploads: Arc<Uploads>,
    local_port: u16,
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
    pub fn new(
        handler: LoadedHandler,
        loader: Arc<Loader>,
        metrics: Arc<Metrics>,
        function: &str,
        local_port: u16,
        uploads: Uploads,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(loader.limits().max_concurrency as usize));
        Self {
            handler: Arc::new(ArcSwap::from_pointee(handler)),
            loader,
            metrics,
            function: function.into(),
            permits,
            uploads: Arc::new(uploads),
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
        )
        .with_state(state)
}

async fn record_metrics(State(state): State<FunctionState>, request: Request, next: Next) -> Response {
    let _in_flight = state.metrics.in_flight();
    let method = request.method().clone();
    let started = Instant::now();
    let response = next.run(request).await;
    state
        .metrics
        .observe_request(&method, response.status().as_u16(), started.elapsed());
    response
}

/// The body first (under the upload budget and its time limit), then a concurrency
/// permit for the handler alone: a client that uploads slowly holds no permit.
async fn serve_function(
    State(state): State<FunctionState>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    // Every permit taken: say so before the client uploads anything.
    if state.permits.available_permits() == 0 {
        return busy(&state);
    }
    let limit = state.loader.limits().max_request_body;
    let too_large = || {
        state.metrics.refuse(Refusal::BodyTooLarge);
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
    let body = if http_body::Body::is_end_stream(&body) {
        Bytes::new()
    } else {
        let uploads = &state.uploads;
        let reserve = declared
            .map_or(limit as u64, |length| length.max(1))
            .min(u64::from(uploads.budget_bytes)) as u32;
        let Ok(_reserved) = uploads.budget.clone().try_acquire_many_owned(reserve) else {
            state.metrics.refuse(Refusal::UploadBudget);
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                "too busy: too many request bodies are being received at once; retry\n",
            )
                .into_response();
        };
        match tokio::time::timeout(uploads.read_timeout, axum::body::to_bytes(body, limit)).await {
            Ok(Ok(body)) => body,
            Ok(Err(error)) if is_length_limit(&error) => return too_large(),
            Ok(Err(error)) => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the request body: {error}\n"),
                )
                    .into_response();
            }
            Err(_) => {
                state.metrics.refuse(Refusal::BodyTimeout);
                let seconds = uploads.read_timeout.as_secs_f64();
                return (
                    StatusCode::REQUEST_TIMEOUT,
                    // The rest of the body is never read: the connection cannot be reused.
                    [(header::CONNECTION, "close")],
                    format!("the request body did not arrive within {seconds}s\n"),
                )
                    .into_response();
            }
        }
    };
    let Ok(permit) = state.permits.clone().try_acquire_owned() else {
        return busy(&state);
    };

    let handler = state.handler.load_full();
    let connection = Connection {
        remote,
        local_port: state.local_port,
    };
    let calls = Arc::new(CallLog::default());
    let mut request = http::Request::from_parts(parts, body);
    request.extensions_mut().insert(calls.clone());
    let mut response = match handler.invoke(request, connection, permit).await {
        Ok(response) => response,
        Err(failure) => {
            state.metrics.count_trap(failure.kind());
            tracing::error!(kind = failure.kind(), failure = ?failure, "handler failed");
            (failure.status(), failure.public_message()).into_response()
        }
    };
    // For the log line: the calls made until the response's headers.
    response.extensions_mut().insert(calls);
    response
}

fn busy(state: &FunctionState) -> Response {
    state.metrics.refuse(Refusal::Busy);
    let limit = state.loader.limits().max_concurrency;
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        format!("too busy: this function serves at most {limit} requests at once; retry\n"),
    )
        .into_response()
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
