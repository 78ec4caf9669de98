//! The namespace's shared pool: one runtime Deployment (`wasmless-pool`) that serves every
//! Function of the namespace with `scale.min: 0` while it has no ready pods of its own,
//! its identity (which may read the namespace's ConfigMaps: the table and the modules), and
//! each pooled Function's entry in its table (a ConfigMap the pool watches).
//!
//! One pool per namespace, not one per cluster: a Service selects pods of its own
//! namespace only, so the Function's Service can point at the pool by selector; the pool
//! reads only its namespace's ConfigMaps; and the boundary between tenants stays the
//! namespace (docs/pool.md, "Threat model").

use super::pod::{
    empty_dir, mount, restricted_container_security, restricted_pod_security, runtime_settings_env,
    with_node_code_store,
};
use super::runtime::{
    DRAIN_DELAY_SECONDS, Expansion, SHUTDOWN_GRACE_SECONDS, TERMINATION_GRACE_PERIOD_SECONDS, admin_probe,
    args_with_locations, container_port, function_env, handler_env_from, surge_strategy,
};
use super::{COMPONENT_LABEL, MANAGED_BY_LABEL, MANAGER, labels_for, meta, prometheus_annotations};
use crate::crd::{Function, POOL_MAX_REQUEST_BODY, POOL_MAX_TIMEOUT, POOL_MEMORY_LIMIT};
use crate::module::{Module, ModuleLocation};
use crate::settings::Settings;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec, PodTemplateSpec, ResourceRequirements,
    ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use wasmless_artifact::{Digest, ports};

/// Name of the pool's Deployment, ServiceAccount, Role and RoleBinding in a namespace.
pub const POOL_NAME: &str = "wasmless-pool";
/// `wasmless.io/component` of the pool's pods.
pub const POOL_COMPONENT: &str = "pool";
/// `wasmless.io/component` of a Function's entry in the pool's table.
pub const POOL_ENTRY_COMPONENT: &str = "pool-entry";
/// Key of the entry (`{"port": N, "args": [...]}`) in an entry ConfigMap.
pub const POOL_ENTRY_KEY: &str = "entry.json";
/// The ports the pool gives Functions, one each: far from the runtime's own (8080, 9090)
/// and below Linux's ephemeral range (32768 and up would collide with outbound calls'
/// local ports only on the same address, but staying clear costs nothing).
pub const POOL_PORTS: std::ops::Range<u16> = 20000..32000;
/// Loaded code the pool keeps before unloading the least recently used Function, unless
/// the operator's `--pool-memory-budget` says otherwise.
pub const DEFAULT_POOL_MEMORY_BUDGET: u64 = 1 << 30;
/// Code files the pool maps (`--pool-mapped-code-budget`): the builder's code is written to
/// the pool's cache volume and mapped, not copied into its memory, so it is disk (and page
/// cache the kernel may drop), not the container's own memory. ~290 Goless samples.
pub const POOL_MAPPED_CODE_BUDGET: u64 = 4 << 30;
/// The cache volume beside the mapped code: what the pool compiles itself when it cannot
/// use the builder's code.
const POOL_COMPILE_CACHE: u64 = 1 << 30;
/// Linear memory the pool's requests in flight may hold together (`--pool-request-memory`):
/// growth past it fails that request with a 503, so the container never goes over its
/// limit for them. Three requests of the largest pooled Function (`POOL_MEMORY_LIMIT`).
pub const POOL_REQUEST_MEMORY: u64 = 768 << 20;
/// The most one Function holds of the pool's request memory, slots and connections, in
/// percent (`--pool-share`): at least half stays for the others.
pub const POOL_SHARE_PERCENT: u8 = 50;
/// What the pool's process needs beside loaded code and requests' linear memory: request
/// bodies being received (the runtime's `--upload-budget`) and held, responses on their way
/// out, what wasmtime keeps resident in its instance slots between requests (up to ~180 MiB
/// with 64 slots), the table, the runtime itself.
const POOL_PROCESS_ROOM: u64 = 512 << 20;
/// The variable the pool reads its namespace from (the downward API's).
pub const NAMESPACE_ENV: &str = "WASMLESS_NAMESPACE";

