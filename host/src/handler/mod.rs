//! A loaded module, ready to serve: the pre-instantiated handler for its ABI, and what
//! one invocation returns.

mod cgi;
mod failure;
mod http;
mod output;
mod reactor;
mod store;
mod stream;

// The parsers of a guest's response: bytes we did not write, fuzzed in their own crate.
pub use failure::Failure;
pub use stream::{End, Streamed};
pub use wasmless_formats::{cgi_response, reactor_response};

use crate::abi::Abi;
use crate::code_cost::CodeCost;
use crate::compile::Compiled;
use crate::limits::{Isolation, RequestLimits};
use crate::mapped_text::MappedText;
use crate::metrics::Metrics;
use crate::precompiled::Residence;
use crate::request_memory::RequestShare;
use axum::body::Body;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use wasmless_artifact::Digest;
use wasmless_outbound::{CallLog, Outbound};
use wasmtime::Engine;

/// Output a handler may write to stdout or stderr per request before writes fail.
const MAX_HANDLER_OUTPUT: usize = 16 << 20;
/// Handler stderr kept for the log per request.
const MAX_LOGGED_STDERR: usize = 64 << 10;

/// What every request's store is built from.
#[derive(Clone)]
pub struct Shared {
    pub limits: RequestLimits,
    pub env: Vec<(String, String)>,
    pub metrics: Arc<Metrics>,
    pub function: String,
    pub outbound: Arc<Outbound>,
    /// The module's files, the guest's read-only `/`; `None`: nothing preopened.
    pub files: Option<Arc<crate::guest_root::GuestRoot>>,
}

/// The log of a request's outbound calls, which the server puts in its extensions (a
/// request from elsewhere, a test's, gets one of its own).
fn call_log<B>(request: &::http::Request<B>) -> Arc<CallLog> {
    request.extensions().get::<Arc<CallLog>>().cloned().unwrap_or_default()
}

/// The request's share of the pool's memory: the one the server took its body from
/// (in its extensions), or a new one (a request from elsewhere, a test's).
fn request_share<B>(request: &::http::Request<B>, limits: &RequestLimits) -> Option<RequestShare> {
    match request.extensions().get::<RequestShare>() {
        Some(share) => Some(share.clone()),
        None => limits.request_share(),
    }
}

/// What a request holds while its instance lives: its Function's concurrency permit and,
/// in the pool, one of the pool's, whose instance slots all Functions share.
pub struct Permit {
    _function: tokio::sync::OwnedSemaphorePermit,
    _host: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Permit {
    pub fn new(function: tokio::sync::OwnedSemaphorePermit, host: Option<tokio::sync::OwnedSemaphorePermit>) -> Self {
        Self {
            _function: function,
            _host: host,
        }
    }
}

impl From<tokio::sync::OwnedSemaphorePermit> for Permit {
    fn from(function: tokio::sync::OwnedSemaphorePermit) -> Self {
        Self::new(function, None)
    }
}

/// Facts about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    pub remote: SocketAddr,
    pub local_port: u16,
}

/// A module compiled and linked once, instantiated afresh for each request (or, for a Go
/// reactor with `--isolation shared`, for each instance of a small pool).
pub struct LoadedHandler {
    pub digest: Digest,
    pub abi: Abi,
    /// What holding this module's code costs, which the pool's budgets count.
    pub code: CodeCost,
    /// Its text, where it is mapped from a file: what an idle Function can let go of.
    mapped_text: Option<MappedText>,
    kind: Kind,
}

enum Kind {
    Http(http::HttpHandler),
    Cgi(cgi::CgiHandler),
    Reactor(reactor::ReactorHandler),
}

impl LoadedHandler {
    /// Crate-private: `residence` must say where wasmtime put `compiled`'s code, as the
    /// loader knows it; code said to be mapped from a file may be released while idle
    /// ([`MappedText`]), which would zero code in the process's own memory.
    pub(crate) fn new(
        engine: &Engine,
        compiled: Compiled,
        abi: Abi,
        residence: Residence,
        digest: Digest,
        shared: Arc<Shared>,
    ) -> wasmtime::Result<Self> {
        if shared.limits.isolation == Isolation::Shared && abi != Abi::GoReactor {
            // A command's instance ends with its `_start`, and nothing here reuses a
            // component's; a fresh instance shares less than asked, never more.
            tracing::warn!(
                abi = abi.name(),
                "--isolation shared applies to Go reactors only: this module gets a fresh instance per request"
            );
        }
        let image = match &compiled {
            Compiled::Component(component) => component.image_range(),
            Compiled::Module(module) => module.image_range(),
        };
        let code = CodeCost::of(image.end.addr() - image.start.addr(), residence);
        let mapped_text = match residence {
            // SAFETY: these residences are code wasmtime mapped from a file.
            Residence::Mapped { .. } | Residence::Stored { .. } => unsafe { MappedText::of(&compiled) },
            Residence::Copied => None,
        };
        let kind = match compiled {
            Compiled::Component(component) => Kind::Http(http::HttpHandler::new(engine, &component, shared)?),
            Compiled::Module(module) if abi == Abi::GoReactor => {
                Kind::Reactor(reactor::ReactorHandler::new(engine, &module, shared)?)
            }
            Compiled::Module(module) => Kind::Cgi(cgi::CgiHandler::new(engine, &module, shared)?),
        };
        Ok(Self {
            digest,
            abi,
            code,
            mapped_text,
            kind,
        })
    }

    /// Lets go of this process's page-table entries for the module's text, if it is mapped
    /// from a file (see [`MappedText`]); the bytes of text that covered, 0 if none.
    pub fn release_mapped_text(&self) -> std::io::Result<usize> {
        match &self.mapped_text {
            Some(text) => text.release().map(|()| text.len()),
            None => Ok(0),
        }
    }

    /// Runs one request in a fresh instance (or a kept one: `--isolation shared`). The permit is held until the instance is
    /// gone, which for a streamed component response is after the last body byte.
    pub async fn invoke(
        &self,
        request: ::http::Request<Bytes>,
        connection: Connection,
        permit: Permit,
    ) -> Result<::http::Response<Body>, Failure> {
        match &self.kind {
            Kind::Http(handler) => handler.invoke(request, permit).await,
            Kind::Cgi(handler) => {
                let response = handler.invoke(request, connection).await;
                drop(permit);
                response
            }
            Kind::Reactor(handler) => handler.invoke(request, connection, permit).await,
        }
    }
}

/// Instantiation, as a span of the request's trace (the handler's own run is the rest of
/// its parent span).
fn instantiate_span<F: Future>(instantiate: F) -> tracing::instrument::Instrumented<F> {
    tracing::Instrument::instrument(
        instantiate,
        tracing::info_span!(target: wasmless_telemetry::TARGET, "instantiate"),
    )
}

/// Logs what a handler wrote to stderr (and, for components, stdout), a line per
/// event, so it is not lost.
fn log_handler_output(stream: &'static str, output: &[u8]) {
    if output.is_empty() {
        return;
    }
    let shown = &output[..output.len().min(MAX_LOGGED_STDERR)];
    let text = String::from_utf8_lossy(shown);
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        tracing::warn!(target: "wasmless::handler", stream, "{line}");
    }
    if output.len() > shown.len() {
        tracing::warn!(target: "wasmless::handler", stream, omitted_bytes = output.len() - shown.len(), "handler output truncated in the log");
    }
}
