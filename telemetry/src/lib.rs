//! Wasmless's traces over OTLP/HTTP (protobuf), shared by the runtime (a trace per
//! request) and the operator (a trace per apply), off unless an endpoint is given: `--otlp-endpoint`
//! (`WASMLESS_OTLP_ENDPOINT`), or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT`. The SDK honours the other standard variables itself
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, ...).
//!
//! Spans are `tracing` spans of target [`TARGET`], turned into OpenTelemetry spans by
//! `tracing-opentelemetry`; the JSON log never shows them, and they exist (at the cost of
//! a disabled callsite) only when tracing is on. Ended spans go to a bounded queue that a
//! request never waits on: when it is full, or an export fails (the collector is down),
//! spans are dropped and counted (`wasmless_trace_spans_dropped_total`), and the count
//! is logged at most every [`DROP_LOG_INTERVAL`]. After a failed export no spans are made
//! for [`PAUSE_AFTER_FAILURE`] (they count as dropped), so a dead collector costs
//! requests nothing.

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter as _, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of the trace spans and span events made with `tracing`: what the
/// OpenTelemetry layer takes, and the log leaves out.
pub const TARGET: &str = "wasmless::trace";

/// Spans waiting for export; past this they are dropped. OpenTelemetry's default for
/// `OTEL_BSP_MAX_QUEUE_SIZE`: about 2 MiB of spans at most, which a collector that is down
/// fills within the first export's wait.
const DEFAULT_QUEUE: usize = 2048;
/// Spans in one export request.
const MAX_BATCH: usize = 512;
/// How long a span may wait for a batch to fill before it is sent anyway.
const DEFAULT_BATCH_DELAY: Duration = Duration::from_secs(1);
/// One export (connect, send, answer) may take this long; spans queue behind it
/// meanwhile, and are dropped once the queue is full.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed export, spans are not made for this long (each that would have been is
/// counted dropped); then the next ones are sent at once to see if the collector is back.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// Dropped spans are logged as one line with their count, at most this often.
pub const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// What `shutdown` waits for the last spans to be sent.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

static ENABLED: AtomicBool = AtomicBool::new(false);
/// The collector failed the last export: spans are not made until the pause is over.
/// Making a span is most of what tracing costs a request, so with the collector down a
/// request costs what it does with tracing off.
static PAUSED: AtomicBool = AtomicBool::new(false);

/// Whether spans are being exported (set once, at start).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether spans are being exported now: tracing is on and the collector is not failing
/// (after a failed export, no spans are made for a while).
pub fn paused() -> bool {
    PAUSED.load(Ordering::Relaxed)
}

/// Spans dropped since the process started: one counter for the process, as the
/// exporter is one (the metrics register it in every registry).
pub fn spans_dropped() -> &'static Counter {
    static DROPPED: LazyLock<Counter> = LazyLock::new(Counter::default);
    &DROPPED
}

#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error("--otlp-endpoint {0:?} is not an http:// or https:// URL")]
    Endpoint(String),
    #[error("cannot make the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Where spans go, if anywhere: the flag (a base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT`:
/// `/v1/traces` is appended), else the standard variables (read by the exporter).
/// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn tracing off whatever is set.
fn destination(
    flag: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Option<String>>, TracesError> {
    let set = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none")
    {
        return Ok(None);
    }
    if let Some(flag) = flag.map(str::trim).filter(|flag| !flag.is_empty()) {
        if !(flag.starts_with("http://") || flag.starts_with("https://")) || flag.parse::<http::Uri>().is_err() {
            return Err(TracesError::Endpoint(flag.to_string()));
        }
        return Ok(Some(Some(format!("{}/v1/traces", flag.trim_end_matches('/')))));
    }
    if set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some() || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        return Ok(Some(None));
    }
    Ok(None)
}

/// The running exporter: its tracer for the `tracing` layer, and what stops it.
pub struct Traces {
    provider: SdkTracerProvider,
    /// The instrumentation scope of the spans: the binary's name.
    scope: &'static str,
    stop: watch::Sender<bool>,
    exporting: tokio::task::JoinHandle<()>,
}

impl Traces {
    /// Starts exporting if an endpoint is configured (`None` otherwise). Must run inside
    /// the tokio runtime: the exporter is a task of it. `service` names the process when
    /// neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` does; `scope` names the
    /// binary that makes the spans (their instrumentation scope).
    pub fn start(flag: Option<&str>, service: &str, scope: &'static str) -> Result<Option<Self>, TracesError> {
        let env = |name: &str| std::env::var(name).ok();
        let Some(endpoint) = destination(flag, env)? else {
            return Ok(None);
        };
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(ExportClient::new());
        if let Some(endpoint) = endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let mut exporter = builder.build()?;

        let named_by_env = env("OTEL_SERVICE_NAME").is_some_and(|name| !name.is_empty())
            || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attrs| attrs.contains("service.name="));
        let mut resource = Resource::builder();
        if !named_by_env {
            resource = resource.with_service_name(service.to_string());
        }
        let resource = resource
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        exporter.set_resource(&resource);

