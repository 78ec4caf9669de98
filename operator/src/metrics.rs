//! The operator's own Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub failures: Family<ErrorLabels, Counter>,
    pub duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Counter::default(),
            failures: Family::default(),
            duration: Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
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
        self
    }

    /// Counts a reconcile and times it until the returned guard drops.
    pub fn start(&self) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer {
            start: Instant::now(),
            duration: self.duration.clone(),
        }
    }

    pub fn failed(&self, error: &crate::Error) {
        self.failures
            .get_or_create(&ErrorLabels {
                error: error.metric_label().into(),
            })
            .inc();
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
