//! Outbound HTTP calls of handlers: denied unless the Function's allow-list names the
//! destination (`policy`), sent by one pooled HTTP/1.1 + HTTP/2 client per Function
//! whose connections are opened only to checked addresses (`connect`), with headers the
//! host adds from Secrets, a per-call timeout inside the request's own deadline (body
//! upload included), a cap on response bodies and on calls at once, request bodies that
//! stream. Guests reach it through the runtime's `wasmless` imports (Go and other WASI
//! preview1 modules) or `wasi:http/outgoing-handler` ([`wasi_http`], components).
//!
//! A crate of its own, as Spin keeps outbound HTTP a factor: it knows nothing of the
//! runtime but what it is given, a configuration and a [`CallMetrics`] to count calls in.

mod body;
mod config;
mod connect;
mod error;
pub mod policy;
pub mod wasi_http;

pub use body::{ChannelBody, ClientBody, Piece, body_channel, empty_body};
pub use config::{ALLOW_INSECURE, OutboundConfig, OutboundConfigError, parse_injected_header, read_ca_file};
pub use error::OutboundError;
use error::classify;

use bytes::Bytes;
use connect::GuardedConnector;
use http::{HeaderName, HeaderValue, Request, Uri, header};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use policy::{Destination, Pattern, Policy};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmless_telemetry::TARGET;

/// Idle pooled connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A header the host adds to calls to one destination.
struct InjectedHeader {
    destination: Pattern,
    name: HeaderName,
    value: HeaderValue,
}

type PooledClient = Client<hyper_rustls::HttpsConnector<GuardedConnector>, ClientBody>;

/// One Function's outbound calls.
pub struct Outbound {
    policy: Arc<Policy>,
    /// None without an allow-list.
    client: Option<PooledClient>,
    timeout: Duration,
    max_response_body: u64,
    calls: Arc<Semaphore>,
    max_concurrency: u32,
    headers: Vec<InjectedHeader>,
    metrics: Arc<dyn CallMetrics>,
}

/// Where a Function's outbound calls are counted (the runtime's metrics).
pub trait CallMetrics: Send + Sync {
    /// A call that reached `host` (its label: an allow-list entry's host) and ended with
    /// `status` (the response's code, or the error's label) after `elapsed`.
    fn observe_outbound(&self, host: &str, status: &str, elapsed: Duration);
    /// A call to `host` that the allow-list denied.
    fn observe_outbound_denied(&self, host: &str);
}

/// Outbound calls of one request, for its log line.
#[derive(Debug, Default)]
pub struct CallLog {
    calls: AtomicU32,
    micros: AtomicU64,
}

impl CallLog {
    fn record(&self, elapsed: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.add_time(elapsed);
    }

    fn add_time(&self, elapsed: Duration) {
        self.micros
            .fetch_add(elapsed.as_micros().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }

    pub fn millis(&self) -> f64 {
        self.micros.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

/// What a call is bounded by: its own deadline and the request's.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    pub call: Instant,
    pub request: Instant,
}

impl Deadlines {
    pub fn earliest(&self) -> Instant {
        self.call.min(self.request)
    }

    /// The error for a deadline that passed: the request's ends the request.
    pub fn passed(&self, authority: &str) -> OutboundError {
        if self.request <= self.call {
            OutboundError::RequestTimeout
        } else {
            OutboundError::Timeout(authority.to_string())
        }
    }
}

/// A response whose head has arrived; its body is read as the guest asks for it.
pub struct OpenResponse {
    pub status: u16,
    pub headers: http::HeaderMap,
    body: hyper::body::Incoming,
    deadlines: Deadlines,
    authority: String,
    remaining: u64,
    limit: u64,
    log: Arc<CallLog>,
    _permit: OwnedSemaphorePermit,
    /// The call's span ends with its response, read or dropped.
    _span: tracing::Span,
}

impl OpenResponse {
    /// The next piece of the body; `None` at its end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, OutboundError> {
        let started = Instant::now();
        let frame = loop {
            let frame = tokio::time::timeout_at(self.deadlines.earliest().into(), self.body.frame()).await;
            match frame {
                Err(_) => return Err(self.deadlines.passed(&self.authority)),
                Ok(None) => break None,
                Ok(Some(Err(error))) => {
                    return Err(OutboundError::Failed {
                        authority: self.authority.clone(),
                        why: format!("the response body was cut off: {error}"),
                    });
                }
                Ok(Some(Ok(frame))) => {
                    // Trailers are dropped: neither guest ABI reads them.
                    if let Ok(data) = frame.into_data() {
                        break Some(data);
                    }
                }
            }
        };
        self.log.add_time(started.elapsed());
        let Some(data) = frame else { return Ok(None) };
        self.remaining = match self.remaining.checked_sub(data.len() as u64) {
            Some(remaining) => remaining,
            None => {
                return Err(OutboundError::TooLarge {
                    authority: self.authority.clone(),
                    limit: self.limit,
                });
            }
        };
        Ok(Some(data))
    }
}

impl Outbound {
    pub fn new(config: &OutboundConfig, metrics: Arc<dyn CallMetrics>) -> Result<Self, OutboundConfigError> {
        let allow = config
            .allow
            .iter()
            .map(|text| Pattern::parse(text))
            .collect::<Result<Vec<_>, _>>()?;
        let headers = config
            .headers
            .iter()
            .map(|(url, name, value)| {
                Ok(InjectedHeader {
                    destination: Pattern::parse(url)?,
                    name: HeaderName::try_from(name.as_str()).map_err(|_| OutboundConfigError::HeaderName {
                        url: url.clone(),
                        name: name.clone(),
                    })?,
                    value: HeaderValue::try_from(value.as_str())
                        .map(|mut value| {
                            value.set_sensitive(true);
                            value
                        })
                        .map_err(|_| OutboundConfigError::HeaderValue {
                            url: url.clone(),
                            name: name.clone(),
                        })?,
                })
            })
            .collect::<Result<Vec<_>, OutboundConfigError>>()?;
        let policy = Arc::new(Policy::new(allow, config.admin_port, config.pod_ip));
        // No allow-list, no client: every call is denied before it would be needed, and a
        // new pod does not spend its start-up loading TLS roots it never uses.
        let client = (!policy.is_empty()).then(|| {
            // Mozilla's roots, and the operator's own CAs (read and checked at start).
            let mut roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            for certificate in &config.extra_roots {
                let _ = roots.add(certificate.clone());
            }
            let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            let tls = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls)
                .https_or_http()
                .enable_all_versions()
                .wrap_connector(GuardedConnector::new(policy.clone()));
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .build(tls)
        });
        let max_concurrency = config.max_concurrency.max(1);
        Ok(Self {
            policy,
            client,
            timeout: config.timeout,
            max_response_body: config.max_response_body,
            calls: Arc::new(Semaphore::new(max_concurrency as usize)),
            max_concurrency,
            headers,
            metrics,
        })
    }

