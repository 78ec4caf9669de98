//! Step 4 of the reconcile: what serves, and where requests go. In order: which module
//! serves ([`choose_module`]: the revision `spec.traffic` names, the latest build, or what
//! serves now), the revisions the pods hold ([`serving_set`]), the Deployment that would
//! serve them ([`desired_deployment`]), the pool or the pods ([`route`]), then the
//! Deployment and the Service written ([`apply_deployment_and_service`]). A new Function
//! whose first build runs gets waiting pods ([`wait_for_first_build`]).

use super::build::Build;
use super::config::Config;
use super::revisions::{self, TrafficProblem};
use super::{Context, Doing, READY, StepError, apply, cleanup, find, pool, routes, scale, switch};
use crate::crd::{Function, ServedBy, Storage};
use crate::module::Module;
use crate::objects::{self, Route};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, ResourceExt};
use wasmless_artifact::Digest;

/// What step 4 left serving: the module, the Deployment (as read when this reconcile did
/// not change it: its status then says how the rollout stands), the replicas it asks for,
/// and where the Service routes.
pub(super) struct Served {
    pub module: Option<Module>,
    pub deployment: Option<Deployment>,
    /// The Deployment's replicas as this reconcile wrote them.
    pub replicas: i32,
    pub route: Option<Route>,
    /// For a pooled Function: its port in the pool, and whether the pool serves it.
    pub pool: Option<(u16, pool::PoolState)>,
    /// Why a Function that asks for `scale.min: 0` is not pooled.
    pub not_pooled: Option<String>,
    /// A change of route or replicas is under way: reconcile again soon.
    pub pending: bool,
    /// The Function's port in the pool while it has an entry there.
    pub entry_port: Option<u16>,
    /// Why the revision `spec.traffic` names does not serve.
    pub traffic_problem: Option<TrafficProblem>,
    /// The revisions a split sends requests to, side by side in the pods (none: one
    /// revision serves, `module`).
    pub shares: Vec<objects::Share>,
}

/// Step 4: the Deployment serves the new module once built, and the previous one (read
/// back from its pod template) while a build runs or after one failed; the Service in
/// front of it, or of the namespace's pool (`scale.min: 0`). While a Secret or ConfigMap
/// the pods need is missing, the pod template stays as it is (pods made from the new one
/// could not start), and only the rest of the Deployment (its replicas) follows the
/// Function.
pub(super) async fn serve(
    func: &Function,
    ctx: &Context,
    ns: &str,
    build: &Build,
    config: Option<&Config>,
) -> Result<Served, StepError> {
    let name = func.name_any();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let existing = apply::get_owned(&deployments, &name, func)
        .await
        .doing(READY, || format!("reading the Deployment {name}"))?;
    let choice = choose_module(ctx, func, ns, build, existing.as_ref()).await?;
    let mut served = Served {
        module: choice.module.clone(),
        deployment: existing.clone(),
        replicas: 0,
        route: None,
        pool: None,
        not_pooled: func.spec.scales_to_zero().then(|| func.spec.pool_refusal()).flatten(),
        pending: false,
        entry_port: None,
        traffic_problem: choice.traffic_problem,
        shares: choice.shares,
    };
    let Some(module) = choice.module.as_ref().filter(|_| !matches!(build, Build::Invalid(_))) else {
        if let Some(Config::Complete(hash)) = config
            && served.traffic_problem.is_none()
        {
            wait_for_first_build(func, ctx, ns, build, hash.as_ref(), &mut served).await?;
        }
        return Ok(served);
    };
    let serving_set = serving_set(ctx, func, ns, build, module, &served.shares).await?;
    let Some((desired, template)) =
        desired_deployment(func, ctx, config, existing.as_ref(), &serving_set, choice.keep_template)
    else {
        // Nothing serves yet, and nothing could start.
        return Ok(served);
    };
    let (replicas, route) = route(ctx, func, ns, module, config, existing.as_ref(), &mut served).await?;
    let mut desired = desired;
    if let Some(spec) = desired.spec.as_mut() {
        spec.replicas = Some(replicas);
    }
    apply_deployment_and_service(
        ctx,
        func,
        ns,
        existing.as_ref(),
        (desired, template),
        &serving_set,
        route,
        &mut served,
    )
    .await?;
    served.replicas = replicas;
    served.route = Some(route);
    Ok(served)
}

