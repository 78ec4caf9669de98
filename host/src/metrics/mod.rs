//! The runtime's Prometheus metrics, as docs/architecture.md ("Metrics") lists them.
//! Every series carries the `function` label but the process's load phases
//! (`wasmless_load_phase_seconds{phase}`). The families are in [`families`]; a
//! [`Metrics`] is one Function's handle on them.

mod families;
pub mod process_memory;

use crate::code_cost::CodeCost;
use crate::load_phases::LoadPhases;
use families::{
    FallbackLabels, Families, Function, FunctionLabels, ModuleLabels, OutboundHostLabels, OutboundLabels, PoolFamilies,
    RefusedLabels, RequestLabels, TraceExemplar, TrapLabels, method_label,
};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// Hosts a handler was denied that get a `host` label of their own; later ones are
/// counted under `other`, so a handler calling random names cannot mint series.
const MAX_DENIED_HOST_LABELS: usize = 64;

/// Why a client was refused: the `reason` label of `wasmless_refused_total`. Three are the
/// edge's own (`wasmless_edge::Refusal`, before a request is read); the rest the server's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The edge's: headers too slow, the connection closed.
    HeaderTimeout,
    /// Body not complete within `--body-read-timeout`: 408.
    BodyTimeout,
    /// The edge's: headers too large, 431.
    HeaderTooLarge,
    /// The edge's: too many connections, 503 and closed.
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

