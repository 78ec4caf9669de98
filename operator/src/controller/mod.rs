//! The Function controller, after kube-rs's `controller-rs`: `Context`, `reconcile` (the
//! steps of docs/operator.md, "Reconcile", each a call into a module of its own),
//! `error_policy` and `run`.
//!
//! `build` runs or reads the build Job, `find` finds a module already built, `apply` writes
//! an object only when it changed, `cleanup` deletes what a Function no longer uses, and
//! `status` writes conditions and Events.

mod apply;
mod autoscaler;
mod build;
mod cleanup;
mod config;
mod find;
mod oci_gc;
mod pool;
mod revisions;
mod scale;
mod status;
mod switch;
mod traces;

pub use apply::is_subset;
pub use oci_gc::{SWEEP_EVERY, SweepError, sweep as sweep_registry};
pub use pool::{IDLE_POOL_GRACE, narrow_pool_roles, scale_idle_pools};
pub use status::{
    CONDITION_BUILT, CONDITION_READY, MAX_EVENT_NOTE_BYTES, REASON_NOT_OWNER, REASON_RECONCILE_ERROR,
    REASON_REFERENCE_NOT_FOUND, event_note,
};
pub use traces::ApplyTraces;

use crate::crd::{Function, Phase, ServedBy, Storage};
use crate::module::Module;
use crate::objects::{self, MANAGER, Route};
use crate::references::{self, ConfigKind};
use crate::{Error, Metrics, Settings};
use build::Build;
use config::Config;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmless_artifact::{Digest, labels};

/// What the controller shares between reconciles.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    /// Consecutive failures per Function, for the error policy's backoff.
    failures: Mutex<HashMap<ObjectRef<Function>, u32>>,
    /// Held while a Function is given a port in its namespace's pool.
    pool_ports: tokio::sync::Mutex<()>,
    /// The scaler's decisions: the replicas each scaled Function wants.
    pub scaler: scale::Scaler,
    /// A trace per apply, when the operator has a collector (`--otlp-endpoint`).
    pub traces: ApplyTraces,
    /// The controller's Functions once it runs (tests that reconcile without it list them).
    functions: std::sync::OnceLock<Store<Function>>,
    /// The registry of `storage: oci`, swept of what no kept revision names.
    registry: Option<crate::registry::Registry>,
}

impl Context {
    pub fn new(client: Client, settings: Settings, metrics: Metrics, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            failures: Mutex::default(),
            pool_ports: tokio::sync::Mutex::default(),
            scaler: scale::Scaler::default(),
            traces: ApplyTraces::default(),
            functions: std::sync::OnceLock::new(),
            registry: settings
                .oci_registry
                .is_some()
                .then(|| crate::registry::Registry::new(settings.oci_plain_http.as_deref())),
            settings,
        }
    }

    /// The same, tracing each apply (the operator's `--otlp-endpoint`).
    pub fn with_traces(mut self, traces: ApplyTraces) -> Self {
        self.traces = traces;
        self
    }
}

/// A step of the reconcile that failed: the condition it reports on (none when status
/// itself cannot be written), what it was doing, and the error.
pub(crate) struct StepError {
    condition: Option<&'static str>,
    doing: String,
    error: Error,
    /// The status this reconcile wrote before the step failed, if it got that far: the
    /// failure is reported on it, not on the older status the reconcile started from.
    written: Option<Box<crate::FunctionStatus>>,
}

impl StepError {
    fn after_writing(mut self, status: &crate::FunctionStatus) -> Self {
        self.written = Some(Box::new(status.clone()));
        self
    }
}

