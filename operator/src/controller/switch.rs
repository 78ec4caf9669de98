//! Step 4, in place: the Function's running pods move to what a new pod template serves
//! without waiting for new pods, where they have every revision it names mounted (a
//! rollback to the standby revision, a split's shares changed, a split promoted; a
//! revision in a registry needs no mount, so a new OCI build switches them too). Their
//! `wasmless.io/routes` annotation is rewritten, which the runtime reads through its
//! downward API file within a few hundred milliseconds and switches to once the revisions
//! are loaded. The rollout replaces them with pods of the new template meanwhile, so what
//! the Deployment says and what each pod's annotations say is what serves.

use super::{Context, Doing, READY, StepError, find};
use crate::crd::Function;
use crate::module::{ModuleLocation, POD_ANNOTATIONS};
use crate::objects::{self, REVISIONS_DIR, ROUTES_ANNOTATION, ROUTES_VOLUME, TRAFFIC_ANNOTATION};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value};

/// The revision mounted beside the ones that serve: the kept revision built before the
/// one with the most requests (the newest kept one while that one is not recorded yet),
/// which is where `wasmless rollback` goes back to. `None` when there is none, when it
/// already serves, or when it is in a registry (the runtime pulls it by digest: no mount).
pub(super) async fn standby(
    ctx: &Context,
    func: &Function,
    ns: &str,
    routes: &[objects::Share],
) -> Result<Option<objects::Share>, StepError> {
    let Some(status) = func.status.as_ref() else {
        return Ok(None);
    };
    let kept = &status.revisions;
    let primary = objects::primary(routes);
    let before = match primary.and_then(|primary| kept.iter().position(|revision| revision.name == primary.revision)) {
        Some(position) => kept.get(position + 1),
        None => kept.first(),
    };
    let Some(revision) = before.filter(|revision| routes.iter().all(|share| share.revision != revision.name)) else {
        return Ok(None);
    };
    let module = find::revision_module(ctx, func, ns, revision)
        .await
        .doing(READY, || format!("reading the module of revision {}", revision.name))?;
    Ok(module
        .filter(|module| matches!(module.location, ModuleLocation::ConfigMaps { .. }))
        .map(|module| objects::Share {
            revision: revision.name.clone(),
            module,
            percent: 0,
            tag: None,
        }))
}

/// Whether the Deployment's rollout has not finished: its pods may still differ from its
/// template, and a switch that failed before may be tried again.
pub(super) fn rolling(deployment: Option<&Deployment>) -> bool {
    let Some(deployment) = deployment else {
        return false;
    };
    let generation = deployment.metadata.generation.unwrap_or_default();
    let Some(status) = deployment.status.as_ref() else {
        return true;
    };
    status.observed_generation.unwrap_or_default() < generation
        || status.updated_replicas.unwrap_or_default() != status.replicas.unwrap_or_default()
}

/// Rewrites the routes (and module) annotations of each running pod of `func` that has
/// every revision `template` serves mounted and serves something else. Returns how many.
pub(super) async fn in_place(
    ctx: &Context,
    func: &Function,
    ns: &str,
    template: &PodTemplateSpec,
) -> Result<usize, StepError> {
    let Some(wanted) = template.metadata.as_ref().and_then(|meta| meta.annotations.as_ref()) else {
        return Ok(0);
    };
    let Some(routes) = wanted.get(ROUTES_ANNOTATION) else {
        return Ok(0);
    };
    let needed = mounted_revisions(routes);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let name = func.name_any();
    let listed = pods
        .list(&ListParams::default().labels(&objects::runtime_selector(func)))
        .await
        .doing(READY, || format!("listing the pods of {name}"))?;
    let annotations: Map<String, Value> = POD_ANNOTATIONS
        .iter()
        .chain([&ROUTES_ANNOTATION, &TRAFFIC_ANNOTATION])
        .map(|key| {
            (
                key.to_string(),
                wanted
                    .get(*key)
                    .map_or(Value::Null, |value| Value::from(value.as_str())),
            )
        })
        .collect();
    let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
    let mut switched = 0;
    for pod in listed.items.iter().filter(|pod| can_switch(pod, routes, &needed)) {
        let pod_name = pod.name_any();
        match pods
            .patch(&pod_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => switched += 1,
            // Gone meanwhile (a rollout deletes pods): nothing to switch.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error).doing(READY, || format!("switching pod {pod_name} of {name} in place")),
        }
    }
    if switched > 0 {
        tracing::info!(function = %name, namespace = ns, pods = switched, "switched running pods in place");
    }
    Ok(switched)
}

/// The directories the routes' revisions are read from, for those that are mounted (an
/// OCI revision is pulled by the runtime: nothing to have).
fn mounted_revisions(routes: &str) -> Vec<String> {
    let targets: Vec<Value> = serde_json::from_str(routes).unwrap_or_default();
    targets
        .iter()
        .filter_map(|target| target["module"].as_str())
        .filter(|module| module.starts_with(REVISIONS_DIR))
        .map(str::to_string)
        .collect()
}

/// A running pod that follows its routes annotation, serves other routes now, and has
/// every directory in `needed` mounted.
fn can_switch(pod: &Pod, routes: &str, needed: &[String]) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if pod.annotations().get(ROUTES_ANNOTATION).map(String::as_str) == Some(routes) {
        return false;
    }
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let follows = spec
        .volumes
        .iter()
        .flatten()
        .any(|volume| volume.name == ROUTES_VOLUME && volume.downward_api.is_some());
    let mounted: Vec<&str> = spec
        .containers
        .iter()
        .flat_map(|container| container.volume_mounts.iter().flatten())
        .map(|mount| mount.mount_path.as_str())
        .collect();
    follows && needed.iter().all(|path| mounted.contains(&path.as_str()))
}
