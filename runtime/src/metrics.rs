//! The runtime's Prometheus metrics, as docs/architecture.md ("Metrics") lists them.
//! Every series carries the `function` label.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// The `function` label, and `revision` where one process serves several revisions of
/// the Function (a traffic split): a Function with one revision has no `revision` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Function {
    name: Arc<String>,
    revision: Option<Arc<String>>,
}

impl Function {
    fn new(name: &str, revision: Option<&str>) -> Self {
        Self {
            name: Arc::new(name.to_string()),
            revision: revision.map(|revision| Arc::new(revision.to_string())),
        }
    }
}

impl EncodeLabelSet for Function {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelSetEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeLabel;
        ("function", self.name.as_str()).encode(encoder.encode_label())?;
        if let Some(revision) = &self.revision {
            ("revision", revision.as_str()).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    #[prometheus(flatten)]
    function: Function,
    method: &'static str,
    status: u16,
}

/// The exemplar of a request-duration bucket: the trace of its latest sampled request, so
/// that a dashboard can go from a slow bucket to a trace of a request that landed in it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TraceExemplar {
    trace_id: String,
}

/// The `method` label: the standard methods by name, any other as `other`, so that a
/// client inventing methods cannot make a series for each (and the memory to keep it).
fn method_label(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FunctionLabels {
    #[prometheus(flatten)]
    function: Function,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrapLabels {
    #[prometheus(flatten)]
    function: Function,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    #[prometheus(flatten)]
    function: Function,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    #[prometheus(flatten)]
    function: Function,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboundLabels {
    #[prometheus(flatten)]
    function: Function,
    host: String,
    /// The response's HTTP status, `denied` or `error`.
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboundHostLabels {
    #[prometheus(flatten)]
    function: Function,
    host: String,
}

/// Hosts a handler was denied that get a `host` label of their own; later ones are
/// counted under `other`, so a handler calling random names cannot mint series.
const MAX_DENIED_HOST_LABELS: usize = 64;

/// Why the edge refused a client: the `reason` label of `wasmless_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Headers not complete within `--header-read-timeout`: the connection is closed.
    HeaderTimeout,
    /// Body not complete within `--body-read-timeout`: 408.
    BodyTimeout,
    /// Request line and headers over `--max-header-size` (or too many headers): 431.
    HeaderTooLarge,
    /// `--max-connections` open already: 503, connection closed.
    ConnectionLimit,
    /// Body over `--max-request-body`: 413.
    BodyTooLarge,
    /// `--upload-budget` taken by bodies being received: 503.
    UploadBudget,
    /// `--max-concurrency` requests running: 503.
    Busy,
    /// In a pool: the request's instance grew past what the pool's requests may hold
    /// together (`--pool-request-memory`), or its Function's share of it: 503.
    PoolMemory,
}

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::HeaderTimeout,
        Refusal::BodyTimeout,
        Refusal::HeaderTooLarge,
        Refusal::ConnectionLimit,
        Refusal::BodyTooLarge,
        Refusal::UploadBudget,
        Refusal::Busy,
        Refusal::PoolMemory,
    ];

    pub fn reason(self) -> &'static str {
        match self {
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::HeaderTooLarge => "header_too_large",
            Refusal::ConnectionLimit => "connection_limit",
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::UploadBudget => "upload_budget",
            Refusal::Busy => "busy",
            Refusal::PoolMemory => "pool_memory",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModuleLabels {
    #[prometheus(flatten)]
    function: Function,
    digest: String,
    abi: &'static str,
}

/// The handle of one Function (the `function` label) on the process's metric families. A
/// dedicated pod has one; the pool one per Function it serves, all in one registry.
pub struct Metrics {
    function: Function,
    registry: Arc<Registry>,
    pool: Option<PoolFamilies>,
    requests: Family<RequestLabels, Counter>,
    request_duration: Family<RequestLabels, HistogramWithExemplars<TraceExemplar>>,
    traps: Family<TrapLabels, Counter>,
    module_load: Family<FunctionLabels, Gauge<f64, AtomicU64>>,
    module_info: Family<ModuleLabels, Gauge>,
    compile_fallbacks: Family<FallbackLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
    outbound_requests: Family<OutboundLabels, Counter>,
    outbound_duration: Family<OutboundHostLabels, Histogram>,
    denied_hosts: std::sync::Mutex<std::collections::HashSet<String>>,
    /// This Function's `wasmless_module_info` series, removed when another module replaces it.
    module_info_labels: std::sync::Mutex<Option<ModuleLabels>>,
    in_flight_family: Family<FunctionLabels, Gauge>,
    instantiate_family: Family<FunctionLabels, Histogram>,
    connections_family: Family<FunctionLabels, Gauge>,
    /// The one series of each per-function family (the registry holds the family),
    /// looked up once, not per request.
    in_flight: Gauge,
    instantiate_duration: Histogram,
    connections_open: Gauge,
}

/// What only the pool exports: how many Functions it holds, what loading one takes, and
/// how many it evicted for its memory budget.
#[derive(Clone)]
struct PoolFamilies {
    loaded: Gauge,
    load_seconds: Histogram,
    evictions: Counter,
}

impl Metrics {
    /// A dedicated runtime's metrics: one Function.
    pub fn new(function: &str) -> Self {
        Self::build(function, false)
    }

    /// The pool's metrics: the pool's own series under `function` (its name), and
    /// [`Metrics::for_function`] for each Function it serves.
    pub fn new_pool(name: &str) -> Self {
        Self::build(name, true)
    }

    fn build(function: &str, pool: bool) -> Self {
        let mut registry = Registry::default();
        let requests = Family::default();
        // From 100 µs to ~6.5 s: a fresh instance is sub-millisecond, a Go start a few ms.
        let request_duration =
            Family::<RequestLabels, HistogramWithExemplars<TraceExemplar>>::new_with_constructor(|| {
                HistogramWithExemplars::new(exponential_buckets(0.0001, 2.0, 17))
            });
        let in_flight = Family::<FunctionLabels, Gauge>::default();
        let instantiate_duration = Family::<FunctionLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00001, 2.0, 16))
        });
        let traps = Family::default();
        let module_load = Family::default();
        let module_info = Family::default();
        let compile_fallbacks = Family::default();
        let refused = Family::default();
        let connections_open = Family::<FunctionLabels, Gauge>::default();
        let outbound_requests = Family::default();
        // From 1 ms to ~65 s: a call inside the cluster takes milliseconds, one across the
        // internet up to its timeout.
        let outbound_duration = Family::<OutboundHostLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 17))
        });
        // prometheus-client appends `_total` to counters.
        registry.register(
            "wasmless_requests",
            "Requests served, by method and status",
            requests.clone(),
        );
        registry.register(
            "wasmless_request_duration_seconds",
            "Time from request to response headers",
            request_duration.clone(),
        );
        registry.register(
            "wasmless_requests_in_flight",
            "Requests being served now",
            in_flight.clone(),
        );
        registry.register(
            "wasmless_instantiate_duration_seconds",
            "Time to instantiate the module for one request",
            instantiate_duration.clone(),
        );
        registry.register("wasmless_traps", "Requests the handler failed, by kind", traps.clone());
        registry.register(
            "wasmless_module_load_seconds",
            "Time the last module load took: read, verify, compile or cache load",
            module_load.clone(),
        );
        registry.register(
            "wasmless_module_info",
            "The module being served (value 1)",
            module_info.clone(),
        );
        registry.register(
            "wasmless_compile_fallbacks",
            "Precompiled code given but not used, so the module was compiled here, by reason",
            compile_fallbacks.clone(),
        );
        registry.register(
            "wasmless_refused",
            "Clients the HTTP edge refused or cut off, by reason",
            refused.clone(),
        );
        registry.register(
            "wasmless_connections_open",
            "Connections open on the function's port",
            connections_open.clone(),
        );
        registry.register(
            "wasmless_outbound_requests",
            "Outbound calls of the handler, by destination host and status (the HTTP status, denied or error)",
            outbound_requests.clone(),
        );
        registry.register(
            "wasmless_outbound_request_duration_seconds",
            "Time an outbound call took until its response headers, by destination host",
            outbound_duration.clone(),
        );
        // One exporter per process: its counter, under the process's own name.
        registry
            .sub_registry_with_label((
                std::borrow::Cow::Borrowed("function"),
                std::borrow::Cow::Owned(function.to_string()),
            ))
            .register(
                "wasmless_trace_spans_dropped",
                "Trace spans dropped rather than exported: the collector down or slower than they come (0 with tracing off)",
                crate::traces::spans_dropped().clone(),
            );
        let pool = pool.then(|| {
            let families = PoolFamilies {
                loaded: Gauge::default(),
                // From 1 ms to ~16 s: code loaded from disk takes milliseconds, a module
                // compiled here seconds.
                load_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
                evictions: Counter::default(),
            };
            registry.register(
                "wasmless_pool_functions_loaded",
                "Functions whose code the pool holds loaded now",
                families.loaded.clone(),
            );
            registry.register(
                "wasmless_pool_load_seconds",
                "Time to load a Function on its first request (read, verify, link)",
                families.load_seconds.clone(),
            );
            registry.register(
                "wasmless_pool_evictions",
                "Functions unloaded to stay within the pool's memory budget",
                families.evictions.clone(),
            );
            families
        });
        let function = Function::new(function, None);
        // Every reason is exported from the start (at 0), so a rate over it has a baseline.
        for refusal in Refusal::ALL {
            let _ = refused.get_or_create(&RefusedLabels {
                function: function.clone(),
                reason: refusal.reason(),
            });
        }
        let labels = FunctionLabels {
            function: function.clone(),
        };
        let in_flight_series = in_flight.get_or_create(&labels).clone();
        let instantiate_series = instantiate_duration.get_or_create(&labels).clone();
        let connections_series = connections_open.get_or_create(&labels).clone();
        Self {
            in_flight: in_flight_series,
            instantiate_duration: instantiate_series,
            connections_open: connections_series,
            in_flight_family: in_flight,
            instantiate_family: instantiate_duration,
            connections_family: connections_open,
            module_info_labels: Default::default(),
            function,
            registry: Arc::new(registry),
            pool,
            requests,
            request_duration,
            traps,
            module_load,
            module_info,
            compile_fallbacks,
            refused,
            outbound_requests,
            outbound_duration,
            denied_hosts: Default::default(),
        }
    }

    /// The handle of another Function in the same registry (the pool's).
    pub fn for_function(&self, function: &str) -> Self {
        self.for_revision(function, None)
    }

    /// The handle of one revision of a Function in the same registry (a split's), its
    /// series labelled `revision` when there is one.
    pub fn for_revision(&self, function: &str, revision: Option<&str>) -> Self {
        let function = Function::new(function, revision);
        for refusal in [
            Refusal::BodyTooLarge,
            Refusal::BodyTimeout,
            Refusal::UploadBudget,
            Refusal::Busy,
        ] {
            let _ = self.refused.get_or_create(&RefusedLabels {
                function: function.clone(),
                reason: refusal.reason(),
            });
        }
        let labels = FunctionLabels {
            function: function.clone(),
        };
        Self {
            in_flight: self.in_flight_family.get_or_create(&labels).clone(),
            instantiate_duration: self.instantiate_family.get_or_create(&labels).clone(),
            connections_open: self.connections_family.get_or_create(&labels).clone(),
            in_flight_family: self.in_flight_family.clone(),
            instantiate_family: self.instantiate_family.clone(),
            connections_family: self.connections_family.clone(),
            module_info_labels: Default::default(),
            function,
            registry: self.registry.clone(),
            pool: self.pool.clone(),
            requests: self.requests.clone(),
            request_duration: self.request_duration.clone(),
            traps: self.traps.clone(),
            module_load: self.module_load.clone(),
            module_info: self.module_info.clone(),
            compile_fallbacks: self.compile_fallbacks.clone(),
            refused: self.refused.clone(),
            outbound_requests: self.outbound_requests.clone(),
            outbound_duration: self.outbound_duration.clone(),
            denied_hosts: Default::default(),
        }
    }

    /// The pool loaded a Function in `elapsed`; `loaded` Functions are held now.
    pub fn pool_loaded(&self, elapsed: Duration, loaded: usize) {
        if let Some(pool) = &self.pool {
            pool.load_seconds.observe(elapsed.as_secs_f64());
            pool.loaded.set(i64::try_from(loaded).unwrap_or(i64::MAX));
        }
    }

    /// The pool unloaded a Function; `loaded` are held now. `evicted`: for the budget
    /// (not because the Function was removed).
    pub fn pool_unloaded(&self, loaded: usize, evicted: bool) {
        if let Some(pool) = &self.pool {
            if evicted {
                pool.evictions.inc();
            }
            pool.loaded.set(i64::try_from(loaded).unwrap_or(i64::MAX));
        }
    }

    /// Drops a removed Function's module info, so the pool exports only what it serves.
    pub fn forget_module(&self) {
        if let Some(labels) = self.module_info_labels.lock().unwrap().take() {
            self.module_info.remove(&labels);
        }
    }

    /// Counts an outbound call that was sent (or failed on the way) and how long it took.
    pub fn observe_outbound(&self, host: &str, status: &str, elapsed: Duration) {
        self.outbound_requests
            .get_or_create(&OutboundLabels {
                function: self.function.clone(),
                host: host.to_string(),
                status: status.to_string(),
            })
            .inc();
        self.outbound_duration
            .get_or_create(&OutboundHostLabels {
                function: self.function.clone(),
                host: host.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts an outbound call the allow-list refused.
    pub fn observe_outbound_denied(&self, host: &str) {
        let host = {
            let mut seen = self.denied_hosts.lock().unwrap();
            if seen.contains(host) || seen.len() < MAX_DENIED_HOST_LABELS {
                seen.insert(host.to_string());
                host.to_string()
            } else {
                "other".to_string()
            }
        };
        self.outbound_requests
            .get_or_create(&OutboundLabels {
                function: self.function.clone(),
                host,
                status: "denied".to_string(),
            })
            .inc();
    }

    /// Counts one client the edge refused or cut off.
    pub fn refuse(&self, refusal: Refusal) {
        self.refused
            .get_or_create(&RefusedLabels {
                function: self.function.clone(),
                reason: refusal.reason(),
            })
            .inc();
    }

    /// Counts an open connection until the guard is dropped.
    pub fn connection_open(&self) -> InFlight {
        let gauge = self.connections_open.clone();
        gauge.inc();
        InFlight(gauge)
    }

    /// Precompiled code could not be used (`reason`: `engine`, `cpu`, `unavailable`,
    /// `malformed`, `deserialize`), so this process compiles the module itself.
    pub fn compile_fallback(&self, reason: &'static str) {
        self.compile_fallbacks
            .get_or_create(&FallbackLabels {
                function: self.function.clone(),
                reason,
            })
            .inc();
    }

    fn function_labels(&self) -> FunctionLabels {
        FunctionLabels {
            function: self.function.clone(),
        }
    }

    /// Counts a request and its time; `trace` (a sampled request's) becomes its bucket's
    /// exemplar.
    pub fn observe_request(
        &self,
        method: &http::Method,
        status: u16,
        elapsed: Duration,
        trace: Option<&crate::traces::TraceIds>,
    ) {
        let labels = RequestLabels {
            function: self.function.clone(),
            method: method_label(method),
            status,
        };
        self.requests.get_or_create(&labels).inc();
        let exemplar = trace.filter(|ids| ids.sampled).map(|ids| TraceExemplar {
            trace_id: ids.trace_id.to_string(),
        });
        self.request_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64(), exemplar, None);
    }

    /// Counts a request in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        let gauge = self.in_flight.clone();
        gauge.inc();
        InFlight(gauge)
    }

    pub fn observe_instantiate(&self, elapsed: Duration) {
        self.instantiate_duration.observe(elapsed.as_secs_f64());
    }

    pub fn count_trap(&self, kind: &'static str) {
        self.traps
            .get_or_create(&TrapLabels {
                function: self.function.clone(),
                kind,
            })
            .inc();
    }

    /// Records a newly loaded module, replacing the info series of the one before.
    pub fn module_loaded(&self, digest: String, abi: &'static str, elapsed: Duration) {
        self.module_load
            .get_or_create(&self.function_labels())
            .set(elapsed.as_secs_f64());
        let labels = ModuleLabels {
            function: self.function.clone(),
            digest,
            abi,
        };
        let mut current = self.module_info_labels.lock().unwrap();
        if let Some(previous) = current.replace(labels.clone()) {
            self.module_info.remove(&previous);
        }
        self.module_info.get_or_create(&labels).set(1);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
