//! The Function controller: `reconcile` follows DESIGN.md's steps, `error_policy` backs off.

use crate::crd::{Function, FunctionStatus, Phase, Storage};
use crate::metrics::BuildOutcome;
use crate::resources::{self, Code, MANAGER, Module, ModuleLocation};
use crate::{Error, Metrics, Settings};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStateTerminated, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmless_artifact::{Digest, Part, annotations, labels};

/// What the controller shares between reconciles.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    /// Consecutive failures per Function, for the error policy's backoff.
    failures: Mutex<HashMap<ObjectRef<Function>, u32>>,
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
            settings,
            failures: Mutex::default(),
        }
    }
}

/// Where the build of the current source stands.
#[derive(Debug)]
enum Build {
    /// The spec cannot be built; the reasons, for status.
    Invalid(String),
    /// The Job is running (or was just created).
    Running {
        job: String,
    },
    /// The Job failed: the condition's reason (`BuildFailed`, `DeadlineExceeded`,
    /// `OOMKilled`) and the message for status (the compiler's output for `BuildFailed`).
    Failed {
        reason: &'static str,
        message: String,
    },
    Done(Module),
}

pub const CONDITION_BUILT: &str = "Built";
pub const CONDITION_READY: &str = "Ready";
/// The reason of a condition whose step failed on an API error (retried with backoff).
pub const REASON_RECONCILE_ERROR: &str = "ReconcileError";
/// Longest Event note the API server accepts, in bytes.
pub const MAX_EVENT_NOTE_BYTES: usize = 1024;

/// A step of the reconcile that failed: the condition it reports on (none when status
/// itself cannot be written), what it was doing, and the error.
pub(crate) struct Failed {
    condition: Option<&'static str>,
    doing: String,
    error: Error,
    /// The status this reconcile wrote before the step failed, if it got that far: the
    /// failure is reported on it, not on the older status the reconcile started from.
    written: Option<Box<FunctionStatus>>,
}

impl Failed {
    fn after_writing(mut self, status: &FunctionStatus) -> Self {
        self.written = Some(Box::new(status.clone()));
        self
    }
}

/// Names the step a fallible call belongs to, for [`Failed`].
trait Doing<T> {
    fn doing(self, condition: Option<&'static str>, what: impl FnOnce() -> String) -> Result<T, Failed>;
}

impl<T, E: Into<Error>> Doing<T> for Result<T, E> {
    fn doing(self, condition: Option<&'static str>, what: impl FnOnce() -> String) -> Result<T, Failed> {
        self.map_err(|error| Failed {
            condition,
            doing: what(),
            error: error.into(),
            written: None,
        })
    }
}

const BUILT: Option<&str> = Some(CONDITION_BUILT);
const READY: Option<&str> = Some(CONDITION_READY);

/// Reconciles one Function; every step is idempotent, so running it again (after a crash,
/// an error, or a watch event) converges on the same objects without duplicates.
pub async fn reconcile(func: Arc<Function>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.start();
    // Deletion needs nothing from us: everything the Function made carries its owner
    // reference, and the garbage collector removes it.
    if func.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    match reconcile_steps(&func, &ctx).await {
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
            report_failure(&ctx, &func, &failed).await;
            Err(failed.error)
        }
    }
}

