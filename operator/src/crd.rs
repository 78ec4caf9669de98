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

/// The most linear memory a request of a Function in the shared pool may have (the pool's
/// `--memory-limit`): a Function that asks for more is served by pods of its own.
pub const POOL_MEMORY_LIMIT: &str = "256Mi";
/// The longest `limits.timeout` of a Function in the shared pool (its
/// `--pool-max-timeout`): a request held longer holds the pool's memory and slots from
/// its neighbours, so a Function that asks for more is served by pods of its own.
pub const POOL_MAX_TIMEOUT: &str = "60s";
/// The largest `limits.maxRequestBody` of a Function in the shared pool (its
/// `--pool-max-request-body`): bodies are held whole in the pool's memory.
pub const POOL_MAX_REQUEST_BODY: &str = "16Mi";

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

    /// More files of the source, by file name: Go's `go.mod` and `go.sum` (the handler is
    /// then built as that module, its dependencies through the operator's module proxy and
    /// checked against `go.sum`), more `.go` files of `package handlers`; for Rust, more `.rs`
    /// files, and `Cargo.toml` (its dependencies built through the operator's crates registry)
    /// with, optionally, the `Cargo.lock` the build is then held to. A name is a plain file name (no `/`, no `..`); `source` with every file is at
    /// most 512 KiB, and a change to any file builds again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16), extend("additionalProperties" = {"type": "string", "maxLength": 524288}))]
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

/// One variable of the handler's environment: a literal `value`, or `valueFrom` a key of a
/// Secret or a ConfigMap, as in a container's `env`. Neither is an empty value, as in
/// Kubernetes (and as this field accepted before `valueFrom`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.value) && has(self.valueFrom))")
    .message("an env entry takes value or valueFrom, not both"))]
pub struct EnvVar {
    #[schemars(length(min = 1, max = 256), regex(pattern = ENV_NAME_PATTERN))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// Where a variable's value comes from: one key of a Secret or of a ConfigMap in the
/// Function's namespace. The kubelet reads it when a runtime pod starts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) == 1")
    .message("valueFrom takes exactly one of secretKeyRef or configMapKeyRef"))]
pub struct EnvVarSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// One key of a Secret or a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct KeyRef {
    /// The object's name, in the Function's namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY_PATTERN))]
    pub key: String,
    /// The variable is left out when the object or the key does not exist, instead of the
    /// Function waiting for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Every key of a Secret or a ConfigMap as a variable, as a container's `envFrom`: `env`
/// wins over it, and a later entry over an earlier one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.secretRef) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) == 1")
    .message("an envFrom entry takes exactly one of secretRef or configMapRef"))]
pub struct EnvFromSource {
    /// Put before every key's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), regex(pattern = ENV_NAME_PATTERN))]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<EnvSourceRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<EnvSourceRef>,
}

/// A whole Secret or ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EnvSourceRef {
    /// The object's name, in the Function's namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    /// Nothing is added when the object does not exist, instead of the Function waiting for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A destination handlers may call: `scheme://host[:port]`, the host a name, `*.` and a
/// name (any name under it), `*` (any host), an IPv4 address or a bracketed IPv6 one.
const OUTBOUND_ALLOW_PATTERN: &str = r"^https?://(\*|(\*\.)?[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$";
/// One destination, no wildcard: a credential goes to the hosts its owner named, no others.
const OUTBOUND_URL_PATTERN: &str = r"^https?://([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$";
/// An HTTP header name: a token (RFC 9110, section 5.6.2).
const HEADER_NAME_PATTERN: &str = r"^[-!#$%&'*+.^_`|~0-9A-Za-z]+$";

/// The HTTP calls a handler may make; without it, none. Everything not allowed is refused.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.headers) || self.headers.all(h, h.url in self.allow)")
    .message("every outbound.headers[].url must be one of outbound.allow, written the same way"))]
