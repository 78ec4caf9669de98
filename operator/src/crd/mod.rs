//! The `Function` custom resource (wasmless.io/v1alpha1), as docs/operator.md describes it.
//!
//! The schema is generated from these types by `crdgen` into `crds/function.yaml`.
//! What the API server can check (enums, bounds, exclusivity, size) is in the schema and
//! its CEL rules; what it cannot (a Goless `package main`, a source of only whitespace) is
//! checked by [`FunctionSpec::problems`] and reported on status.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod env;
mod limits;
mod outbound;
mod problems;
mod reference;
mod status;
mod triggers;

pub use env::*;
pub use limits::*;
pub use outbound::*;
pub use reference::reference_markdown;
pub use status::*;
pub use triggers::*;

/// Longest Function name: `<name>-build-<10 hex>` names a Job, whose pods carry it as a
/// label value (at most 63 characters).
pub const MAX_NAME_LEN: usize = 46;

/// The one DNS label a Function cannot be named: its Deployment would be the pool's.
pub const RESERVED_NAME: &str = "wasmless-pool";

/// Whether `name` can name a Function: a DNS-1035 label (it is the default Service name)
/// of at most [`MAX_NAME_LEN`] characters.
pub fn name_problem(name: &str) -> Option<String> {
    let dns_label = name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if name == RESERVED_NAME {
        return Some(format!(
            "name {RESERVED_NAME:?} is the namespace's shared pool's Deployment: give the Function another name"
        ));
    }
    (!dns_label || name.len() > MAX_NAME_LEN).then(|| {
        format!(
            "name {name:?} must be a DNS label of at most {MAX_NAME_LEN} characters: it names the Service and the build Jobs"
        )
    })
}

/// Largest inline source accepted, in bytes (a ConfigMap holds 1 MiB, and a handler
/// bigger than this belongs in a prebuilt module).
pub const MAX_SOURCE_BYTES: usize = 512 * 1024;

/// A function: handler source (or a prebuilt module) served over HTTP by the Wasmless runtime.
///
/// `function` is a reserved word in CEL, so the rules name that field `__function__`, as
/// Kubernetes escapes it.
// One `printcolumn(...)` per column is kube's syntax, which clippy takes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "wasmless.io",
    version = "v1alpha1",
    kind = "Function",
    namespaced,
    shortname = "fn",
    status = "FunctionStatus",
    doc = "An HTTP function: handler source built once to WebAssembly and served by the Wasmless runtime",
    printcolumn(name = "Language", type_ = "string", json_path = ".spec.language"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Served", type_ = "string", json_path = ".status.servedBy"),
    printcolumn(name = "Digest", type_ = "string", json_path = ".status.moduleDigestShort"),
    printcolumn(name = "URL", type_ = "string", json_path = ".status.url"),
    printcolumn(name = "Triggers", type_ = "string", json_path = ".status.triggersSummary"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Revision", type_ = "string", json_path = ".status.latestReadyRevision", priority = 1),
    printcolumn(name = "Serving", type_ = "string", json_path = ".status.serving", priority = 1),
    // `kubectl scale fn/hello` and a HorizontalPodAutoscaler write spec.replicas through
    // this; the HPA finds the pods to measure by status.selector.
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 46")
        .message("a Function's name must be a DNS label of at most 46 characters: it names the Service and the build Jobs (<name>-build-<10 hex>, at most 63)"),
    validation = Rule::new("self.metadata.name != 'wasmless-pool'")
        .message("wasmless-pool is the name of the namespace's shared pool: give the Function another name")
)]
#[x_kube(validation = Rule::new(
    "(has(self.source) ? 1 : 0) + (has(self.__function__) ? 1 : 0) + (has(self.module) ? 1 : 0) == 1"
).message("exactly one of source, function (the Goless field) or module must be set"))]
#[x_kube(validation = Rule::new("!has(self.source) || size(self.source) <= 524288").message("source is over 512 KiB"))]
#[x_kube(validation = Rule::new("!has(self.__function__) || size(self.__function__) <= 524288").message("function is over 512 KiB"))]
#[x_kube(validation = Rule::new("!has(self.files) || size(self.files) == 0 || has(self.source) || has(self.__function__)")
    .message("files go beside an inline source (source or function), not a prebuilt module"))]
