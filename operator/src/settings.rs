//! The operator's settings: images, default storage, registry. Read from flags and
//! environment by the binary, built directly by the tests.

use crate::crd::Storage;
use crate::node_code_store::NodeCodeStore;

#[derive(Clone, Debug)]
pub struct Settings {
    /// Image of `wasmless-runtime` for the function pods.
    pub runtime_image: String,
    /// Image of `wasmless-builder` for the build Jobs.
    pub builder_image: String,
    /// Part of every source digest: a new builder rebuilds every function once.
    pub builder_version: String,
    /// Storage of Functions that do not set `spec.storage`.
    pub default_storage: Storage,
    /// Registry (`host[:port][/prefix]`) for OCI storage; without it `storage: oci` is refused on status.
    pub oci_registry: Option<String>,
    /// Registries (comma-separated `host:port`) spoken to over plain HTTP, passed to the
    /// builder and the runtime as `WASMLESS_OCI_PLAIN_HTTP`.
    pub oci_plain_http: Option<String>,
    /// The Go module proxy (a `GOPROXY` value) build Jobs fetch the modules of a handler's
    /// go.mod from, passed to the builder as `WASMLESS_GOPROXY`; without it such handlers
    /// fail to build with a message naming this setting.
    pub go_proxy: Option<String>,
    /// The crates registry (a sparse index URL) build Jobs fetch the dependencies of a Rust
    /// handler's Cargo.toml from, passed to the builder as `WASMLESS_CARGO_REGISTRY`; without
    /// it such handlers fail to build with a message naming this setting.
    pub cargo_registry: Option<String>,
    /// Where build Jobs keep the build cache they share across builds.
    pub build_cache: BuildCache,
    /// Pods of each namespace's shared pool (Functions with `scale.min: 0` are served there
    /// while idle): two, so a pool pod's restart or eviction leaves one serving.
    pub pool_replicas: i32,
    /// Loaded code each pool pod keeps before unloading the least recently used Function,
    /// in bytes; its container may use this and 1 GiB more (requests in flight).
    pub pool_memory_budget: u64,
    /// Whether pool pods load a Function new to their table before its first request
    /// (while under three quarters of the budget), or on it.
    pub pool_load_ahead: bool,
    /// Whether runtime pods (the pools' and Functions' own) mount the node's code store
    /// (the CSI driver `code.wasmless.io`): always, never, or while that driver is installed.
    pub node_code_store: NodeCodeStore,
    /// The OpenTelemetry collector (an OTLP/HTTP endpoint) function pods and pools send
    /// traces to, passed to the runtime as `WASMLESS_OTLP_ENDPOINT`; none: no traces.
    pub otlp_endpoint: Option<String>,
}

/// The volume of build Jobs' persistent cache (Go's and Cargo's caches, built modules and
/// their compiled code), mounted at `/cache` in build Jobs and nowhere else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildCache {
    /// A directory on the node (`hostPath`, created if missing): warm on every node a build
    /// has run on. The builder's uid must own it (see docs/operator.md, "The build cache").
    HostPath(String),
    /// A PersistentVolumeClaim of this name in the Function's namespace.
    Claim(String),
    /// None: every build starts cold, in the Job's emptyDir.
    None,
}

/// The node directory build Jobs use when the operator is not told otherwise.
pub const DEFAULT_BUILD_CACHE_PATH: &str = "/var/lib/wasmless/builds";

impl std::str::FromStr for BuildCache {
    type Err = String;

    /// `hostPath:/abs/dir`, `pvc:<claim>` or `none`.
    fn from_str(value: &str) -> Result<Self, String> {
        let usage = "write hostPath:/absolute/dir, pvc:<claim name> or none";
        match value.split_once(':') {
            _ if value == "none" => Ok(Self::None),
            Some(("hostPath", path)) if path.starts_with('/') && !path.split('/').any(|p| p == "..") => {
                Ok(Self::HostPath(path.into()))
            }
            Some(("hostPath", path)) => Err(format!(
                "build cache hostPath {path:?} is not an absolute path: {usage}"
            )),
            Some(("pvc", claim))
                if !claim.is_empty()
                    && claim.len() <= 253
                    && claim
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.') =>
            {
                Ok(Self::Claim(claim.into()))
            }
            Some(("pvc", claim)) => Err(format!(
                "build cache claim {claim:?} is not a PersistentVolumeClaim name: {usage}"
            )),
            _ => Err(format!("build cache {value:?}: {usage}")),
        }
    }
}

impl Settings {
    /// Settings with the given images, ConfigMap storage, no registry, and the build cache
    /// in [`DEFAULT_BUILD_CACHE_PATH`] on the node.
    pub fn new(runtime_image: impl Into<String>, builder_image: impl Into<String>) -> Self {
        let builder_image = builder_image.into();
        Self {
            runtime_image: runtime_image.into(),
            builder_version: builder_image.clone(),
            builder_image,
            default_storage: Storage::ConfigMap,
            oci_registry: None,
            oci_plain_http: None,
            go_proxy: None,
            build_cache: BuildCache::HostPath(DEFAULT_BUILD_CACHE_PATH.into()),
            cargo_registry: None,
            pool_replicas: 2,
            pool_memory_budget: crate::objects::DEFAULT_POOL_MEMORY_BUDGET,
            pool_load_ahead: true,
            node_code_store: NodeCodeStore::default(),
            otlp_endpoint: None,
        }
    }
}
