//! Step 3 of the reconcile: reuse a module already built from this source, or create the
//! build Job, or read how it ended (the builder's termination message, the Job's conditions).

use super::{BUILT, Context, Doing, StepError, find};
use crate::Error;
use crate::crd::{Function, Storage};
use crate::module::{Code, Module, ModuleLocation};
use crate::objects::{self, MANAGER};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use wasmless_artifact::{Digest, labels};

/// Where the build of the current source stands.
#[derive(Debug)]
pub(super) enum Build {
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

/// Reuses a module already built from `digest`, or runs (or reads) its Job.
pub(super) async fn build(func: &Function, ctx: &Context, ns: &str, digest: &Digest) -> Result<Build, StepError> {
    let name = func.name_any();
    let storage = func.spec.storage.unwrap_or(ctx.settings.default_storage);
    let found = match storage {
        Storage::ConfigMap => find::find_chunks(ctx, func, ns, digest)
            .await
            .doing(BUILT, || format!("reading the module ConfigMaps of {name}"))?,
        // The Job's result is the only record of an OCI build; status caches it.
        Storage::Oci => find::oci_module_from_status(func, digest),
    };
    if let Some(module) = found {
        return Ok(Build::Done(module));
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let job_name = objects::job_name(&name, digest);
    let Some(job) = super::apply::get_owned(&jobs, &job_name, func)
        .await
        .doing(BUILT, || format!("reading the build Job {job_name}"))?
    else {
        ensure_builder_rbac(ctx, ns).await.doing(BUILT, || {
            format!("writing the builder's ServiceAccount, Role and RoleBinding in {ns}")
        })?;
        let publish = objects::publish_target(func, storage, &ctx.settings, digest)
            .ok_or(Error::NoRegistry)
            .doing(BUILT, || "choosing where the build publishes".into())?;
        let job = objects::build_job(func, &ctx.settings, digest, &publish);
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
    if let Some(failed) = conditions.iter().find(|c| c.type_ == "Failed" && c.status == "True") {
        return failed_build(ctx, ns, &job, failed).await;
    }
    if is("Complete") {
        return completed_build(ctx, ns, &name, &job, digest, storage).await;
    }
    // An OCI build is recorded only by its result line: it is read as soon as the builder
    // has exited with success, a second or two before the Job counts the pod and completes
    // (the kubelet's report, then the Job controller's batch), which an edit would wait for.
    if matches!(storage, Storage::Oci)
        && let Some(module) = last_termination(ctx, ns, &job)
            .await
            .doing(BUILT, || format!("reading the pods of the build Job {job_name}"))?
            .filter(|terminated| terminated.exit_code == 0)
            .and_then(|terminated| terminated.message)
            .and_then(|message| module_from_result(&message, digest).ok())
    {
        return Ok(Build::Done(module));
    }
    Ok(Build::Running { job: job_name })
}

/// Why a failed Job failed. What stopped the builder comes first: after a deadline or an
/// out-of-memory kill, the termination message is only the log tail
/// (FallbackToLogsOnError), which says nothing about why the build ended.
async fn failed_build(
    ctx: &Context,
    ns: &str,
    job: &Job,
    failed: &k8s_openapi::api::batch::v1::JobCondition,
) -> Result<Build, StepError> {
    let job_name = job.name_any();
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
    let terminated = last_termination(ctx, ns, job)
        .await
        .doing(BUILT, || format!("reading the pods of the build Job {job_name}"))?;
    if let Some(terminated) = &terminated
        && terminated.reason.as_deref() == Some("OOMKilled")
    {
        return Ok(Build::Failed {
            reason: "OOMKilled",
            message: format!(
                "the builder of Job {job_name} ran out of memory (its container's limit is {}) and was killed; \
                 delete the Job to build again, or make the handler smaller",
                objects::BUILDER_MEMORY_LIMIT
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
    Ok(Build::Failed {
        reason: "BuildFailed",
        message: objects::cut_message(&message),
    })
}

/// The module a completed Job made: for ConfigMap storage the chunks were looked for
/// before, so a build that succeeded without them published somewhere else; for OCI, the
/// builder's result line in its termination message.
async fn completed_build(
    ctx: &Context,
    ns: &str,
    name: &str,
    job: &Job,
    digest: &Digest,
    storage: Storage,
) -> Result<Build, StepError> {
    let job_name = job.name_any();
    let failed = |message: String| Build::Failed {
        reason: "BuildFailed",
        message,
    };
    Ok(match storage {
        Storage::ConfigMap => failed(format!(
            "build Job {job_name} succeeded but no complete set of module ConfigMaps labelled {}={},{}={} exists",
            labels::FUNCTION,
            name,
            labels::SOURCE_DIGEST,
            labels::digest_value(digest)
        )),
        Storage::Oci => match last_termination(ctx, ns, job)
            .await
            .doing(BUILT, || format!("reading the pods of the build Job {job_name}"))?
            .and_then(|t| t.message)
            .filter(|m| !m.trim().is_empty())
        {
            Some(message) => module_from_result(&message, digest).map_or_else(failed, Build::Done),
            None => failed(format!("build Job {job_name} succeeded but left no result")),
        },
    })
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

/// The module an OCI build published, from the last JSON line of its termination message.
fn module_from_result(message: &str, source_digest: &Digest) -> Result<Module, String> {
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
    Ok(Module {
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
    })
}

/// How the build in the Job's newest pod ended: the first of its steps (the compile step,
/// then the publish step: init containers, then containers) that failed, else the last one,
/// whose termination message is the result line. Its reason (`OOMKilled`, `Error`, …) and
/// message (the compiler's output on failure, the result line on success) are that step's;
/// its start is the first step's, so that the wait before it is the pod's and not the build's.
/// Only the Job's own pods count: anyone who may create pods could label one with the Job's
/// name, and its termination message would be taken for the build's result.
async fn last_termination(ctx: &Context, ns: &str, job: &Job) -> Result<Option<ContainerStateTerminated>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={}", job.name_any())))
        .await?;
    let uid = job.uid().unwrap_or_default();
    // The newest pod is the build's last attempt.
    let mut pods: Vec<Pod> = list
        .items
        .into_iter()
        .filter(|pod| super::apply::owned_by(&pod.metadata, &uid))
        .collect();
    pods.sort_by_key(|pod| std::cmp::Reverse(pod.metadata.creation_timestamp.clone().map(|t| t.0)));
    Ok(pods.iter().find_map(|pod| build_ended(pod.status.as_ref()?)))
}

/// [`last_termination`] of one pod: none until a step failed or the last one ended.
fn build_ended(status: &k8s_openapi::api::core::v1::PodStatus) -> Option<ContainerStateTerminated> {
    let steps: Vec<ContainerStateTerminated> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|status| {
            status
                .state
                .as_ref()
                .and_then(|s| s.terminated.clone())
                .or_else(|| status.last_state.as_ref().and_then(|s| s.terminated.clone()))
        })
        .collect();
    let first_start = steps
        .iter()
        .filter_map(|step| step.started_at.clone())
        .min_by_key(|t| t.0);
    let last_step_ended = status
        .container_statuses
        .iter()
        .flatten()
        .all(|status| status.state.as_ref().is_some_and(|s| s.terminated.is_some()));
    let ended = match steps.iter().find(|step| step.exit_code != 0) {
        Some(failed) => failed.clone(),
        None if last_step_ended => steps.last()?.clone(),
        None => return None,
    };
    Some(ContainerStateTerminated {
        started_at: first_start.or(ended.started_at.clone()),
        ..ended
    })
}

async fn ensure_builder_rbac(ctx: &Context, ns: &str) -> Result<(), Error> {
    use super::apply::apply_if_changed;
    let (account, role, binding) = objects::builder_rbac(ns);
    apply_if_changed(&Api::<ServiceAccount>::namespaced(ctx.client.clone(), ns), &account).await?;
    apply_if_changed(&Api::<Role>::namespaced(ctx.client.clone(), ns), &role).await?;
    apply_if_changed(&Api::<RoleBinding>::namespaced(ctx.client.clone(), ns), &binding).await?;
    Ok(())
}

/// What the build of `digest` took, phase by phase, for the `Built` condition and its
/// Event: the wait from the Job's creation to the builder's start (the Kubernetes
/// timestamps, whole seconds), then the builder's own phases and cache answers from its
/// result line. None when the Job or its result is gone (an operator that found the module
/// already built). The apply's trace gets the same, as spans.
pub(super) async fn build_report(ctx: &Context, func: &Function, digest: &Digest) -> Option<String> {
    let (name, ns) = (func.name_any(), func.namespace().unwrap_or_default());
    let job_name = objects::job_name(&name, digest);
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), &ns);
    let job = super::apply::get_owned(&jobs, &job_name, func).await.ok().flatten()?;
    let terminated = last_termination(ctx, &ns, &job).await.ok().flatten()?;
    ctx.traces.build_ended(func, &job, &terminated);
    let waited = match (&job.metadata.creation_timestamp, &terminated.started_at) {
        (Some(created), Some(started)) => Some((started.0.as_second() - created.0.as_second()).max(0)),
        _ => None,
    };
    describe_result(terminated.message.as_deref()?, waited)
}

/// The builder's phases (`"phases"`) and cache answers (`"cache"`) in words; `waited` is
/// the Job's scheduling and start, in seconds.
pub fn describe_result(message: &str, waited: Option<i64>) -> Option<String> {
    let line = message.lines().rev().find(|l| l.trim_start().starts_with('{'))?;
    let result: serde_json::Value = serde_json::from_str(line).ok()?;
    let phases = result.get("phases")?;
    let seconds = |key: &str| phases.get(key).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let cache = |key: &str| {
        result
            .pointer(&format!("/cache/{key}"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("none")
            .to_string()
    };
    let mut text = String::from("build phases:");
    if let Some(waited) = waited {
        text.push_str(&format!(" Job created → builder started {waited} s,"));
    }
    text.push_str(&format!(
        " check {:.2} s, compile {:.2} s, snapshot {:.2} s, precompile {:.2} s, publish {:.2} s (builder total {:.2} s); module cache {}, code cache {}",
        seconds("check"),
        seconds("compile"),
        seconds("snapshot"),
        seconds("precompile"),
        seconds("publish"),
        seconds("total"),
        cache("module"),
        cache("code"),
    ));
    if let Some(problems) = result.pointer("/cache/problems").and_then(serde_json::Value::as_array) {
        let problems: Vec<&str> = problems.iter().filter_map(serde_json::Value::as_str).collect();
        text.push_str(&format!(" ({})", problems.join("; ")));
    }
    Some(text)
}
