//! The autoscaler: every [`TICK`], for the Functions with `scale`, it reads how busy each
//! was — in its own pods and in its namespace's pool — from their `/metrics`, decides how
//! many pods of its own it wants, and has the controller reconcile the Functions whose
//! decision changed. The reconcile (`scale::route`) then moves the route and the replicas
//! in the order that drops no request. Off the request path: the pool serves meanwhile.
//!
//! Busy is concurrency, by Little's law: the growth of `wasmless_request_duration_seconds_sum`
//! over a tick is the request-seconds served in it, so divided by the tick it is the
//! average number of requests in flight — exact for short requests, which a sampled
//! in-flight gauge would mostly miss. `wasmless_requests_in_flight` covers the long ones
//! still running.
//!
//! Events waiting for a Function in the broker count too, as Knative's activator counts
//! the requests it holds: demand the pods there are have not met. `wasmless-events` writes
//! each trigger's lag on `status.triggers`; a trigger asks at most its `maxInFlight` of the
//! Function at once (a schedule, 1), which is what its backlog is worth in requests in
//! flight. The larger of that and the measure is the load: the deliveries running are in
//! both. A backlog so scales a Function out of the pool, and an empty queue lets it go
//! back after `idleTimeout`.

use super::Context;
use super::backlog::waiting_events;
use super::pool::{get, pod_addr, ready_pool_pods};
use crate::crd::Function;
use crate::objects::COMPONENT_LABEL;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use wasmless_artifact::labels;

/// How often the pods and the pool are read.
pub const TICK: Duration = Duration::from_secs(2);
/// The ticks averaged for a decision to add pods: short, so a burst is met within seconds.
const UP_WINDOW: usize = 3;
/// How long the load must stay below the pods there are before some go (not to zero: that
/// is `idleTimeout`'s).
const DOWN_DELAY: Duration = Duration::from_secs(30);
/// What one scrape of one pod said about one Function.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Sample {
    /// `wasmless_request_duration_seconds_sum`, over its series.
    pub busy_seconds: f64,
    /// `wasmless_requests_total`, over its series.
    pub requests: f64,
    /// `wasmless_requests_in_flight`.
    pub in_flight: f64,
}

/// Reads a runtime's `/metrics` text: each Function's [`Sample`].
pub fn parse_metrics(text: &str) -> HashMap<String, Sample> {
    let mut samples: HashMap<String, Sample> = HashMap::new();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(function) = label_value(labels, "function") else {
            continue;
        };
        let sample = samples.entry(function).or_default();
        match name {
            "wasmless_request_duration_seconds_sum" => sample.busy_seconds += value,
            "wasmless_requests_total" => sample.requests += value,
            "wasmless_requests_in_flight" => sample.in_flight += value,
            _ => {}
        }
    }
    samples
}

/// The value of `key` in a series' `a="x",b="y"}`.
fn label_value(labels: &str, key: &str) -> Option<String> {
    let mut rest = labels;
    loop {
        let (name, after) = rest.split_once("=\"")?;
        // The value runs to the next quote not escaped by a backslash.
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => value.push(chars.next()?.1),
                (at, '"') => break at,
                (_, c) => value.push(c),
            }
        };
        if name.trim_start_matches(',') == key {
            return Some(value);
        }
        rest = &after[end + 1..];
    }
}

/// One Function's recent load, kept between ticks.
#[derive(Default)]
struct Load {
    /// The last sample of each pod (by IP), to take differences from.
    last: HashMap<String, Sample>,
    /// Average concurrency of the recent ticks, newest last.
    window: VecDeque<f64>,
    /// The last time the load was more than a trickle (half the target per pod).
    last_active: Option<Instant>,
    /// Since when the load has wanted fewer pods than there are.
    lower_since: Option<Instant>,
    /// The events waiting in the broker at the last tick.
    waiting: f64,
}

