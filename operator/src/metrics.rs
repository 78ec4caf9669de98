//! The operator's own Prometheus metrics: its reconciles, the builds it saw end, and the
//! replicas of every Function it watches.
//!
//! The Function's namespace is the label `function_namespace`, not `namespace`: Prometheus
//! scrapes the operator in its own namespace, and the shipped scrape configuration
//! (deploy/prometheus/prometheus.yml) sets `namespace` to the pod's, which would rename a
//! scraped `namespace` to `exported_namespace`.

use crate::crd::Function;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub function: String,
    pub function_namespace: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FunctionLabels {
    pub function: String,
    pub function_namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScaleLabels {
    pub function: String,
    pub function_namespace: String,
    /// `up` or `down`.
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabels {
    function: String,
    function_namespace: String,
    state: &'static str,
}

/// How a build ended, as the `Built` condition reports it: the `result` label of
/// `wasmless_operator_builds_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildOutcome {
    /// The module was published (`Built`).
    Succeeded,
    /// The builder exited with an error, the compiler's output on status (`BuildFailed`).
    Failed,
    /// The Job ran past its deadline (`DeadlineExceeded`).
    DeadlineExceeded,
    /// The builder ran out of memory (`OOMKilled`).
    OomKilled,
}

impl BuildOutcome {
    pub const ALL: [BuildOutcome; 4] = [
        BuildOutcome::Succeeded,
        BuildOutcome::Failed,
        BuildOutcome::DeadlineExceeded,
        BuildOutcome::OomKilled,
    ];

    pub fn label(self) -> &'static str {
        match self {
            BuildOutcome::Succeeded => "succeeded",
            BuildOutcome::Failed => "failed",
            BuildOutcome::DeadlineExceeded => "deadline_exceeded",
            BuildOutcome::OomKilled => "oom_killed",
        }
    }

    /// The result a `Built` condition's reason reports, if it reports one.
    pub fn of_reason(reason: &str) -> Option<Self> {
        match reason {
            "Built" => Some(BuildOutcome::Succeeded),
            "BuildFailed" => Some(BuildOutcome::Failed),
            "DeadlineExceeded" => Some(BuildOutcome::DeadlineExceeded),
            "OOMKilled" => Some(BuildOutcome::OomKilled),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub failures: Family<ErrorLabels, Counter>,
    pub duration: Histogram,
    pub builds: Family<BuildLabels, Counter>,
    /// The autoscaler's decisions, by Function and direction.
    pub scale_decisions: Family<ScaleLabels, Counter>,
    /// The requests in flight the autoscaler last measured for each scaled Function.
    pub concurrency: Family<FunctionLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The last build end counted for each Function (by UID): see [`Metrics::build_ended`].
    last_build_counted: Arc<Mutex<HashMap<String, String>>>,
    /// The controller's cache of Functions, read on every scrape; set once it runs.
    functions: Arc<OnceLock<Store<Function>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Counter::default(),
            failures: Family::default(),
            duration: Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            builds: Family::default(),
            scale_decisions: Family::default(),
            concurrency: Family::default(),
            last_build_counted: Arc::default(),
            functions: Arc::default(),
        }
    }
}

impl Metrics {
    pub fn register(self, registry: &mut Registry) -> Self {
        registry.register(
            "wasmless_operator_reconciles",
            "Reconciles started",
            self.reconciles.clone(),
        );
        registry.register(
            "wasmless_operator_reconcile_errors",
            "Reconciles that ended in an error, by error kind",
            self.failures.clone(),
        );
        registry.register(
            "wasmless_operator_reconcile_duration_seconds",
            "Time a reconcile took",
            self.duration.clone(),
        );
        registry.register(
            "wasmless_operator_builds",
            "Builds this operator saw end, by Function and result (succeeded, failed, deadline_exceeded, oom_killed)",
            self.builds.clone(),
        );
        registry.register(
            "wasmless_operator_scale_decisions",
            "Changes of the pods a Function with scale wants, by direction (up, down)",
            self.scale_decisions.clone(),
        );
        registry.register(
            "wasmless_operator_function_concurrency",
            "Requests in flight on average over the last tick, in a scaled Function's pods and its pool",
            self.concurrency.clone(),
        );
        registry.register_collector(Box::new(Replicas(self.functions.clone())));
        self
    }

    /// Serves `wasmless_function_replicas` from the controller's cache of Functions, so a
    /// deleted Function's series go with it. Only the first store given is used.
    pub fn watch(&self, functions: Store<Function>) {
        let _ = self.functions.set(functions);
    }