        let queue_size = env("OTEL_BSP_MAX_QUEUE_SIZE")
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or(DEFAULT_QUEUE);
        let delay = env("OTEL_BSP_SCHEDULE_DELAY")
            .and_then(|v| v.parse().ok())
            .map_or(DEFAULT_BATCH_DELAY, Duration::from_millis);
        let (queue, spans) = mpsc::channel(queue_size);
        let (stop, stopped) = watch::channel(false);
        let last_error = Arc::new(Mutex::new(None));
        let exporting = tokio::spawn(export(exporter, spans, stopped.clone(), delay, last_error.clone()));
        tokio::spawn(log_drops(stopped, last_error));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(QueueProcessor { queue })
            .with_resource(resource)
            .build();
        ENABLED.store(true, Ordering::Relaxed);
        Ok(Some(Self {
            provider,
            scope,
            stop,
            exporting,
        }))
    }

    /// A tracer for spans made with OpenTelemetry's API (spans whose ids or times are
    /// chosen, not those of `tracing`'s scopes).
    pub fn tracer(&self) -> opentelemetry_sdk::trace::SdkTracer {
        self.provider.tracer(self.scope)
    }

    /// The `tracing` layer that turns spans of [`TARGET`] into these traces.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer())
            // Each would be an attribute on every span: thread names and timings nobody
            // asked for, and work on every poll of a request.
            .with_threads(false)
            .with_target(false)
            .with_location(false)
            .with_tracked_inactivity(false)
            .with_filter(TraceFilter)
    }

    /// Sends what is queued (for at most a few seconds) and stops.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(SHUTDOWN_FLUSH, self.exporting).await.is_err() {
            tracing::warn!("the last trace spans were not sent within {SHUTDOWN_FLUSH:?}: dropped");
        }
        let _ = self.provider.shutdown();
    }
}

/// Spans and span events of [`TARGET`], and while the collector is failing no spans
/// (each counted dropped): decided per span, not cached per callsite, for the pause.
struct TraceFilter;

impl<S> tracing_subscriber::layer::Filter<S> for TraceFilter {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: &tracing_subscriber::layer::Context<'_, S>) -> bool {
        if metadata.target() != TARGET {
            return false;
        }
        if metadata.is_span() && PAUSED.load(Ordering::Relaxed) {
            spans_dropped().inc();
            return false;
        }
        true
    }

    fn callsite_enabled(&self, metadata: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        if metadata.target() == TARGET {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    /// The most verbose level of [`TARGET`]'s spans and events. Without a hint the
    /// subscriber's maximum is TRACE, and so is the `log` crate's: every `log::trace!` of
    /// every dependency (mio, rustls, ...) is then turned into a `tracing` event and offered
    /// to the filters, which cost a request as much as 30 % more CPU with tracing on.
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::INFO)
    }
}

/// Hands ended spans to the export task; never blocks.
#[derive(Debug)]
struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() && self.queue.try_send(span).is_err() {
            spans_dropped().inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// [`Traces::shutdown`] does the flushing, asynchronously; this is called as the
    /// provider goes, when there is nothing left to wait for.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task: batches of up to [`MAX_BATCH`] spans, each sent within `delay` of
/// its first span, one export at a time. A failed export's spans are dropped (counted):
/// retrying would hold memory for a collector that may not come back. It also pauses
/// span making for [`PAUSE_AFTER_FAILURE`]; the first spans after the pause are sent at
/// once, and pause it again if the collector is still not taking them.
async fn export(
    exporter: opentelemetry_otlp::SpanExporter,
    mut spans: mpsc::Receiver<SpanData>,
    mut stop: watch::Receiver<bool>,
    delay: Duration,
    last_error: Arc<Mutex<Option<String>>>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut stopping = false;
    let mut resume_at: Option<tokio::time::Instant> = None;
    // The first spans are sent at once, as after a pause: a collector that is down from the
    // start is found within milliseconds, not after a batch's wait filled the queue.
    let mut probing = true;
    while !stopping {
        tokio::select! {
            span = spans.recv() => match span {
                // Made before the pause: the collector is not taking spans.
                Some(_) if resume_at.is_some() => {
                    spans_dropped().inc();
                    continue;
                }
                Some(span) => batch.push(span),
                None => stopping = true,
            },
            () = tokio::time::sleep_until(resume_at.unwrap_or_else(tokio::time::Instant::now)), if resume_at.is_some() => {
                resume_at = None;
                probing = true;
                PAUSED.store(false, Ordering::Relaxed);
                continue;
            }
            _ = stop.changed() => stopping = true,
        }
        let deadline = tokio::time::Instant::now() + if probing { Duration::ZERO } else { delay };
        while !stopping && !batch.is_empty() && batch.len() < MAX_BATCH {
            tokio::select! {
                span = spans.recv() => match span {
                    Some(span) => batch.push(span),
                    None => stopping = true,
                },
                () = tokio::time::sleep_until(deadline) => break,
                _ = stop.changed() => stopping = true,
            }
        }
        if stopping {
            while batch.len() < MAX_BATCH * 4
                && let Ok(span) = spans.try_recv()
            {
                batch.push(span);
            }
        }
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(MAX_BATCH));
            let sent = std::mem::replace(&mut batch, rest);
            let count = sent.len() as u64;
            match exporter.export(sent).await {
                Ok(()) => probing = false,
                Err(error) => {
                    spans_dropped().inc_by(count + batch.len() as u64);
                    batch.clear();
                    *last_error.lock().unwrap() = Some(error.to_string());
                    PAUSED.store(true, Ordering::Relaxed);
                    resume_at = Some(tokio::time::Instant::now() + PAUSE_AFTER_FAILURE);
                }
            }
        }
    }
}

