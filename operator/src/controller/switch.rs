//! Step 4, in place: the Function's running pods move to new routes without waiting for
//! new pods: a rollback, a split's shares changed or promoted, a new build. A revision in
//! ConfigMaps is read from its directory where the pod has it mounted, else through the API
//! with the Function's chunk reader (a ServiceAccount whose Role may `get` only the chunks
//! of the revisions it serves and stands by with); a revision in a registry needs neither.
//! Their `wasmless.io/routes` annotation is rewritten with the routes' generation, which
//! the runtime reads through its downward API file within a few hundred milliseconds and
//! switches to once the revisions are loaded. Pods started later read the same routes from
//! the Function's routes ConfigMap (`routes.rs`); where the template changed, the rollout
//! replaces the running pods meanwhile.

use super::status::CONDITION_BUILT;
use super::{Context, Doing, READY, StepError, apply, find};
use crate::crd::Function;
use crate::module::{ModuleLocation, POD_ANNOTATIONS};
use crate::objects::{self, ROUTES_ANNOTATION, ROUTES_VOLUME, TRAFFIC_ANNOTATION};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

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

/// How long after its first build a new Function's Service waits for one of its switched
/// pods to be ready before it leaves them and rolls out as any build does.
const FIRST_SWITCH_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a new Function's first build is done and its pods, which waited for it behind
/// a Service that sends to them ready or not ([`objects::waiting_service`]), are still being
/// switched to it: none is ready yet. Meanwhile the Deployment keeps the waiting template
/// (a rollout would add pods the Service sends to before they listen) and the Service
/// keeps sending to them; once one is ready (or [`FIRST_SWITCH_GRACE`] after the build) the
/// Service sends to ready pods only, and the build rolls out as any other.
pub(super) fn holding_for_first_switch(
    func: &Function,
    deployment: Option<&Deployment>,
    service: Option<&Service>,
) -> bool {
    let Some(deployment) = deployment else {
        return false;
    };
    let waiting = objects::waits_for_first_build(deployment);
    let publishing_not_ready = service
        .and_then(|service| service.spec.as_ref()?.publish_not_ready_addresses)
        .unwrap_or(false);
    // Pods that wait, none of them ready yet (with none at all, there is nothing to wait for).
    let status = deployment.status.as_ref();
    let waiting_pods = status.and_then(|status| status.replicas).unwrap_or(0) > 0;
    let none_ready = status.and_then(|status| status.ready_replicas).unwrap_or(0) == 0;
    let built_since = func
        .status
        .as_ref()
        .and_then(|status| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == CONDITION_BUILT && c.status == "True")
        })
        .map(|condition| condition.last_transition_time.0);
    let within_grace = built_since.is_none_or(|since| {
        Timestamp::now().duration_since(since) < SignedDuration::try_from(FIRST_SWITCH_GRACE).unwrap_or_default()
    });
    waiting && publishing_not_ready && waiting_pods && none_ready && within_grace
}

