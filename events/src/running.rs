//! The triggers this process delivers, kept to what the Functions say: `set` starts a
//! Function's new triggers, restarts its changed ones and stops (and removes the consumers
//! of) its removed ones; each runs `keep_delivering`, which finds the Function's Pods
//! (`endpoints.rs`), delivers until the consumer's stream ends, and starts again after a
//! growing pause.

use crate::broker::Broker;
use crate::deliver::{self, HttpClient, Target};
use crate::endpoints::{self, Addresses};
use crate::function::Wanted;
use crate::journal::Journal;
use crate::metrics::EventMetrics;
use crate::names::TriggerRef;
use crate::report::Progresses;
use crate::schedule::{self, Schedule};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// How often a trigger's progress is read (`wasmless_events_lag`, `status.triggers`), and
/// its Function's Pods.
const LOOK_EVERY: Duration = Duration::from_secs(5);
/// The shortest gap between two reads of a trigger's Pods when deliveries keep finding none.
const LOOK_AGAIN_AFTER: Duration = Duration::from_secs(1);
/// The longest pause before a trigger whose delivery stopped is started again.
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(30);

pub struct Running<B: Broker> {
    broker: Arc<B>,
    kube: kube::Client,
    metrics: EventMetrics,
    progresses: Progresses,
    sending: Sending,
    triggers: HashMap<TriggerRef, (Wanted, JoinHandle<()>)>,
}

/// What every trigger's deliveries share: the HTTP client, the process's permits, and
/// where their notes go.
#[derive(Clone)]
struct Sending {
    http: HttpClient,
    in_flight: Arc<Semaphore>,
    journal: Journal,
}

impl<B: Broker> Running<B> {
    /// `max_in_flight`: deliveries at once over every trigger (`--max-in-flight`).
    pub fn new(
        broker: Arc<B>,
        kube: kube::Client,
        metrics: EventMetrics,
        journal: Journal,
        max_in_flight: usize,
    ) -> Self {
        Self {
            broker,
            kube,
            metrics,
            progresses: Progresses::default(),
            sending: Sending {
                http: deliver::http_client(),
                in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
                journal,
            },
            triggers: HashMap::new(),
        }
    }

    /// Each running trigger's last progress, for `report::keep_reporting`.
    pub fn progresses(&self) -> Progresses {
        self.progresses.clone()
    }

    /// The Functions whose triggers run, as (namespace, name).
    pub fn functions(&self) -> Vec<(String, String)> {
        let mut functions: Vec<_> = self
            .triggers
            .keys()
            .map(|trigger| (trigger.namespace.clone(), trigger.function.clone()))
            .collect();
        functions.sort();
        functions.dedup();
        functions
    }

    /// Function `namespace/name`'s triggers become `wanted` (empty: none of them runs).
    pub async fn set(&mut self, namespace: &str, name: &str, wanted: Vec<Wanted>) {
        let of_function = |trigger: &TriggerRef| trigger.namespace == namespace && trigger.function == name;
        let stale: Vec<TriggerRef> = self
            .triggers
            .iter()
            .filter(|(trigger, (running, _))| of_function(trigger) && !wanted.iter().any(|want| want == running))
            .map(|(trigger, _)| trigger.clone())
            .collect();
        for trigger in stale {
            let (running, task) = self.triggers.remove(&trigger).expect("listed above");
            task.abort();
            let removed = !wanted.iter().any(|want| want.consumer.trigger == trigger);
            if removed {
                if let Err(error) = self.broker.remove_consumer(&running.consumer).await {
                    tracing::warn!(?trigger, %error, "a removed trigger's consumer is left on the broker");
                }
                // Its ticks go too: a trigger made again under the name starts afresh.
                if running.schedule.is_some()
                    && let Err(error) = self.broker.trim(&trigger.namespace, &running.consumer.subject, 0).await
                {
                    tracing::warn!(?trigger, %error, "a removed schedule's ticks are left on the broker");
                }
                self.metrics.trigger_stopped(&trigger);
                self.progresses.remove(&trigger);
                tracing::info!(?trigger, "trigger removed");
            }
        }
        for want in wanted {
            let trigger = want.consumer.trigger.clone();
            if self.triggers.contains_key(&trigger) {
                continue;
            }
            self.metrics.trigger_started(&trigger);
            let delivering = keep_delivering(
                self.broker.clone(),
                self.kube.clone(),
                self.metrics.clone(),
                self.progresses.clone(),
                self.sending.clone(),
                want.clone(),
            );
            let ticking = keep_ticking(self.broker.clone(), want.clone());
            let reading = keep_reading_progress(
                self.broker.clone(),
                want.clone(),
                self.metrics.clone(),
                self.progresses.clone(),
            );
            let task = tokio::spawn(async move {
                tokio::join!(delivering, ticking, reading);
            });
            tracing::info!(?trigger, subject = %want.consumer.subject, "trigger started");
            self.triggers.insert(trigger, (want, task));
        }
    }
}