    /// No outbound calls at all: what a Function without `spec.outbound` gets.
    pub fn denied(metrics: Arc<dyn CallMetrics>) -> Self {
        let config = OutboundConfig {
            allow: Vec::new(),
            timeout: Duration::from_secs(5),
            max_response_body: 0,
            max_concurrency: 1,
            headers: Vec::new(),
            admin_port: 0,
            pod_ip: None,
            extra_roots: Vec::new(),
        };
        Self::new(&config, metrics).expect("an empty policy is valid")
    }

    /// The deadlines of a call the guest wants done within `guest_timeout` (none: zero).
    pub fn deadlines(&self, request_deadline: Instant, guest_timeout: Option<Duration>) -> Deadlines {
        let timeout = guest_timeout.map_or(self.timeout, |guest| guest.min(self.timeout));
        Deadlines {
            call: Instant::now() + timeout,
            request: request_deadline,
        }
    }

    /// Checks `uri` against the policy and takes one of the Function's call slots, waiting
    /// for one within the call's deadline: what happens before a request leaves, so a
    /// guest learns of a refusal before it streams a body.
    pub async fn admit(&self, uri: &Uri, deadlines: Deadlines, log: &CallLog) -> Result<Admitted, OutboundError> {
        let started = Instant::now();
        // The call's span (a child of the handler's), from here to the end of its response.
        let span = tracing::info_span!(
            target: TARGET,
            "outbound",
            otel.name = tracing::field::Empty,
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            http.request.method = tracing::field::Empty,
            // Without the query, which may carry secrets.
            url.full = %format_args!("{}://{}{}", uri.scheme_str().unwrap_or("http"), uri.authority().map_or("", |a| a.as_str()), uri.path()),
            server.address = uri.host(),
            server.port = uri.port_u16(),
            http.response.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let failed = |error: OutboundError| {
            record_call_failure(&span, &error);
            error
        };
        let destination = Destination::of(uri)
            .ok_or_else(|| failed(OutboundError::BadRequest(format!("{uri} is not an http(s) URL"))))?;
        let authority = destination.authority();
        let allowed = match (self.policy.allows(&destination), &self.client) {
            (Some(allowed), Some(_)) => allowed,
            _ => {
                let scheme = uri.scheme_str().unwrap_or("http");
                self.metrics.observe_outbound_denied(&destination.host);
                log.record(started.elapsed());
                return Err(failed(OutboundError::Denied(format!("{scheme}://{authority}"))));
            }
        };
        let host_label = allowed.host_label(&destination);
        // More calls than the cap wait for a slot, as a pooled client's requests wait for
        // a connection: a burst is smoothed, not failed. Only a call whose deadline passes
        // while it waits fails, with the limit named. A wait is a span of its own.
        let acquired = match self.calls.clone().try_acquire_owned() {
            Ok(permit) => Ok(Ok(permit)),
            Err(_) => {
                let wait = tracing::info_span!(target: TARGET, parent: &span, "wait for outbound slot");
                let acquire = tracing::Instrument::instrument(self.calls.clone().acquire_owned(), wait);
                tokio::time::timeout_at(deadlines.earliest().into(), acquire).await
            }
        };
        let permit = match acquired {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => {
                let elapsed = started.elapsed();
                log.record(elapsed);
                self.metrics.observe_outbound(&host_label, "error", elapsed);
                return Err(failed(if deadlines.request <= deadlines.call {
                    OutboundError::RequestTimeout
                } else {
                    OutboundError::Limit {
                        authority,
                        limit: self.max_concurrency,
                        waited_ms: elapsed.as_millis(),
                    }
                }));
            }
        };
        Ok(Admitted {
            destination,
            host_label,
            permit,
            started,
            span,
        })
    }

    /// Sends an admitted request and waits for its response head; its body (if any) is
    /// read as the request goes, within the same deadlines.
    pub async fn send(
        &self,
        admitted: Admitted,
        request: Request<ClientBody>,
        deadlines: Deadlines,
        log: Arc<CallLog>,
    ) -> Result<OpenResponse, OutboundError> {
        let Admitted {
            destination,
            host_label,
            permit,
            started,
            span,
        } = admitted;
        let method = request.method().as_str();
        span.record("otel.name", method);
        span.record("http.request.method", method);
        let result = self
            .exchange(request, &destination, permit, deadlines, log.clone(), &span)
            .await;
        let elapsed = started.elapsed();
        log.record(elapsed);
        match &result {
            Ok(response) => {
                self.metrics
                    .observe_outbound(&host_label, &response.status.to_string(), elapsed);
                span.record("http.response.status_code", response.status);
                // A client's span is in error for any 4xx or 5xx.
                if response.status >= 400 {
                    span.record("otel.status_code", "ERROR");
                    span.record("error.type", tracing::field::display(response.status));
                }
            }
            Err(error) => {
                self.metrics
                    .observe_outbound(&host_label, error.status_label(), elapsed);
                record_call_failure(&span, error);
            }
        }
        result
    }

    async fn exchange(
        &self,
        request: Request<ClientBody>,
        destination: &Destination,
        permit: OwnedSemaphorePermit,
        deadlines: Deadlines,
        log: Arc<CallLog>,
        span: &tracing::Span,
    ) -> Result<OpenResponse, OutboundError> {
        let authority = destination.authority();
        let mut request = self.prepare(request, destination);
        // The host propagates the trace: handlers need no code of their own for it.
        wasmless_telemetry::inject(span, request.headers_mut());
        let Some(client) = &self.client else {
            return Err(OutboundError::Denied(authority));
        };
        let until = deadlines.earliest().into();
        let response = match tokio::time::timeout_at(until, client.request(request)).await {
            Err(_) => return Err(deadlines.passed(&authority)),
            Ok(Err(error)) => return Err(classify(&authority, &error)),
            Ok(Ok(response)) => response,
        };
        let (parts, body) = response.into_parts();
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|length| length > self.max_response_body) {
            return Err(OutboundError::TooLarge {
                authority,
                limit: self.max_response_body,
            });
        }
        Ok(OpenResponse {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
            deadlines,
            authority,
            remaining: self.max_response_body,
            limit: self.max_response_body,
            log,
            _permit: permit,
            _span: span.clone(),
        })
    }