async fn reconcile_steps(func: &Function, ctx: &Context) -> Result<Action, Failed> {
    let ns = func.namespace().ok_or(Error::NoNamespace).doing(None, String::new)?;
    let name = func.name_any();
    let storage = func.spec.storage.unwrap_or(ctx.settings.default_storage);

    // 1. The source digest, and the source in its ConfigMap. 2-3. The build.
    let mut problems = func.spec.problems();
    problems.extend(crate::crd::name_problem(&name));
    if storage == Storage::Oci && ctx.settings.oci_registry.is_none() && func.spec.module.is_none() {
        problems.push("storage oci needs the operator's --oci-registry setting".into());
    }
    let (source_digest, build) = if !problems.is_empty() {
        (None, Build::Invalid(problems.join("; ")))
    } else if let Some(image) = &func.spec.module {
        match prebuilt_module(image) {
            Ok(module) => (Some(module.source_digest), Build::Done(module)),
            Err(problem) => (None, Build::Invalid(problem)),
        }
    } else {
        let source = func.spec.inline_source().unwrap_or_default();
        let digest = resources::source_digest(func.spec.language, &ctx.settings.builder_version, source);
        let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
        let source_cm = resources::source_configmap(func, source, &digest);
        apply_if_changed(&configmaps, &source_cm).await.doing(BUILT, || {
            format!("writing the source ConfigMap {}", source_cm.name_any())
        })?;
        (Some(digest), build(func, ctx, &ns, &digest, storage).await?)
    };

    // 4. The Deployment serves the new module once built, and the previous one (read back
    // from its pod template) while a build runs or after one failed.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = deployments
        .get_opt(&name)
        .await
        .doing(READY, || format!("reading the Deployment {name}"))?;
    let serving = match &build {
        Build::Done(module) => Some(module.clone()),
        _ => existing.as_ref().and_then(serving_module),
    };
    let mut rolled = false;
    if let (Some(module), false) = (&serving, matches!(build, Build::Invalid(_))) {
        let desired = resources::deployment(func, &ctx.settings, module);
        rolled = apply_if_changed_with(&deployments, existing.as_ref(), &desired)
            .await
            .doing(READY, || format!("applying the Deployment {name}"))?;
        let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
        let service = resources::service(func);
        apply_if_changed(&services, &service)
            .await
            .doing(READY, || format!("applying the Service {}", service.name_any()))?;
        remove_renamed_services(&services, func, &service.name_any()).await?;
    }

    // 5. Status and events.
    let deployment_now = if rolled { None } else { existing.as_ref() };
    let status = status_for(func, &build, source_digest, serving.as_ref(), deployment_now);
    let old = func.status.clone().unwrap_or_default();
    let status = keep_transition_times(status, &old);
    publish_transitions(ctx, func, &old, &status).await;
    if status != old {
        write_status(ctx, func, &status)
            .await
            .doing(None, || format!("writing the status of {name}"))?;
    }
    // Counted once status records it, so a status write that fails and is retried does
    // not count the same build twice.
    ctx.metrics.builds_seen(&name, &ns);
    if func.spec.module.is_none()
        && let Some(result) = build_ended(&old, &status)
    {
        ctx.metrics.build_ended(&name, &ns, result);
    }

    // Once the current module serves everywhere, older builds are garbage.
    if let (Build::Done(module), Some(Phase::Ready)) = (&build, status.phase)
        && func.spec.module.is_none()
    {
        collect_old_builds(ctx, &ns, &name, &module.source_digest)
            .await
            .doing(BUILT, || format!("deleting the older builds of {name}"))
            .map_err(|failed| failed.after_writing(&status))?;
    }

    Ok(match (&build, status.phase) {
        (Build::Running { .. }, _) => Action::requeue(Duration::from_secs(15)),
        (Build::Failed { .. } | Build::Invalid(_), _) => Action::await_change(),
        (_, Some(Phase::Ready)) => Action::requeue(Duration::from_secs(600)),
        _ => Action::requeue(Duration::from_secs(30)),
    })
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

async fn write_status(ctx: &Context, func: &Function, status: &FunctionStatus) -> Result<(), Error> {
    let functions: Api<Function> = Api::namespaced(ctx.client.clone(), &func.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "status": status,
    });
    functions
        .patch_status(
            &func.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// Puts a failed step on the condition it belongs to (`Built` for the source, the build
/// and the collection of older builds, `Ready` for the Deployment and the Service), reason
/// `ReconcileError`, with a Warning Event; the rest of the status stays as the last
/// write left it.
async fn report_failure(ctx: &Context, func: &Function, failed: &Failed) {
    let Some(kind) = failed.condition else { return };
    let mut message = format!("{}: {}", failed.doing, failed.error);
    if matches!(&failed.error, Error::Kube(kube::Error::Api(status)) if status.code == 403) {
        message.push_str(
            " — the operator's ServiceAccount is not allowed this: install the RBAC of this version (kubectl apply -k deploy/)",
        );
    }
    message.push_str("; retrying with backoff");
    let old = match &failed.written {
        Some(written) => FunctionStatus::clone(written),
        None => func.status.clone().unwrap_or_default(),
    };
    let mut status = old.clone();
    let failed_condition = condition(kind, false, REASON_RECONCILE_ERROR, message, func.metadata.generation);
    match status.conditions.iter_mut().find(|c| c.type_ == kind) {
        Some(existing) => *existing = failed_condition,
        None => status.conditions.push(failed_condition),
    }
    if status.phase.is_none() || (kind == CONDITION_READY && status.phase == Some(Phase::Ready)) {
        status.phase = Some(Phase::Pending);
    }
    status.observed_generation = func.metadata.generation;
    let status = keep_transition_times(status, &old);
    publish_transitions(ctx, func, &old, &status).await;
    if status != old
        && let Err(error) = write_status(ctx, func, &status).await
    {
        tracing::warn!(function = %func.name_any(), %error, "could not report the failed step on status");
    }
}

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
    );
    ctx.metrics.watch(controller.store());
    controller
        .owns(api::<ConfigMap>(&client, namespace), owned.clone())
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
}