#[x_kube(validation = Rule::new("!has(self.module) || self.language == 'wasm'")
    .message("module is a prebuilt WebAssembly image: set language: wasm"))]
#[x_kube(validation = Rule::new("!has(self.triggers) || self.triggers.all(t, self.triggers.exists_one(u, u.name == t.name))")
    .message("each of triggers[] needs a name of its own"))]
#[x_kube(validation = Rule::new("self.language != 'wasm' || has(self.module)")
    .message("language wasm takes a prebuilt module (spec.module), not inline source"))]
#[serde(rename_all = "camelCase")]
pub struct FunctionSpec {
    /// Language of the handler source.
    #[serde(default)]
    pub language: Language,

    /// Inline handler source (Go: `package handlers` with `func Handler(w, r)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 524288))]
    pub source: Option<String>,

    /// Inline handler source under Goless's field name; the same as `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 524288))]
    pub function: Option<String>,

    /// More files of the source, by their path from the handler's folder: Go's `go.mod` and
    /// `go.sum` (the handler is then built as that module, its dependencies through the
    /// operator's module proxy and checked against `go.sum`), more `.go` files of `package
    /// handlers`; for Rust, more `.rs` files, and `Cargo.toml` (its dependencies built
    /// through the operator's crates registry) with, optionally, the `Cargo.lock` the build
    /// is then held to. A Go handler also ships any other file, in folders or not
    /// (`countries.csv`, `templates/index.html`): written beside its source, so
    /// `//go:embed templates/*.html` finds them, and packed into the module, so the handler
    /// reads them at run time in its working directory (`os.ReadFile("countries.csv")`),
    /// read-only. A name is letters, digits, `.`, `_`, `-` and `/` between folders: no `..`,
    /// no leading `/`, no empty or hidden segment. `source` with every file is at most
    /// 512 KiB, at most 64 files, text only; a change to any file builds again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64), extend("additionalProperties" = {"type": "string", "maxLength": 524288}))]
    pub files: BTreeMap<String, String>,

    /// A prebuilt module in an OCI registry (language: wasm); nothing is built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<ModuleImage>,

    /// Name of the Service (Goless field); defaults to the Function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub service: Option<String>,

    /// Port of the Service (Goless field).
    #[serde(default = "default_server_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub server_port: i32,

    /// Runtime pods; 0 pauses the function. With `scale`, the pods follow `scale` instead.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// Scaling on demand: `min: 0` serves the Function from its namespace's shared pool
    /// while it has no pods of its own, so an idle Function costs no pod and still answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,

    /// The handler's WASI environment: literal values, and keys of Secrets and ConfigMaps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub env: Vec<EnvVar>,

    /// Whole Secrets and ConfigMaps in the handler's environment; `env` wins over these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub env_from: Vec<EnvFromSource>,

    /// The HTTP calls the handler may make; absent, it may make none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound: Option<Outbound>,

    /// Per-request limits enforced by the runtime.
    #[serde(default)]
    pub limits: Limits,

    /// The runtime container's resource requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Where the built module is stored; defaults to the operator's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,

    /// Revisions kept (every successful build is one, listed on status): their modules and
    /// compiled code stay stored, so traffic can go back to one without a build. Older
    /// revisions are deleted with their objects.
    #[serde(default = "default_revision_history_limit")]
    #[schemars(range(min = 1, max = 100))]
    pub revision_history_limit: i32,

    /// Which revisions serve, and each one's share of the requests (the percents add up to
    /// 100): absent, the latest build. `[{revision: hello-2, percent: 100}]` rolls back to
    /// a kept revision without a build; `[{revision: hello-1, percent: 90},
    /// {latestRevision: true, percent: 10, tag: canary}]` sends a tenth to the latest build,
    /// and every request with `Wasmless-Tag: canary` to it too. The split is made in the
    /// Function's pods, which hold every revision named here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub traffic: Vec<TrafficTarget>,

    /// Events the Function is called on besides HTTP requests, each as a `POST` in the
    /// CloudEvents binary mode (`ce-id`, `ce-source`, `ce-type`, the payload as the body):
    /// the handler stays an HTTP handler. Delivered by the events component
    /// (`wasmless-events`), to the Function's Service, so a Function at `scale.min: 0` is
    /// answered by its namespace's pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub triggers: Vec<Trigger>,

