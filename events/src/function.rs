//! A Function as the events component reads it: its triggers, its delivery policy and its
//! Service, from the object's JSON (the schema and its checks are the operator's CRD,
//! `operator/src/crd/triggers.rs`: this crate depends on no operator code). `wanted` is
//! pure: what should run for one Function.

use crate::broker::ConsumerSpec;
use crate::cloudevent::Kind;
use crate::names::{self, NameError, TriggerRef};
use crate::retry::DeliveryPolicy;
use crate::schedule::{Schedule, ScheduleError};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;
use std::time::Duration;
use thiserror::Error;

/// A try's answer may come this long after its timeout before the broker hands the message
/// out again: the deliverer settles it first.
const ACK_MARGIN: Duration = Duration::from_secs(5);
/// The longest `delivery.timeout` and `delivery.backoff`, as the CRD says: a try that may
/// hold one of the process's slots for hours holds it from every namespace.
pub const MAX_DELIVERY_DURATION: Duration = Duration::from_secs(300);

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FunctionError {
    #[error("spec does not read as a Function's: {0}")]
    Spec(String),
    #[error("spec.delivery.{field}: {why}")]
    Delivery { field: &'static str, why: String },
    #[error("spec.triggers[{trigger}].path {path:?}: write a path starting with '/', without spaces, '?' or '#'")]
    Path { trigger: String, path: String },
    #[error("spec.triggers[{trigger}].queue: {source}")]
    Subject {
        trigger: String,
        #[source]
        source: NameError,
    },
    #[error("spec.triggers[{trigger}]: {source}")]
    Schedule {
        trigger: String,
        #[source]
        source: ScheduleError,
    },
    #[error("spec.triggers[{trigger}]: give it a queue or a schedule, one of the two")]
    Kind { trigger: String },
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    triggers: Vec<TriggerSpec>,
    #[serde(default)]
    delivery: Option<DeliverySpec>,
    #[serde(default)]
    service: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TriggerSpec {
    name: String,
    #[serde(default = "root")]
    path: String,
    #[serde(default)]
    queue: Option<QueueSpec>,
    #[serde(default)]
    schedule: Option<String>,
    #[serde(default)]
    time_zone: Option<String>,
}

fn root() -> String {
    "/".into()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueueSpec {
    subject: String,
    #[serde(default = "ten")]
    max_in_flight: u32,
}

fn ten() -> u32 {
    10
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeliverySpec {
    retries: Option<u32>,
    backoff: Option<String>,
    timeout: Option<String>,
    dead_letter: Option<bool>,
}

/// One trigger as it should run.
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    pub kind: Kind,
    /// A schedule trigger's cron expression and time zone, as written (checked).
    pub schedule: Option<(String, Option<String>)>,
    pub consumer: ConsumerSpec,
    pub policy: DeliveryPolicy,
    /// The Service in the Function's namespace its events go to, and the path.
    pub service: String,
    pub path: String,
    /// The Function's UID, which the notes on its deliveries name (`journal.rs`); set by
    /// the watch.
    pub function_uid: Option<String>,
}

/// `wasmless.io/v1alpha1` `Function`, read as JSON: this crate needs only its triggers.
pub fn functions_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("wasmless.io", "v1alpha1", "Function"),
        "functions",
    )
}

pub fn functions_api(client: kube::Client, namespace: Option<&str>) -> kube::Api<DynamicObject> {
    let resource = functions_resource();
    match namespace {
        Some(namespace) => kube::Api::namespaced_with(client, namespace, &resource),
        None => kube::Api::all_with(client, &resource),
    }
}

/// The triggers of Function `name` in `namespace` with this `spec`, as they should run.
pub fn wanted(namespace: &str, name: &str, spec: &serde_json::Value) -> Result<Vec<Wanted>, FunctionError> {
    let spec: Spec = serde_json::from_value(spec.clone()).map_err(|error| FunctionError::Spec(error.to_string()))?;
    let policy = policy(spec.delivery.as_ref())?;
    let service = spec.service.clone().unwrap_or_else(|| name.to_string());
    spec.triggers
        .iter()
        .map(|trigger| {
            let path_ok = trigger.path.starts_with('/')
                && !trigger
                    .path
                    .contains(|c: char| c.is_whitespace() || c.is_control() || c == '?' || c == '#');
            if !path_ok {
                return Err(FunctionError::Path {
                    trigger: trigger.name.clone(),
                    path: trigger.path.clone(),
                });
            }
            let reference = TriggerRef::new(namespace, name, &trigger.name);
            let (kind, subject, max_in_flight) = match (&trigger.queue, &trigger.schedule) {
                (Some(queue), None) => {
                    let subject =
                        names::subject(namespace, &queue.subject).map_err(|source| FunctionError::Subject {
                            trigger: trigger.name.clone(),
                            source,
                        })?;
                    (Kind::Queue, subject, queue.max_in_flight.max(1))
                }
                // A tick at a time: a run does not overlap the one before.
                (None, Some(expression)) => {
                    Schedule::parse(expression, trigger.time_zone.as_deref()).map_err(|source| {
                        FunctionError::Schedule {
                            trigger: trigger.name.clone(),
                            source,
                        }
                    })?;
                    (Kind::Schedule, reference.schedule_subject(), 1)
                }
                _ => {
                    return Err(FunctionError::Kind {
                        trigger: trigger.name.clone(),
                    });
                }
            };
            Ok(Wanted {
                function_uid: None,
                kind,
                schedule: trigger
                    .schedule
                    .clone()
                    .map(|expression| (expression, trigger.time_zone.clone())),
                consumer: ConsumerSpec {
                    trigger: reference,
                    subject,
                    max_in_flight,
                    ack_wait: policy.timeout + ACK_MARGIN,
                    max_deliver: policy.retries + 2,
                },
                policy: policy.clone(),
                service: service.clone(),
                path: trigger.path.clone(),
            })
        })
        .collect()
}

fn policy(delivery: Option<&DeliverySpec>) -> Result<DeliveryPolicy, FunctionError> {
    let defaults = DeliveryPolicy::default();
    let Some(delivery) = delivery else {
        return Ok(defaults);
    };
    let duration = |field, text: &Option<String>, default| match text {
        None => Ok(default),
        Some(text) => match wasmless_formats::quantity::parse_duration(text) {
            Ok(duration) if duration <= MAX_DELIVERY_DURATION => Ok(duration),
            Ok(_) => Err(FunctionError::Delivery {
                field,
                why: format!("{text} is over the longest, {}s", MAX_DELIVERY_DURATION.as_secs()),
            }),
            Err(why) => Err(FunctionError::Delivery { field, why }),
        },
    };
    Ok(DeliveryPolicy {
        retries: delivery.retries.unwrap_or(defaults.retries),
        backoff: duration("backoff", &delivery.backoff, defaults.backoff)?,
        timeout: duration("timeout", &delivery.timeout, defaults.timeout)?,
        dead_letter: delivery.dead_letter.unwrap_or(defaults.dead_letter),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_function_without_triggers_wants_nothing() {
        assert_eq!(
            wanted("shop", "hello", &json!({"source": "package handlers"})),
            Ok(vec![])
        );
    }

    #[test]
    fn a_queue_trigger_runs_under_the_functions_namespace_and_policy() {
        let spec = json!({
            "service": "front",
            "triggers": [{"name": "created", "path": "/hook", "queue": {"subject": "orders.created", "maxInFlight": 4}}],
            "delivery": {"retries": 5, "backoff": "250ms", "timeout": "10s", "deadLetter": false},
        });
        let wanted = wanted("shop", "orders", &spec).unwrap();
        assert_eq!(wanted.len(), 1);
        let trigger = &wanted[0];
        assert_eq!(trigger.consumer.subject, "wasmless.shop.orders.created");
        assert_eq!(trigger.consumer.trigger, TriggerRef::new("shop", "orders", "created"));
        assert_eq!(trigger.consumer.max_in_flight, 4);
        assert_eq!(trigger.consumer.ack_wait, Duration::from_secs(15));
        assert_eq!(trigger.consumer.max_deliver, 7);
        assert_eq!((trigger.service.as_str(), trigger.path.as_str()), ("front", "/hook"));
        assert_eq!(
            trigger.policy,
            DeliveryPolicy {
                retries: 5,
                backoff: Duration::from_millis(250),
                timeout: Duration::from_secs(10),
                dead_letter: false
            }
        );
    }

    #[test]
    fn defaults_are_the_crds() {
        let spec = json!({"triggers": [{"name": "t", "queue": {"subject": "jobs"}}]});
        let trigger = &wanted("shop", "worker", &spec).unwrap()[0];
        assert_eq!((trigger.service.as_str(), trigger.path.as_str()), ("worker", "/"));
        assert_eq!(trigger.consumer.max_in_flight, 10);
        assert_eq!(trigger.policy, DeliveryPolicy::default());
    }

    #[test]
    fn delivery_durations_over_five_minutes_and_paths_leaving_the_host_are_refused() {
        let long =
            json!({"triggers": [{"name": "t", "queue": {"subject": "jobs"}}], "delivery": {"timeout": "999999m"}});
        let error = wanted("shop", "worker", &long).unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.delivery.timeout: 999999m is over the longest, 300s"
        );
        let path = json!({"triggers": [{"name": "t", "path": "@169.254.169.254/x", "queue": {"subject": "jobs"}}]});
        assert!(matches!(
            wanted("shop", "worker", &path),
            Err(FunctionError::Path { .. })
        ));
    }

    #[test]
    fn a_schedule_trigger_reads_its_own_ticks_one_at_a_time() {
        let spec = json!({"triggers": [{"name": "nightly", "path": "/cron", "schedule": "0 3 * * *", "timeZone": "Europe/Paris"}]});
        let trigger = &wanted("shop", "reports", &spec).unwrap()[0];
        assert_eq!(trigger.kind, Kind::Schedule);
        assert_eq!(trigger.consumer.subject, "wasmless.shop._schedule.reports.nightly");
        assert_eq!(trigger.consumer.max_in_flight, 1);
        assert_eq!(
            trigger.schedule,
            Some(("0 3 * * *".to_string(), Some("Europe/Paris".to_string())))
        );
        for (bad, words) in [
            (json!({"name": "t", "schedule": "at noon"}), "write 5 fields"),
            (
                json!({"name": "t", "schedule": "* * * * *", "timeZone": "Nowhere"}),
                "IANA",
            ),
            (json!({"name": "t"}), "a queue or a schedule"),
            (
                json!({"name": "t", "schedule": "* * * * *", "queue": {"subject": "a"}}),
                "a queue or a schedule",
            ),
        ] {
            let error = wanted("shop", "reports", &json!({"triggers": [bad]})).unwrap_err();
            assert!(error.to_string().contains(words), "{error}");
        }
    }

    #[test]
    fn a_subject_the_crd_would_refuse_is_refused_here_too() {
        let spec = json!({"triggers": [{"name": "t", "queue": {"subject": "_deadletter.other"}}]});
        let error = wanted("shop", "worker", &spec).unwrap_err();
        assert!(
            error.to_string().starts_with("spec.triggers[t].queue: subject"),
            "{error}"
        );
    }
}