/// A prebuilt module (`spec.module`): nothing to build, the runtime pulls it by digest.
fn prebuilt_module(image: &crate::crd::ModuleImage) -> Result<Module, String> {
    let digest: Digest = image.digest.parse().map_err(|e| format!("module.digest: {e}"))?;
    let reference = image
        .image
        .strip_prefix(wasmless_artifact::oci::SCHEME)
        .unwrap_or(&image.image)
        .to_string();
    Ok(Module {
        digest,
        size: None,
        // A prebuilt module has no source: its own digest names it.
        source_digest: digest,
        location: ModuleLocation::Oci { reference },
        code: None,
    })
}

/// Steps 2-3: reuse a module already built from this source, or run (or read) its Job.
async fn build(func: &Function, ctx: &Context, ns: &str, digest: &Digest, storage: Storage) -> Result<Build, Failed> {
    let name = func.name_any();
    match storage {
        Storage::ConfigMap => {
            if let Some(module) = find_chunks(ctx, func, ns, digest)
                .await
                .doing(BUILT, || format!("reading the module ConfigMaps of {name}"))?
            {
                return Ok(Build::Done(module));
            }
        }
        Storage::Oci => {
            // The Job's result is the only record of an OCI build; status caches it.
            if let Some(module) = oci_module_from_status(func, digest) {
                return Ok(Build::Done(module));
            }
        }
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let job_name = resources::job_name(&name, digest);
    let Some(job) = jobs
        .get_opt(&job_name)
        .await
        .doing(BUILT, || format!("reading the build Job {job_name}"))?
    else {
        ensure_builder_rbac(ctx, ns).await.doing(BUILT, || {
            format!("writing the builder's ServiceAccount, Role and RoleBinding in {ns}")
        })?;
        let publish = resources::publish_target(func, storage, &ctx.settings, digest)
            .ok_or(Error::NoRegistry)
            .doing(BUILT, || "choosing where the build publishes".into())?;
        let job = resources::build_job(func, &ctx.settings, digest, &publish);
        jobs.patch(&job_name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&job))
            .await
            .doing(BUILT, || format!("creating the build Job {job_name}"))?;
        return Ok(Build::Running { job: job_name });
    };
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let is = |kind: &str| conditions.iter().any(|c| c.type_ == kind && c.status == "True");
    let last_pod = || async {
        last_termination(ctx, ns, &job_name)
            .await
            .doing(BUILT, || format!("reading the pods of the build Job {job_name}"))
    };
    if let Some(failed) = conditions.iter().find(|c| c.type_ == "Failed" && c.status == "True") {
        // What stopped the builder comes first: after a deadline or an out-of-memory kill,
        // the termination message is only the log tail (FallbackToLogsOnError), which
        // says nothing about why the build ended.
        if failed.reason.as_deref() == Some("DeadlineExceeded") {
            let deadline = job
                .spec
                .as_ref()
                .and_then(|s| s.active_deadline_seconds)
                .unwrap_or_default();
            return Ok(Build::Failed {
                reason: "DeadlineExceeded",
                message: format!(
                    "build Job {job_name} ran longer than its deadline of {deadline} s and was stopped; \
                     the build may hang on this source, or the node is overloaded: fix the source, or delete the Job to build again"
                ),
            });
        }
        let terminated = last_pod().await?;
        if let Some(terminated) = &terminated
            && terminated.reason.as_deref() == Some("OOMKilled")
        {
            return Ok(Build::Failed {
                reason: "OOMKilled",
                message: format!(
                    "the builder of Job {job_name} ran out of memory (its container's limit is {}) and was killed; \
                     delete the Job to build again, or make the handler smaller",
                    resources::BUILDER_MEMORY_LIMIT
                ),
            });
        }
        let message = terminated
            .and_then(|t| t.message)
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| {
                format!(
                    "build Job {job_name} failed ({}): {}",
                    failed.reason.as_deref().unwrap_or("no reason"),
                    failed.message.as_deref().unwrap_or("no message")
                )
            });
        return Ok(Build::Failed {
            reason: "BuildFailed",
            message: resources::cut_message(&message),
        });
    }
    let failed = |message: String| Build::Failed {
        reason: "BuildFailed",
        message,
    };
    if is("Complete") {
        return Ok(match storage {
            // The chunks were looked for above: a build that succeeded without them
            // published somewhere else.
            Storage::ConfigMap => failed(format!(
                "build Job {job_name} succeeded but no complete set of module ConfigMaps labelled {}={},{}={} exists",
                labels::FUNCTION,
                name,
                labels::SOURCE_DIGEST,
                labels::digest_value(digest)
            )),
            Storage::Oci => match last_pod()
                .await?
                .and_then(|t| t.message)
                .filter(|m| !m.trim().is_empty())
            {
                Some(message) => oci_module_from_result(&message, digest).unwrap_or_else(failed),
                None => failed(format!("build Job {job_name} succeeded but left no result")),
            },
        });
    }
    Ok(Build::Running { job: job_name })
}

