//! The events component's metrics (docs/architecture.md, "Events"): what became of each
//! try, how long a message took from its publish to a 2xx, and each trigger's lag. The
//! Function's namespace is `function_namespace`, as the operator's metrics name it: the
//! scrape sets `namespace` to the scraped pod's.

use crate::names::TriggerRef;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TriggerLabels {
    function: String,
    function_namespace: String,
    trigger: String,
}

impl From<&TriggerRef> for TriggerLabels {
    fn from(trigger: &TriggerRef) -> Self {
        Self {
            function: trigger.function.clone(),
            function_namespace: trigger.namespace.clone(),
            trigger: trigger.trigger.clone(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveredLabels {
    #[prometheus(flatten)]
    trigger: TriggerLabels,
    outcome: &'static str,
}

/// What one try came to, as the `outcome` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx; the message is done.
    Ok,
    /// Failed, and handed out again later.
    Retry,
    /// Failed for the last time, parked on the trigger's dead-letter subject.
    DeadLetter,
    /// Failed for the last time, with dead letters off (`spec.delivery.deadLetter: false`).
    Dropped,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [Outcome::Ok, Outcome::Retry, Outcome::DeadLetter, Outcome::Dropped];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Retry => "retry",
            Outcome::DeadLetter => "dead_letter",
            Outcome::Dropped => "dropped",
        }
    }
}

#[derive(Clone)]
pub struct EventMetrics {
    delivered: Family<DeliveredLabels, Counter>,
    delivery_seconds: Family<TriggerLabels, Histogram>,
    lag: Family<TriggerLabels, Gauge>,
}

impl EventMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            delivered: Family::default(),
            // 1 ms to ~9 min: a message delivered at once, to one retried for minutes.
            delivery_seconds: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 20))),
            lag: Family::default(),
        };
        registry.register(
            "wasmless_events_delivered",
            "Tries to deliver an event to a Function, by outcome",
            metrics.delivered.clone(),
        );
        registry.register(
            "wasmless_events_delivery_seconds",
            "From an event's publish to the Function's 2xx, retries included",
            metrics.delivery_seconds.clone(),
        );
        registry.register(
            "wasmless_events_lag",
            "A trigger's events not yet delivered, or delivered and not yet answered",
            metrics.lag.clone(),
        );
        metrics
    }

    /// Every outcome of the trigger exported at 0, so that a rate over it exists before the
    /// first failure.
    pub fn trigger_started(&self, trigger: &TriggerRef) {
        for outcome in Outcome::ALL {
            let _ = self.delivered.get_or_create(&DeliveredLabels {
                trigger: trigger.into(),
                outcome: outcome.label(),
            });
        }
        let _ = self.lag.get_or_create(&trigger.into());
    }

    pub fn delivered(&self, trigger: &TriggerRef, outcome: Outcome) {
        self.delivered
            .get_or_create(&DeliveredLabels {
                trigger: trigger.into(),
                outcome: outcome.label(),
            })
            .inc();
    }

    pub fn delivered_after(&self, trigger: &TriggerRef, seconds: f64) {
        self.delivery_seconds.get_or_create(&trigger.into()).observe(seconds);
    }

    pub fn set_lag(&self, trigger: &TriggerRef, lag: u64) {
        self.lag
            .get_or_create(&trigger.into())
            .set(i64::try_from(lag).unwrap_or(i64::MAX));
    }

    /// A trigger removed: its series go with it.
    pub fn trigger_stopped(&self, trigger: &TriggerRef) {
        for outcome in Outcome::ALL {
            self.delivered.remove(&DeliveredLabels {
                trigger: trigger.into(),
                outcome: outcome.label(),
            });
        }
        self.delivery_seconds.remove(&trigger.into());
        self.lag.remove(&trigger.into());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PublishedLabels {
    function_namespace: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    reason: &'static str,
}

/// The publishing ingress's metrics: publishes of authenticated senders by their namespace
/// (no label is taken from an unauthenticated request, which could make series without
/// end), and connections refused at its edge.
#[derive(Clone)]
pub struct IngressMetrics {
    published: Family<PublishedLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
    connections: Gauge,
}

impl IngressMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            published: Family::default(),
            refused: Family::default(),
            connections: Gauge::default(),
        };
        registry.register(
            "wasmless_events_published",
            "Publishes through the ingress of an authenticated ServiceAccount, by its namespace and whether the broker holds the event (accepted) or not (failed)",
            metrics.published.clone(),
        );
        registry.register(
            "wasmless_events_ingress_refused",
            "Connections the ingress refused or closed: header_timeout, header_too_large, connection_limit",
            metrics.refused.clone(),
        );
        registry.register(
            "wasmless_events_ingress_connections",
            "Connections open to the ingress",
            metrics.connections.clone(),
        );
        metrics
    }

    pub fn published(&self, namespace: &str, accepted: bool) {
        self.published
            .get_or_create(&PublishedLabels {
                function_namespace: namespace.to_string(),
                outcome: if accepted { "accepted" } else { "failed" },
            })
            .inc();
    }
}

/// Counts a connection open until dropped.
struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl wasmless_edge::EdgeMetrics for IngressMetrics {
    fn refuse(&self, refusal: wasmless_edge::Refusal) {
        let reason = match refusal {
            wasmless_edge::Refusal::HeaderTimeout => "header_timeout",
            wasmless_edge::Refusal::HeaderTooLarge => "header_too_large",
            wasmless_edge::Refusal::ConnectionLimit => "connection_limit",
        };
        self.refused.get_or_create(&RefusedLabels { reason }).inc();
    }

    fn connection_open(&self) -> Box<dyn Send> {
        self.connections.inc();
        Box::new(OpenConnection(self.connections.clone()))
    }
}
