//! `status`: the phase, conditions, revisions and the traffic that serves.

use super::*;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    Building,
    Ready,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Building => "Building",
            Phase::Ready => "Ready",
            Phase::Failed => "Failed",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FunctionStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// `Built` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// sha256 over language, builder version, source and files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_digest: Option<String>,
    /// sha256 of the `.wasm` bytes being served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_digest: Option<String>,
    /// The first 10 hex digits of `moduleDigest` (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_digest_short: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_size: Option<i64>,
    /// Where the module being served is stored (`oci://...` for OCI storage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_ref: Option<String>,
    /// sha256 of the compiled code served with the module (the stored, compressed artifact),
    /// when the build made one: new pods load it instead of compiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Compiler output of the last failed build (at most 4 KiB), or why the spec is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The runtime pods that exist (ready or not), for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Where requests to the Function's Service go: `pods` (its own) or `pool` (the
    /// namespace's shared pool, while a Function with `scale.min: 0` has no ready pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<ServedBy>,
    /// When `servedBy` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by_since: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The pool's port for this Function, while it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_port: Option<i32>,
    /// The label selector of the runtime pods, in its string form, for the scale
    /// subresource: a HorizontalPodAutoscaler reads the pods' metrics through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The revisions kept (`spec.revisionHistoryLimit`), newest first: every successful
    /// build is one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<Revision>,
    /// The newest revision that served with every pod ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_ready_revision: Option<String>,
    /// The revisions serving and their shares, as `spec.traffic` resolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficStatus>,
    /// `traffic` in one line for `kubectl get -o wide`: `hello-1 90%, hello-2 10% (canary)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<String>,
    /// Each of `spec.triggers` as the broker says it, written by `wasmless-events` (never
    /// by the operator, which reads the lag for the autoscaler).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub triggers: Vec<TriggerStatus>,
    /// `triggers` in one line for `kubectl get`: `orders lag 120 dead 2, tick lag 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggers_summary: Option<String>,
}

impl FunctionStatus {
    /// What the operator writes: all but the fields `wasmless-events` owns, which a
    /// server-side apply by the operator would otherwise take over and set back to what it
    /// last read.
    pub fn operators_part(&self) -> FunctionStatus {
        FunctionStatus {
            triggers: Vec::new(),
            triggers_summary: None,
            ..self.clone()
        }
    }
}

/// A trigger's progress, as `wasmless-events` last read it from the broker.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TriggerStatus {
    pub name: String,
    /// Events not yet handled: waiting in the broker, and handed out but not answered.
    #[serde(default)]
    pub lag: i64,
    /// When an event was last handed to the Function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fired: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Events parked on the trigger's dead-letter subject, there now.
    #[serde(default)]
    pub dead_letters: i64,
    /// When `lag` was read: the autoscaler takes no lag older than a minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// A revision that serves, and its share of the requests.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficStatus {
    pub revision: String,
    pub percent: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// A successful build of a Function: what it serves, by digest.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    /// `<function>-<n>`, numbered from 1 in the order the builds succeeded.
    pub name: String,
    /// The source it was built from (see `status.sourceDigest`).
    pub source_digest: String,
    /// sha256 of its `.wasm` bytes.
    pub module_digest: String,
    /// sha256 of its compiled code, when the build made some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_digest: Option<String>,
    /// Where its module is stored (`oci://...` for OCI storage, else its chunk ConfigMaps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_ref: Option<String>,
    /// When the build's module was first seen.
    pub created: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// Where a Function's Service sends requests.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServedBy {
    Pods,
    Pool,
}