impl Load {
    /// Takes this tick's samples (pod IP → sample) and the events waiting in the broker;
    /// the concurrency of the tick.
    fn observe(&mut self, samples: HashMap<String, Sample>, tick: Duration, waiting: f64) -> f64 {
        let mut busy = 0.0;
        let mut in_flight = 0.0;
        for (pod, sample) in &samples {
            let before = match self.last.get(pod) {
                Some(before) if before.requests <= sample.requests => *before,
                // Restarted: its counters began again from zero.
                Some(_) => Sample::default(),
                // First seen: its counters hold all its past, nothing to tell this tick by.
                None => *sample,
            };
            busy += (sample.busy_seconds - before.busy_seconds).max(0.0);
            // The gauge is one instant; the busy time covers the whole tick, but only of the
            // requests that ended in it. So the gauge counts only where fewer requests ended
            // in the tick than it shows running: requests longer than the tick (streams),
            // which the busy time has not seen yet. Else a periodic load in step with the
            // scrapes (a client's eight requests at once every 400 ms, read every 2 s) shows
            // its bursts at every reading, and a trickle of 0.1 in flight held three pods
            // (found in the e2e's zero_failed_requests).
            let ended = (sample.requests - before.requests).max(0.0);
            if sample.in_flight > ended {
                in_flight += sample.in_flight;
            }
        }
        let concurrency = (busy / tick.as_secs_f64()).max(in_flight).max(waiting);
        self.last = samples;
        self.waiting = waiting;
        self.window.push_back(concurrency);
        while self.window.len() > UP_WINDOW {
            self.window.pop_front();
        }
        concurrency
    }

    fn average(&self) -> f64 {
        if self.window.is_empty() {
            return 0.0;
        }
        self.window.iter().sum::<f64>() / self.window.len() as f64
    }
}

/// The pods a Function wants, from its load: enough that each has at most
/// `targetConcurrency` in flight; its floor when idle for `idleTimeout`; fewer only after
/// [`DOWN_DELAY`] of lower load; always within `[floor, max]`.
fn decide(func: &Function, load: &mut Load, current: i32, now: Instant) -> (i32, String) {
    let scale = func.spec.scale.as_ref().expect("only scaled Functions are decided");
    let floor = super::scale::floor(func);
    let ceiling = scale.max.max(floor);
    let average = load.average();
    // From zero, pods only for load past the target: the pool serves a trickle as well as a
    // pod would, and a pod for every first request would make min 0 pointless. Once there
    // are pods, they stay (down to one) until the idle timeout.
    let target = f64::from(scale.target_concurrency);
    let by_load = if current == 0 && average <= target {
        0
    } else {
        (average / target).ceil() as i32
    };
    // Idle is a trickle, not silence: under half a pod's target the pool serves the load as
    // well as pods would, so a Function with a request now and then still goes back to it.
    if average >= target / 2.0 {
        load.last_active = Some(now);
    }
    let idle_for = load.last_active.map_or(Duration::MAX, |at| now.duration_since(at));
    let idle_timeout =
        wasmless_formats::quantity::parse_duration(&scale.idle_timeout).unwrap_or(Duration::from_secs(60));
    let target = f64::from(scale.target_concurrency);
    if by_load > current {
        load.lower_since = None;
        let wanted = by_load.clamp(floor, ceiling);
        let demand = if load.waiting > 0.0 {
            format!(
                "{average:.1} requests in flight or events waiting ({:.0} now)",
                load.waiting
            )
        } else {
            format!("{average:.1} requests in flight")
        };
        return (
            wanted,
            format!("{demand} on average, over {target} per pod for {current} pods"),
        );
    }
    if idle_for >= idle_timeout {
        load.lower_since = None;
        return (
            floor,
            format!(
                "under {:.1} requests in flight for {}",
                target / 2.0,
                scale.idle_timeout
            ),
        );
    }
    if by_load.max(1) < current {
        let since = *load.lower_since.get_or_insert(now);
        if now.duration_since(since) >= DOWN_DELAY {
            load.lower_since = None;
            let wanted = by_load.max(1).clamp(floor, ceiling);
            return (
                wanted,
                format!(
                    "{average:.1} requests in flight on average for {}s",
                    DOWN_DELAY.as_secs()
                ),
            );
        }
    } else {
        load.lower_since = None;
    }
    (current.clamp(floor, ceiling), String::new())
}