/// The builder's result line: `{"digest":"sha256:..","size":N,"published":"..","code":{"digest":..}}`.
#[derive(serde::Deserialize)]
struct BuildResult {
    digest: String,
    size: Option<u64>,
    published: String,
    code: Option<BuildResultCode>,
}

#[derive(serde::Deserialize)]
struct BuildResultCode {
    digest: String,
}

fn oci_module_from_result(message: &str, source_digest: &Digest) -> Result<Build, String> {
    let line = message
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_default();
    let result: BuildResult = serde_json::from_str(line)
        .map_err(|e| format!("the build's result {line:?} is not the builder's JSON line: {e}"))?;
    let digest = result.digest.parse().map_err(|e| format!("the build's result: {e}"))?;
    let code = match result.code {
        Some(code) => Some(Code {
            digest: code
                .digest
                .parse()
                .map_err(|e| format!("the build's result: code: {e}"))?,
            chunks: 0,
        }),
        None => None,
    };
    Ok(Build::Done(Module {
        digest,
        size: result.size,
        source_digest: *source_digest,
        code,
        location: ModuleLocation::Oci {
            reference: result
                .published
                .strip_prefix(wasmless_artifact::oci::SCHEME)
                .unwrap_or(&result.published)
                .to_string(),
        },
    }))
}

fn oci_module_from_status(func: &Function, digest: &Digest) -> Option<Module> {
    let status = func.status.as_ref()?;
    if status.source_digest.as_deref() != Some(&digest.to_string()) {
        return None;
    }
    let reference = status
        .module_ref
        .as_deref()?
        .strip_prefix(wasmless_artifact::oci::SCHEME)?;
    Some(Module {
        digest: status.module_digest.as_deref()?.parse().ok()?,
        size: status.module_size.and_then(|s| u64::try_from(s).ok()),
        source_digest: *digest,
        code: status
            .code_digest
            .as_deref()
            .and_then(|d| d.parse().ok())
            .map(|digest| Code { digest, chunks: 0 }),
        location: ModuleLocation::Oci {
            reference: reference.to_string(),
        },
    })
}

