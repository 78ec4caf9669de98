//! Outbound HTTP calls of handlers: denied unless the Function's allow-list names the
//! destination (`policy`), sent by one pooled HTTP/1.1 + HTTP/2 client per Function
//! whose connections are opened only to checked addresses (`connect`), with headers the
//! host adds from Secrets, a per-call timeout inside the request's own deadline, a cap on
//! response bodies and on calls at once. Guests reach it through the `wasmless` imports
//! (`guest`, Go and other WASI preview1 modules) or `wasi:http/outgoing-handler`
//! (`wasi_http`, components).

mod connect;
pub mod guest;
pub mod policy;
pub mod wasi_http;

use crate::metrics::Metrics;
use bytes::Bytes;
use connect::{ConnectError, GuardedConnector};
use http::{HeaderName, HeaderValue, Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use policy::{Destination, Pattern, Policy};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmless_formats::outbound::OutboundRequest;

/// Idle pooled connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// What the flags say about outbound calls.
#[derive(Debug, Clone)]
pub struct OutboundConfig {
    pub allow: Vec<String>,
    pub timeout: Duration,
    pub max_response_body: u64,
    pub max_concurrency: u32,
    /// `(url pattern, header name, value)`: the value read from the environment variable
    /// `--outbound-header` named, never from anything a guest can see.
    pub headers: Vec<(String, String, String)>,
    pub admin_port: u16,
    pub pod_ip: Option<IpAddr>,
}

/// Why the outbound flags cannot be used; the runtime does not start.
#[derive(Debug, thiserror::Error)]
pub enum OutboundConfigError {
    #[error(transparent)]
    Pattern(#[from] policy::BadPattern),
    #[error("--outbound-header for {url}: {name:?} is not a header name")]
    HeaderName { url: String, name: String },
    #[error("--outbound-header for {url}: the value of {name} is not a header value (a line break?)")]
    HeaderValue { url: String, name: String },
    #[error("--outbound-header {0:?}: write \"<url> <Header-Name> <ENV_VAR>\", the value in that environment variable")]
    HeaderSyntax(String),
    #[error("--outbound-header for {url}: the environment variable {variable} holding the value of {name} is not set")]
    HeaderMissing {
        url: String,
        name: String,
        variable: String,
    },
}

/// `"<url> <Header-Name> <ENV_VAR>"` with the value taken from the environment.
pub fn parse_injected_header(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(String, String, String), OutboundConfigError> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [url, name, variable] = fields[..] else {
        return Err(OutboundConfigError::HeaderSyntax(text.to_string()));
    };
    let value = lookup(variable).ok_or_else(|| OutboundConfigError::HeaderMissing {
        url: url.into(),
        name: name.into(),
        variable: variable.into(),
    })?;
    Ok((url.into(), name.into(), value))
}

/// A header the host adds to calls to one destination.
struct InjectedHeader {
    destination: Pattern,
    name: HeaderName,
    value: HeaderValue,
}

type PooledClient = Client<hyper_rustls::HttpsConnector<GuardedConnector>, Full<Bytes>>;

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
    metrics: Arc<Metrics>,
}

/// Why a call failed. The guest is told the kind ([`OutboundError::errno`]) and the text.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error(
        "wasmless: the call to {0} was denied: it is not in this Function's spec.outbound.allow (runtime flag --outbound-allow); add its scheme://host:port there"
    )]
    Denied(String),
    #[error("wasmless: the call to {authority} was refused: {why}")]
    Prohibited { authority: String, why: String },
    #[error("wasmless: the call to {0} timed out (spec.outbound.timeout, or the request's own timeout)")]
    Timeout(String),
    #[error("wasmless: {0}")]
    Dns(String),
    #[error("wasmless: {0}")]
    Connect(String),
    #[error("wasmless: TLS with {authority} failed: {why}")]
    Tls { authority: String, why: String },
    #[error("wasmless: the response from {authority} is over spec.outbound.maxResponseBody ({limit} bytes)")]
    TooLarge { authority: String, limit: u64 },
    #[error("wasmless: too many outbound calls at once: spec.outbound.maxConcurrency is {0}")]
    Limit(u32),
    #[error("wasmless: the outbound request is malformed: {0}")]
    BadRequest(String),
    #[error("wasmless: the call to {authority} failed: {why}")]
    Failed { authority: String, why: String },
    /// The request's own deadline passed while the call waited: the request ends (504).
    #[error("the request's timeout passed during an outbound call")]
    RequestTimeout,
}

impl OutboundError {
    /// The number the `wasmless` imports return; sdk/go/outbound maps each to a Go error.
    pub fn errno(&self) -> u32 {
        match self {
            Self::Denied(_) | Self::Prohibited { .. } => 1,
            Self::Timeout(_) | Self::RequestTimeout => 2,
            Self::Dns(_) => 3,
            Self::Connect(_) => 4,
            Self::Tls { .. } => 5,
            Self::TooLarge { .. } => 6,
            Self::Limit(_) => 7,
            Self::BadRequest(_) => 9,
            Self::Failed { .. } => 10,
        }
    }

