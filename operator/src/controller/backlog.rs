//! A Function's backlog as load for the autoscaler: the events waiting for it in the
//! broker, as `wasmless-events` writes them on `status.triggers` (docs/pool.md, "The
//! autoscaler").

use crate::crd::Function;
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

/// How long a trigger's lag counts after `wasmless-events` read it. It writes a lag over
/// zero again every few seconds; an older one is from a component no longer there, and
/// the backlog it saw may be long gone.
const LAG_FRESH_FOR: Duration = Duration::from_secs(60);

/// The requests in flight the Function's triggers ask for, by its `status.triggers`: each
/// lag read in the last [`LAG_FRESH_FOR`], up to what the trigger delivers at once.
pub fn waiting_events(func: &Function, now: Timestamp) -> f64 {
    let Some(status) = &func.status else { return 0.0 };
    status
        .triggers
        .iter()
        .filter(|reported| {
            reported.observed_at.as_ref().is_some_and(|at| {
                // A writer's clock a little ahead of this one's is as fresh.
                now.duration_since(at.0).unsigned_abs() <= LAG_FRESH_FOR
            })
        })
        .map(|reported| {
            let at_once = func
                .spec
                .triggers
                .iter()
                .find(|trigger| trigger.name == reported.name)
                .map_or(0, |trigger| {
                    trigger.queue.as_ref().map_or(1, |queue| queue.max_in_flight)
                });
            reported.lag.clamp(0, i64::from(at_once)) as f64
        })
        .sum()
}

#[cfg(test)]
pub(crate) use tests::with_lag;

#[cfg(test)]
mod tests {
    use super::*;

    fn function(target_concurrency: i32) -> Function {
        let mut func = Function::new(
            "f",
            serde_json::from_value(serde_json::json!({"source": "package handlers"})).unwrap(),
        );
        func.spec.scale = Some(crate::crd::Scale {
            min: 0,
            max: 5,
            target_concurrency,
            idle_timeout: "20s".into(),
        });
        func
    }

    pub(crate) fn with_lag(mut func: Function, lag: i64, read_ago: Duration, now: Timestamp) -> Function {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        func.spec.triggers = serde_json::from_value(serde_json::json!([
            {"name": "orders", "queue": {"subject": "orders.created", "maxInFlight": 50}},
            {"name": "nightly", "schedule": "0 3 * * *"},
        ]))
        .unwrap();
        func.status = Some(crate::crd::FunctionStatus {
            triggers: vec![crate::crd::TriggerStatus {
                name: "orders".into(),
                lag,
                last_fired: None,
                dead_letters: 0,
                observed_at: Some(Time(now - read_ago)),
            }],
            ..Default::default()
        });
        func
    }

    #[test]
    fn a_lag_no_component_keeps_writing_counts_for_nothing() {
        let now = Timestamp::now();
        let stale = with_lag(function(10), 2000, Duration::from_secs(300), now);
        assert_eq!(waiting_events(&stale, now), 0.0);
        let fresh = with_lag(function(10), 7, Duration::from_secs(30), now);
        assert_eq!(waiting_events(&fresh, now), 7.0);
        assert_eq!(waiting_events(&function(10), now), 0.0, "no status");
    }

    #[test]
    fn a_schedules_backlog_asks_one_request_and_a_removed_trigger_none() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = Timestamp::now();
        let mut func = with_lag(function(1), 0, Duration::ZERO, now);
        let status = func.status.as_mut().unwrap();
        status.triggers[0].name = "gone".into();
        status.triggers.push(crate::crd::TriggerStatus {
            name: "nightly".into(),
            lag: 40,
            last_fired: None,
            dead_letters: 0,
            observed_at: Some(Time(now)),
        });
        status.triggers[0].lag = 900;
        assert_eq!(waiting_events(&func, now), 1.0);
    }
}
