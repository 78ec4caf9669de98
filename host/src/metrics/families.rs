//! The runtime's metric families and their labels: each family made and registered once
//! per process, and shared by every Function's (or revision's) handle on it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// The `function` label, and `revision` where one process serves several revisions of
/// the Function (a traffic split): a Function with one revision has no `revision` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Function {
    pub(super) name: Arc<String>,
    pub(super) revision: Option<Arc<String>>,
}

impl Function {
    pub(super) fn new(name: &str, revision: Option<&str>) -> Self {
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
pub(super) struct RequestLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
    pub(super) method: &'static str,
    pub(super) status: u16,
}

/// The exemplar of a request-duration bucket: the trace of its latest sampled request, so
/// that a dashboard can go from a slow bucket to a trace of a request that landed in it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TraceExemplar {
    pub(super) trace_id: String,
}

/// The `method` label: the standard methods by name, any other as `other`, so that a
/// client inventing methods cannot make a series for each (and the memory to keep it).
pub(super) fn method_label(method: &http::Method) -> &'static str {
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
pub(super) struct FunctionLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TrapLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FallbackLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RefusedLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutboundLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
    pub(super) host: String,
    /// The response's HTTP status, `denied` or `error`.
    pub(super) status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutboundHostLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
    pub(super) host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModuleLabels {
    #[prometheus(flatten)]
    pub(super) function: Function,
    pub(super) digest: String,
    pub(super) abi: &'static str,
}

/// `phase`: a step of loading code ([`crate::load_phases::LoadPhase`]). No `function`:
/// a pool loads a thousand Functions, and where load time goes is the process's question.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PhaseLabels {
    pub(super) phase: &'static str,
}

/// `op`: `get` or `put`; `result`: `found`, `absent`, `corrupt`, `stored`, `refused` or
/// `error` (the store could not be asked). No `function`: the store is the node's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CodeStoreLabels {
    pub(super) op: &'static str,
    pub(super) result: &'static str,
}

/// Every family a Function's series are in (and the process's load phases).
#[derive(Clone)]
pub(super) struct Families {
    pub(super) requests: Family<RequestLabels, Counter>,
    pub(super) request_duration: Family<RequestLabels, HistogramWithExemplars<TraceExemplar>>,
    pub(super) in_flight: Family<FunctionLabels, Gauge>,
    pub(super) instantiate_duration: Family<FunctionLabels, Histogram>,
    pub(super) traps: Family<TrapLabels, Counter>,
    pub(super) module_load: Family<FunctionLabels, Gauge<f64, AtomicU64>>,
    pub(super) load_phase: Family<PhaseLabels, Histogram>,
    pub(super) module_info: Family<ModuleLabels, Gauge>,
    pub(super) compile_fallbacks: Family<FallbackLabels, Counter>,
    pub(super) code_store: Family<CodeStoreLabels, Counter>,
    pub(super) refused: Family<RefusedLabels, Counter>,
    pub(super) connections_open: Family<FunctionLabels, Gauge>,
    pub(super) outbound_requests: Family<OutboundLabels, Counter>,
    pub(super) outbound_duration: Family<OutboundHostLabels, Histogram>,
}