/// Names the step a fallible call belongs to, for [`StepError`].
trait Doing<T> {
    fn doing(self, condition: Option<&'static str>, what: impl FnOnce() -> String) -> Result<T, StepError>;
}

impl<T, E: Into<Error>> Doing<T> for Result<T, E> {
    fn doing(self, condition: Option<&'static str>, what: impl FnOnce() -> String) -> Result<T, StepError> {
        self.map_err(|error| StepError {
            condition,
            doing: what(),
            error: error.into(),
            written: None,
        })
    }
}

/// The condition a step's failure is reported on: `Built` for the source, the build and
/// the collection of older builds, `Ready` for the Deployment and the Service.
const BUILT: Option<&str> = Some(CONDITION_BUILT);
const READY: Option<&str> = Some(CONDITION_READY);

/// Reconciles one Function; every step is idempotent, so running it again (after a crash,
/// an error, or a watch event) converges on the same objects without duplicates.
pub async fn reconcile(func: Arc<Function>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.start();
    // Deletion needs nothing from us: everything the Function made carries its owner
    // reference, and the garbage collector removes it.
    if func.metadata.deletion_timestamp.is_some() {
        ctx.traces.forget(&func);
        return Ok(Action::await_change());
    }
    let trace = ctx.traces.reconcile(&func);
    let steps = reconcile_steps(&func, &ctx);
    let outcome = match &trace {
        Some(trace) => opentelemetry::trace::FutureExt::with_context(steps, trace.clone()).await,
        None => steps.await,
    };
    let failure = outcome
        .as_ref()
        .err()
        .map(|failed| format!("{}: {}", failed.doing, failed.error));
    ctx.traces.reconciled(&func, trace, failure);
    match outcome {
        Ok(action) => {
            ctx.failures
                .lock()
                .expect("failure counts")
                .remove(&ObjectRef::from_obj(&*func));
            Ok(action)
        }
        Err(failed) => {
            // Retried with backoff by the error policy; meanwhile status says what failed,
            // instead of keeping what the last successful reconcile wrote.
            status::report_failure(&ctx, &func, &failed).await;
            Err(failed.error)
        }
    }
}

/// The steps of docs/operator.md, "Reconcile", in their order.
async fn reconcile_steps(func: &Function, ctx: &Context) -> Result<Action, StepError> {
    let ns = func.namespace().ok_or(Error::NoNamespace).doing(None, String::new)?;
    let name = func.name_any();
    // 1. Validate.
    let problems = problems(func, &ctx.settings);
    // 2. The source digest, the source in its ConfigMap. 3. The build.
    let (source_digest, build) = if !problems.is_empty() {
        (None, Build::Invalid(problems.join("; ")))
    } else if let Some(image) = &func.spec.module {
        match find::prebuilt_module(image) {
            Ok(module) => (Some(module.source_digest), Build::Done(module)),
            Err(problem) => (None, Build::Invalid(problem)),
        }
    } else {
        let digest = ctx.traces.step("write source", write_source(func, ctx, &ns)).await?;
        let build = ctx.traces.step("build", build::build(func, ctx, &ns, &digest)).await?;
        if matches!(build, Build::Running { .. }) {
            ctx.traces.build_running(func);
        }
        (Some(digest), build)
    };
    // 4. Serve, with the Secrets and ConfigMaps the pods read.
    let config = match &build {
        Build::Invalid(_) => None,
        _ => Some(
            ctx.traces
                .step("read config", config::resolve(ctx, func, &ns))
                .await
                .doing(READY, || format!("reading the Secrets and ConfigMaps {name} uses"))?,
        ),
    };
    let served = ctx
        .traces
        .step("serve", serve(func, ctx, &ns, &build, config.as_ref()))
        .await?;
    let missing = match &config {
        Some(Config::Missing(message)) => Some(message.as_str()),
        _ => None,
    };
    // 5. Status and events.
    let status = ctx
        .traces
        .step(
            "status",
            status::update(ctx, func, &build, source_digest, &served, missing),
        )
        .await?;
    ctx.traces.phase(func, status.phase);
    // 6. Garbage: once the current module serves everywhere, the builds of revisions no
    // longer kept are.
    if let (Build::Done(module), Some(Phase::Ready)) = (&build, status.phase)
        && func.spec.module.is_none()
    {
        let kept = revisions::kept_sources(&status.revisions);
        ctx.traces
            .step(
                "collect old builds",
                cleanup::collect_old_builds(ctx, func, &module.source_digest, &kept),
            )
            .await
            .doing(BUILT, || format!("deleting the older builds of {name}"))
            .map_err(|failed| failed.after_writing(&status))?;
    }
    Ok(match (&build, status.phase) {
        (Build::Running { .. }, _) => Action::requeue(Duration::from_secs(15)),
        (Build::Failed { .. } | Build::Invalid(_), _) => Action::await_change(),
        // A pool that does not serve the Function yet is a second away; a route moving
        // between the pool and pods waits on pods starting or the route settling.
        _ if served.pending => Action::requeue(Duration::from_secs(1)),
        (_, Some(Phase::Ready)) => Action::requeue(Duration::from_secs(600)),
        _ => Action::requeue(Duration::from_secs(30)),
    })
}

/// Step 1: what is wrong with the Function that the CRD did not refuse, for status.
fn problems(func: &Function, settings: &Settings) -> Vec<String> {
    let mut problems = func.spec.problems();
    problems.extend(crate::crd::name_problem(&func.name_any()));
    let storage = func.spec.storage.unwrap_or(settings.default_storage);
    if storage == Storage::Oci && settings.oci_registry.is_none() && func.spec.module.is_none() {
        problems.push("storage oci needs the operator's --oci-registry setting".into());
    }
    problems
}

/// Step 2: the source digest, and the source in its immutable ConfigMap.
async fn write_source(func: &Function, ctx: &Context, ns: &str) -> Result<Digest, StepError> {
    let source = func.spec.inline_source().unwrap_or_default();
    let digest = objects::spec_source_digest(func, &ctx.settings.builder_version);
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let source_cm = objects::source_configmap(func, source, &digest);
    apply::apply_if_changed(&configmaps, &source_cm)
        .await
        .doing(BUILT, || {
            format!("writing the source ConfigMap {}", source_cm.name_any())
        })?;
    Ok(digest)
}

/// What step 4 left serving: the module, the Deployment (as read when this reconcile did
/// not change it: its status then says how the rollout stands), the replicas it asks for,
/// and where the Service routes.
struct Served {
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
    pub traffic_problem: Option<revisions::TrafficProblem>,
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
async fn serve(
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
    let already_serving = || existing.as_ref().and_then(find::serving_module);
    // The revisions a split names, each read; while one cannot be, the pods stay as they are.
    let mut traffic_problem = None;
    let mut shares = Vec::new();
    if let Some(split) = revisions::split(func) {
        match resolve_split(ctx, func, ns, build, split).await? {
            Ok(resolved) => shares = resolved,
            Err(problem) => traffic_problem = Some(problem),
        }
    }
    let keep_template = traffic_problem.is_some();
    // The revision `spec.traffic` names, else the latest build; while either cannot serve,
    // what serves now.
    let serving = match (revisions::wanted(func), build) {
        _ if keep_template => already_serving(),
        _ if !shares.is_empty() => objects::primary(&shares).map(|share| share.module.clone()),
        (revisions::Wanted::Latest, Build::Done(module)) => Some(module.clone()),
        (revisions::Wanted::Latest, _) => already_serving(),
        (revisions::Wanted::Revision(revision), _) => {
            let found = find::revision_module(ctx, func, ns, revision)
                .await
                .doing(READY, || format!("reading the module of revision {}", revision.name))?;
            if found.is_none() {
                traffic_problem = Some(revisions::TrafficProblem::not_found(format!(
                    "the module of revision {} is no longer stored: name another revision in spec.traffic",
                    revision.name
                )));
            }
            found.or_else(already_serving)
        }
        (revisions::Wanted::NotKept(problem), _) => {
            traffic_problem = Some(revisions::TrafficProblem::not_found(problem));
            already_serving()
        }
    };
    let not_pooled = func.spec.scales_to_zero().then(|| func.spec.pool_refusal()).flatten();
    let mut served = Served {
        module: serving.clone(),
        deployment: existing.clone(),
        replicas: 0,
        route: None,
        pool: None,
        not_pooled,
        pending: false,
        entry_port: None,
        traffic_problem,
        shares,
    };
    let Some(module) = serving.as_ref().filter(|_| !matches!(build, Build::Invalid(_))) else {
        if let Some(Config::Complete(hash)) = config
            && served.traffic_problem.is_none()
        {
            wait_for_first_build(func, ctx, ns, build, hash.as_ref(), &mut served).await?;
        }
        return Ok(served);
    };
    let routes = match served.shares.is_empty() {
        true => vec![objects::Share {
            revision: revision_name(func, build, module),
            module: module.clone(),
            percent: 100,
            tag: None,
        }],
        false => served.shares.clone(),
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
    let serving_set = objects::Serving {
        routes,
        standby,
        chunk_reader,
    };
    let mut desired = match (config, &existing) {
        (Some(Config::Complete(hash)), Some(existing)) if keep_template => {
            let mut desired = objects::deployment(func, &ctx.settings, &serving_set, hash.as_ref());
            if let (Some(spec), Some(live)) = (desired.spec.as_mut(), existing.spec.as_ref()) {
                spec.template = live.template.clone();
            }
            desired
        }
        (Some(Config::Complete(hash)), _) => objects::deployment(func, &ctx.settings, &serving_set, hash.as_ref()),
        (Some(Config::Missing(_)), Some(existing)) => {
            let mut desired = objects::deployment(func, &ctx.settings, &serving_set, None);
            if let (Some(spec), Some(live)) = (desired.spec.as_mut(), existing.spec.as_ref()) {
                spec.template = live.template.clone();
            }
            desired
        }
        // Nothing serves yet, and nothing could start.
        (Some(Config::Missing(_)), None) | (None, _) => return Ok(served),
    };
    let pooled = func.spec.scales_to_zero() && served.not_pooled.is_none();
    let live_replicas = existing.as_ref().and_then(|d| d.spec.as_ref()?.replicas);
    let own_available = existing
        .as_ref()
        .and_then(|d| d.status.as_ref()?.available_replicas)
        .unwrap_or(0);
    let wanted = scale::replicas(func, ctx.scaler.wanted(func), live_replicas);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
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
    let (replicas, route) = if pooled || (leaving && own_available == 0) {
        pool::ensure_pool(ctx, func, ns).await?;
        let was_served_by_pods = status.and_then(|status| status.served_by) == Some(ServedBy::Pods);
        let port = pool::write_entry(ctx, func, ns, &entry, was_served_by_pods).await?;
        let state = pool::pool_state(ctx, ns, &name, port).await;
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
        (decision.replicas, decision.route(port))
    } else {
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
        (wanted, Route::Pods)
    };
    if let Some(spec) = desired.spec.as_mut() {
        spec.replicas = Some(replicas);
    }
    let service_name = objects::service_name(func);
    let live_service = apply::get_owned(&services, &service_name, func)
        .await
        .doing(READY, || format!("reading the Service {service_name}"))?;
    // A first build's pods are switched to it where they wait, before anything rolls.
    let holding =
        route == Route::Pods && switch::holding_for_first_switch(func, existing.as_ref(), live_service.as_ref());
    let serves = desired.spec.as_ref().map(|spec| spec.template.clone());
    if holding
        && let (Some(spec), Some(live)) = (desired.spec.as_mut(), existing.as_ref().and_then(|d| d.spec.as_ref()))
    {
        spec.template = live.template.clone();
    }
    let rolled = apply::apply_if_changed_with(&deployments, existing.as_ref(), &desired)
        .await
        .doing(READY, || format!("applying the Deployment {name}"))?;
    // The pods that have every revision the template serves mounted move to it now; the
    // rollout replaces them meanwhile, and the rest as it goes.
    if (holding || rolled || switch::rolling(existing.as_ref()))
        && let Some(template) = serves.as_ref()
    {
        switch::in_place(ctx, func, ns, template, &serving_set).await?;
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
    served.replicas = replicas;
    served.route = Some(route);
    if rolled {
        served.deployment = None;
    }
    Ok(served)
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
        crate::crd::Storage::ConfigMap => switch::chunk_reader(ctx, func, ns, &[], true).await?,
        crate::crd::Storage::Oci => None,
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
    split: Result<Vec<revisions::Share<'_>>, revisions::TrafficProblem>,
) -> Result<Result<Vec<objects::Share>, revisions::TrafficProblem>, StepError> {
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
                    return Ok(Err(revisions::TrafficProblem::not_found(
                        "spec.traffic sends requests to the latest revision, and none is built yet".into(),
                    )));
                };
                let found = find::revision_module(ctx, func, ns, revision)
                    .await
                    .doing(READY, || format!("reading the module of revision {}", revision.name))?;
                let Some(module) = found else {
                    return Ok(Err(revisions::TrafficProblem::not_found(format!(
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

/// Requeues a failed reconcile after 1 s, 2 s, 4 s … up to 5 minutes.
pub fn error_policy(func: Arc<Function>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(error);
    let mut failures = ctx.failures.lock().expect("failure counts");
    let count = failures.entry(ObjectRef::from_obj(&*func)).or_default();
    *count = count.saturating_add(1);
    let delay = Duration::from_secs(1u64 << (*count - 1).min(8)).min(Duration::from_secs(300));
    tracing::warn!(function = %func.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Reconciles at once. Unbounded, a start (or a takeover) with a thousand Functions sent
/// the API server tens of thousands of requests in a burst, so slowly answered that the
/// Lease was not renewed in time: the operator stopped, restarted and did it again.
const CONCURRENT_RECONCILES: u16 = 8;

/// Runs the controller until a shutdown signal (or until `stop` resolves).
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>, stop: impl Future<Output = ()> + Send + Sync + 'static) {
    let client = ctx.client.clone();
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    // Only what a Function made is watched, not every ConfigMap in the cluster.
    let owned = watcher::Config::default().labels(labels::FUNCTION);
    let controller = Controller::new(
        api::<Function>(&client, namespace),
        watcher::Config::default().any_semantic(),
    )
    .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENT_RECONCILES));
    ctx.metrics.watch(controller.store());
    let _ = ctx.functions.set(controller.store());
    // A Secret or ConfigMap that a Function's pods read changes their configuration: its
    // Functions are reconciled, and roll their pods. Metadata only: the resourceVersion is
    // all that is compared, and a value never reaches the operator.
    // (`Api<PartialObjectMeta<_>>` lists and watches with the API server's metadata-only
    // representation.)
    let functions = controller.store();
    let readers = move |kind: ConfigKind| {
        let functions = functions.clone();
        move |meta: &ObjectMeta| {
            let name = meta.name.as_deref().unwrap_or_default();
            references::functions_reading(&functions.state(), kind, meta.namespace.as_deref(), name)
        }
    };
    let (secret_readers, configmap_readers) = (readers(ConfigKind::Secret), readers(ConfigKind::ConfigMap));
    let all = watcher::Config::default().any_semantic();
    // The autoscaler's decisions come back as reconciles of the Functions they changed.
    let (scaled, decisions) = tokio::sync::mpsc::unbounded_channel();
    let autoscaler = tokio::spawn(autoscaler::run(ctx.clone(), controller.store(), scaled));
    let registry_sweep = tokio::spawn(oci_gc::sweep_forever(ctx.clone(), namespace.map(str::to_string)));
    let idle_pools = tokio::spawn(pool::scale_idle_pools_forever(
        ctx.clone(),
        api::<Deployment>(&client, namespace),
        controller.store(),
    ));
    let decisions = futures::stream::unfold(decisions, |mut decisions| async move {
        decisions.recv().await.map(|func| (func, decisions))
    });
    controller
        .reconcile_on(decisions)
        .watches(
            api::<PartialObjectMeta<Secret>>(&client, namespace),
            all.clone(),
            move |secret| secret_readers(&secret.metadata),
        )
        .watches(
            api::<PartialObjectMeta<ConfigMap>>(&client, namespace),
            all,
            move |cm| configmap_readers(&cm.metadata),
        )
        // Metadata only (as `owns` watches anyway, said here): the chunk ConfigMaps among
        // them hold every module and its compiled code, 6 MB for a Goless handler.
        .owns(api::<PartialObjectMeta<ConfigMap>>(&client, namespace), owned.clone())
        .owns(api::<Job>(&client, namespace), owned.clone())
        .owns(api::<Deployment>(&client, namespace), owned.clone())
        .owns(api::<Service>(&client, namespace), owned)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(function = %object.name, "reconciled"),
                Err(error) => tracing::debug!(%error, "reconcile did not complete"),
            }
        })
        .await;
    autoscaler.abort();
    idle_pools.abort();
    registry_sweep.abort();
}