    /// Counts a reconcile and times it until the returned guard drops.
    pub fn start(&self) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer {
            start: Instant::now(),
            duration: self.duration.clone(),
        }
    }

    /// Sets the measured concurrency of a scaled Function, and exports its scale decisions
    /// at 0 from its first tick on, so that its first decision shows as an increase (and
    /// a dashboard shows "no decisions" rather than no data).
    pub fn concurrency(&self, function: &str, namespace: &str, value: f64) {
        for up in [true, false] {
            let _ = self
                .scale_decisions
                .get_or_create(&scale_labels(function, namespace, up));
        }
        self.concurrency
            .get_or_create(&FunctionLabels {
                function: function.into(),
                function_namespace: namespace.into(),
            })
            .set(value);
    }

    pub fn scale_decided(&self, function: &str, namespace: &str, up: bool) {
        self.scale_decisions
            .get_or_create(&scale_labels(function, namespace, up))
            .inc();
    }

    pub fn failed(&self, error: &crate::Error) {
        self.failures
            .get_or_create(&ErrorLabels {
                error: error.metric_label().into(),
            })
            .inc();
    }

    /// Exports every build result of a Function at 0 (once), so that the first build
    /// that ends shows as an increase rather than as a series appearing at 1.
    pub fn builds_seen(&self, function: &str, namespace: &str) {
        for result in BuildOutcome::ALL {
            let _ = self.builds.get_or_create(&build_labels(function, namespace, result));
        }
    }

    /// Counts the end of the build `build` (what identifies it: its source digest) of the
    /// Function `uid`, once. Two reconciles can each see the same build end: one triggered
    /// by the Job's change may read the Function from a cache that does not yet hold the
    /// status the other wrote, and so take the end for new.
    pub fn build_ended(&self, uid: &str, build: &str, function: &str, namespace: &str, result: BuildOutcome) {
        let end = format!("{build} {}", result.label());
        {
            let mut last = self.last_build_counted.lock().unwrap_or_else(|e| e.into_inner());
            if last.get(uid) == Some(&end) {
                return;
            }
            last.insert(uid.to_string(), end);
        }
        self.builds
            .get_or_create(&build_labels(function, namespace, result))
            .inc();
    }
}

fn scale_labels(function: &str, namespace: &str, up: bool) -> ScaleLabels {
    ScaleLabels {
        function: function.into(),
        function_namespace: namespace.into(),
        direction: if up { "up" } else { "down" },
    }
}

fn build_labels(function: &str, namespace: &str, result: BuildOutcome) -> BuildLabels {
    BuildLabels {
        function: function.into(),
        function_namespace: namespace.into(),
        result: result.label(),
    }
}

/// `wasmless_function_replicas{state="desired"|"ready"}`: `spec.replicas` (what the user,
/// `kubectl scale` or an autoscaler asked for) and `status.readyReplicas` of each Function.
struct Replicas(Arc<OnceLock<Store<Function>>>);

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas").finish_non_exhaustive()
    }
}

impl Collector for Replicas {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = Family::<ReplicaLabels, Gauge>::default();
        for func in self.0.get().map(Store::state).unwrap_or_default() {
            let labels = |state| ReplicaLabels {
                function: func.name_any(),
                function_namespace: func.namespace().unwrap_or_default(),
                state,
            };
            let ready = func.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
            family.get_or_create(&labels("desired")).set(func.spec.replicas.into());
            family.get_or_create(&labels("ready")).set(ready.into());
        }
        let metric = encoder.encode_descriptor(
            "wasmless_function_replicas",
            "Replicas of each Function: desired (spec.replicas) and ready (status.readyReplicas)",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

pub struct ReconcileTimer {
    start: Instant,
    duration: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.duration.observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_end_seen_by_two_reconciles_is_counted_once() {
        let metrics = Metrics::default();
        let failed = |uid: &str, source: &str| metrics.build_ended(uid, source, "f", "ns", BuildOutcome::Failed);
        failed("uid-1", "sha256:a");
        failed("uid-1", "sha256:a"); // a reconcile that read the status from before the first
        failed("uid-1", "sha256:b"); // an edit that fails too
        failed("uid-1", "sha256:a"); // and back
        failed("uid-2", "sha256:a"); // the Function deleted and made again
        let count = metrics
            .builds
            .get_or_create(&build_labels("f", "ns", BuildOutcome::Failed))
            .get();
        assert_eq!(count, 4);
    }

    #[test]
    fn a_scaled_function_shows_no_decisions_as_zero_before_its_first() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        let metrics = metrics.register(&mut registry);
        metrics.concurrency("idle", "ns", 0.0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for direction in ["up", "down"] {
            let series = format!(
                "wasmless_operator_scale_decisions_total{{function=\"idle\",function_namespace=\"ns\",direction=\"{direction}\"}} 0"
            );
            assert!(text.contains(&series), "{series} missing from:\n{text}");
        }
    }
}