impl Families {
    /// Makes every family and registers it in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let families = Self {
            requests: Family::default(),
            // From 100 µs to ~6.5 s: a fresh instance is sub-millisecond, a Go start a few ms.
            request_duration: Family::new_with_constructor(|| {
                HistogramWithExemplars::new(exponential_buckets(0.0001, 2.0, 17))
            }),
            in_flight: Family::default(),
            instantiate_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.00001, 2.0, 16))
            }),
            traps: Family::default(),
            module_load: Family::default(),
            // From 100 µs to ~6.5 s: a link is under a millisecond, a compile seconds.
            load_phase: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 17))),
            module_info: Family::default(),
            compile_fallbacks: Family::default(),
            code_store: Family::default(),
            refused: Family::default(),
            connections_open: Family::default(),
            outbound_requests: Family::default(),
            // From 1 ms to ~65 s: a call inside the cluster takes milliseconds, one across
            // the internet up to its timeout.
            outbound_duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 17))),
        };
        // prometheus-client appends `_total` to counters. The registry holds clones of the
        // families; the handles share their series.
        let f = families.clone();
        registry.register("wasmless_requests", "Requests served, by method and status", f.requests);
        registry.register(
            "wasmless_request_duration_seconds",
            "Time from request to response headers",
            f.request_duration,
        );
        registry.register("wasmless_requests_in_flight", "Requests being served now", f.in_flight);
        registry.register(
            "wasmless_instantiate_duration_seconds",
            "Time to instantiate the module for one request",
            f.instantiate_duration,
        );
        registry.register("wasmless_traps", "Requests the handler failed, by kind", f.traps);
        registry.register(
            "wasmless_module_load_seconds",
            "Time the last module load took: read, verify, compile or cache load",
            f.module_load,
        );
        registry.register(
            "wasmless_load_phase_seconds",
            "Time each phase of loading a Function's code took: store, fetch, verify, place, open, compile, files, link",
            f.load_phase,
        );
        registry.register(
            "wasmless_module_info",
            "The module being served (value 1)",
            f.module_info,
        );
        registry.register(
            "wasmless_compile_fallbacks",
            "Precompiled code given but not used, so the module was compiled here, by reason",
            f.compile_fallbacks,
        );
        registry.register(
            "wasmless_code_store_requests",
            "Requests to the node's store of verified code (--code-store), by op (get, put) and result",
            f.code_store,
        );
        registry.register(
            "wasmless_refused",
            "Clients the HTTP edge refused or cut off, by reason",
            f.refused,
        );
        registry.register(
            "wasmless_connections_open",
            "Connections open on the function's port",
            f.connections_open,
        );
        registry.register(
            "wasmless_outbound_requests",
            "Outbound calls of the handler, by destination host and status (the HTTP status, denied or error)",
            f.outbound_requests,
        );
        registry.register(
            "wasmless_outbound_request_duration_seconds",
            "Time an outbound call took until its response headers, by destination host",
            f.outbound_duration,
        );
        families
    }
}

/// What only the pool exports: how many Functions it holds, what loading one takes, how
/// many it evicted for its memory budget, and the mapped code it let go of while idle.
#[derive(Clone)]
pub(super) struct PoolFamilies {
    pub(super) loaded: Gauge,
    pub(super) load_seconds: Histogram,
    pub(super) evictions: Counter,
    pub(super) code_bytes: Family<CodeMemoryLabels, Gauge>,
    pub(super) idle_code_released: Counter,
}

/// `memory`: `private` (the process's own: code copied into it, what wasmtime builds from
/// code) or `mapped` (code files mapped from the pod's disk, page cache).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CodeMemoryLabels {
    pub(super) memory: &'static str,
}

impl PoolFamilies {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let families = Self {
            loaded: Gauge::default(),
            // From 1 ms to ~16 s: code loaded from disk takes milliseconds, a module
            // compiled here seconds.
            load_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            evictions: Counter::default(),
            code_bytes: Family::default(),
            idle_code_released: Counter::default(),
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
            "Functions unloaded to stay within the pool's budgets",
            families.evictions.clone(),
        );
        registry.register(
            "wasmless_pool_code_bytes",
            "Bytes the loaded Functions' code holds: private (counted against --pool-memory-budget), mapped from files the pool wrote (--pool-mapped-code-budget), or shared, mapped from the node's store (on no budget)",
            families.code_bytes.clone(),
        );
        registry.register(
            "wasmless_pool_idle_code_released",
            "Times a loaded Function idle for --pool-release-code-after had its mapped code's pages dropped from the pool process's page tables (they stay in the node's page cache; its next request maps back what it touches)",
            families.idle_code_released.clone(),
        );
        families
    }
}