/// Which module serves, and why it is not the one asked for.
struct Choice {
    module: Option<Module>,
    traffic_problem: Option<TrafficProblem>,
    shares: Vec<objects::Share>,
    /// A split names a revision that cannot be read: the pods stay as they are.
    keep_template: bool,
}

/// The revision `spec.traffic` names (or the revisions of its split), else the latest
/// build; while either cannot serve, what serves now.
async fn choose_module(
    ctx: &Context,
    func: &Function,
    ns: &str,
    build: &Build,
    existing: Option<&Deployment>,
) -> Result<Choice, StepError> {
    let already_serving = || existing.and_then(find::serving_module);
    let mut traffic_problem = None;
    let mut shares = Vec::new();
    if let Some(split) = revisions::split(func) {
        match resolve_split(ctx, func, ns, build, split).await? {
            Ok(resolved) => shares = resolved,
            Err(problem) => traffic_problem = Some(problem),
        }
    }
    let keep_template = traffic_problem.is_some();
    let module = match (revisions::wanted(func), build) {
        _ if keep_template => already_serving(),
        _ if !shares.is_empty() => objects::primary(&shares).map(|share| share.module.clone()),
        (revisions::Wanted::Latest, Build::Done(module)) => Some(module.clone()),
        (revisions::Wanted::Latest, _) => already_serving(),
        (revisions::Wanted::Revision(revision), _) => {
            let found = find::revision_module(ctx, func, ns, revision)
                .await
                .doing(READY, || format!("reading the module of revision {}", revision.name))?;
            if found.is_none() {
                traffic_problem = Some(TrafficProblem::not_found(format!(
                    "the module of revision {} is no longer stored: name another revision in spec.traffic",
                    revision.name
                )));
            }
            found.or_else(already_serving)
        }
        (revisions::Wanted::NotKept(problem), _) => {
            traffic_problem = Some(TrafficProblem::not_found(problem));
            already_serving()
        }
    };
    Ok(Choice {
        module,
        traffic_problem,
        shares,
        keep_template,
    })
}

/// The revisions the pods serve (one, or a split's), the standby beside them, and the
/// account that may read their chunks.
async fn serving_set(
    ctx: &Context,
    func: &Function,
    ns: &str,
    build: &Build,
    module: &Module,
    shares: &[objects::Share],
) -> Result<objects::Serving, StepError> {
    let routes = match shares.is_empty() {
        true => vec![objects::Share {
            revision: revision_name(func, build, module),
            module: module.clone(),
            percent: 100,
            tag: None,
        }],
        false => shares.to_vec(),
    };
    let standby = switch::standby(ctx, func, ns, &routes).await?;
    let chunk_reader = switch::chunk_reader(
        ctx,
        func,
        ns,
        &routes.iter().chain(standby.iter()).collect::<Vec<_>>(),
        false,
    )
    .await?;
    Ok(objects::Serving {
        routes,
        standby,
        chunk_reader,
    })
}

/// Where the pod template of the Deployment written comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Template {
    /// Made for what serves now: the pods roll to it where it differs.
    New,
    /// The live one, whose pods serve the new routes as they are (`routes::serves_in_place`):
    /// nothing rolls, the routes change in place.
    LiveServesTheRoutes,
    /// The live one, and what it served serves on: the new one could not serve (a split's
    /// revision unreadable, a Secret or ConfigMap missing).
    LiveAsItWas,
}

/// The Deployment that serves `serving_set`, and where its pod template comes from.
/// `None`: nothing serves yet and nothing could start.
fn desired_deployment(
    func: &Function,
    ctx: &Context,
    config: Option<&Config>,
    existing: Option<&Deployment>,
    serving_set: &objects::Serving,
    keep_template: bool,
) -> Option<(Deployment, Template)> {
    match (config, existing) {
        (Some(Config::Complete(hash)), Some(existing)) if keep_template => Some((
            as_it_was(
                objects::deployment(func, &ctx.settings, serving_set, hash.as_ref()),
                existing,
            ),
            Template::LiveAsItWas,
        )),
        (Some(Config::Complete(hash)), existing) => {
            let desired = objects::deployment(func, &ctx.settings, serving_set, hash.as_ref());
            match existing.filter(|existing| live_serves_the_routes(func, existing, &desired, serving_set)) {
                Some(existing) => Some((with_live_template(desired, existing), Template::LiveServesTheRoutes)),
                None => Some((desired, Template::New)),
            }
        }
        (Some(Config::Missing(_)), Some(existing)) => Some((
            as_it_was(objects::deployment(func, &ctx.settings, serving_set, None), existing),
            Template::LiveAsItWas,
        )),
        (Some(Config::Missing(_)), None) | (None, _) => None,
    }
}

