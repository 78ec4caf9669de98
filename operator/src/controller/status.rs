//! Step 5 of the reconcile: the Function's status (`Built`, `Ready`, phase, digests, URL)
//! and an Event for each condition that changed; and a failed step reported on its condition.

use super::build::Build;
use super::pool::PoolState;
use super::revisions;
use super::{Context, Doing, Served, StepError};
use crate::Error;
use crate::crd::{Function, FunctionStatus, Phase, ServedBy};
use crate::metrics::BuildOutcome;
use crate::module::Module;
use crate::objects::{self, MANAGER, POOL_NAME, Route};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use wasmless_artifact::Digest;

pub const CONDITION_BUILT: &str = "Built";
pub const CONDITION_READY: &str = "Ready";
/// The reason of a condition whose step failed on an API error (retried with backoff).
pub const REASON_RECONCILE_ERROR: &str = "ReconcileError";
/// The Ready condition's reason while a Secret or ConfigMap the pods need does not exist.
pub const REASON_REFERENCE_NOT_FOUND: &str = "ReferenceNotFound";
/// The reason of a condition whose step found an object of its name that the Function
/// does not own (a Service, a Deployment, a ConfigMap or a Job someone else made).
pub const REASON_NOT_OWNER: &str = "NotOwner";
/// The Ready condition's reason while the namespace's pool serves the Function.
pub const REASON_SERVED_BY_POOL: &str = "ServedByPool";
/// Longest Event note the API server accepts, in bytes.
pub const MAX_EVENT_NOTE_BYTES: usize = 1024;

/// Writes the status this reconcile arrived at, with its Events, and counts a build that
/// ended; the status written.
pub(super) async fn update(
    ctx: &Context,
    func: &Function,
    build: &Build,
    source_digest: Option<Digest>,
    served: &Served,
    missing: Option<&str>,
) -> Result<FunctionStatus, StepError> {
    let (name, ns) = (func.name_any(), func.namespace().unwrap_or_default());
    let mut status = status_for(func, build, source_digest, served, missing);
    // What the operator wrote last: `wasmless-events`' fields are not its to compare.
    let old = func.status.clone().unwrap_or_default().operators_part();
    status.revisions = match build {
        Build::Done(module) => revisions::record(func, &old.revisions, module, Time(Timestamp::now())),
        _ => revisions::keep(func, &old.revisions),
    };
    // Of a split, the newest revision it serves.
    let position = |module: &&crate::module::Module| {
        revisions::serving(&status.revisions, module)
            .and_then(|revision| status.revisions.iter().position(|r| r.name == revision.name))
            .unwrap_or(usize::MAX)
    };
    let newest_served = served.shares.iter().map(|share| &share.module).min_by_key(position);
    let ready_with = newest_served
        .or(served.module.as_ref())
        .filter(|_| status.phase == Some(Phase::Ready));
    status.latest_ready_revision =
        revisions::latest_ready(&status.revisions, old.latest_ready_revision.as_deref(), ready_with);
    status.traffic = match served.shares.as_slice() {
        [] => revisions::traffic(&status.revisions, served.module.as_ref()),
        shares => revisions::split_traffic(shares),
    };
    status.serving = match served.shares.as_slice() {
        [] => status.traffic.first().map(|traffic| traffic.revision.clone()),
        shares => Some(crate::objects::traffic_summary(shares)),
    };
    status.served_by_since = match status.served_by {
        None => None,
        same if same == old.served_by => old.served_by_since.clone(),
        Some(_) => Some(Time(Timestamp::now())),
    };
    if let (Build::Done(_), Some(digest)) = (build, source_digest)
        && func.spec.module.is_none()
    {
        add_build_report(ctx, func, &digest, &old, &mut status).await;
    }
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
        let uid = func.uid().unwrap_or_default();
        let build = status.source_digest.clone().unwrap_or_default();
        ctx.metrics.build_ended(&uid, &build, &name, &ns, result);
    }
    Ok(status)
}