pub struct Outbound {
    /// Destinations: `scheme://host[:port]`, where host may be `*.example.com` (any name
    /// under it), `*` (any host), or an IP address. Without a port, the scheme's.
    #[schemars(length(min = 1, max = 64), inner(length(max = 512), regex(pattern = OUTBOUND_ALLOW_PATTERN)))]
    pub allow: Vec<String>,
    /// Longest time of one call, always within the request's own `limits.timeout`.
    #[serde(default = "default_outbound_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    pub timeout: String,
    /// Largest response body a call reads.
    #[serde(default = "default_max_response_body")]
    #[schemars(regex(pattern = QUANTITY_PATTERN), length(max = 32))]
    pub max_response_body: String,
    /// Outbound calls in flight at once in one pod, over all its requests.
    #[serde(default = "default_max_outbound_concurrency")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_concurrency: i32,
    /// Headers the runtime adds to calls to one destination, their values from Secrets:
    /// the handler never sees them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<OutboundHeader>,
    /// Certificate authorities HTTPS calls trust besides Mozilla's roots, such as a
    /// cluster's internal CA: PEM certificates in a key of a ConfigMap. A change to it rolls
    /// the pods; a missing one is a condition on the Function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
}

/// Where the PEM certificates of `outbound.caBundle` are.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaBundle {
    pub config_map_key_ref: ConfigMapKeyRef,
}

/// One key of a ConfigMap, in the Function's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ConfigMapKeyRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY_PATTERN))]
    pub key: String,
}

/// A header the runtime adds to every call to `url`, its value read from a Secret. Over
/// https only, unless `allowInsecure` says otherwise: the value is a credential, and plain
/// http hands it to anyone on the network path.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.url.startsWith('http://') || (has(self.allowInsecure) && self.allowInsecure)")
    .message(INSECURE_HEADER_MESSAGE))]
pub struct OutboundHeader {
    /// The destination, one of `allow` as written there, without a wildcard.
    #[schemars(length(max = 512), regex(pattern = OUTBOUND_URL_PATTERN))]
    pub url: String,
    /// The header's name, such as `Authorization`.
    #[schemars(length(min = 1, max = 256), regex(pattern = HEADER_NAME_PATTERN))]
    pub name: String,
    pub value_from: SecretValueSource,
    /// Send the header to an `http://` url too, its value in clear on the network: only
    /// where the path is trusted (a mesh that encrypts between pods, a sidecar on the
    /// node). Without it, a header for an `http://` url is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure: Option<bool>,
}

const INSECURE_HEADER_MESSAGE: &str = "an outbound.headers[] url is http://, where the header's value would travel in clear: use https, or set allowInsecure: true on that header if the network path is trusted";

impl OutboundHeader {
    /// Whether this header would go over plain http without its entry saying so.
    fn is_insecure(&self) -> bool {
        self.url.starts_with("http://") && self.allow_insecure != Some(true)
    }
}

/// A value from a Secret: a header has no value when the Secret is missing, so it is not optional.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretValueSource {
    pub secret_key_ref: SecretKeyRef,
}

/// One key of a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY_PATTERN))]
    pub key: String,
}

fn default_outbound_timeout() -> String {
    "5s".into()
}
fn default_max_response_body() -> String {
    "10Mi".into()
}
fn default_max_outbound_concurrency() -> i32 {
    64
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
            problems.extend(self.files_problems(source));
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
        if let Some(outbound) = &self.outbound {
            problems.extend(outbound.problems());
        }
        problems
    }
}

impl FunctionSpec {
    /// Whether the Function asks to be served by the pool while idle (`scale.min: 0`).
    pub fn scales_to_zero(&self) -> bool {
        self.scale.as_ref().is_some_and(|scale| scale.min == 0)
    }

    /// Why a Function that asks for `scale.min: 0` is served by pods of its own instead of
    /// the pool (at least one): the pool runs many Functions in one process, so it mounts
    /// no Function's files (a CA bundle is one; env values from Secrets and ConfigMaps the
    /// pool reads itself), and it keeps no instance between requests (`isolation: shared`
    /// keeps one per pod, on purpose).
    pub fn pool_refusal(&self) -> Option<String> {
        if self.traffic.iter().filter(|t| t.percent > 0 || t.tag.is_some()).count() > 1 {
            return Some(
                "spec.traffic splits it between revisions, which its own pods hold side by side: it keeps one pod of its own".into(),
            );
        }
        if self
            .outbound
            .as_ref()
            .is_some_and(|outbound| outbound.ca_bundle.is_some())
        {
            return Some(
                "outbound.caBundle is a file its pods mount, which the shared pool does not: it keeps one pod of its own"
                    .into(),
            );
        }
        let pool_memory = wasmless_formats::quantity::parse_bytes(POOL_MEMORY_LIMIT).expect("a quantity");
        if wasmless_formats::quantity::parse_bytes(&self.limits.memory).is_ok_and(|memory| memory > pool_memory) {
            return Some(format!(
                "limits.memory {} is over the shared pool's {POOL_MEMORY_LIMIT}: it keeps one pod of its own",
                self.limits.memory
            ));
        }
        let pool_timeout = wasmless_formats::quantity::parse_duration(POOL_MAX_TIMEOUT).expect("a duration");
        if wasmless_formats::quantity::parse_duration(&self.limits.timeout).is_ok_and(|timeout| timeout > pool_timeout)
        {
            return Some(format!(
                "limits.timeout {} is over the shared pool's {POOL_MAX_TIMEOUT}: it keeps one pod of its own",
                self.limits.timeout
            ));
        }
        let pool_body = wasmless_formats::quantity::parse_bytes(POOL_MAX_REQUEST_BODY).expect("a quantity");
        if wasmless_formats::quantity::parse_bytes(&self.limits.max_request_body).is_ok_and(|body| body > pool_body) {
            return Some(format!(
                "limits.maxRequestBody {} is over the shared pool's {POOL_MAX_REQUEST_BODY}: it keeps one pod of its own",
                self.limits.max_request_body
            ));
        }
        if self.limits.isolation == Isolation::Shared {
            return Some(
                "limits.isolation shared keeps instances between requests, which the shared pool does not: it keeps one pod of its own"
                    .into(),
            );
        }
        None
    }