fn pool_labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (COMPONENT_LABEL.to_string(), POOL_COMPONENT.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
    ])
}

fn pool_meta(namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(POOL_NAME.into()),
        namespace: Some(namespace.into()),
        labels: Some(pool_labels()),
        ..Default::default()
    }
}

/// The label selector (`key=value,...`) of the entries the pool serves.
pub fn pool_entry_selector() -> String {
    format!("{COMPONENT_LABEL}={POOL_ENTRY_COMPONENT}")
}

/// The labels a Service selects the pool's pods by.
pub fn pool_pod_selector() -> BTreeMap<String, String> {
    pool_labels()
}

/// The label selector of the pools' Deployments (and pods), for a list.
pub fn pool_deployment_selector() -> String {
    pool_labels()
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The pool's identity: it may read the ConfigMaps of its namespace (its table, the
/// modules' chunks, and what pooled Functions' `env` reads) and `get` the Secrets named in
/// `secrets` — those the namespace's pooled Functions read — and nothing else. No Secret
/// rule at all when there are none: a rule with no names would allow every Secret. Shared by
/// the namespace's pooled Functions, so it carries no owner reference.
pub fn pool_rbac(namespace: &str, secrets: &BTreeSet<String>) -> (ServiceAccount, Role, RoleBinding) {
    let account = ServiceAccount {
        metadata: pool_meta(namespace),
        ..Default::default()
    };
    let mut rules = vec![PolicyRule {
        api_groups: Some(vec!["".into()]),
        resources: Some(vec!["configmaps".into()]),
        // get: a module's chunks and env values; list and watch: the table's entries.
        verbs: ["get", "list", "watch"].map(String::from).to_vec(),
        ..Default::default()
    }];
    if !secrets.is_empty() {
        rules.push(PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(secrets.iter().cloned().collect()),
            verbs: vec!["get".into()],
            ..Default::default()
        });
    }
    let role = Role {
        metadata: pool_meta(namespace),
        rules: Some(rules),
    };
    let binding = super::own_account_binding(pool_meta(namespace));
    (account, role, binding)
}