/// Adds where the build's time went to the `Built` condition's message, and publishes it
/// as an Event `BuildPhases` of its own. The chunks can be seen before the builder's pod
/// has ended (it publishes, then exits): then the `Built` Event goes out without them, and
/// a later reconcile (the Job's completion wakes one) adds them. Not only in the `Built`
/// Event: a reconcile that reads a status older than the last one written sees the
/// transition again, and the recorder folds a repeated Event into the first one's series,
/// with the first one's note (which had no phases). Once read, later reconciles keep them.
async fn add_build_report(
    ctx: &Context,
    func: &Function,
    digest: &Digest,
    old: &FunctionStatus,
    status: &mut FunctionStatus,
) {
    let Some(built) = status.conditions.iter_mut().find(|c| c.type_ == CONDITION_BUILT) else {
        return;
    };
    let before = old.conditions.iter().find(|c| c.type_ == CONDITION_BUILT);
    let same_build = before.is_some_and(|b| b.reason == built.reason) && old.source_digest == status.source_digest;
    if let Some(before) = before.filter(|_| same_build)
        && before.message.starts_with(&built.message)
        && before.message != built.message
    {
        built.message = before.message.clone();
        return;
    }
    let name = func.name_any();
    let Some(report) = super::build::build_report(ctx, func, digest).await else {
        return;
    };
    built.message = format!("{}; {report}", built.message);
    let event = Event {
        type_: EventType::Normal,
        reason: "BuildPhases".into(),
        note: Some(event_note(&report)),
        action: CONDITION_BUILT.into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &func.object_ref(&())).await {
        tracing::warn!(function = %name, %error, "could not publish event");
    }
}