/// Whether the pods of `existing`'s template can serve `serving_set`'s routes as they are
/// while `desired` differs from it in the revisions it mounts only.
fn live_serves_the_routes(
    func: &Function,
    existing: &Deployment,
    desired: &Deployment,
    serving_set: &objects::Serving,
) -> bool {
    let kept: Vec<&str> = func
        .status
        .iter()
        .flat_map(|status| &status.revisions)
        .map(|revision| revision.name.as_str())
        .collect();
    routes::serves_in_place(
        existing,
        desired,
        &serving_set.routes,
        &kept,
        &find::served_revisions(existing),
        &func.name_any(),
    )
}

/// `desired` with the pod template the live Deployment has, and that template's digest
/// (what a later reconcile compares its own with: `routes::serves_in_place`).
fn with_live_template(mut desired: Deployment, live: &Deployment) -> Deployment {
    if let (Some(spec), Some(live)) = (desired.spec.as_mut(), live.spec.as_ref()) {
        spec.template = live.template.clone();
    }
    let live_digest = live
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(objects::TEMPLATE_DIGEST_ANNOTATION));
    if let Some(annotations) = desired.metadata.annotations.as_mut() {
        match live_digest {
            Some(digest) => annotations.insert(objects::TEMPLATE_DIGEST_ANNOTATION.into(), digest.clone()),
            None => annotations.remove(objects::TEMPLATE_DIGEST_ANNOTATION),
        };
    }
    desired
}

/// `desired` with the live Deployment's pod template and its record of what serves (its
/// `wasmless.io/` annotations: the others are the Deployment controller's and kubectl's).
fn as_it_was(desired: Deployment, live: &Deployment) -> Deployment {
    let mut desired = with_live_template(desired, live);
    let recorded = live.metadata.annotations.iter().flatten();
    desired.metadata.annotations = Some(
        recorded
            .filter(|(key, _)| key.starts_with("wasmless.io/"))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
    );
    desired
}

/// Where requests go, and the replicas the Deployment keeps: the pool (with the
/// Function's entry written) for a pooled Function, or one leaving the pool until a pod
/// of its own is available; else the pods, the entry removed once the route has settled.
async fn route(
    ctx: &Context,
    func: &Function,
    ns: &str,
    module: &Module,
    config: Option<&Config>,
    existing: Option<&Deployment>,
    served: &mut Served,
) -> Result<(i32, Route), StepError> {
    let pooled = func.spec.scales_to_zero() && served.not_pooled.is_none();
    let live_replicas = existing.and_then(|d| d.spec.as_ref()?.replicas);
    let own_available = existing
        .and_then(|d| d.status.as_ref()?.available_replicas)
        .unwrap_or(0);
    let wanted = scale::replicas(func, ctx.scaler.wanted(func), live_replicas);
    let status = func.status.as_ref();
    let entry_port = status
        .and_then(|status| status.pool_port)
        .and_then(|port| u16::try_from(port).ok());
    // A Function that leaves the pool (scale.min raised, or it now reads a Secret) stays
    // there until a pod of its own is available, and its entry until the route has settled.
    let leaving = !pooled && entry_port.is_some();
    let entry = pool::EntryParts {
        module,
        config_hash: match config {
            Some(Config::Complete(hash)) => hash.as_ref(),
            _ => None,
        },
    };
    if pooled || (leaving && own_available == 0) {
        pool::ensure_pool(ctx, func, ns).await?;
        let was_served_by_pods = status.and_then(|status| status.served_by) == Some(ServedBy::Pods);
        let port = pool::write_entry(ctx, func, ns, &entry, was_served_by_pods).await?;
        let state = pool::pool_state(ctx, ns, &func.name_any(), port).await;
        let decision = scale::route(
            wanted,
            own_available,
            live_replicas.unwrap_or(0),
            state == pool::PoolState::Serving,
            status,
        );
        if matches!(decision.route(port), Route::Pods) != was_served_by_pods {
            pool::write_entry(ctx, func, ns, &entry, !was_served_by_pods).await?;
        }
        served.pool = Some((port, state));
        served.entry_port = Some(port);
        served.pending = decision.pending;
        return Ok((decision.replicas, decision.route(port)));
    }
    if leaving {
        if scale::settled(status, ServedBy::Pods) {
            pool::remove_entry(ctx, func, ns).await?;
        } else {
            // Meanwhile the pool closes its keep-alive connections, which reconnect
            // to the pods before the entry goes.
            pool::write_entry(ctx, func, ns, &entry, true).await?;
            served.entry_port = entry_port;
            served.pending = true;
        }
    }
    Ok((wanted, Route::Pods))
}

