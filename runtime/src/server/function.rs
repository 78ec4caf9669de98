//! One request to a Function, as a chain of steps read top to bottom: a free slot, the
//! body (under the upload budget and its time limit), the permits, the body's share of the
//! pool's memory, the module, the handler. Each step returns the response it fails with,
//! so a client that uploads slowly holds no permit, and no step runs after one refused.

// Each step's `Err` is the response the request ends with, moved once per request: boxing
// it would buy nothing but an allocation on the refusal's path.
#![allow(clippy::result_large_err)]

use super::{FunctionState, local_port};
use crate::tenant::Tenant;
use crate::traces;
use axum::Extension;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{StatusCode, header};
use std::net::SocketAddr;
use std::sync::Arc;
use wasmless_host::handler::{Connection, Failure, LoadedHandler, Permit};
use wasmless_host::metrics::{Metrics, Refusal};
use wasmless_host::request_memory::{Refused, RequestShare};
use wasmless_outbound::CallLog;

pub(super) async fn serve_function(
    State(state): State<FunctionState>,
    ConnectInfo(remote): ConnectInfo<SocketAddr>,
    Extension(tenant): Extension<Arc<Tenant>>,
    request: Request,
) -> Response {
    match serve(&state, remote, &tenant, request).await {
        Ok(response) | Err(response) => response,
    }
}

async fn serve(
    state: &FunctionState,
    remote: SocketAddr,
    tenant: &Tenant,
    request: Request,
) -> Result<Response, Response> {
    // Every permit taken: say so before the client uploads anything.
    if tenant.permits.available_permits() == 0 {
        return Err(busy(tenant));
    }
    let local_port = local_port(&request).0;
    let (parts, body) = read_body(state, tenant, request).await?;
    let permit = take_permits(tenant)?;
    let share = take_body_share(tenant, body.len())
        .map_err(|refused| pool_memory_full(tenant, &Failure::SharedMemoryFull(refused.to_string())))?;
    let handler = load(tenant).await?;
    let mut request = http::Request::from_parts(parts, body);
    let calls = Arc::new(CallLog::default());
    request.extensions_mut().insert(calls.clone());
    if let Some(share) = share {
        request.extensions_mut().insert(share);
    }
    let mut response = invoke(tenant, &handler, request, Connection { remote, local_port }, permit).await;
    // For the log line: the calls made until the response's headers.
    response.extensions_mut().insert(calls);
    Ok(response)
}

/// The request's head and its whole body, read under the upload budget, the Function's
/// body limit and the read timeout.
async fn read_body(
    state: &FunctionState,
    tenant: &Tenant,
    request: Request,
) -> Result<(http::request::Parts, Bytes), Response> {
    let metrics = tenant.metrics();
    let limit = tenant.loader.limits().max_request_body;
    let too_large = || {
        refuse(metrics, Refusal::BodyTooLarge);
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
        return Err(too_large());
    }
    let (parts, body) = request.into_parts();
    if http_body::Body::is_end_stream(&body) {
        return Ok((parts, Bytes::new()));
    }
    let uploads = &state.uploads;
    let reserve = declared
        .map_or(limit as u64, |length| length.max(1))
        .min(u64::from(uploads.budget_bytes)) as u32;
    let Ok(_reserved) = uploads.budget.clone().try_acquire_many_owned(reserve) else {
        refuse(metrics, Refusal::UploadBudget);
        return Err(retry_later(
            "too busy: too many request bodies are being received at once; retry\n".into(),
        ));
    };
    let read = tracing::Instrument::instrument(
        axum::body::to_bytes(body, limit),
        tracing::info_span!(target: traces::TARGET, "read request body"),
    );
    match tokio::time::timeout(uploads.read_timeout, read).await {
        Ok(Ok(body)) => Ok((parts, body)),
        Ok(Err(error)) if is_length_limit(&error) => Err(too_large()),
        Ok(Err(error)) => Err((
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {error}\n"),
        )
            .into_response()),
        Err(_) => {
            refuse(metrics, Refusal::BodyTimeout);
            let seconds = uploads.read_timeout.as_secs_f64();
            Err((
                StatusCode::REQUEST_TIMEOUT,
                // The rest of the body is never read: the connection cannot be reused.
                [(header::CONNECTION, "close")],
                format!("the request body did not arrive within {seconds}s\n"),
            )
                .into_response())
        }
    }
}