impl<B: Broker> Drop for Running<B> {
    fn drop(&mut self) {
        for (_, task) in self.triggers.values() {
            task.abort();
        }
    }
}

/// A schedule trigger's ticks, published until its task is aborted (`schedule.rs`); nothing
/// for a queue trigger.
async fn keep_ticking<B: Broker>(broker: Arc<B>, want: Wanted) {
    let Some((expression, time_zone)) = &want.schedule else {
        return;
    };
    match Schedule::parse(expression, time_zone.as_deref()) {
        Ok(schedule) => {
            schedule::keep_ticking(
                broker,
                want.consumer.trigger.clone(),
                want.consumer.subject.clone(),
                schedule,
            )
            .await;
        }
        // `function::wanted` parsed it already.
        Err(error) => tracing::warn!(trigger = ?want.consumer.trigger, %error, "schedule not ticking"),
    }
}

/// A trigger's progress, read from the broker until its task is aborted: for the metric, for
/// its Function's status (the autoscaler's lag) and for `keep_looking`. From the start, so
/// a Function with no Pod yet shows its backlog.
async fn keep_reading_progress<B: Broker>(broker: Arc<B>, want: Wanted, metrics: EventMetrics, progresses: Progresses) {
    let trigger = &want.consumer.trigger;
    loop {
        match broker.progress(&want.consumer).await {
            Ok(progress) => {
                metrics.set_lag(trigger, progress.lag);
                progresses.set(trigger, progress);
            }
            // No consumer yet: `keep_delivering` makes it.
            Err(error) => tracing::debug!(?trigger, %error, "progress not read"),
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// One trigger, delivered until its task is aborted.
async fn keep_delivering<B: Broker>(
    broker: Arc<B>,
    kube: kube::Client,
    metrics: EventMetrics,
    progresses: Progresses,
    sending: Sending,
    want: Wanted,
) {
    let trigger = want.consumer.trigger.clone();
    let mut pause = Duration::from_millis(500);
    loop {
        let delivered = async {
            broker
                .ensure_namespace(&trigger.namespace)
                .await
                .map_err(|e| e.to_string())?;
            broker
                .ensure_consumer(&want.consumer)
                .await
                .map_err(|e| e.to_string())?;
            let addresses = Arc::new(Addresses::default());
            addresses.set(first_pods(&kube, &trigger, &want.service).await?);
            let target = Arc::new(Target {
                trigger: trigger.clone(),
                kind: want.kind,
                addresses: addresses.clone(),
                path: want.path.clone(),
                policy: want.policy.clone(),
                journal: sending.journal.about(want.function_uid.clone()),
            });
            pause = Duration::from_millis(500);
            let delivering = deliver::deliver_all(
                broker.clone(),
                want.consumer.clone(),
                target,
                sending.http.clone(),
                metrics.clone(),
                sending.in_flight.clone(),
            );
            tokio::select! {
                ended = delivering => ended.map_err(|e| e.to_string()),
                () = keep_looking(&kube, &want, &addresses, &progresses) => Ok(()),
            }
        }
        .await;
        if let Err(error) = delivered {
            tracing::warn!(?trigger, %error, ?pause, "trigger not delivering; starting it again after a pause");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RESTART_PAUSE);
    }
}

/// The Function's ready Pods, waited for: until one serves it (its first build, a pool that
/// does not route to it yet), its events stay in the broker instead of spending their
/// tries. Read again every second, then less often, up to every 10 s.
async fn first_pods(
    kube: &kube::Client,
    trigger: &TriggerRef,
    service: &str,
) -> Result<Vec<std::net::SocketAddr>, String> {
    let mut pause = Duration::from_secs(1);
    loop {
        let found = endpoints::pod_addresses(kube, &trigger.namespace, service)
            .await
            .map_err(|e| e.to_string())?;
        if !found.is_empty() {
            return Ok(found);
        }
        tracing::debug!(?trigger, ?pause, "no ready Pod serves the Function yet");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// The Function's Pods, read again every few seconds while events wait: Pods come and go
/// (the pool at zero, the Function's own when it scales).
async fn keep_looking(kube: &kube::Client, want: &Wanted, addresses: &Addresses, progresses: &Progresses) {
    let trigger = &want.consumer.trigger;
    loop {
        let missed = tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => false,
            () = addresses.missed() => true,
        };
        if missed {
            if let Ok(found) = endpoints::pod_addresses(kube, &trigger.namespace, &want.service).await {
                addresses.set(found);
            }
            tokio::time::sleep(LOOK_AGAIN_AFTER).await;
            continue;
        }
        // An idle trigger costs the API server nothing: its Pods are read again once it
        // has events to deliver.
        if progresses.get(trigger).is_some_and(|progress| progress.lag == 0) {
            continue;
        }
        match endpoints::pod_addresses(kube, &trigger.namespace, &want.service).await {
            Ok(found) => addresses.set(found),
            Err(error) => {
                tracing::warn!(?trigger, %error, "the Function's Pods not read; delivering to the ones known")
            }
        }
    }
}