    /// What is wrong with `files` beside the inline `source`: names, the total size, and
    /// what the builder would refuse of them anyway.
    fn files_problems(&self, source: &str) -> Vec<String> {
        use wasmless_formats::source::{self as formats, Language as SourceLanguage, SourceError};
        let mut problems = Vec::new();
        if self.files.is_empty() {
            return problems;
        }
        let language = match self.language {
            Language::Go => SourceLanguage::Go,
            Language::Rust => SourceLanguage::Rust,
            Language::Wat => SourceLanguage::Wat,
            Language::Wasm | Language::Unknown => return problems,
        };
        if self.files.len() > formats::MAX_FILES {
            problems.push(format!(
                "files holds {} files, over the limit of {}",
                self.files.len(),
                formats::MAX_FILES
            ));
        }
        for name in self.files.keys() {
            if name == self.language.source_file_name() {
                problems.push(format!(
                    "files has {name}, the name the source itself is built as: give that file another name"
                ));
            } else if let Some(problem) = formats::file_name_problem(language, name) {
                problems.push(format!("files: {problem}"));
            }
        }
        let total = source.len() + self.files.values().map(String::len).sum::<usize>();
        if total > MAX_SOURCE_BYTES {
            problems.push(format!(
                "source and files are {total} bytes together, over the {MAX_SOURCE_BYTES}-byte limit"
            ));
        }
        if self.files.contains_key("go.sum") && !self.files.contains_key("go.mod") {
            problems.push(SourceError::GoSumWithoutGoMod.to_string());
        }
        if self.files.contains_key("Cargo.lock") && !self.files.contains_key("Cargo.toml") {
            problems.push(SourceError::CargoLockWithoutCargoToml.to_string());
        }
        problems
    }
}

impl Outbound {
    /// What the schema's patterns let through: a port past 65535, one header given twice
    /// for one destination (which of the two values would be sent?), and a header for
    /// plain http without `allowInsecure`.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let urls = self.allow.iter().chain(self.headers.iter().map(|h| &h.url));
        for url in urls {
            if let Some(port) = port_of(url)
                && port.parse::<u16>().is_err()
            {
                problems.push(format!("outbound URL {url} has port {port}, past 65535"));
            }
        }
        // The CRD refuses these on a write; one stored before that rule existed is
        // refused here, so its pods keep the Deployment they have.
        problems.extend(
            self.headers
                .iter()
                .filter(|header| header.is_insecure())
                .map(|header| format!("{}: {INSECURE_HEADER_MESSAGE}", header.url)),
        );
        for (index, header) in self.headers.iter().enumerate() {
            let repeated = self.headers[..index]
                .iter()
                .any(|h| h.url == header.url && h.name.eq_ignore_ascii_case(&header.name));
            if repeated {
                problems.push(format!(
                    "outbound.headers names {} for {} twice: give each header one value",
                    header.name, header.url
                ));
            }
        }
        problems
    }
}

/// The port written in `scheme://host[:port]`, if any (an IPv6 host is bracketed).
fn port_of(url: &str) -> Option<&str> {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let after_host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']')?.1,
        None => authority.find(':').map_or("", |at| &authority[at..]),
    };
    after_host.strip_prefix(':')
}
