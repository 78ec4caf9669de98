//! Components exporting `wasi:http/incoming-handler`, served through wasmtime-wasi-http.

use super::output::CapturedOutput;
use super::stream::{End, StreamEnd, Streamed};
use super::{Failure, MAX_HANDLER_OUTPUT, Shared, log_handler_output};
use crate::engine::arm_timeout;
use crate::limits::RequestLimiter;
use crate::request_memory::RequestShare;
use axum::body::Body;
use bytes::Bytes;
use http::{Response, header};
use http_body_util::{BodyExt, Full};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tracing::Instrument;
use wasmless_outbound::CallLog;
use wasmless_outbound::wasi_http::OutboundHooks;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::ProxyPre;
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, Scheme};
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

pub struct HttpHandler {
    pre: ProxyPre<HttpState>,
    shared: Arc<Shared>,
}

struct HttpState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: OutboundHooks,
    limiter: RequestLimiter,
}

impl WasiView for HttpState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HttpState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

impl HttpHandler {
    pub fn new(engine: &Engine, component: &Component, shared: Arc<Shared>) -> wasmtime::Result<Self> {
        let mut linker = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        let pre = ProxyPre::new(linker.instantiate_pre(component)?)?;
        Ok(Self { pre, shared })
    }

    /// A request's own store: its WASI context with captured output, its limits, its deadline.
    fn new_store(
        &self,
        stdout: &CapturedOutput,
        stderr: &CapturedOutput,
        log: Arc<CallLog>,
        share: Option<RequestShare>,
        deadline: Instant,
    ) -> Store<HttpState> {
        let wasi = WasiCtxBuilder::new()
            .args(&[self.shared.function.as_str()])
            .envs(&self.shared.env)
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        let state = HttpState {
            wasi,
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: OutboundHooks::new(self.shared.outbound.clone(), log, deadline),
            limiter: RequestLimiter::new(&self.shared.limits, share),
        };
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|state| &mut state.limiter);
        arm_timeout(&mut store, deadline);
        store
    }

    pub async fn invoke(
        &self,
        request: http::Request<Bytes>,
        permit: super::Permit,
    ) -> Result<Response<Body>, Failure> {
        let share = super::request_share(&request, &self.shared.limits);
        let stdout = CapturedOutput::new(MAX_HANDLER_OUTPUT, share.clone());
        let stderr = CapturedOutput::new(MAX_HANDLER_OUTPUT, share.clone());
        let deadline = Instant::now() + self.shared.limits.timeout;
        let mut store = self.new_store(&stdout, &stderr, super::call_log(&request), share, deadline);

        let (sender, receiver) = tokio::sync::oneshot::channel();
        let responded = Arc::new(AtomicBool::new(false));
        let respond = {
            let responded = responded.clone();
            move |response| {
                responded.store(true, Ordering::SeqCst);
                let _ = sender.send(response);
            }
        };
        let incoming = store
            .data_mut()
            .http()
            .new_incoming_request(Scheme::Http, with_host(request))
            .and_then(|incoming| {
                Ok((
                    incoming,
                    store.data_mut().http().new_response_outparam_from_callback(respond)?,
                ))
            });
        let (incoming, outparam) = incoming.map_err(|e| Failure::Trap(format!("{e:?}")))?;

        let pre = self.pre.clone();
        let shared = self.shared.clone();
        let end = StreamEnd::default();
        let ended = end.clone();
        let run = async move {
            let _permit = permit;
            let started = Instant::now();
            let handled = async {
                let proxy = super::instantiate_span(pre.instantiate_async(&mut store)).await?;
                shared.metrics.observe_instantiate(started.elapsed());
                proxy
                    .wasi_http_incoming_handler()
                    .call_handle(&mut store, incoming, outparam)
                    .await
            };
            // The epoch deadline stops a guest only while it computes: one asleep in a host
            // call (a `wasi:clocks` sleep, a wait on a stream) is stopped here, at its deadline.
            let handled = tokio::time::timeout_at(deadline.into(), handled).await;
            log_handler_output("stdout", &stdout.contents());
            log_handler_output("stderr", &stderr.contents());
            let result = match handled {
                Ok(result) => result.map_err(|error| Failure::classify(error, &store.data().limiter)),
                Err(_) => Err(Failure::Timeout),
            };
            ended.set(match &result {
                Ok(()) => End::Complete,
                Err(Failure::Timeout) => End::Timeout,
                Err(failure) => End::Failed(failure.kind()),
            });
            if let Err(failure) = &result
                && responded.load(Ordering::SeqCst)
            {
                // Headers are out: the client sees a cut body, the log and metrics see why.
                shared.metrics.count_trap(failure.kind());
                tracing::error!(target: wasmless_telemetry::TARGET, kind = failure.kind(), "failed after the response headers");
                tracing::error!(kind = failure.kind(), failure = ?failure, "handler failed after sending its response headers");
            }
            result
        }
        .in_current_span();

        let (answer, streamed) = first_answer(run, receiver).await?;
        response_of(answer, streamed.then_some(Streamed(end)))
    }
}