/// One line per [`DROP_LOG_INTERVAL`] at most, with the count, never one per span.
async fn log_drops(mut stop: watch::Receiver<bool>, last_error: Arc<Mutex<Option<String>>>) {
    let mut logged = spans_dropped().get();
    let mut last_line: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let total = spans_dropped().get();
        if total > logged && last_line.is_none_or(|at| at.elapsed() >= DROP_LOG_INTERVAL) {
            let reason = last_error.lock().unwrap().take();
            tracing::warn!(
                dropped = total - logged,
                dropped_total = total,
                reason = reason
                    .as_deref()
                    .unwrap_or("the queue was full: the collector is slower than spans come"),
                "trace spans dropped: the collector is not taking them; requests are not affected"
            );
            logged = total;
            last_line = Some(Instant::now());
        }
    }
}

/// The exporter's HTTP client: the hyper client the runtime already has for outbound
/// calls (no second HTTP or TLS stack), with Mozilla's roots for an https collector.
#[derive(Debug)]
struct ExportClient {
    client: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Full<Bytes>,
    >,
}

impl ExportClient {
    fn new() -> Self {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self { client }
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: http::Request<Bytes>) -> Result<http::Response<Bytes>, HttpError> {
        let exchange = async {
            let response = self.client.request(request.map(Full::new)).await?;
            let (parts, body) = response.into_parts();
            // A collector answers with a small status message; more is not read.
            let body = Limited::new(body, 1 << 20).collect().await?.to_bytes();
            Ok::<_, HttpError>(http::Response::from_parts(parts, body))
        };
        tokio::time::timeout(EXPORT_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("no answer from the collector within {EXPORT_TIMEOUT:?}"))?
    }
}

/// Reads `traceparent`/`tracestate` from a request's headers.
struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Makes `span` the child of the trace the caller's `traceparent` names, if any.
pub fn continue_from(span: &tracing::Span, headers: &HeaderMap) {
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// Puts `span`'s `traceparent` (and `tracestate`) on an outgoing request, replacing
/// any the handler set (it would be the incoming request's, one hop behind).
pub fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    let context = span.context();
    if context.span().span_context().is_valid() {
        headers.remove("tracestate");
        TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
    }
}

/// The ids a log line joins its trace with.
#[derive(Debug, Clone, Copy)]
pub struct TraceIds {
    pub trace_id: opentelemetry::trace::TraceId,
    pub span_id: opentelemetry::trace::SpanId,
    /// Whether the trace is exported (the sampler's choice): only such a trace can be an
    /// exemplar, since only it can be looked up.
    pub sampled: bool,
}

impl TraceIds {
    pub fn of(span: &tracing::Span) -> Option<Self> {
        let context = span.context();
        let span_context = context.span().span_context().clone();
        span_context.is_valid().then(|| Self {
            trace_id: span_context.trace_id(),
            span_id: span_context.span_id(),
            sampled: span_context.is_sampled(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn tracing_is_off_unless_an_endpoint_is_given() {
        assert!(destination(None, env(&[])).unwrap().is_none());
        assert!(
            destination(Some(""), env(&[("OTEL_SERVICE_NAME", "x")]))
                .unwrap()
                .is_none()
        );
        assert_eq!(
            destination(Some("http://collector:4318/"), env(&[])).unwrap(),
            Some(Some("http://collector:4318/v1/traces".into()))
        );
        // The standard variables are the exporter's to read.
        for name in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] {
            assert_eq!(destination(None, env(&[(name, "http://c:4318")])).unwrap(), Some(None));
        }
        let off = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        assert!(destination(Some("http://c:4318"), env(&off)).unwrap().is_none());
        let none = [("OTEL_TRACES_EXPORTER", "none")];
        assert!(destination(Some("http://c:4318"), env(&none)).unwrap().is_none());
        assert!(destination(Some("collector:4318"), env(&[])).is_err());
    }
}
