//! What a failed `real_api` scenario left in its namespace, printed beside its panic: on a
//! CI machine the namespace is gone with the cluster, and an assertion such as "phase
//! Building, not Ready" says nothing of which of the build, the Job, the chunks, the
//! Deployment or the pods stood still.

use crate::harness::Harness;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::ListParams;
use std::fmt::Debug;
use wasmless_operator::crd::Function;

/// Events printed, the newest.
const EVENTS_SHOWN: usize = 30;

impl Harness {
    /// Every object of the scenario's namespace a build and a rollout go through, as lines.
    pub(crate) async fn cluster_state(&self) -> String {
        let mut lines = vec![format!(
            "== what namespace {} holds (kept for a look while the cluster runs)",
            self.ns
        )];
        lines.extend(self.each("Functions", function_lines).await);
        lines.extend(self.each("Jobs", |job: Job| vec![job_line(job)]).await);
        lines.extend(self.chunk_names().await);
        lines.extend(self.each("Deployments", |d: Deployment| vec![deployment_line(d)]).await);
        lines.extend(self.each("Pods", |pod: Pod| vec![pod_line(pod)]).await);
        lines.extend(self.events().await);
        lines.join("\n")
    }

    /// The lines `describe` makes of each object of kind `K` in the namespace, or why they
    /// could not be listed.
    async fn each<K>(&self, kind: &str, describe: impl Fn(K) -> Vec<String>) -> Vec<String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + serde::de::DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        match self.api::<K>().list(&ListParams::default()).await {
            Ok(list) => list.items.into_iter().flat_map(describe).collect(),
            Err(error) => vec![format!("{kind}: {error}")],
        }
    }

    /// Names only: the chunks' data is megabytes.
    async fn chunk_names(&self) -> Vec<String> {
        let line = match self.api::<ConfigMap>().list_metadata(&ListParams::default()).await {
            Ok(list) => format!(
                "ConfigMaps: {:?}",
                list.items.iter().map(|cm| cm.name_any()).collect::<Vec<_>>()
            ),
            Err(error) => format!("ConfigMaps: {error}"),
        };
        vec![line]
    }

    /// The newest Events, oldest first.
    async fn events(&self) -> Vec<String> {
        let mut events = match self.api::<Event>().list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(error) => return vec![format!("Events: {error}")],
        };
        events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        let skip = events.len().saturating_sub(EVENTS_SHOWN);
        events
            .into_iter()
            .skip(skip)
            .map(|event| {
                let about = event.regarding.and_then(|r| r.name).unwrap_or_default();
                format!(
                    "Event {} {about}: {}",
                    event.reason.unwrap_or_default(),
                    event.note.unwrap_or_default()
                )
            })
            .collect()
    }
}

fn function_lines(func: Function) -> Vec<String> {
    let status = func.status.clone().unwrap_or_default();
    let mut lines = vec![format!(
        "Function {} generation {:?}: phase {:?}, observed {:?}, source {:?}, module {:?}",
        func.name_any(),
        func.metadata.generation,
        status.phase,
        status.observed_generation,
        status.source_digest,
        status.module_digest
    )];
    lines.extend(
        status
            .conditions
            .iter()
            .map(|c| format!("  {} {} {}: {}", c.type_, c.status, c.reason, c.message)),
    );
    lines
}

fn job_line(job: Job) -> String {
    let status = job.status.clone().unwrap_or_default();
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason.as_deref().unwrap_or("")))
        .collect();
    format!(
        "Job {}: active {:?}, succeeded {:?}, failed {:?}, started {:?}, conditions {conditions:?}",
        job.name_any(),
        status.active,
        status.succeeded,
        status.failed,
        status.start_time.map(|t| t.0.to_string())
    )
}

fn deployment_line(deployment: Deployment) -> String {
    let status = deployment.status.clone().unwrap_or_default();
    format!(
        "Deployment {} generation {:?} (observed {:?}): wanted {:?}, replicas {:?}, updated {:?}, ready {:?}, available {:?}",
        deployment.name_any(),
        deployment.metadata.generation,
        status.observed_generation,
        deployment.spec.as_ref().and_then(|s| s.replicas),
        status.replicas,
        status.updated_replicas,
        status.ready_replicas,
        status.available_replicas
    )
}

fn pod_line(pod: Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone());
    let containers: Vec<String> = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| {
            let state = c.state.clone().unwrap_or_default();
            let now = match (state.waiting, state.running, state.terminated) {
                (Some(w), ..) => format!("waiting {:?} {:?}", w.reason, w.message),
                (_, Some(_), _) => "running".into(),
                (.., Some(t)) => format!("terminated {} {:?}", t.exit_code, t.reason),
                _ => "unknown".into(),
            };
            format!("{} {now}, restarts {}", c.name, c.restart_count)
        })
        .collect();
    format!(
        "Pod {}: {:?}, ready {ready:?}, {containers:?}",
        pod.name_any(),
        status.phase
    )
}