/// What the handler answers first, and whether its body goes on after it (`true`).
/// The handler runs here, on the connection's task, until it answers. Most finish in that
/// one go; only one still writing its body gets a task of its own. Spawning every request
/// instead wakes a parked worker thread each time, which costs more than the instance itself.
async fn first_answer(
    run: impl Future<Output = Result<(), Failure>> + Send + 'static,
    mut receiver: tokio::sync::oneshot::Receiver<Result<Response<HyperOutgoingBody>, ErrorCode>>,
) -> Result<(Result<Response<HyperOutgoingBody>, ErrorCode>, bool), Failure> {
    let mut run = Box::pin(run);
    tokio::select! {
        biased;
        finished = &mut run => match receiver.try_recv() {
            Ok(answer) => Ok((answer, false)),
            Err(_) => Err(without_response(finished)),
        },
        answer = &mut receiver => match answer {
            Ok(Ok(response)) => {
                tokio::spawn(run);
                Ok((Ok(response), true))
            }
            // An error code is the whole answer: no body follows it, and what the guest does
            // after it (were it to sleep past its deadline, a second failure counted) is
            // dropped with it.
            Ok(Err(code)) => Ok((Err(code), false)),
            // The handler dropped its response-outparam: its own result says why.
            Err(_) => Err(without_response(run.await)),
        },
    }
}

/// The response a handler set, marked `streamed` when its body goes on after the
/// handler's turn on the connection's task.
fn response_of(
    answer: Result<Response<HyperOutgoingBody>, ErrorCode>,
    streamed: Option<Streamed>,
) -> Result<Response<Body>, Failure> {
    match answer {
        Ok(response) => {
            let mut response = response.map(|body| {
                Body::new(body.map_err(|code| std::io::Error::other(format!("the handler's body failed: {code:?}"))))
            });
            if let Some(streamed) = streamed {
                response.extensions_mut().insert(streamed);
            }
            Ok(response)
        }
        Err(code) => Err(Failure::Trap(format!("the handler answered with error {code:?}"))),
    }
}

/// Why a handler that finished without setting its response failed.
fn without_response(finished: Result<(), Failure>) -> Failure {
    finished
        .err()
        .unwrap_or_else(|| Failure::BadResponse("the handler returned without setting a response".into()))
}

/// wasi:http needs an authority; HTTP/1.0 clients may send no Host.
fn with_host(
    request: http::Request<Bytes>,
) -> http::Request<impl http_body::Body<Data = Bytes, Error = wasmtime_wasi_http::Error> + Send + 'static> {
    let (mut parts, body) = request.into_parts();
    if !parts.headers.contains_key(header::HOST) && parts.uri.authority().is_none() {
        parts
            .headers
            .insert(header::HOST, http::HeaderValue::from_static("localhost"));
    }
    http::Request::from_parts(parts, Full::new(body).map_err(|never| match never {}))
}
