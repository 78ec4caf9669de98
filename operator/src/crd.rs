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

/// Longest Function name: `<name>-build-<10 hex>` names a Job, whose pods carry it as a
/// label value (at most 63 characters).
pub const MAX_NAME_LEN: usize = 46;

/// Whether `name` can name a Function: a DNS-1035 label (it is the default Service name)
/// of at most [`MAX_NAME_LEN`] characters.
pub fn name_problem(name: &str) -> Option<String> {
    let dns_label = name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
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
    printcolumn(name = "Digest", type_ = "string", json_path = ".status.moduleDigestShort"),
    printcolumn(name = "URL", type_ = "string", json_path = ".status.url"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    // `kubectl scale fn/hello` and a HorizontalPodAutoscaler write spec.replicas through
    // this; the HPA finds the pods to measure by status.selector.
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 46")
        .message("a Function's name must be a DNS label of at most 46 characters: it names the Service and the build Jobs (<name>-build-<10 hex>, at most 63)")
)]
#[x_kube(validation = Rule::new(
    "(has(self.source) ? 1 : 0) + (has(self.__function__) ? 1 : 0) + (has(self.module) ? 1 : 0) == 1"
).message("exactly one of source, function (the Goless field) or module must be set"))]
#[x_kube(validation = Rule::new("!has(self.source) || size(self.source) <= 524288").message("source is over 512 KiB"))]
#[x_kube(validation = Rule::new("!has(self.__function__) || size(self.__function__) <= 524288").message("function is over 512 KiB"))]
#[x_kube(validation = Rule::new("!has(self.module) || self.language == 'wasm'")
    .message("module is a prebuilt WebAssembly image: set language: wasm"))]
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

    /// Runtime pods; 0 pauses the function.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// The handler's WASI environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,

    /// Per-request limits enforced by the runtime.
    #[serde(default)]
    pub limits: Limits,

    /// The runtime container's resource requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Where the built module is stored; defaults to the operator's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,
}

fn default_server_port() -> i32 {
    8080
}

fn default_replicas() -> i32 {
    1
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

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EnvVar {
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"))]
    pub name: String,
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub value: String,
}

/// A Kubernetes binary quantity such as `64Mi`, as the runtime's flags read it.
const QUANTITY_PATTERN: &str = r"^[0-9]+(Ki|Mi|Gi)?$";
/// A duration such as `10s`, `500ms` or `2m`.
const DURATION_PATTERN: &str = r"^[0-9]+(ms|s|m)$";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Linear memory of one request's instance.
    #[serde(default = "default_memory")]
    #[schemars(regex(pattern = QUANTITY_PATTERN), length(max = 32))]
    pub memory: String,
    /// Wall time of one request (504 past it).
    #[serde(default = "default_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub timeout: String,
    /// Requests served at once by one pod (503 past it).
    #[serde(default = "default_max_concurrency")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_concurrency: i32,
    /// Largest request body (413 past it).
    #[serde(default = "default_max_request_body")]
    #[schemars(regex(pattern = QUANTITY_PATTERN), length(max = 32))]
    pub max_request_body: String,
    /// What requests share: `request` (default), a fresh instance per request, sharing
    /// nothing; `shared`, a Go handler's instances are kept and reused, one request at a
    /// time each, so globals and the heap persist between the requests one instance
    /// serves (as in Goless's one process). Go handlers only; others are per request.
    #[serde(default)]
    pub isolation: Isolation,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// A fresh instance per request.
    #[default]
    Request,
    /// Instances kept and reused, one request at a time each.
    Shared,
    /// A value this operator does not know (from a newer CRD): reported on status, as
    /// [`Language::Unknown`] is, instead of failing to deserialize.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory: default_memory(),
            timeout: default_timeout(),
            max_concurrency: default_max_concurrency(),
            max_request_body: default_max_request_body(),
            isolation: Isolation::default(),
        }
    }
}

fn default_memory() -> String {
    "64Mi".into()
}
fn default_timeout() -> String {
    "10s".into()
}
fn default_max_concurrency() -> i32 {
    64
}
fn default_max_request_body() -> String {
    "1Mi".into()
}

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
    /// sha256 over language, builder version and source.
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
    /// The label selector of the runtime pods, in its string form, for the scale
    /// subresource: a HorizontalPodAutoscaler reads the pods' metrics through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

impl FunctionSpec {
    /// The inline source, from `source` or Goless's `function`.
    pub fn inline_source(&self) -> Option<&str> {
        self.source.as_deref().or(self.function.as_deref())
    }

    /// What is wrong with this spec that the schema did not (or could not) refuse, in
    /// words for status. Empty when the spec can be built.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.language == Language::Unknown {
            problems.push("language is not one of go, rust, wat, wasm".to_string());
        }
        let sources = [self.source.is_some(), self.function.is_some(), self.module.is_some()];
        if sources.iter().filter(|set| **set).count() != 1 {
            problems.push("exactly one of source, function (the Goless field) or module must be set".to_string());
        }
        if let Some(source) = self.inline_source() {
            if source.trim().is_empty() {
                problems.push("source is empty".to_string());
            } else if source.len() > MAX_SOURCE_BYTES {
                problems.push(format!(
                    "source is {} bytes, over the {MAX_SOURCE_BYTES}-byte limit",
                    source.len()
                ));
            } else if self.language == Language::Go {
                match wasmless_artifact::go_package(source) {
                    Some("handlers") => {}
                    Some(other) => problems.push(format!(
                        "Go source must be `package handlers` (the Goless convention; Wasmless generates main), not `package {other}`"
                    )),
                    None => problems.push("Go source has no package clause; write `package handlers`".to_string()),
                }
            }
            if self.language == Language::Wasm {
                problems.push("language wasm takes a prebuilt module (spec.module), not inline source".to_string());
            }
        }
        if let Some(module) = &self.module
            && self.language != Language::Wasm
        {
            problems.push(format!(
                "module {} is prebuilt: set language: wasm (it is {})",
                module.image,
                self.language.as_str()
            ));
        }
        if !(1..=65535).contains(&self.server_port) {
            problems.push(format!("serverPort {} is not a port (1-65535)", self.server_port));
        }
        if self.server_port == i32::from(wasmless_artifact::ports::ADMIN) {
            // The Service carries both ports, and the API server refuses two of one number.
            problems.push(format!(
                "serverPort {} is the Service's metrics port (the runtime's admin port): choose another, such as 8080",
                self.server_port
            ));
        }
        if self.limits.isolation == Isolation::Unknown {
            problems.push("limits.isolation is not one of request, shared".to_string());
        }
        if self.replicas < 0 {
            problems.push(format!("replicas {} is negative", self.replicas));
        }
        problems
    }
}