/// Runs until the process ends: ticks, decides, and sends the Functions to reconcile.
pub async fn run(ctx: Arc<Context>, functions: Store<Function>, reconcile: mpsc::UnboundedSender<ObjectRef<Function>>) {
    let mut loads: HashMap<ObjectRef<Function>, Load> = HashMap::new();
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_tick = Instant::now();
    loop {
        interval.tick().await;
        let now = Instant::now();
        let tick = now.duration_since(last_tick).max(Duration::from_millis(100));
        last_tick = now;
        let scaled: Vec<Arc<Function>> = functions
            .state()
            .into_iter()
            .filter(|func| func.spec.scale.is_some() && func.metadata.deletion_timestamp.is_none())
            .collect();
        loads.retain(|key, _| scaled.iter().any(|func| ObjectRef::from_obj(&**func) == *key));
        let mut by_namespace: BTreeMap<String, Vec<Arc<Function>>> = BTreeMap::new();
        for func in scaled {
            by_namespace
                .entry(func.namespace().unwrap_or_default())
                .or_default()
                .push(func);
        }
        for (ns, funcs) in by_namespace {
            let scrapes = scrape_namespace(&ctx, &ns).await;
            for func in funcs {
                let key = ObjectRef::from_obj(&*func);
                let load = loads.entry(key.clone()).or_insert_with(|| Load {
                    // An operator that just started has seen no idle time.
                    last_active: Some(now),
                    ..Default::default()
                });
                let samples: HashMap<String, Sample> = scrapes
                    .iter()
                    .filter_map(|(pod, samples)| Some((pod.clone(), *samples.get(&func.name_any())?)))
                    .collect();
                let concurrency = load.observe(samples, tick, waiting_events(&func, Timestamp::now()));
                ctx.metrics.concurrency(&func.name_any(), &ns, concurrency);
                let current = ctx
                    .scaler
                    .wanted(&func)
                    .or_else(|| func.status.as_ref().and_then(|s| s.replicas))
                    .unwrap_or(0);
                let (wanted, why) = decide(&func, load, current, now);
                if ctx.scaler.set(key.clone(), wanted) && wanted != current {
                    ctx.metrics.scale_decided(&func.name_any(), &ns, wanted > current);
                    announce(&ctx, &func, current, wanted, &why).await;
                    let _ = reconcile.send(key);
                }
            }
        }
    }
}

/// Every runtime pod's and pool pod's samples in `ns`, by pod IP. A pod that does not
/// answer is left out of this tick.
async fn scrape_namespace(ctx: &Context, ns: &str) -> HashMap<String, HashMap<String, Sample>> {
    let mut ips = ready_pool_pods(ctx, ns).await.unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let runtime_pods = format!("{COMPONENT_LABEL}=runtime,{}", labels::FUNCTION);
    if let Ok(list) = pods.list(&ListParams::default().labels(&runtime_pods)).await {
        ips.extend(list.items.iter().filter_map(|pod| pod.status.as_ref()?.pod_ip.clone()));
    }
    let scrapes = futures::future::join_all(ips.into_iter().map(|ip| async move {
        let text = get(&format!("http://{}/metrics", pod_addr(&ip))).await.ok()?;
        Some((ip, parse_metrics(&String::from_utf8_lossy(&text))))
    }))
    .await;
    scrapes.into_iter().flatten().collect()
}