/// The complete chunk set built from `digest`, if the builder published one, with the
/// compiled code's chunks when those are complete too. The chunks get the Function as
/// their owner here, in case the builder did not know its UID.
async fn find_chunks(ctx: &Context, func: &Function, ns: &str, digest: &Digest) -> Result<Option<Module>, Error> {
    let name = func.name_any();
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{}={},{}={}",
        labels::FUNCTION,
        name,
        labels::SOURCE_DIGEST,
        labels::digest_value(digest)
    );
    // Names, labels and annotations are all it needs: not the chunks' megabytes of data.
    let found = configmaps
        .list_metadata(&ListParams::default().labels(&selector))
        .await?;
    let Some(module) = complete_chunks(&found.items, Part::Module, &name, digest) else {
        return Ok(None);
    };
    let Ok(module_digest) = module.module_digest.parse::<Digest>() else {
        return Ok(None);
    };
    // Code made from another module than the one found is not this build's: never serve it.
    let code = complete_chunks(&found.items, Part::Code, &name, digest)
        .filter(|code| code.module_digest == module.module_digest)
        .and_then(|code| {
            Some(Code {
                digest: code.annotation(annotations::CODE_DIGEST).parse().ok()?,
                chunks: code.chunks.len(),
            })
        });
    let owner = func.controller_owner_ref(&());
    for cm in &found.items {
        adopt(&configmaps, cm, owner.as_ref()).await?;
    }
    Ok(Some(Module {
        digest: module_digest,
        size: module.annotation(annotations::MODULE_SIZE).parse().ok(),
        source_digest: *digest,
        location: ModuleLocation::ConfigMaps {
            count: module.chunks.len(),
        },
        code,
    }))
}

/// One part's chunk ConfigMaps, all present and agreeing on the module digest.
struct ChunkSet<'a> {
    chunks: Vec<&'a PartialObjectMeta<ConfigMap>>,
    module_digest: String,
}

impl ChunkSet<'_> {
    fn annotation(&self, key: &str) -> String {
        self.chunks[0].annotations().get(key).cloned().unwrap_or_default()
    }
}

fn complete_chunks<'a>(
    found: &'a [PartialObjectMeta<ConfigMap>],
    part: Part,
    function: &str,
    digest: &Digest,
) -> Option<ChunkSet<'a>> {
    let annotation =
        |cm: &PartialObjectMeta<ConfigMap>, key: &str| cm.annotations().get(key).cloned().unwrap_or_default();
    let first_name = part.configmap_name(function, digest, 0);
    let first = found.iter().find(|cm| cm.name_any() == first_name)?;
    let module_digest = annotation(first, annotations::MODULE_DIGEST);
    let count = annotation(first, annotations::CHUNK_COUNT).parse::<usize>().ok()?;
    let chunks = part
        .configmap_names(function, digest, count)
        .into_iter()
        .map(|name| {
            found
                .iter()
                .find(|cm| cm.name_any() == name && annotation(cm, annotations::MODULE_DIGEST) == module_digest)
        })
        .collect::<Option<Vec<_>>>()?;
    (!chunks.is_empty()).then_some(ChunkSet { chunks, module_digest })
}

