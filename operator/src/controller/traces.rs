//! The operator's traces (`--otlp-endpoint`): one trace per apply, so that "why did my
//! apply take 30 s" is one picture. An apply is a generation of a Function: its trace
//! starts at the first reconcile that sees the generation and ends at the one that finds
//! it `Ready` or `Failed`. Each reconcile on the way is a span of it, with a span per step,
//! and the build Job is one too: the wait for its pod, then the builder's own phases,
//! placed at the times they ran. Reconciles of a Function whose apply has ended (resyncs,
//! a pod that moved) are traces of their own.

use crate::crd::{Function, Phase};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ContainerStateTerminated;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use opentelemetry::trace::{FutureExt as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context as TraceContext, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// The applies being traced; nothing when tracing is off.
#[derive(Default)]
pub struct ApplyTraces {
    tracer: Option<SdkTracer>,
    applies: Mutex<HashMap<ObjectRef<Function>, Apply>>,
}

/// One generation of a Function.
struct Apply {
    generation: i64,
    /// The apply's root span (none for a generation applied before this process saw it).
    root: Option<TraceContext>,
    /// Until the generation is `Ready` or `Failed`: reconciles are the apply's.
    open: bool,
    /// When a reconcile first found the build running (the operator had just created the
    /// Job): more precise than the Job's whole-second creation time.
    build_started: Option<SystemTime>,
    build_traced: bool,
    /// The phase the last status write gave the generation.
    phase: Option<Phase>,
}

/// The builder's phases, in the order they run, as its result line names them.
const BUILDER_PHASES: [&str; 5] = ["check", "compile", "snapshot", "precompile", "publish"];

impl ApplyTraces {
    pub fn new(tracer: SdkTracer) -> Self {
        Self {
            tracer: Some(tracer),
            applies: Mutex::default(),
        }
    }

    /// Starts the span of a reconcile of `func`: in its apply's trace while the apply is
    /// under way (a new generation starts one), else a trace of its own.
    pub(super) fn reconcile(&self, func: &Function) -> Option<TraceContext> {
        let tracer = self.tracer.as_ref()?;
        let generation = func.metadata.generation.unwrap_or_default();
        let mut applies = self.applies.lock().expect("applies");
        let apply = applies
            .entry(ObjectRef::from_obj(func))
            .or_insert_with(|| Apply::start(tracer, func));
        if apply.generation != generation {
            apply.end("a newer generation was applied before this one was Ready");
            *apply = Apply::start(tracer, func);
        }
        let parent = apply.root.clone().filter(|_| apply.open).unwrap_or_default();
        let span = tracer
            .span_builder("reconcile")
            .with_kind(SpanKind::Internal)
            .with_attributes(function_attributes(func))
            .start_with_context(tracer, &parent);
        Some(parent.with_span(span))
    }

    /// Runs a step of the reconcile in a span of its own, a child of the reconcile's.
    pub(super) async fn step<T>(&self, name: &'static str, step: impl Future<Output = T>) -> T {
        // On the heap: the steps' futures are large, and a reconcile holds several.
        let step = Box::pin(step);
        let parent = TraceContext::current();
        let Some(tracer) = self.tracer.as_ref().filter(|_| parent.has_active_span()) else {
            return step.await;
        };
        let span = tracer.start_with_context(name, &parent);
        let context = parent.with_span(span);
        let output = step.with_context(context.clone()).await;
        context.span().end();
        output
    }

    /// The reconcile's build found the Job running: the first time, the operator has just
    /// created it.
    pub(super) fn build_running(&self, func: &Function) {
        self.with_apply(func, |apply| {
            apply.build_started.get_or_insert_with(SystemTime::now);
        });
    }

    /// What the status write said of the generation.
    pub(super) fn phase(&self, func: &Function, phase: Option<Phase>) {
        self.with_apply(func, |apply| apply.phase = phase);
    }

    /// Ends the reconcile's span (in error with what failed), and the apply's once its
    /// generation is `Ready` or `Failed`.
    pub(super) fn reconciled(&self, func: &Function, reconcile: Option<TraceContext>, failure: Option<String>) {
        let Some(reconcile) = reconcile else {
            return;
        };
        if let Some(failure) = &failure {
            reconcile.span().set_status(Status::error(failure.clone()));
        }
        reconcile.span().end();
        self.with_apply(func, |apply| {
            let Some(phase) = apply
                .phase
                .filter(|phase| matches!(phase, Phase::Ready | Phase::Failed))
            else {
                return;
            };
            let Some(root) = apply.root.as_ref().filter(|_| apply.open) else {
                return;
            };
            apply.open = false;
            let span = root.span();
            span.set_attribute(KeyValue::new("wasmless.phase", phase.as_str()));
            if phase == Phase::Failed {
                span.set_status(Status::error(
                    failure.unwrap_or_else(|| "the Function is Failed".into()),
                ));
            }
            span.end();
            tracing::info!(
                function = %func.name_any(),
                namespace = %func.namespace().unwrap_or_default(),
                generation = apply.generation,
                trace_id = %span.span_context().trace_id(),
                phase = phase.as_str(),
                "apply traced"
            );
        });
    }

    /// The build Job of the apply ended: its span, with the wait for the build pod and the
    /// builder's phases (from its result line) as children. Once per apply, and also when
    /// the apply is already Ready: the pods can serve the published module before the Job
    /// is seen complete.
    pub(super) fn build_ended(&self, func: &Function, job: &Job, terminated: &ContainerStateTerminated) {
        let Some(tracer) = self.tracer.as_ref() else {
            return;
        };
        self.with_apply(func, |apply| {
            let Some(root) = apply.root.as_ref().filter(|_| !apply.build_traced) else {
                return;
            };
            apply.build_traced = true;
            let result = terminated
                .message
                .as_deref()
                .and_then(|message| message.lines().rev().find(|l| l.trim_start().starts_with('{')))
                .and_then(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .unwrap_or_default();
            let phases = &result["phases"];
            let seconds = |key: &str| Duration::from_secs_f64(phases[key].as_f64().unwrap_or(0.0).max(0.0));
            let job_created = job.metadata.creation_timestamp.as_ref().map(|t| system_time(t.0));
            let Some(created) = apply.build_started.or(job_created) else {
                return;
            };
            let builder_started = phases["startedUnixMs"]
                .as_u64()
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
                .or_else(|| terminated.started_at.as_ref().map(|t| system_time(t.0)))
                .unwrap_or(created)
                .max(created);
            let ended = builder_started + seconds("total");
            let build = tracer
                .span_builder("build")
                .with_start_time(created)
                .with_attributes([
                    KeyValue::new("k8s.job.name", job.name_any()),
                    KeyValue::new("wasmless.build.module_cache", cache_answer(&result, "module")),
                    KeyValue::new("wasmless.build.code_cache", cache_answer(&result, "code")),
                ])
                .start_with_context(tracer, root);
            let build = root.with_span(build);
            let child = |name: &'static str, from: SystemTime, to: SystemTime| {
                let mut span = tracer
                    .span_builder(name)
                    .with_start_time(from)
                    .start_with_context(tracer, &build);
                opentelemetry::trace::Span::end_with_timestamp(&mut span, to);
            };
            child("start build pod", created, builder_started);
            let mut at = builder_started;
            for phase in BUILDER_PHASES {
                let took = seconds(phase);
                if !took.is_zero() {
                    child(phase, at, at + took);
                    at += took;
                }
            }
            build.span().end_with_timestamp(ended.max(at));
        });
    }

    fn with_apply(&self, func: &Function, change: impl FnOnce(&mut Apply)) {
        if self.tracer.is_none() {
            return;
        }
        let mut applies = self.applies.lock().expect("applies");
        if let Some(apply) = applies
            .get_mut(&ObjectRef::from_obj(func))
            .filter(|apply| Some(apply.generation) == func.metadata.generation)
        {
            change(apply);
        }
    }

    /// Forgets a deleted Function.
    pub(super) fn forget(&self, func: &Function) {
        if let Some(mut apply) = self.applies.lock().expect("applies").remove(&ObjectRef::from_obj(func)) {
            apply.end("the Function was deleted before it was Ready");
        }
    }
}

impl Apply {
    /// A generation seen for the first time. One that status already says was applied (an
    /// operator that restarted) has no apply left to trace.
    fn start(tracer: &SdkTracer, func: &Function) -> Self {
        let generation = func.metadata.generation.unwrap_or_default();
        let status = func.status.as_ref();
        let applied = status.is_some_and(|status| {
            status.observed_generation == Some(generation) && matches!(status.phase, Some(Phase::Ready | Phase::Failed))
        });
        let root = (!applied).then(|| {
            let span = tracer
                .span_builder("apply")
                .with_kind(SpanKind::Internal)
                .with_attributes(function_attributes(func))
                .start(tracer);
            TraceContext::new().with_span(span)
        });
        Self {
            generation,
            open: root.is_some(),
            root,
            build_started: None,
            build_traced: false,
            phase: None,
        }
    }

    /// Ends an apply that will not reach `Ready` or `Failed`, in error for `why`.
    fn end(&mut self, why: &'static str) {
        if let Some(root) = self.root.as_ref().filter(|_| self.open) {
            root.span().set_status(Status::error(why));
            root.span().end();
        }
        self.open = false;
    }
}

fn function_attributes(func: &Function) -> Vec<KeyValue> {
    vec![
        KeyValue::new("faas.name", func.name_any()),
        KeyValue::new("k8s.namespace.name", func.namespace().unwrap_or_default()),
        KeyValue::new("wasmless.generation", func.metadata.generation.unwrap_or_default()),
    ]
}

fn cache_answer(result: &serde_json::Value, part: &str) -> String {
    result["cache"][part].as_str().unwrap_or("none").to_string()
}

fn system_time(at: k8s_openapi::jiff::Timestamp) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(at.as_millisecond().max(0) as u64)
}