/// The routes ConfigMap, the Deployment and the Service written. A first build's pods are
/// switched to it where they wait, before anything rolls; otherwise the running pods that
/// can serve the new routes move to them now, and a rollout (where the template changed)
/// replaces them meanwhile.
#[allow(clippy::too_many_arguments)] // the step's inputs, each named where it is read
async fn apply_deployment_and_service(
    ctx: &Context,
    func: &Function,
    ns: &str,
    existing: Option<&Deployment>,
    (mut desired, template): (Deployment, Template),
    serving_set: &objects::Serving,
    route: Route,
    served: &mut Served,
) -> Result<(), StepError> {
    let name = func.name_any();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    let service_name = objects::service_name(func);
    let live_service = apply::get_owned(&services, &service_name, func)
        .await
        .doing(READY, || format!("reading the Service {service_name}"))?;
    let holding = route == Route::Pods && switch::holding_for_first_switch(func, existing, live_service.as_ref());
    if holding && let Some(live) = existing {
        desired = with_live_template(desired, live);
    }
    // Before the Deployment: a pod it starts reads them.
    let switch_to = match template {
        Template::LiveAsItWas => None,
        Template::New | Template::LiveServesTheRoutes => {
            let spec = desired.spec.as_ref().and_then(|spec| spec.template.spec.as_ref());
            let routes = spec
                .and_then(|spec| objects::routes_json_for(spec, &serving_set.routes, &name))
                .unwrap_or_else(|| objects::routes_json(&serving_set.routes));
            // The Deployment records them as its pods read them.
            if let Some(annotations) = desired.metadata.annotations.as_mut() {
                annotations.insert(objects::ROUTES_ANNOTATION.into(), routes.clone());
            }
            Some(routes::write(ctx, func, ns, &routes).await?)
        }
    };
    let rolled = apply::apply_if_changed_with(&deployments, existing, &desired)
        .await
        .doing(READY, || format!("applying the Deployment {name}"))?;
    // Every time, not only when something changed: a switch cut short (an operator that
    // stopped, a patch refused) is finished by the next reconcile, not by the kubelet's
    // next sync of the ConfigMap a minute on. Pods switched already are passed over.
    if let Some(generation) = switch_to {
        switch::in_place(ctx, func, ns, serving_set, generation).await?;
    }
    let service = match holding {
        true => objects::waiting_service(func),
        false => objects::service(func, route),
    };
    apply::apply_if_changed_with(&services, live_service.as_ref(), &service)
        .await
        .doing(READY, || format!("applying the Service {}", service.name_any()))?;
    served.pending |= holding;
    cleanup::remove_renamed_services(&services, func, &service.name_any()).await?;
    // A Deployment whose template is the live one has not started rolling: its status
    // still says how the pods stand.
    if rolled && template == Template::New {
        served.deployment = None;
    }
    Ok(())
}