/// The handle of one Function (the `function` label) on the process's metric families. A
/// dedicated pod has one; the pool one per Function it serves, all in one registry.
pub struct Metrics {
    function: Function,
    registry: Arc<Registry>,
    families: Families,
    pool: Option<PoolFamilies>,
    denied_hosts: std::sync::Mutex<std::collections::HashSet<String>>,
    /// This Function's `wasmless_module_info` series, removed when another module replaces it.
    module_info_labels: std::sync::Mutex<ModuleInfo>,
    /// The one series of each per-function family (the registry holds the family),
    /// looked up once, not per request.
    in_flight: Gauge,
    instantiate_duration: Histogram,
    connections_open: Gauge,
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
        let families = Families::register(&mut registry);
        // One exporter and one process: their series under the process's own name.
        let process = registry.sub_registry_with_label((
            std::borrow::Cow::Borrowed("function"),
            std::borrow::Cow::Owned(function.to_string()),
        ));
        process.register(
            "wasmless_trace_spans_dropped",
            "Trace spans dropped rather than exported: the collector down or slower than they come (0 with tracing off)",
            wasmless_telemetry::spans_dropped().clone(),
        );
        process.register_collector(Box::new(process_memory::ProcessMemoryCollector));
        let pool = pool.then(|| PoolFamilies::register(&mut registry));
        let function = Function::new(function, None);
        // Every reason is exported from the start (at 0), so a rate over it has a baseline.
        Self::handle(function, Arc::new(registry), families, pool, &Refusal::ALL)
    }

    /// The handle of another Function in the same registry (the pool's).
    pub fn for_function(&self, function: &str) -> Self {
        self.for_revision(function, None)
    }

    /// The handle of one revision of a Function in the same registry (a split's), its
    /// series labelled `revision` when there is one.
    pub fn for_revision(&self, function: &str, revision: Option<&str>) -> Self {
        Self::handle(
            Function::new(function, revision),
            self.registry.clone(),
            self.families.clone(),
            self.pool.clone(),
            &[
                Refusal::BodyTooLarge,
                Refusal::BodyTimeout,
                Refusal::UploadBudget,
                Refusal::Busy,
            ],
        )
    }

    /// `function`'s handle on `families`, with its `refusals` exported at 0.
    fn handle(
        function: Function,
        registry: Arc<Registry>,
        families: Families,
        pool: Option<PoolFamilies>,
        refusals: &[Refusal],
    ) -> Self {
        for refusal in refusals {
            let _ = families.refused.get_or_create(&RefusedLabels {
                function: function.clone(),
                reason: refusal.reason(),
            });
        }
        let labels = FunctionLabels {
            function: function.clone(),
        };
        let in_flight = families.in_flight.get_or_create(&labels).clone();
        let instantiate_duration = families.instantiate_duration.get_or_create(&labels).clone();
        let connections_open = families.connections_open.get_or_create(&labels).clone();
        Self {
            in_flight,
            instantiate_duration,
            connections_open,
            module_info_labels: Default::default(),
            denied_hosts: Default::default(),
            function,
            registry,
            families,
            pool,
        }
    }

    /// The pool loaded a Function in `elapsed`; `loaded` Functions are held now, their
    /// code costing `code`.
    pub fn pool_loaded(&self, elapsed: Duration, loaded: usize, code: CodeCost) {
        if let Some(pool) = &self.pool {
            pool.load_seconds.observe(elapsed.as_secs_f64());
            pool.loaded.set(i64::try_from(loaded).unwrap_or(i64::MAX));
            self.pool_code(code);
        }
    }

    /// The pool unloaded a Function; `loaded` are held now, costing `code`. `evicted`: for
    /// the budgets (not because the Function was removed).
    pub fn pool_unloaded(&self, loaded: usize, evicted: bool, code: CodeCost) {
        if let Some(pool) = &self.pool {
            if evicted {
                pool.evictions.inc();
            }
            pool.loaded.set(i64::try_from(loaded).unwrap_or(i64::MAX));
            self.pool_code(code);
        }
    }

    /// The pool dropped an idle Function's mapped text from its page tables.
    pub fn pool_idle_code_released(&self) {
        if let Some(pool) = &self.pool {
            pool.idle_code_released.inc();
        }
    }

    fn pool_code(&self, code: CodeCost) {
        if let Some(pool) = &self.pool {
            for (memory, bytes) in [
                ("private", code.private),
                ("mapped", code.mapped),
                ("shared", code.shared),
            ] {
                pool.code_bytes
                    .get_or_create(&families::CodeMemoryLabels { memory })
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
    }

    /// Drops a removed Function's module info, so the pool exports only what it serves; a
    /// load of it still on its way when it was removed exports none either.
    pub fn forget_module(&self) {
        let mut current = self.module_info_labels.lock().unwrap();
        if let ModuleInfo::Exported(labels) = std::mem::replace(&mut *current, ModuleInfo::Forgotten) {
            self.families.module_info.remove(&labels);
        }
    }

    /// Counts one client the edge refused or cut off.
    pub fn refuse(&self, refusal: Refusal) {
        self.families
            .refused
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
        self.families
            .compile_fallbacks
            .get_or_create(&FallbackLabels {
                function: self.function.clone(),
                reason,
            })
            .inc();
    }

    /// A request to the node's code store (`op`: `get`, `put`) and what came of it.
    pub fn code_store_request(&self, op: &'static str, result: &'static str) {
        self.families
            .code_store
            .get_or_create(&families::CodeStoreLabels { op, result })
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
        trace: Option<&wasmless_telemetry::TraceIds>,
    ) {
        let labels = RequestLabels {
            function: self.function.clone(),
            method: method_label(method),
            status,
        };
        self.families.requests.get_or_create(&labels).inc();
        let exemplar = trace.filter(|ids| ids.sampled).map(|ids| TraceExemplar {
            trace_id: ids.trace_id.to_string(),
        });
        self.families
            .request_duration
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
        self.families
            .traps
            .get_or_create(&TrapLabels {
                function: self.function.clone(),
                kind,
            })
            .inc();
    }

    /// Records a newly loaded module, replacing the info series of the one before, and
    /// what each phase of its load took.
    pub fn module_loaded(&self, digest: String, abi: &'static str, elapsed: Duration, phases: &LoadPhases) {
        self.families
            .module_load
            .get_or_create(&self.function_labels())
            .set(elapsed.as_secs_f64());
        for (phase, took) in phases.iter() {
            self.families
                .load_phase
                .get_or_create(&families::PhaseLabels { phase: phase.name() })
                .observe(took.as_secs_f64());
        }
        let labels = ModuleLabels {
            function: self.function.clone(),
            digest,
            abi,
        };
        let mut current = self.module_info_labels.lock().unwrap();
        match std::mem::replace(&mut *current, ModuleInfo::Exported(labels.clone())) {
            ModuleInfo::Forgotten => {
                *current = ModuleInfo::Forgotten;
                return;
            }
            ModuleInfo::Exported(previous) => {
                self.families.module_info.remove(&previous);
            }
            ModuleInfo::None => {}
        }
        self.families.module_info.get_or_create(&labels).set(1);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// The `wasmless_module_info` series a Function's handle exports.
#[derive(Default)]
enum ModuleInfo {
    #[default]
    None,
    Exported(ModuleLabels),
    /// The Function was removed ([`Metrics::forget_module`]): no series from now on.
    Forgotten,
}

pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl From<wasmless_edge::Refusal> for Refusal {
    fn from(refusal: wasmless_edge::Refusal) -> Self {
        match refusal {
            wasmless_edge::Refusal::HeaderTimeout => Refusal::HeaderTimeout,
            wasmless_edge::Refusal::HeaderTooLarge => Refusal::HeaderTooLarge,
            wasmless_edge::Refusal::ConnectionLimit => Refusal::ConnectionLimit,
        }
    }
}

impl wasmless_edge::EdgeMetrics for Metrics {
    fn refuse(&self, refusal: wasmless_edge::Refusal) {
        Metrics::refuse(self, refusal.into());
    }

    fn connection_open(&self) -> Box<dyn Send> {
        Box::new(Metrics::connection_open(self))
    }
}

impl wasmless_outbound::CallMetrics for Metrics {
    /// Counts an outbound call that was sent (or failed on the way) and how long it took.
    fn observe_outbound(&self, host: &str, status: &str, elapsed: Duration) {
        self.families
            .outbound_requests
            .get_or_create(&OutboundLabels {
                function: self.function.clone(),
                host: host.to_string(),
                status: status.to_string(),
            })
            .inc();
        self.families
            .outbound_duration
            .get_or_create(&OutboundHostLabels {
                function: self.function.clone(),
                host: host.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts an outbound call the allow-list refused.
    fn observe_outbound_denied(&self, host: &str) {
        let host = {
            let mut seen = self.denied_hosts.lock().unwrap();
            if seen.contains(host) || seen.len() < MAX_DENIED_HOST_LABELS {
                seen.insert(host.to_string());
                host.to_string()
            } else {
                "other".to_string()
            }
        };
        self.families
            .outbound_requests
            .get_or_create(&OutboundLabels {
                function: self.function.clone(),
                host,
                status: "denied".to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module_info_series(pool: &Metrics) -> usize {
        pool.encode()
            .lines()
            .filter(|line| line.starts_with("wasmless_module_info{"))
            .count()
    }

    #[test]
    fn a_removed_function_exports_no_module_info_even_from_a_load_that_ends_after() {
        let pool = Metrics::new_pool("pool");
        let (stays, removed) = (pool.for_function("stays"), pool.for_function("removed"));
        let loaded = |function: &Metrics, digest: &str| {
            function.module_loaded(digest.into(), "cgi", Duration::from_millis(1), &LoadPhases::default());
        };
        loaded(&stays, "sha256:01");
        loaded(&removed, "sha256:02");
        assert_eq!(module_info_series(&pool), 2);
        loaded(&removed, "sha256:03");
        assert_eq!(
            module_info_series(&pool),
            2,
            "a new module replaces the old one's series"
        );
        removed.forget_module();
        assert_eq!(module_info_series(&pool), 1);
        loaded(&removed, "sha256:04");
        assert_eq!(
            module_info_series(&pool),
            1,
            "a load on its way when the Function was removed"
        );
    }
}