    /// The request as it leaves: the Host header from the URL (a guest does not pick
    /// another virtual host behind an allowed name), framing headers left to the client
    /// but for a Content-Length the body is held to, and the host's own headers for this
    /// destination in place of any the guest set.
    fn prepare(&self, request: Request<ClientBody>, destination: &Destination) -> Request<ClientBody> {
        let (mut parts, body) = request.into_parts();
        let headers = &mut parts.headers;
        let length = wasmless_formats::outbound::content_length(headers).ok().flatten();
        for name in [
            header::HOST,
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::CONNECTION,
            header::UPGRADE,
            HeaderName::from_static("keep-alive"),
            HeaderName::from_static("proxy-connection"),
        ] {
            headers.remove(name);
        }
        if let Some(length) = length {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        }
        for injected in &self.headers {
            if injected.destination.matches(destination) {
                headers.insert(injected.name.clone(), injected.value.clone());
            }
        }
        Request::from_parts(parts, body)
    }
}

/// A call the policy allowed, holding one of the Function's call slots.
pub struct Admitted {
    destination: Destination,
    host_label: String,
    permit: OwnedSemaphorePermit,
    started: Instant,
    span: tracing::Span,
}

/// Marks a call's span failed, with the error the guest is told.
fn record_call_failure(span: &tracing::Span, error: &OutboundError) {
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", tracing::field::display(error));
    span.record("error.type", error.status_label());
}