/// The ServiceAccount `func`'s pods run as to read the chunks of the revisions in
/// ConfigMaps they serve or stand by with (and nothing else), written now, before any pod
/// is switched to them; `None` (the default account, no token) when none is in ConfigMaps,
/// or when an account of that name exists that the Function does not own: the operator
/// never lends its pods an identity someone else may have given rights to. `first_build`:
/// the pods start before the Function's first build (into ConfigMaps) ends, so the account
/// is written with no chunk to read yet: the Role, which must name some (a rule without
/// names would grant every ConfigMap), and its binding come with the build. The binding
/// waits for the Role: the API server refuses to bind a Role that does not exist to an
/// operator without the `bind` verb, and the operator has none.
pub(super) async fn chunk_reader(
    ctx: &Context,
    func: &Function,
    ns: &str,
    serving: &[&objects::Share],
    first_build: bool,
) -> Result<Option<String>, StepError> {
    let function = func.name_any();
    let chunks: BTreeSet<String> = serving
        .iter()
        .flat_map(|share| objects::chunk_configmap_names(&function, &share.module))
        .collect();
    if chunks.is_empty() && !first_build {
        return Ok(None);
    }
    let (account, role, binding) = objects::chunk_reader_rbac(func, &chunks);
    let name = account.name_any();
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), ns);
    let existing = accounts
        .get_opt(&name)
        .await
        .doing(READY, || format!("reading the ServiceAccount {name}"))?;
    let uid = func.uid();
    if let Some(existing) = existing.as_ref()
        && !existing
            .owner_references()
            .iter()
            .any(|owner| Some(&owner.uid) == uid.as_ref())
    {
        tracing::warn!(function = %function, namespace = ns, account = %name, "a ServiceAccount of this name exists that the Function does not own: its pods run without a token, and a new revision waits for new pods");
        return Ok(None);
    }
    apply::apply_if_changed_with(&accounts, existing.as_ref(), &account)
        .await
        .doing(READY, || format!("applying the ServiceAccount {name}"))?;
    if chunks.is_empty() {
        return Ok(Some(name));
    }
    apply::apply_if_changed(&Api::<Role>::namespaced(ctx.client.clone(), ns), &role)
        .await
        .doing(READY, || format!("applying the Role {name}"))?;
    apply::apply_if_changed(&Api::<RoleBinding>::namespaced(ctx.client.clone(), ns), &binding)
        .await
        .doing(READY, || format!("applying the RoleBinding {name}"))?;
    Ok(Some(name))
}

/// Rewrites the routes (and module) annotations of each running pod of `func` that can
/// serve `serving` and serves something else, with routes `generation`: a revision in
/// ConfigMaps from its directory where the pod has it mounted, else through the API where
/// the pod runs as the Function's chunk reader; one in a registry by its reference.
/// Returns how many.
pub(super) async fn in_place(
    ctx: &Context,
    func: &Function,
    ns: &str,
    serving: &objects::Serving,
    generation: u64,
) -> Result<usize, StepError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let name = func.name_any();
    let listed = pods
        .list(&ListParams::default().labels(&objects::runtime_selector(func)))
        .await
        .doing(READY, || format!("listing the pods of {name}"))?;
    let mut wanted = BTreeMap::new();
    if let Some(primary) = objects::primary(&serving.routes) {
        primary.module.write_pod_annotations(&mut wanted);
    }
    if serving.is_split() {
        wanted.insert(TRAFFIC_ANNOTATION.into(), objects::traffic_summary(&serving.routes));
    }
    let annotations: Map<String, Value> = POD_ANNOTATIONS
        .iter()
        .chain([&TRAFFIC_ANNOTATION])
        .map(|key| {
            (
                key.to_string(),
                wanted
                    .get(*key)
                    .map_or(Value::Null, |value| Value::from(value.as_str())),
            )
        })
        .collect();
    let mut switched = 0;
    for pod in &listed.items {
        let Some(routes) = routes_for(pod, serving, &name) else {
            continue;
        };
        // A pod of an older operator's template reads a bare list.
        let document = match pod.spec.as_ref().is_some_and(objects::reads_routes_documents) {
            true => objects::routes_document(generation, &routes),
            false => routes,
        };
        if pod.annotations().get(ROUTES_ANNOTATION) == Some(&document) {
            continue;
        }
        let mut annotations = annotations.clone();
        annotations.insert(ROUTES_ANNOTATION.into(), Value::from(document));
        let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
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
        tracing::info!(function = %name, namespace = ns, pods = switched, generation, "switched running pods in place");
    }
    Ok(switched)
}

/// The routes `pod` would serve `serving` with, given what it has: `None` when it is going,
/// does not follow its routes annotation, or lacks a revision in ConfigMaps (neither
/// mounted nor readable through the API).
fn routes_for(pod: &Pod, serving: &objects::Serving, function: &str) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let follows = spec
        .volumes
        .iter()
        .flatten()
        .any(|volume| volume.name == ROUTES_VOLUME && volume.downward_api.is_some());
    if !follows {
        return None;
    }
    objects::routes_json_for(spec, &serving.routes, function)
}