/// Step 4 before anything is built: the pods of a new Function start while its first
/// build runs, with routes that name no revision (the runtime waits, not ready), and the
/// build's reconcile switches them in place to what it built (`switch::in_place`), so the
/// first answer waits for the build, not for a pod to start after it. Its Service is made
/// too, so only its endpoints remain to be programmed. A build that failed leaves no pod
/// waiting. A Function that scales to zero waits in no pod of its own.
async fn wait_for_first_build(
    func: &Function,
    ctx: &Context,
    ns: &str,
    build: &Build,
    config_hash: Option<&Digest>,
    served: &mut Served,
) -> Result<(), StepError> {
    let name = func.name_any();
    let building = matches!(build, Build::Running { .. });
    let existing = served.deployment.as_ref();
    if func.spec.scales_to_zero()
        || existing.is_some_and(|deployment| find::serving_module(deployment).is_some())
        || (existing.is_none() && !building)
    {
        return Ok(());
    }
    let storage = func.spec.storage.unwrap_or(ctx.settings.default_storage);
    let chunk_reader = match storage {
        Storage::ConfigMap => switch::chunk_reader(ctx, func, ns, &[], true).await?,
        Storage::Oci => None,
    };
    let waiting = objects::Serving {
        routes: Vec::new(),
        standby: None,
        chunk_reader,
    };
    let live_replicas = existing.and_then(|d| d.spec.as_ref()?.replicas);
    let replicas = match building {
        true => scale::replicas(func, ctx.scaler.wanted(func), live_replicas),
        false => 0,
    };
    let mut desired = objects::deployment(func, &ctx.settings, &waiting, config_hash);
    if let Some(spec) = desired.spec.as_mut() {
        spec.replicas = Some(replicas);
    }
    // The pods mount it: none names a revision yet.
    routes::write(ctx, func, ns, &objects::routes_json(&[])).await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    apply::apply_if_changed_with(&deployments, existing, &desired)
        .await
        .doing(READY, || {
            format!("applying the Deployment {name}, waiting for its first build")
        })?;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    let service = objects::waiting_service(func);
    apply::apply_if_changed(&services, &service)
        .await
        .doing(READY, || format!("applying the Service {}", service.name_any()))?;
    served.replicas = replicas;
    served.route = Some(Route::Pods);
    Ok(())
}

/// The revisions of a split, each with its module: the latest build's is the one just
/// built, or while a build runs (or after one failed) the newest kept revision's. Two
/// targets on one revision are one share. `Err`: why a revision cannot be served.
async fn resolve_split(
    ctx: &Context,
    func: &Function,
    ns: &str,
    build: &Build,
    split: Result<Vec<revisions::Share<'_>>, TrafficProblem>,
) -> Result<Result<Vec<objects::Share>, TrafficProblem>, StepError> {
    let split = match split {
        Ok(split) => split,
        Err(problem) => return Ok(Err(problem)),
    };
    let newest = func.status.as_ref().and_then(|status| status.revisions.first());
    let mut shares: Vec<objects::Share> = Vec::new();
    for share in split {
        let (revision, module) = match (share.revision, build) {
            (None, Build::Done(module)) => (revisions::name_of(func, module), module.clone()),
            _ => {
                let Some(revision) = share.revision.or(newest) else {
                    return Ok(Err(TrafficProblem::not_found(
                        "spec.traffic sends requests to the latest revision, and none is built yet".into(),
                    )));
                };
                let found = find::revision_module(ctx, func, ns, revision)
                    .await
                    .doing(READY, || format!("reading the module of revision {}", revision.name))?;
                let Some(module) = found else {
                    return Ok(Err(TrafficProblem::not_found(format!(
                        "the module of revision {} is no longer stored: name another revision in spec.traffic",
                        revision.name
                    ))));
                };
                (revision.name.clone(), module)
            }
        };
        match shares.iter_mut().find(|known| known.revision == revision) {
            Some(known) => {
                known.percent = known.percent.saturating_add(share.percent);
                known.tag = known.tag.take().or(share.tag.map(str::to_string));
            }
            None => shares.push(objects::Share {
                revision,
                module,
                percent: share.percent,
                tag: share.tag.map(str::to_string),
            }),
        }
    }
    // Every share on one revision (the latest while it is the one being split from): no
    // split, so the pods are not restarted for one.
    if shares.len() == 1 {
        shares.clear();
    }
    Ok(Ok(shares))
}

/// The name of the revision that serves `module` alone: the one `spec.traffic` names, the
/// one the latest build is (or will be once status records it), or the kept revision of
/// the same module (what served before a build that runs, or failed).
fn revision_name(func: &Function, build: &Build, module: &Module) -> String {
    match (revisions::wanted(func), build) {
        (revisions::Wanted::Revision(revision), _) => revision.name.clone(),
        (revisions::Wanted::Latest, Build::Done(built)) if built == module => revisions::name_of(func, module),
        _ => func
            .status
            .as_ref()
            .and_then(|status| revisions::serving(&status.revisions, module))
            .map_or_else(|| revisions::name_of(func, module), |revision| revision.name.clone()),
    }
}