async fn adopt(
    configmaps: &Api<ConfigMap>,
    cm: &PartialObjectMeta<ConfigMap>,
    owner: Option<&OwnerReference>,
) -> Result<(), Error> {
    let Some(owner) = owner else { return Ok(()) };
    if cm.owner_references().iter().any(|o| o.uid == owner.uid) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": cm.name_any(), "ownerReferences": [owner] },
    });
    configmaps
        .patch(
            &cm.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// How the builder container of the Job's newest pod ended: its reason (`OOMKilled`,
/// `Error`, …) and termination message (the compiler's output on failure, the result line
/// on success).
async fn last_termination(ctx: &Context, ns: &str, job_name: &str) -> Result<Option<ContainerStateTerminated>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job_name}")))
        .await?;
    // The newest pod is the build's last attempt.
    let mut pods = list.items;
    pods.sort_by_key(|pod| std::cmp::Reverse(pod.metadata.creation_timestamp.clone().map(|t| t.0)));
    Ok(pods.iter().find_map(|pod| {
        let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
        statuses.iter().find_map(|status| {
            status
                .state
                .as_ref()
                .and_then(|s| s.terminated.clone())
                .or_else(|| status.last_state.as_ref().and_then(|s| s.terminated.clone()))
        })
    }))
}

async fn ensure_builder_rbac(ctx: &Context, ns: &str) -> Result<(), Error> {
    let (account, role, binding) = resources::builder_rbac(ns);
    apply_if_changed(&Api::<ServiceAccount>::namespaced(ctx.client.clone(), ns), &account).await?;
    apply_if_changed(&Api::<Role>::namespaced(ctx.client.clone(), ns), &role).await?;
    apply_if_changed(&Api::<RoleBinding>::namespaced(ctx.client.clone(), ns), &binding).await?;
    Ok(())
}

/// The module a Deployment serves, from the annotations its pod template was written with.
fn serving_module(deployment: &Deployment) -> Option<Module> {
    let template = deployment
        .spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?;
    let location = match template.get(resources::MODULE_REF_ANNOTATION) {
        Some(reference) => ModuleLocation::Oci {
            reference: reference.clone(),
        },
        None => ModuleLocation::ConfigMaps {
            count: template.get(resources::CHUNK_COUNT_ANNOTATION)?.parse().ok()?,
        },
    };
    Some(Module {
        digest: template.get(annotations::MODULE_DIGEST)?.parse().ok()?,
        size: template.get(annotations::MODULE_SIZE).and_then(|s| s.parse().ok()),
        source_digest: template.get(resources::SOURCE_DIGEST_ANNOTATION)?.parse().ok()?,
        location,
        code: template
            .get(annotations::CODE_DIGEST)
            .and_then(|d| d.parse().ok())
            .map(|digest| Code {
                digest,
                chunks: template
                    .get(resources::CODE_CHUNK_COUNT_ANNOTATION)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0),
            }),
    })
}

/// Server-side applies `desired` unless the live object already holds every field of it,
/// so an unchanged reconcile writes nothing.
async fn apply_if_changed<K>(api: &Api<K>, desired: &K) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let existing = api.get_opt(&desired.name_any()).await?;
    apply_if_changed_with(api, existing.as_ref(), desired).await
}

async fn apply_if_changed_with<K>(api: &Api<K>, existing: Option<&K>, desired: &K) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    if let Some(existing) = existing
        && is_subset(&serde_json::to_value(desired)?, &serde_json::to_value(existing)?)
    {
        return Ok(false);
    }
    api.patch(
        &desired.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(desired),
    )
    .await?;
    Ok(true)
}

/// Whether every field set in `part` has the same value in `whole` (lists element-wise,
/// same length). Fields the API server defaults are only in `whole` and do not count;
/// a zero value in `part` (`false`, `0`, `""`, `{}`, `[]`) matches a field `whole` lacks,
/// since the API server drops such fields rather than store them (Go's `omitempty`).
pub fn is_subset(part: &serde_json::Value, whole: &serde_json::Value) -> bool {
    use serde_json::Value;
    fn is_zero(value: &Value) -> bool {
        match value {
            Value::Null => true,
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.values().all(is_zero),
        }
    }
    match (part, whole) {
        (Value::Object(part), Value::Object(whole)) => part
            .iter()
            .all(|(key, value)| whole.get(key).map_or(is_zero(value), |w| is_subset(value, w))),
        (Value::Array(part), Value::Array(whole)) => {
            part.len() == whole.len() && part.iter().zip(whole).all(|(p, w)| is_subset(p, w))
        }
        _ => part == whole,
    }
}

