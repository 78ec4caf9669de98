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
use std::fmt::Write;
use wasmless_operator::crd::Function;

impl Harness {
    /// Every object of the scenario's namespace a build and a rollout go through, as lines.
    pub(crate) async fn cluster_state(&self) -> String {
        let mut out = format!(
            "== what namespace {} holds (kept for a look while the cluster runs)\n",
            self.ns
        );
        self.functions(&mut out).await;
        self.jobs_and_chunks(&mut out).await;
        self.deployments_and_pods(&mut out).await;
        self.events(&mut out).await;
        out
    }

    async fn functions(&self, out: &mut String) {
        match self.api::<Function>().list(&ListParams::default()).await {
            Ok(list) => {
                for func in list.items {
                    let status = func.status.clone().unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "Function {} generation {:?}: phase {:?}, observed {:?}, source {:?}, module {:?}",
                        func.name_any(),
                        func.metadata.generation,
                        status.phase,
                        status.observed_generation,
                        status.source_digest,
                        status.module_digest
                    );
                    for c in &status.conditions {
                        let _ = writeln!(out, "  {} {} {}: {}", c.type_, c.status, c.reason, c.message);
                    }
                }
            }
            Err(error) => {
                let _ = writeln!(out, "Functions: {error}");
            }
        }
    }

    async fn jobs_and_chunks(&self, out: &mut String) {
        let all = ListParams::default();
        match self.api::<Job>().list(&all).await {
            Ok(list) => {
                for job in list.items {
                    let status = job.status.clone().unwrap_or_default();
                    let conditions: Vec<String> = status
                        .conditions
                        .iter()
                        .flatten()
                        .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason.as_deref().unwrap_or("")))
                        .collect();
                    let _ = writeln!(
                        out,
                        "Job {}: active {:?}, succeeded {:?}, failed {:?}, started {:?}, conditions {conditions:?}",
                        job.name_any(),
                        status.active,
                        status.succeeded,
                        status.failed,
                        status.start_time.map(|t| t.0.to_string())
                    );
                }
            }
            Err(error) => {
                let _ = writeln!(out, "Jobs: {error}");
            }
        }
        match self.api::<ConfigMap>().list_metadata(&all).await {
            Ok(list) => {
                let names: Vec<String> = list.items.iter().map(|cm| cm.name_any()).collect();
                let _ = writeln!(out, "ConfigMaps: {names:?}");
            }
            Err(error) => {
                let _ = writeln!(out, "ConfigMaps: {error}");
            }
        }
    }

    async fn deployments_and_pods(&self, out: &mut String) {
        let all = ListParams::default();
        match self.api::<Deployment>().list(&all).await {
            Ok(list) => {
                for deployment in list.items {
                    let status = deployment.status.clone().unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "Deployment {} generation {:?} (observed {:?}): wanted {:?}, replicas {:?}, updated {:?}, ready {:?}, available {:?}",
                        deployment.name_any(),
                        deployment.metadata.generation,
                        status.observed_generation,
                        deployment.spec.as_ref().and_then(|s| s.replicas),
                        status.replicas,
                        status.updated_replicas,
                        status.ready_replicas,
                        status.available_replicas
                    );
                }
            }
            Err(error) => {
                let _ = writeln!(out, "Deployments: {error}");
            }
        }
        match self.api::<Pod>().list(&all).await {
            Ok(list) => {
                for pod in list.items {
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
                    let _ = writeln!(
                        out,
                        "Pod {}: {:?}, ready {ready:?}, {containers:?}",
                        pod.name_any(),
                        status.phase
                    );
                }
            }
            Err(error) => {
                let _ = writeln!(out, "Pods: {error}");
            }
        }
    }

    async fn events(&self, out: &mut String) {
        match self.api::<Event>().list(&ListParams::default()).await {
            Ok(list) => {
                let mut events = list.items;
                events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
                let skip = events.len().saturating_sub(30);
                for event in events.into_iter().skip(skip) {
                    let about = event
                        .regarding
                        .as_ref()
                        .and_then(|r| r.name.clone())
                        .unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "Event {} {about}: {}",
                        event.reason.unwrap_or_default(),
                        event.note.unwrap_or_default()
                    );
                }
            }
            Err(error) => {
                let _ = writeln!(out, "Events: {error}");
            }
        }
    }
}
