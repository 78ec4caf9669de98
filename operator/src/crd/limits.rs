//! `spec.limits`, and the caps of the shared pool: what keeps a Function on pods of its own.

use super::*;

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
}