/// The Function's permit, and in a pool the pool's.
fn take_permits(tenant: &Tenant) -> Result<Permit, Response> {
    let Ok(permit) = tenant.permits.clone().try_acquire_owned() else {
        return Err(busy(tenant));
    };
    let host_permit = match &tenant.host_permits {
        Some(host) => match host.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                refuse(tenant.metrics(), Refusal::Busy);
                return Err(retry_later(
                    "too busy: the pool serving this function is running as many requests as it can; retry\n".into(),
                ));
            }
        },
        None => None,
    };
    Ok(Permit::new(permit, host_permit))
}

/// The Function's handler, loaded now if it is not yet: in the pool a Function's first
/// request loads it, which is worth a span; the rest is not.
async fn load(tenant: &Tenant) -> Result<Arc<LoadedHandler>, Response> {
    let load = tenant.handler();
    let load = if tenant.handler.load().is_none() {
        tracing::Instrument::instrument(load, tracing::info_span!(target: traces::TARGET, "load module")).await
    } else {
        load.await
    };
    load.map_err(|error| {
        tracing::error!(%error, "cannot load the function's module; this request fails, and the next one tries again");
        retry_later("the function's module cannot be loaded now; retry (the runtime's log says why)\n".into())
    })
}

/// The handler's answer, or the response its failure gets.
async fn invoke(
    tenant: &Tenant,
    handler: &LoadedHandler,
    request: http::Request<Bytes>,
    connection: Connection,
    permit: Permit,
) -> Response {
    let span = tracing::info_span!(
        target: traces::TARGET,
        "handler",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let invoked = tracing::Instrument::instrument(handler.invoke(request, connection, permit), span.clone()).await;
    match invoked {
        Ok(response) => response,
        Err(failure @ Failure::SharedMemoryFull(_)) => {
            failure.record(&span);
            pool_memory_full(tenant, &failure)
        }
        Err(failure) => {
            failure.record(&span);
            tenant.metrics().count_trap(failure.kind());
            tracing::error!(kind = failure.kind(), failure = ?failure, "handler failed");
            (failure.status(), failure.public_message()).into_response()
        }
    }
}

/// A refusal: counted, and an event on the request's trace.
fn refuse(metrics: &Metrics, refusal: Refusal) {
    metrics.refuse(refusal);
    tracing::warn!(target: traces::TARGET, reason = refusal.reason(), "request refused");
}

/// In a pool, the body the handler is given is host memory held while it runs: it is
/// taken from the request's share of the pool's memory before the handler starts, as its
/// linear memory is while it runs, and given back with it when the request ends. `Err`:
/// a body that does not fit.
fn take_body_share(tenant: &Tenant, length: usize) -> Result<Option<RequestShare>, Refused> {
    let share = tenant.loader.limits().request_share();
    if let Some(share) = &share
        && !share.take(length)
    {
        return Err(Refused {
            what: "request body",
            bytes: length,
        });
    }
    Ok(share)
}

/// The pool's doing, not the handler's: a refusal, and the client may retry.
fn pool_memory_full(tenant: &Tenant, failure: &Failure) -> Response {
    refuse(tenant.metrics(), Refusal::PoolMemory);
    tracing::warn!(
        function = %tenant.function,
        failure = ?failure,
        "the pool's memory for requests is taken (--pool-request-memory, or this function's share of it): this request gets a 503"
    );
    retry_later(failure.public_message())
}

fn busy(tenant: &Tenant) -> Response {
    refuse(tenant.metrics(), Refusal::Busy);
    let limit = tenant.loader.limits().max_concurrency;
    retry_later(format!(
        "too busy: this function serves at most {limit} requests at once; retry\n"
    ))
}

/// A 503 that tells the client to come back in a second.
fn retry_later(message: String) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], message).into_response()
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