fn condition(kind: &str, ok: bool, reason: &str, message: String, generation: Option<i64>) -> Condition {
    Condition {
        type_: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(Timestamp::now()),
    }
}

fn status_for(
    func: &Function,
    build: &Build,
    source_digest: Option<Digest>,
    serving: Option<&Module>,
    deployment: Option<&Deployment>,
) -> FunctionStatus {
    let generation = func.metadata.generation;
    let (built, phase_of_build, build_message) = match build {
        Build::Invalid(problems) => (
            condition(CONDITION_BUILT, false, "InvalidSpec", problems.clone(), generation),
            Some(Phase::Failed),
            Some(problems.clone()),
        ),
        Build::Running { job } => (
            condition(
                CONDITION_BUILT,
                false,
                "Building",
                format!("build Job {job} is running"),
                generation,
            ),
            Some(Phase::Building),
            None,
        ),
        Build::Failed { reason, message } => (
            condition(
                CONDITION_BUILT,
                false,
                reason,
                message.lines().next().unwrap_or_default().to_string(),
                generation,
            ),
            Some(Phase::Failed),
            Some(message.clone()),
        ),
        Build::Done(module) => (
            condition(
                CONDITION_BUILT,
                true,
                "Built",
                format!("module {}", module.digest),
                generation,
            ),
            None,
            None,
        ),
    };
    let replicas = func.spec.replicas;
    let deploy_status = deployment.and_then(|d| d.status.clone()).unwrap_or_default();
    let up_to_date = deployment.is_some_and(|d| {
        d.status.as_ref().and_then(|s| s.observed_generation) >= d.metadata.generation
            && deploy_status.updated_replicas.unwrap_or(0) >= replicas
    });
    let available = deploy_status.available_replicas.unwrap_or(0);
    let ready = if serving.is_none() {
        condition(
            CONDITION_READY,
            false,
            "NoModule",
            "no module has been built yet".into(),
            generation,
        )
    } else if replicas == 0 {
        condition(
            CONDITION_READY,
            false,
            "ScaledToZero",
            "replicas is 0".into(),
            generation,
        )
    } else if up_to_date && available >= replicas {
        condition(
            CONDITION_READY,
            true,
            "Available",
            format!("{available}/{replicas} replicas available"),
            generation,
        )
    } else {
        condition(
            CONDITION_READY,
            false,
            "RollingOut",
            format!("{available}/{replicas} replicas available"),
            generation,
        )
    };
    let phase = phase_of_build.unwrap_or(if ready.status == "True" || replicas == 0 {
        Phase::Ready
    } else {
        Phase::Pending
    });
    FunctionStatus {
        phase: Some(phase),
        conditions: vec![built, ready],
        observed_generation: generation,
        source_digest: source_digest.map(|d| d.to_string()),
        module_digest: serving.map(|m| m.digest.to_string()),
        module_digest_short: serving.map(|m| m.digest.short()),
        module_size: serving.and_then(|m| m.size).and_then(|s| i64::try_from(s).ok()),
        module_ref: serving.map(|m| m.reference(&func.name_any())),
        code_digest: serving.and_then(|m| m.code.as_ref()).map(|c| c.digest.to_string()),
        url: serving.map(|_| resources::url(func)),
        build_message,
        ready_replicas: deploy_status.ready_replicas.or(serving.map(|_| 0)),
        replicas: deploy_status.replicas.or(serving.map(|_| 0)),
        selector: Some(resources::runtime_selector(func)),
    }
}

/// The build result `new` reports that `old` did not: a `Built` condition whose reason is a
/// build's end, for another source or after another reason. A failed step in between
/// (`ReconcileError`) leaves the outcome that was already there uncounted again: the same
/// module digest after a success, the same message after a failure.
fn build_ended(old: &FunctionStatus, new: &FunctionStatus) -> Option<BuildOutcome> {
    let built = |status: &FunctionStatus| status.conditions.iter().find(|c| c.type_ == CONDITION_BUILT).cloned();
    let now = built(new)?;
    let result = BuildOutcome::of_reason(&now.reason)?;
    let Some(before) = built(old) else { return Some(result) };
    let repeated = old.source_digest == new.source_digest
        && (before.reason == now.reason
            || (before.reason == REASON_RECONCILE_ERROR
                && match result {
                    BuildOutcome::Succeeded => old.module_digest == new.module_digest,
                    _ => old.build_message == new.build_message,
                }));
    (!repeated).then_some(result)
}