async fn write_status(ctx: &Context, func: &Function, status: &FunctionStatus) -> Result<(), Error> {
    let functions: Api<Function> = Api::namespaced(ctx.client.clone(), &func.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "status": status.operators_part(),
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

/// Puts a failed step on the condition it belongs to, reason `ReconcileError`, with a
/// Warning Event; the rest of the status stays as the last write left it.
pub(super) async fn report_failure(ctx: &Context, func: &Function, failed: &StepError) {
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
    let reason = match &failed.error {
        Error::NotOwner { .. } => REASON_NOT_OWNER,
        _ => REASON_RECONCILE_ERROR,
    };
    let failed_condition = condition(kind, false, reason, message, func.metadata.generation);
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
    served: &Served,
    missing: Option<&str>,
) -> FunctionStatus {
    let (serving, deployment) = (served.module.as_ref(), served.deployment.as_ref());
    let generation = func.metadata.generation;
    let (built, phase_of_build, build_message) = built_condition(build, generation);
    let replicas = served.replicas;
    let pooled = served.pool.is_some();
    let deploy_status = deployment.and_then(|d| d.status.clone()).unwrap_or_default();
    let ready = match (missing, &served.traffic_problem) {
        (Some(message), _) => condition(
            CONDITION_READY,
            false,
            REASON_REFERENCE_NOT_FOUND,
            message.into(),
            generation,
        ),
        (None, Some(problem)) => condition(
            CONDITION_READY,
            false,
            problem.reason,
            problem.message.clone(),
            generation,
        ),
        (None, None) => match (&served.route, &served.pool) {
            (Some(Route::Pool { port }), Some((_, state))) => pool_ready_condition(*port, replicas, state, generation),
            _ => ready_condition(func, replicas, serving, deployment),
        },
    };
    let mut ready = ready;
    if let Some(reason) = &served.not_pooled {
        ready.message = format!("{}; scale.min 0 is not honoured: {reason}", ready.message);
    }
    let paused = replicas == 0 && !pooled && missing.is_none();
    let phase = phase_of_build.unwrap_or(if ready.status == "True" || paused {
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
        url: serving.map(|_| objects::url(func)),
        build_message,
        ready_replicas: deploy_status.ready_replicas.or(serving.map(|_| 0)),
        replicas: deploy_status.replicas.or(serving.map(|_| 0)),
        served_by: served.route.map(|route| match route {
            Route::Pods => ServedBy::Pods,
            Route::Pool { .. } => ServedBy::Pool,
        }),
        served_by_since: None,
        pool_port: served.entry_port.map(i32::from),
        selector: Some(objects::runtime_selector(func)),
        revisions: Vec::new(),
        latest_ready_revision: None,
        traffic: Vec::new(),
        serving: None,
        triggers: Vec::new(),
        triggers_summary: None,
    }
}

/// `Ready` of a Function the Service routes to the pool: true once every ready pool pod
/// listens on its port.
fn pool_ready_condition(port: u16, replicas: i32, state: &PoolState, generation: Option<i64>) -> Condition {
    let pods = match replicas {
        0 => "no pods of its own".to_string(),
        n => format!("while {n} pods of its own start or stop"),
    };
    match state {
        PoolState::Serving => condition(
            CONDITION_READY,
            true,
            REASON_SERVED_BY_POOL,
            format!("served by the namespace's pool ({POOL_NAME}, port {port}), {pods}"),
            generation,
        ),
        PoolState::NotYet(why) => condition(CONDITION_READY, false, "PoolStarting", why.clone(), generation),
    }
}

/// `Built`, the phase the build decides (none once built: then `Ready` decides), and the
/// message for `status.buildMessage`.
fn built_condition(build: &Build, generation: Option<i64>) -> (Condition, Option<Phase>, Option<String>) {
    let built = |ok, reason: &str, message| condition(CONDITION_BUILT, ok, reason, message, generation);
    match build {
        Build::Invalid(problems) => (
            built(false, "InvalidSpec", problems.clone()),
            Some(Phase::Failed),
            Some(problems.clone()),
        ),
        Build::Running { job } => (
            built(false, "Building", format!("build Job {job} is running")),
            Some(Phase::Building),
            None,
        ),
        Build::Failed { reason, message } => (
            built(false, reason, message.lines().next().unwrap_or_default().to_string()),
            Some(Phase::Failed),
            Some(message.clone()),
        ),
        Build::Done(module) => (built(true, "Built", format!("module {}", module.digest)), None, None),
    }
}

/// `Ready`: true when the Deployment has observed its generation and all `replicas` are
/// updated and available.
fn ready_condition(
    func: &Function,
    replicas: i32,
    serving: Option<&Module>,
    deployment: Option<&Deployment>,
) -> Condition {
    let generation = func.metadata.generation;
    let deploy_status = deployment.and_then(|d| d.status.clone()).unwrap_or_default();
    // As `kubectl rollout status` judges a rollout done: every pod of the new template, no
    // pod of an older one left (a surge pod counts as updated while an old pod still
    // serves), and the new ones available.
    let updated = deploy_status.updated_replicas.unwrap_or(0);
    let up_to_date = deployment.is_some_and(|d| {
        d.status.as_ref().and_then(|s| s.observed_generation) >= d.metadata.generation
            && updated >= replicas
            && deploy_status.replicas.unwrap_or(0) <= updated
    });
    let available = deploy_status.available_replicas.unwrap_or(0).min(updated);
    let ready = |ok, reason: &str, message| condition(CONDITION_READY, ok, reason, message, generation);
    if serving.is_none() {
        ready(false, "NoModule", "no module has been built yet".into())
    } else if replicas == 0 {
        ready(false, "ScaledToZero", "replicas is 0".into())
    } else if up_to_date && available >= replicas {
        ready(true, "Available", format!("{available}/{replicas} replicas available"))
    } else {
        ready(
            false,
            "RollingOut",
            format!("{available}/{replicas} replicas available"),
        )
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
            "BuildFailed"
                | "DeadlineExceeded"
                | "OOMKilled"
                | "InvalidSpec"
                | REASON_RECONCILE_ERROR
                | REASON_REFERENCE_NOT_FOUND
                | REASON_NOT_OWNER
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