/// An Event on the Function for each decision, saying why.
async fn announce(ctx: &Context, func: &Function, from: i32, to: i32, why: &str) {
    let event = Event {
        type_: EventType::Normal,
        reason: if to > from { "ScaledUp" } else { "ScaledDown" }.into(),
        note: Some(super::event_note(&format!("{from} → {to} pods of its own: {why}"))),
        action: "Scale".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &func.object_ref(&())).await {
        tracing::warn!(function = %func.name_any(), %error, "could not publish event");
    }
    tracing::info!(function = %func.name_any(), from, to, why, "scaled");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::backlog::with_lag;
    use crate::crd::Scale;

    const METRICS: &str = r#"# HELP wasmless_requests Requests served
# TYPE wasmless_requests counter
wasmless_requests_total{function="hello",method="GET",status="200"} 120
wasmless_requests_total{function="hello",method="POST",status="500"} 3
wasmless_requests_total{function="other",method="GET",status="200"} 7
wasmless_request_duration_seconds_sum{function="hello",method="GET",status="200"} 6.5
wasmless_request_duration_seconds_sum{function="hello",method="POST",status="500"} 0.5
wasmless_request_duration_seconds_count{function="hello",method="GET",status="200"} 120
wasmless_requests_in_flight{function="hello"} 2
wasmless_requests_in_flight{function="other"} 0
"#;

    #[test]
    fn reads_each_functions_busy_time_requests_and_in_flight() {
        let samples = parse_metrics(METRICS);
        assert_eq!(
            samples["hello"],
            Sample {
                busy_seconds: 7.0,
                requests: 123.0,
                in_flight: 2.0
            }
        );
        assert_eq!(samples["other"].requests, 7.0);
        assert_eq!(
            label_value(r#"xfunction="no",function="yes"}"#, "function"),
            Some("yes".into())
        );
        assert_eq!(
            label_value(r#"a="q\"uote",function="f"}"#, "function"),
            Some("f".into())
        );
        assert_eq!(label_value(r#"a="x"}"#, "function"), None);
    }

    fn function(min: i32, max: i32, target: i32, idle: &str) -> Function {
        let mut func = Function::new(
            "f",
            serde_json::from_value(serde_json::json!({"source": "package handlers"})).unwrap(),
        );
        func.spec.scale = Some(Scale {
            min,
            max,
            target_concurrency: target,
            idle_timeout: idle.into(),
        });
        func
    }

    fn tick(load: &mut Load, pod: &str, busy: f64, requests: f64) -> f64 {
        let sample = Sample {
            busy_seconds: busy,
            requests,
            in_flight: 0.0,
        };
        load.observe(HashMap::from([(pod.to_string(), sample)]), TICK, 0.0)
    }

    #[test]
    fn load_over_the_target_adds_pods_at_once_and_idleness_returns_to_the_floor() {
        let func = function(0, 5, 10, "20s");
        let start = Instant::now();
        let mut load = Load::default();
        // 50 request-seconds per 2 s tick: 25 in flight on average.
        tick(&mut load, "10.0.0.1", 0.0, 0.0);
        let concurrency = tick(&mut load, "10.0.0.1", 50.0, 1000.0);
        assert_eq!(concurrency, 25.0);
        tick(&mut load, "10.0.0.1", 100.0, 2000.0);
        let (wanted, why) = decide(&func, &mut load, 0, start + TICK * 2);
        // The window holds 0, 25, 25: 16.7 on average, two pods of 10.
        assert_eq!(wanted, 2, "{why}");
        // No request since: back to 0 after the idle timeout, not before.
        let quiet = start + TICK * 3;
        tick(&mut load, "10.0.0.1", 100.0, 2000.0);
        tick(&mut load, "10.0.0.1", 100.0, 2000.0);
        tick(&mut load, "10.0.0.1", 100.0, 2000.0);
        let (wanted, _) = decide(&func, &mut load, 2, quiet + Duration::from_secs(10));
        assert_eq!(wanted, 2, "not idle for 20 s yet");
        let (wanted, why) = decide(&func, &mut load, 2, start + TICK * 2 + Duration::from_secs(20));
        assert_eq!(wanted, 0, "{why}");
        assert!(why.contains("for 20s"), "{why}");
    }

    #[test]
    fn a_trickle_stays_in_the_pool() {
        let func = function(0, 5, 10, "60s");
        let start = Instant::now();
        let mut load = Load::default();
        tick(&mut load, "pool", 0.0, 0.0);
        // 8 in flight on average: under the target of 10 per pod.
        tick(&mut load, "pool", 16.0, 500.0);
        let (wanted, why) = decide(&func, &mut load, 0, start + TICK);
        assert_eq!(wanted, 0, "{why}");
        // 24 in flight: past it, two pods.
        tick(&mut load, "pool", 64.0, 1500.0);
        tick(&mut load, "pool", 112.0, 2500.0);
        let (wanted, why) = decide(&func, &mut load, 0, start + TICK * 3);
        assert_eq!(wanted, 2, "{why}");
    }

    #[test]
    fn pods_stay_within_min_and_max() {
        let func = function(1, 3, 1, "1s");
        let start = Instant::now();
        let mut load = Load::default();
        tick(&mut load, "p", 0.0, 0.0);
        tick(&mut load, "p", 100.0, 10.0);
        let (wanted, _) = decide(&func, &mut load, 1, start + TICK);
        assert_eq!(wanted, 3, "50 in flight wants 50 pods; max is 3");
        let idle = start + Duration::from_secs(60);
        for _ in 0..UP_WINDOW {
            tick(&mut load, "p", 100.0, 10.0);
        }
        let (wanted, _) = decide(&func, &mut load, 3, idle);
        assert_eq!(wanted, 1, "idle: min 1, not 0");
    }

    fn tick_in_flight(load: &mut Load, busy: f64, requests: f64, in_flight: f64) -> f64 {
        let sample = Sample {
            busy_seconds: busy,
            requests,
            in_flight,
        };
        load.observe(HashMap::from([("p".to_string(), sample)]), TICK, 0.0)
    }

    #[test]
    fn requests_longer_than_a_tick_count_by_the_gauge() {
        let mut load = Load::default();
        tick_in_flight(&mut load, 0.0, 0.0, 0.0);
        // Six streams open for minutes: none has ended, so no busy time yet.
        assert_eq!(tick_in_flight(&mut load, 0.0, 0.0, 6.0), 6.0);
        assert_eq!(tick_in_flight(&mut load, 0.0, 0.0, 6.0), 6.0);
    }

    #[test]
    fn bursts_in_step_with_the_scrapes_are_not_taken_for_the_load() {
        let func = function(0, 3, 2, "15s");
        let start = Instant::now();
        // Three pods, busy until `start`; then the trickle.
        let mut load = Load {
            last_active: Some(start),
            ..Load::default()
        };
        tick_in_flight(&mut load, 0.0, 0.0, 0.0);
        // 20 requests a second of 7 ms, eight at once, each reading catching a burst: 40
        // ended per tick, 0.28 s busy, 8 running at the instant of the scrape.
        let mut concurrency = 0.0;
        for n in 1..=10 {
            concurrency = tick_in_flight(&mut load, 0.28 * n as f64, 40.0 * n as f64, 8.0);
        }
        assert!((concurrency - 0.14).abs() < 1e-9, "{concurrency}");
        let (wanted, why) = decide(&func, &mut load, 3, start + Duration::from_secs(16));
        assert_eq!(wanted, 0, "{why}");
    }

    #[test]
    fn a_backlog_in_the_broker_scales_out_of_the_pool_and_an_empty_queue_back_to_it() {
        let now = Timestamp::now();
        let start = Instant::now();
        let mut load = Load::default();
        // 2,000 events waiting, delivered 50 at a time: 5 pods' worth, while the pool
        // measures 3 in flight.
        let backlog = with_lag(function(0, 8, 10, "20s"), 2000, Duration::from_secs(3), now);
        let waiting = waiting_events(&backlog, now);
        assert_eq!(waiting, 50.0);
        let pool = |busy: f64, requests: f64| {
            HashMap::from([(
                "pool".to_string(),
                Sample {
                    busy_seconds: busy,
                    requests,
                    in_flight: 0.0,
                },
            )])
        };
        load.observe(pool(0.0, 0.0), TICK, waiting);
        load.observe(pool(6.0, 3000.0), TICK, waiting);
        let (wanted, why) = decide(&backlog, &mut load, 0, start + TICK);
        assert_eq!(wanted, 5, "{why}");
        assert!(why.contains("events waiting (50 now)"), "{why}");
        // Drained: nothing waits, nothing runs; the pods go after the idle timeout.
        let drained = with_lag(function(0, 5, 10, "20s"), 0, Duration::ZERO, now);
        for _ in 0..UP_WINDOW {
            load.observe(pool(6.0, 3000.0), TICK, waiting_events(&drained, now));
        }
        let (wanted, _) = decide(&drained, &mut load, 5, start + Duration::from_secs(10));
        assert_eq!(wanted, 5, "not idle for 20 s yet");
        let (wanted, why) = decide(&drained, &mut load, 5, start + TICK + Duration::from_secs(21));
        assert_eq!(wanted, 0, "{why}");
    }

    #[test]
    fn a_restarted_pod_counts_from_zero() {
        let mut load = Load::default();
        tick(&mut load, "p", 500.0, 900.0);
        // The pod restarted: its counters went down. Its 4 s count as this tick's.
        let concurrency = tick(&mut load, "p", 4.0, 10.0);
        assert_eq!(concurrency, 2.0);
    }
}