    /// The `status` label: `denied` for what the policy refused, `error` for the rest.
    fn status_label(&self) -> &'static str {
        match self {
            Self::Denied(_) | Self::Prohibited { .. } => "denied",
            _ => "error",
        }
    }
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
    fn earliest(&self) -> Instant {
        self.call.min(self.request)
    }

    /// The error for a deadline that passed: the request's ends the request.
    fn passed(&self, authority: &str) -> OutboundError {
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
    pub fn new(config: &OutboundConfig, metrics: Arc<Metrics>) -> Result<Self, OutboundConfigError> {
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
            let tls = hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(rustls::crypto::aws_lc_rs::default_provider())
                .expect("aws-lc-rs supports the default protocol versions")
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
    pub fn denied(metrics: Arc<Metrics>) -> Self {
        let config = OutboundConfig {
            allow: Vec::new(),
            timeout: Duration::from_secs(5),
            max_response_body: 0,
            max_concurrency: 1,
            headers: Vec::new(),
            admin_port: 0,
            pod_ip: None,
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

    /// Sends `request` if the policy allows it, and waits for its response head.
    pub async fn send(
        &self,
        request: OutboundRequest,
        deadlines: Deadlines,
        log: Arc<CallLog>,
    ) -> Result<OpenResponse, OutboundError> {
        let started = Instant::now();
        let destination = Destination::of(&request.uri)
            .ok_or_else(|| OutboundError::BadRequest(format!("{} is not an http(s) URL", request.uri)))?;
        let authority = destination.authority();
        let Some(allowed) = self.policy.allows(&destination) else {
            let scheme = request.uri.scheme_str().unwrap_or("http");
            self.metrics.observe_outbound_denied(&destination.host);
            log.record(started.elapsed());
            return Err(OutboundError::Denied(format!("{scheme}://{authority}")));
        };
        let host_label = allowed.host_label(&destination);
        let result = self.exchange(request, &destination, deadlines, log.clone()).await;
        let elapsed = started.elapsed();
        log.record(elapsed);
        match &result {
            Ok(response) => self
                .metrics
                .observe_outbound(&host_label, &response.status.to_string(), elapsed),
            Err(error) => self
                .metrics
                .observe_outbound(&host_label, error.status_label(), elapsed),
        }
        result
    }

    async fn exchange(
        &self,
        request: OutboundRequest,
        destination: &Destination,
        deadlines: Deadlines,
        log: Arc<CallLog>,
    ) -> Result<OpenResponse, OutboundError> {
        let authority = destination.authority();
        let until = deadlines.earliest().into();
        let permit = match tokio::time::timeout_at(until, self.calls.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => return Err(OutboundError::Limit(self.max_concurrency)),
        };
        let request = self.prepare(request, destination)?;
        let Some(client) = &self.client else {
            return Err(OutboundError::Denied(authority));
        };
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
        })
    }

    /// The request as it leaves: the Host header from the URL (a guest does not pick
    /// another virtual host behind an allowed name), framing headers left to the client,
    /// and the host's own headers for this destination in place of any the guest set.
    fn prepare(
        &self,
        request: OutboundRequest,
        destination: &Destination,
    ) -> Result<Request<Full<Bytes>>, OutboundError> {
        let mut headers = request.headers;
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
        for injected in &self.headers {
            if injected.destination.matches(destination) {
                headers.insert(injected.name.clone(), injected.value.clone());
            }
        }
        let mut builder = Request::builder().method(request.method).uri(request.uri);
        if let Some(map) = builder.headers_mut() {
            *map = headers;
        }
        builder
            .body(Full::new(request.body))
            .map_err(|e| OutboundError::BadRequest(e.to_string()))
    }
}

/// Which kind of failure a client error is, by what it was caused by.
fn classify(authority: &str, error: &hyper_util::client::legacy::Error) -> OutboundError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(connect) = current.downcast_ref::<ConnectError>() {
            return match connect {
                ConnectError::Prohibited { .. } | ConnectError::NotAllowed(_) => OutboundError::Prohibited {
                    authority: authority.to_string(),
                    why: connect.to_string(),
                },
                ConnectError::Dns { .. } => OutboundError::Dns(connect.to_string()),
                ConnectError::Connect { .. } => OutboundError::Connect(connect.to_string()),
            };
        }
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return OutboundError::Tls {
                authority: authority.to_string(),
                why: tls.to_string(),
            };
        }
        source = current.source();
    }
    let why = error_chain(error);
    if why.contains("certificate") || why.contains("tls") || why.contains("TLS") {
        return OutboundError::Tls {
            authority: authority.to_string(),
            why,
        };
    }
    OutboundError::Failed {
        authority: authority.to_string(),
        why,
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(current) = source {
        text.push_str(": ");
        text.push_str(&current.to_string());
        source = current.source();
    }
    text
}