/// The pool's Deployment in `namespace`: the runtime in pool mode, its table the entry
/// ConfigMaps of the namespace.
pub fn pool_deployment(namespace: &str, settings: &Settings) -> Deployment {
    let labels = pool_labels();
    let probe = admin_probe;
    let mut args: Vec<String> = [
        ("--pool", format!("api:{}", pool_entry_selector())),
        ("--admin-port", ports::ADMIN.to_string()),
        ("--memory-limit", POOL_MEMORY_LIMIT.into()),
        ("--pool-memory-budget", quantity(settings.pool_memory_budget).0),
        ("--pool-mapped-code-budget", quantity(POOL_MAPPED_CODE_BUDGET).0),
        ("--pool-request-memory", quantity(POOL_REQUEST_MEMORY).0),
        ("--pool-share", POOL_SHARE_PERCENT.to_string()),
        ("--pool-max-timeout", POOL_MAX_TIMEOUT.into()),
        ("--pool-max-request-body", POOL_MAX_REQUEST_BODY.into()),
        ("--pool-load-ahead", settings.pool_load_ahead.to_string()),
        ("--cache-dir", "/cache".into()),
        ("--drain-delay", format!("{DRAIN_DELAY_SECONDS}s")),
        ("--shutdown-grace", format!("{SHUTDOWN_GRACE_SECONDS}s")),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value])
    .collect();
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (volumes, mounts) = pool_volumes(settings, &mut args);
    let mut env: Vec<EnvVar> = runtime_settings_env(settings).collect();
    env.push(field(NAMESPACE_ENV, "metadata.namespace"));
    env.push(field(super::POD_IP_ENV, "status.podIP"));
    let container = Container {
        name: "pool".into(),
        image: Some(settings.runtime_image.clone()),
        args: Some(args),
        env: Some(env),
        ports: Some(vec![container_port("metrics", ports::ADMIN)]),
        readiness_probe: Some(probe("/readyz", 1)),
        liveness_probe: Some(probe("/healthz", 10)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("100m".into())),
                ("memory".into(), Quantity("128Mi".into())),
            ])),
            // Derived from what the pool admits: the budget of loaded code, the requests'
            // linear memory, and the process beside them.
            limits: Some(BTreeMap::from([(
                "memory".into(),
                quantity(settings.pool_memory_budget + POOL_REQUEST_MEMORY + POOL_PROCESS_ROOM),
            )])),
            ..Default::default()
        }),
        security_context: Some(restricted_container_security()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    Deployment {
        metadata: pool_meta(namespace),
        spec: Some(DeploymentSpec {
            replicas: Some(settings.pool_replicas),
            revision_history_limit: Some(3),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            strategy: Some(surge_strategy()),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(prometheus_annotations()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(POOL_NAME.into()),
                    // The one runtime pod that talks to the API: it watches its table.
                    automount_service_account_token: Some(true),
                    enable_service_links: Some(false),
                    security_context: Some(restricted_pod_security()),
                    containers: vec![container],
                    termination_grace_period_seconds: Some(TERMINATION_GRACE_PERIOD_SECONDS),
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pool's volumes and their mounts: the cache of mapped and compiled code, and with
/// `--node-code-store` the node's store, whose socket `args` then name.
fn pool_volumes(settings: &Settings, args: &mut Vec<String>) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![empty_dir(
        "cache",
        &quantity(POOL_MAPPED_CODE_BUDGET + POOL_COMPILE_CACHE).0,
    )];
    let mut mounts = vec![mount("cache", "/cache", false)];
    with_node_code_store(settings, &mut volumes, &mut mounts, args);
    (volumes, mounts)
}

/// Name of a Function's entry ConfigMap.
pub fn pool_entry_name(function: &str) -> String {
    format!("{function}-pool")
}

/// The runtime's `configmaps:` location of `count` chunks (of the module for `--module`,
/// of its code for `--code`): the pool fetches them from the API, where a dedicated pod has
/// them mounted.
fn chunks_location(func: &Function, module: &Module, count: usize) -> String {
    format!("configmaps:{}/{}/{count}", func.name_any(), module.source_digest)
}

/// The runtime arguments a pooled Function is served with: its pod's, the module and code
/// read from the API instead of a volume.
pub fn pool_args(func: &Function, module: &Module) -> Vec<String> {
    match &module.location {
        ModuleLocation::ConfigMaps { count } => {
            let code_chunks = module.code.as_ref().map_or(0, |code| code.chunks);
            args_with_locations(
                func,
                module,
                chunks_location(func, module, *count),
                chunks_location(func, module, code_chunks),
            )
        }
        ModuleLocation::Oci { .. } => super::runtime_args(func, module),
    }
}

/// A Function's entry in the pool's table: its port there, its runtime arguments, and
/// whether its Service routes to its own pods now (the pool then closes each connection
/// after its answer, so keep-alive clients reconnect to the pods).
///
/// A pod has the Function's variables in its container's `env` and `envFrom`, which the
/// kubelet resolves; the pool's process is shared, so a pooled Function's travel in its
/// entry, in the same shape, and the pool reads their Secrets and ConfigMaps itself
/// (`config_hash`, of their resourceVersions, changes the entry when one of them changes).
/// Values are references, never read by the operator nor written here.
pub fn pool_entry(
    func: &Function,
    module: &Module,
    port: u16,
    served_by_pods: bool,
    config_hash: Option<&Digest>,
) -> ConfigMap {
    let mut entry = serde_json::json!({ "port": port, "args": pool_args(func, module) });
    if served_by_pods {
        entry["servedByPods"] = true.into();
    }
    let env = function_env(func, Expansion::None);
    if !env.is_empty() {
        entry["env"] = serde_json::to_value(env).expect("JSON");
    }
    let env_from = handler_env_from(func);
    if !env_from.is_empty() {
        entry["envFrom"] = serde_json::to_value(env_from).expect("JSON");
    }
    if let Some(hash) = config_hash {
        entry["configHash"] = hash.to_string().into();
    }
    ConfigMap {
        metadata: meta(
            func,
            pool_entry_name(&func.name_any()),
            labels_for(func, POOL_ENTRY_COMPONENT),
        ),
        data: Some(BTreeMap::from([(POOL_ENTRY_KEY.into(), entry.to_string())])),
        ..Default::default()
    }
}

/// The port an entry ConfigMap gives its Function, if it is one.
pub fn pool_entry_port(entry: &ConfigMap) -> Option<u16> {
    let text = entry.data.as_ref()?.get(POOL_ENTRY_KEY)?;
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    u16::try_from(value.get("port")?.as_u64()?).ok()
}

/// The port a Function gets in its pool when none of `taken` holds it: a start that
/// depends only on its name (so a Function keeps its port across re-creation when it can),
/// then the next free one.
pub fn free_pool_port(function: &str, taken: &std::collections::BTreeSet<u16>) -> Option<u16> {
    let hash = wasmless_artifact::Digest::of(function.as_bytes()).hex();
    let hash = u16::from_str_radix(&hash[..4], 16).expect("hex digits");
    let span = POOL_PORTS.end - POOL_PORTS.start;
    let start = hash % span;
    (0..span)
        .map(|offset| POOL_PORTS.start + (start + offset) % span)
        .find(|port| !taken.contains(port))
}

/// `bytes` as people write it: `2Gi` when whole gibibytes, else mebibytes, rounded up.
fn quantity(bytes: u64) -> Quantity {
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    match bytes % GI {
        0 => Quantity(format!("{}Gi", bytes / GI)),
        _ => Quantity(format!("{}Mi", bytes.div_ceil(MI))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_code_store::{NodeCodeStore, NodeCodeStoreSetting};

    #[test]
    fn quantities_read_as_people_write_them() {
        assert_eq!(quantity(1 << 30).0, "1Gi");
        assert_eq!(quantity(3 << 30).0, "3Gi");
        assert_eq!(quantity(1536 << 20).0, "1536Mi");
        assert_eq!(quantity((1 << 20) + 1).0, "2Mi");
        for bytes in [1 << 30, 1536 << 20, 5 << 30] {
            assert_eq!(wasmless_formats::quantity::parse_bytes(&quantity(bytes).0), Ok(bytes));
        }
    }

    #[test]
    fn with_the_node_code_store_a_pool_pod_reaches_its_agent_through_a_read_only_volume() {
        let pod = |node_code_store: NodeCodeStore| {
            let settings = Settings {
                node_code_store,
                ..Settings::new("wasmless/runtime:0.1.0", "wasmless/builder:0.1.0")
            };
            pool_deployment("team-a", &settings)
                .spec
                .unwrap()
                .template
                .spec
                .unwrap()
        };
        let auto = NodeCodeStore::new(NodeCodeStoreSetting::Auto);
        let before_the_driver = pod(auto.clone());
        assert_eq!(before_the_driver, pod(NodeCodeStore::new(NodeCodeStoreSetting::False)));
        let without = before_the_driver;
        assert!(
            !without.containers[0]
                .args
                .as_ref()
                .unwrap()
                .contains(&"--code-store".to_string())
        );
        assert_eq!(without.volumes.unwrap().len(), 1);

        let with = pod(NodeCodeStore::new(NodeCodeStoreSetting::True));
        auto.driver_seen(true);
        assert_eq!(pod(auto), with, "auto, once the driver is installed");
        let volume = with
            .volumes
            .unwrap()
            .into_iter()
            .find(|volume| volume.csi.is_some())
            .unwrap();
        let csi = volume.csi.unwrap();
        assert_eq!((csi.driver.as_str(), csi.read_only), ("code.wasmless.io", Some(true)));
        let container = &with.containers[0];
        let mounted = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|mount| mount.name == volume.name)
            .unwrap();
        assert_eq!(mounted.read_only, Some(true));
        let args = container.args.as_ref().unwrap();
        let socket = &args[args.iter().position(|arg| arg == "--code-store").unwrap() + 1];
        assert_eq!(socket, &format!("{}/agent.sock", mounted.mount_path));
    }
}