/// A condition whose status did not change keeps the time it last changed.
fn keep_transition_times(mut status: FunctionStatus, old: &FunctionStatus) -> FunctionStatus {
    for condition in &mut status.conditions {
        if let Some(previous) = old.conditions.iter().find(|c| c.type_ == condition.type_)
            && previous.status == condition.status
        {
            condition.last_transition_time = previous.last_transition_time.clone();
        }
    }
    status
}

/// One Event per condition that changed status or reason.
async fn publish_transitions(ctx: &Context, func: &Function, old: &FunctionStatus, new: &FunctionStatus) {
    for condition in &new.conditions {
        let previous = old.conditions.iter().find(|c| c.type_ == condition.type_);
        if previous.is_some_and(|p| p.status == condition.status && p.reason == condition.reason) {
            continue;
        }
        let warning = matches!(
            condition.reason.as_str(),
            "BuildFailed" | "DeadlineExceeded" | "OOMKilled" | "InvalidSpec" | REASON_RECONCILE_ERROR
        ) || (condition.type_ == CONDITION_READY
            && condition.reason == "RollingOut"
            && previous.is_some_and(|p| p.status == "True"));
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: condition.reason.clone(),
            note: Some(event_note(&condition.message)),
            action: condition.type_.clone(),
            secondary: None,
        };
        // Events are for people watching; a lost one must not fail the reconcile.
        if let Err(error) = ctx.recorder.publish(&event, &func.object_ref(&())).await {
            tracing::warn!(function = %func.name_any(), %error, "could not publish event");
        }
    }
}

/// The Event API refuses a note over [`MAX_EVENT_NOTE_BYTES`] bytes (not characters):
/// the start of the message, cut on a character boundary.
pub fn event_note(message: &str) -> String {
    const MARK: &str = " …";
    let message = message.trim_end();
    if message.len() <= MAX_EVENT_NOTE_BYTES {
        return message.to_string();
    }
    let end = message.floor_char_boundary(MAX_EVENT_NOTE_BYTES - MARK.len());
    format!("{}{MARK}", &message[..end])
}

/// Deletes this Function's Services under another name than `spec.service` now gives.
async fn remove_renamed_services(services: &Api<Service>, func: &Function, current: &str) -> Result<(), Failed> {
    let selector = format!("{}={}", labels::FUNCTION, func.name_any());
    let uid = func.uid();
    let listed = services
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .doing(READY, || format!("listing the Services of {}", func.name_any()))?;
    for service in listed.items {
        let owned = service.owner_references().iter().any(|o| Some(&o.uid) == uid.as_ref());
        let old = service.name_any();
        if owned && old != current {
            services
                .delete(&old, &DeleteParams::default())
                .await
                .doing(READY, || format!("deleting the Service {old}, renamed to {current}"))?;
        }
    }
    Ok(())
}

/// Deletes the Jobs, source and chunk ConfigMaps of this Function's older sources.
async fn collect_old_builds(ctx: &Context, ns: &str, name: &str, current: &Digest) -> Result<(), Error> {
    let selector = format!(
        "{}={name},{}!={}",
        labels::FUNCTION,
        labels::SOURCE_DIGEST,
        labels::digest_value(current)
    );
    let params = ListParams::default().labels(&selector);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    for job in jobs.list_metadata(&params).await?.items {
        if job.labels().contains_key(labels::SOURCE_DIGEST) {
            jobs.delete(&job.name_any(), &DeleteParams::background()).await?;
        }
    }
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    for cm in configmaps.list_metadata(&params).await?.items {
        if cm.labels().contains_key(labels::SOURCE_DIGEST) {
            configmaps.delete(&cm.name_any(), &DeleteParams::default()).await?;
        }
    }
    Ok(())
}
