//! The operator's flags (each also an environment variable), as `wasmless-operator --help`
//! lists them and `docs/reference/wasmless-operator.md` shows them, and the [`Settings`] they make.

use crate::Settings;
use crate::crd::Storage;
use crate::node_code_store::{NodeCodeStore, NodeCodeStoreSetting};
use clap::Parser;
use std::net::SocketAddr;

#[derive(Parser, Debug)]
#[command(version, about = "Kubernetes operator for Wasmless Functions")]
pub struct Args {
    /// Image of wasmless-runtime for the function pods.
    #[arg(long, env = "WASMLESS_RUNTIME_IMAGE")]
    pub runtime_image: String,
    /// Image of wasmless-builder for the build Jobs.
    #[arg(long, env = "WASMLESS_BUILDER_IMAGE")]
    pub builder_image: String,
    /// Part of every source digest; defaults to the builder image, so a new builder rebuilds once.
    #[arg(long, env = "WASMLESS_BUILDER_VERSION")]
    pub builder_version: Option<String>,
    /// Module storage of Functions that do not choose: configMap or oci.
    #[arg(long, env = "WASMLESS_DEFAULT_STORAGE", default_value = "configMap", value_parser = parse_storage)]
    pub default_storage: Storage,
    /// Registry for OCI storage: host[:port][/prefix].
    #[arg(long, env = "WASMLESS_OCI_REGISTRY")]
    pub oci_registry: Option<String>,
    /// Registries (comma-separated host:port) reached over plain HTTP instead of HTTPS, such as
    /// a registry inside the cluster without TLS; passed on to build Jobs and function pods.
    #[arg(long, env = "WASMLESS_OCI_PLAIN_HTTP")]
    pub oci_plain_http: Option<String>,
    /// The Go module proxy build Jobs fetch the modules of a handler's go.mod from (a GOPROXY
    /// value, such as https://proxy.golang.org or an internal mirror); downloads are checked
    /// against the handler's go.sum. Without it, handlers that need modules do not build.
    #[arg(long, env = "WASMLESS_GOPROXY")]
    pub go_proxy: Option<String>,
    /// Build Jobs' persistent cache, mounted only into them: hostPath:/dir on the node (made
    /// if missing; the builder's uid 65532 must own it to use it), pvc:<claim> (a
    /// PersistentVolumeClaim of that name in each Function's namespace), or none (cold builds).
    #[arg(
        long,
        env = "WASMLESS_BUILDER_CACHE",
        default_value = "hostPath:/var/lib/wasmless/builds"
    )]
    pub build_cache: crate::settings::BuildCache,
    /// The crates registry build Jobs fetch the dependencies of a Rust handler's Cargo.toml
    /// from, in place of crates.io: a sparse index (sparse+https://host/path/, a crates.io
    /// mirror that also serves the Rust SDK's dependencies). Without it, Rust handlers with
    /// dependencies do not build.
    #[arg(long, env = "WASMLESS_CARGO_REGISTRY")]
    pub cargo_registry: Option<String>,
    /// Pods of each namespace's shared pool, which serves the Functions with `scale.min: 0`
    /// while they have no pods of their own.
    #[arg(long, env = "WASMLESS_POOL_REPLICAS", default_value_t = 2, value_parser = clap::value_parser!(i32).range(1..=100))]
    pub pool_replicas: i32,
    /// Loaded code each pool pod keeps (a quantity: 1Gi, 4Gi) before it unloads the least
    /// recently used Function, which loads again on its next request; the pool's container
    /// may use this and 1280Mi more (requests in flight, the process). Raise it for a namespace of many pooled Functions: a
    /// Goless handler's code takes about 15 MiB, a small Rust one under 1 MiB.
    #[arg(long, env = "WASMLESS_POOL_MEMORY_BUDGET", default_value = "1Gi", value_parser = wasmless_formats::quantity::parse_bytes)]
    pub pool_memory_budget: u64,
    /// Pool pods load each Function new to their table before its first request, while
    /// their loaded code is under three quarters of the budget (false: on its first request,
    /// which then waits for the load).
    #[arg(long, env = "WASMLESS_POOL_LOAD_AHEAD", default_value_t = true, action = clap::ArgAction::Set)]
    pub pool_load_ahead: bool,
    /// Pool pods and Functions' own pods map compiled code from their node's store (the node
    /// agent of deploy/node-agent/, the CSI driver code.wasmless.io), so a node keeps each
    /// Function's code once and a pod loads it without reading it. auto: while the CSIDriver
    /// code.wasmless.io exists (installing or removing the agent turns it on or off); true:
    /// always, where a pod waits for the driver before it starts; false: never. A change
    /// rolls every Function's pods.
    #[arg(long, env = "WASMLESS_NODE_CODE_STORE", value_enum, default_value = "auto")]
    pub node_code_store: NodeCodeStoreSetting,
    /// The OpenTelemetry collector function pods and pools send traces to, and the
    /// operator its trace of each apply: an OTLP/HTTP endpoint such as
    /// http://otel-collector.observability:4318. Unset: no traces.
    #[arg(long, env = "WASMLESS_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Watch only this namespace (default: all).
    #[arg(long, env = "WASMLESS_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "WASMLESS_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Reconcile only while holding the Lease (needed with more than one replica).
    #[arg(long, env = "WASMLESS_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    #[arg(long, env = "WASMLESS_LEASE_NAME", default_value = "wasmless-operator")]
    pub lease_name: String,
    /// Namespace of the Lease: the operator's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "wasmless-system")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease and in Events.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

fn parse_storage(value: &str) -> Result<Storage, String> {
    match value {
        "configMap" | "configmap" => Ok(Storage::ConfigMap),
        "oci" => Ok(Storage::Oci),
        other => Err(format!("storage {other:?} is not configMap or oci")),
    }
}

impl Args {
    /// The operator's settings as the flags say; a flag given empty is unset.
    pub fn settings(&self) -> Settings {
        let mut settings = Settings::new(&self.runtime_image, &self.builder_image);
        settings.builder_version = self
            .builder_version
            .clone()
            .unwrap_or_else(|| self.builder_image.clone());
        settings.default_storage = self.default_storage;
        settings.oci_registry = self.oci_registry.clone();
        settings.oci_plain_http = self.oci_plain_http.clone();
        settings.go_proxy = self.go_proxy.clone().filter(|proxy| !proxy.trim().is_empty());
        settings.build_cache = self.build_cache.clone();
        settings.pool_replicas = self.pool_replicas;
        settings.pool_memory_budget = self.pool_memory_budget;
        settings.pool_load_ahead = self.pool_load_ahead;
        settings.node_code_store = NodeCodeStore::new(self.node_code_store);
        settings.otlp_endpoint = self
            .otlp_endpoint
            .clone()
            .filter(|endpoint| !endpoint.trim().is_empty());
        settings.cargo_registry = self
            .cargo_registry
            .clone()
            .filter(|registry| !registry.trim().is_empty());
        settings
    }
}