    /// How the triggers' events are delivered: tries, delays, and dead letters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
}

/// A share of a Function's requests and the revision that serves it, in the shape
/// Knative's `traffic` has.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.revision) != (has(self.latestRevision) && self.latestRevision)")
    .message("a traffic target names a revision or sets latestRevision: true (one of the two)"))]
pub struct TrafficTarget {
    /// A revision on `status.revisions` (`<function>-<n>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 80))]
    pub revision: Option<String>,
    /// The latest build, whichever it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_revision: Option<bool>,
    #[schemars(range(min = 0, max = 100))]
    pub percent: i32,
    /// Requests with the header `Wasmless-Tag: <tag>` go to this revision, whatever its
    /// share (0 included): a new revision can be tried before it takes traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub tag: Option<String>,
}

fn default_server_port() -> i32 {
    8080
}

fn default_replicas() -> i32 {
    1
}

fn default_revision_history_limit() -> i32 {
    5
}

/// How many pods of its own a Function runs, and when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max").message("scale.min must not be above scale.max"))]
pub struct Scale {
    /// Fewest pods of its own. 0: none while idle, the namespace's pool serves it.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub min: i32,
    /// Most pods of its own.
    #[serde(default = "default_scale_max")]
    #[schemars(range(min = 1, max = 1000))]
    pub max: i32,
    /// Requests in flight per pod that the scaler aims for: more, and pods are added.
    #[serde(default = "default_target_concurrency")]
    #[schemars(range(min = 1, max = 10000))]
    pub target_concurrency: i32,
    /// How long a Function with pods of its own has under half `targetConcurrency` in
    /// flight before it is back to `min` (and, at 0, served by the pool again).
    #[serde(default = "default_idle_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub idle_timeout: String,
}

fn default_scale_max() -> i32 {
    10
}
fn default_target_concurrency() -> i32 {
    10
}
fn default_idle_timeout() -> String {
    "60s".into()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    #[default]
    Go,
    Rust,
    Wat,
    Wasm,
    /// A language this operator does not know. The CRD's enum refuses it; this variant
    /// exists so that a Function admitted by an older CRD is reported on its status
    /// instead of failing to deserialize (which would stall the watch of every Function).
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Go => "go",
            Language::Rust => "rust",
            Language::Wat => "wat",
            Language::Wasm => "wasm",
            Language::Unknown => "unknown",
        }
    }

    /// File name the source is mounted as in the build Job, so the compiler sees the
    /// extension it expects.
    pub fn source_file_name(self) -> &'static str {
        match self {
            Language::Go => "handler.go",
            Language::Rust => "lib.rs",
            Language::Wat => "module.wat",
            Language::Wasm | Language::Unknown => "module.wasm",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Storage {
    /// zstd chunks in ConfigMaps `<fn>-module-<10 hex>-<i>`: needs nothing else.
    #[serde(rename = "configMap")]
    ConfigMap,
    /// A Wasm OCI artifact in the operator's registry.
    #[serde(rename = "oci")]
    Oci,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ModuleImage {
    /// The Wasm OCI artifact: `registry/repo@sha256:<manifest digest>`, or `registry/repo`
    /// to pull the layer by `digest` (a bare tag is refused by the runtime).
    #[schemars(
        length(min = 1, max = 1024),
        regex(pattern = r"^[^\s:@]+(:[0-9]+)?(/[^\s:@]+)*(@sha256:[0-9a-f]{64})?$")
    )]
    pub image: String,
    /// sha256 of the `.wasm` bytes, which the runtime verifies before serving.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub digest: String,
}

/// A DNS subdomain: the name of a Secret or a ConfigMap.
const OBJECT_NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A key of a Secret's or a ConfigMap's data.
const DATA_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";
/// A name the handler's environment can hold, and a prefix of one.
const ENV_NAME_PATTERN: &str = r"^[A-Za-z_][A-Za-z0-9_]*$";
/// A Kubernetes binary quantity such as `64Mi`, as the runtime's flags read it.
const QUANTITY_PATTERN: &str = r"^[0-9]+(Ki|Mi|Gi)?$";
/// A duration such as `10s`, `500ms` or `2m`.
const DURATION_PATTERN: &str = r"^[0-9]+(ms|s|m)$";
