//! The Function controller, after kube-rs's `controller-rs`: `Context`, `reconcile` (the
//! steps of docs/operator.md, "Reconcile", each a call into a module of its own),
//! `error_policy` and `run`.
//!
//! `build` runs or reads the build Job, `find` finds a module already built, `apply` writes
//! an object only when it changed, `cleanup` deletes what a Function no longer uses, and
//! `status` writes conditions and Events.

mod apply;
mod autoscaler;
mod backlog;
mod build;
mod cleanup;
mod config;
mod find;
mod oci_gc;
mod pool;
mod revisions;
mod routes;
mod scale;
mod serve;
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

use crate::crd::{Function, Phase, Storage};
use crate::objects::{self, MANAGER};
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
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serve::Served;
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
        .step("serve", serve::serve(func, ctx, &ns, &build, config.as_ref()))
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

/// What a change of a Function must touch to be reconciled: all of it but what only
/// `wasmless-events` writes (its triggers' progress, every few seconds while events wait,
/// which the autoscaler reads from the store and no step of the reconcile does) and the
/// bookkeeping every write moves.
fn reconciled_part(func: &Function) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut value = serde_json::to_value(func).ok()?;
    if let Some(status) = value.get_mut("status").and_then(|status| status.as_object_mut()) {
        status.remove("triggers");
        status.remove("triggersSummary");
    }
    if let Some(metadata) = value.get_mut("metadata").and_then(|metadata| metadata.as_object_mut()) {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    Some(hasher.finish())
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
    // Before the first reconcile, so a restarted operator builds the pods it built before.
    crate::node_code_store::detect(&client, &ctx.settings.node_code_store).await;
    let (store_changed, store_changes) = tokio::sync::mpsc::unbounded_channel();
    let node_code_store = tokio::spawn(crate::node_code_store::follow(
        client.clone(),
        ctx.settings.node_code_store.clone(),
        store_changed,
    ));
    let store_changes = futures::stream::unfold(store_changes, |mut changes| async move {
        changes.recv().await.map(|()| ((), changes))
    });
    // Only what a Function made is watched, not every ConfigMap in the cluster.
    let owned = watcher::Config::default().labels(labels::FUNCTION);
    let (reader, writer) = kube::runtime::reflector::store();
    let changed_functions = watcher(
        api::<Function>(&client, namespace),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects()
    .predicate_filter(reconciled_part, Default::default());
    let controller = Controller::for_stream(changed_functions, reader)
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
        .reconcile_all_on(store_changes)
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
    node_code_store.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_of_the_triggers_progress_alone_reconciles_nothing() {
        let func = |resource_version: &str, phase: &str, lag: i64, source: &str| -> Function {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "wasmless.io/v1alpha1",
                "kind": "Function",
                "metadata": {"name": "orders", "namespace": "shop", "resourceVersion": resource_version},
                "spec": {"source": source},
                "status": {"phase": phase, "triggers": [{"name": "created", "lag": lag}], "triggersSummary": format!("created lag {lag}")},
            }))
            .unwrap()
        };
        let before = reconciled_part(&func("1", "Ready", 0, "package handlers"));
        assert_eq!(reconciled_part(&func("2", "Ready", 900, "package handlers")), before);
        assert_ne!(reconciled_part(&func("3", "Building", 900, "package handlers")), before);
        assert_ne!(
            reconciled_part(&func("4", "Ready", 0, "package handlers // v2")),
            before
        );
    }
}
