//! The runtime Deployment serving a module, and `runtime_args`: the one place the runtime's
//! flags are written (the operator's half of the contract with `wasmless-runtime`'s `Config`).

use super::pod::{empty_dir, mount, restricted_container_security, restricted_pod_security, runtime_settings_env};
use super::{labels_for, meta, prometheus_annotations};
use crate::crd::{Function, Isolation};
use crate::module::{Module, ModuleLocation};
use crate::references::CONFIG_HASH_ANNOTATION;
use crate::settings::Settings;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, ConfigMapKeySelector, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvFromSource, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, SecretEnvSource, SecretKeySelector,
    ServiceAccount, Volume, VolumeProjection,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use wasmless_artifact::{Digest, Part, ports};

/// How long a terminating runtime pod keeps accepting and serving after SIGTERM (the
/// runtime's `--drain-delay`, with readiness already false): the time kube-proxy (and any
/// other endpoint watcher) needs to stop routing new requests to it. Without it a rolling
/// update refuses the requests that are still routed to old pods.
pub const DRAIN_DELAY_SECONDS: i64 = 5;
/// Then the time requests in flight get to finish (the runtime's `--shutdown-grace`).
pub const SHUTDOWN_GRACE_SECONDS: i64 = 30;
/// The pod's `terminationGracePeriodSeconds`: above the drain delay and the grace
/// together, so the kubelet's SIGKILL never cuts a drain short.
pub const TERMINATION_GRACE_PERIOD_SECONDS: i64 = DRAIN_DELAY_SECONDS + SHUTDOWN_GRACE_SECONDS + 5;
/// Where the chunk ConfigMaps (module and code) are mounted, one projected volume.
const MODULE_DIR: &str = "/module";
/// Where each revision a pod has is mounted (the ones it serves and its standby), in a
/// directory named after it.
pub const REVISIONS_DIR: &str = "/revisions";
/// The pod annotation that says which revisions a split's pods serve, and their shares.
pub const TRAFFIC_ANNOTATION: &str = "wasmless.io/traffic";
/// The pod annotation the runtime serves from: its `--traffic-file`, a JSON list of the
/// revisions requests go to, with where each is and its digests. The operator rewrites it
/// on a running pod to move the pod's requests to revisions the pod has mounted.
pub const ROUTES_ANNOTATION: &str = "wasmless.io/routes";
/// Where the downward API volume puts [`ROUTES_ANNOTATION`].
const ROUTES_DIR: &str = "/etc/wasmless/routes";
const ROUTES_FILE: &str = "traffic.json";
/// The downward API volume of [`ROUTES_ANNOTATION`]: a pod without it (made by an older
/// operator) is never switched in place.
pub const ROUTES_VOLUME: &str = "routes";
/// The runtime's compiled-code cache, an emptyDir.
const CACHE_DIR: &str = "/cache";
/// Where `outbound.caBundle`'s key is mounted, as [`OUTBOUND_CA_FILE`]: the runtime's
/// `--outbound-ca`.
const OUTBOUND_CA_DIR: &str = "/etc/wasmless/outbound-ca";
const OUTBOUND_CA_FILE: &str = "ca.pem";

/// The Function's `outbound.caBundle`, if any.
fn outbound_ca(func: &Function) -> Option<&crate::crd::CaBundle> {
    func.spec.outbound.as_ref()?.ca_bundle.as_ref()
}

/// What a Function's pods serve: the revisions requests go to (one, or a split's), and
/// the revision mounted beside them that takes none (the one `wasmless rollback` goes
/// back to), so that a switch to it moves running pods in place instead of new ones.
#[derive(Clone, Debug, PartialEq)]
pub struct Serving {
    /// Their percents add up to 100; none while a new Function's first build runs.
    pub routes: Vec<Share>,
    pub standby: Option<Share>,
    /// The Function's chunk reader ([`chunk_reader_name`]) when the pods run as it, with
    /// its token, to read a revision built after they started from the API; `None`: the
    /// namespace's default account without a token.
    pub chunk_reader: Option<String>,
}

impl Serving {
    /// Several revisions take requests.
    pub fn is_split(&self) -> bool {
        self.routes.len() > 1
    }

    /// Every revision the pods have mounted (the served ones, then the standby).
    fn mounted(&self) -> impl Iterator<Item = &Share> {
        self.routes.iter().chain(self.standby.iter())
    }
}

/// The share with the most requests (the first of equals): the one whose module the pods'
/// module annotations name, and whose predecessor is the standby.
pub fn primary(shares: &[Share]) -> Option<&Share> {
    shares.iter().rev().max_by_key(|share| share.percent)
}

/// One revision of a traffic split, as the pods serve it.
#[derive(Clone, Debug, PartialEq)]
pub struct Share {
    /// `<function>-<n>`: the runtime labels the revision's metrics with it.
    pub revision: String,
    pub module: Module,
    pub percent: u8,
    pub tag: Option<String>,
}

/// The runtime Deployment serving `serving`: each of its revisions (and the standby)
/// mounted under [`REVISIONS_DIR`], and the runtime following [`ROUTES_ANNOTATION`]
/// through a downward API file, so the operator can move running pods between those
/// revisions by annotating them. Everything in the pod template is a function of the
/// spec, the revisions and `config_hash` (over the versions of the Secrets and ConfigMaps
/// the pods read, `references::config_hash`), so an unchanged module and configuration
/// apply an identical template and restart nothing, and a changed Secret rolls the pods,
/// which read it only when they start.
pub fn deployment(func: &Function, settings: &Settings, serving: &Serving, config_hash: Option<&Digest>) -> Deployment {
    let labels = labels_for(func, "runtime");
    let mut annotations = prometheus_annotations();
    // No revision yet: the pods of a new Function start while its first build runs, and
    // wait for the operator to name one in their routes.
    if let Some(primary) = primary(&serving.routes) {
        primary.module.write_pod_annotations(&mut annotations);
    }
    if let Some(hash) = config_hash {
        annotations.insert(CONFIG_HASH_ANNOTATION.into(), hash.to_string());
    }
    annotations.insert(ROUTES_ANNOTATION.into(), routes_json(&serving.routes));
    if serving.is_split() {
        annotations.insert(TRAFFIC_ANNOTATION.into(), traffic_summary(&serving.routes));
    }
    let mut volumes = vec![empty_dir("cache", "512Mi"), routes_volume()];
    let mut mounts = vec![mount("cache", CACHE_DIR, false), mount(ROUTES_VOLUME, ROUTES_DIR, true)];
    for (index, share) in serving.mounted().enumerate() {
        let name = format!("revision-{index}");
        if let Some(chunks) = chunk_volume(func, &share.module, &name) {
            volumes.push(chunks);
            mounts.push(mount(&name, &format!("{REVISIONS_DIR}/{}", share.revision), true));
        }
    }
    if let Some(bundle) = outbound_ca(func) {
        volumes.push(Volume {
            name: "outbound-ca".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: bundle.config_map_key_ref.name.clone(),
                items: Some(vec![KeyToPath {
                    key: bundle.config_map_key_ref.key.clone(),
                    path: OUTBOUND_CA_FILE.into(),
                    ..Default::default()
                }]),
                optional: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount("outbound-ca", OUTBOUND_CA_DIR, true));
    }
    let mut args = function_args(func);
    args.extend(["--traffic-file".into(), format!("{ROUTES_DIR}/{ROUTES_FILE}")]);
    let container = Container {
        volume_mounts: Some(mounts),
        args: Some(args),
        ..runtime_container(func, settings)
    };
    Deployment {
        metadata: meta(func, func.name_any(), labels.clone()),
        spec: Some(DeploymentSpec {
            replicas: Some(func.spec.replicas),
            revision_history_limit: Some(3),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            strategy: Some(surge_strategy()),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    // A handler has no business with the Kubernetes API (it sees none of
                    // the pod's files); the runtime reads its own revisions' chunks there,
                    // where the pods run as the Function's chunk reader.
                    service_account_name: serving.chunk_reader.clone(),
                    automount_service_account_token: Some(serving.chunk_reader.is_some()),
                    enable_service_links: Some(false),
                    security_context: Some(restricted_pod_security()),
                    containers: vec![container],
                    // No preStop sleep: the runtime's own drain delay keeps it serving.
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

/// The `runtime` container, without its arguments and volume mounts.
fn runtime_container(func: &Function, settings: &Settings) -> Container {
    let probe = admin_probe;
    Container {
        name: "runtime".into(),
        image: Some(settings.runtime_image.clone()),
        ports: Some(vec![
            container_port("http", ports::HTTP),
            container_port("metrics", ports::ADMIN),
        ]),
        // Every second: the kubelet probes as soon as it sees the container started, which
        // can be before the runtime listens, and the pod then takes traffic only from the
        // next probe on (a new pod on the test cluster once waited 2 s for it).
        readiness_probe: Some(probe("/readyz", 1)),
        liveness_probe: Some(probe("/healthz", 10)),
        env: Some(runtime_env(func, settings)),
        env_from: Some(handler_env_from(func)).filter(|env_from| !env_from.is_empty()),
        resources: func.spec.resources.clone(),
        security_context: Some(restricted_container_security()),
        ..Default::default()
    }
}

/// The runtime's command line for serving `module` as `func` asks: the operator's half of
/// the contract whose other half is `wasmless_runtime::config::Config` (the `cli` crate's
/// tests parse these with it). Their order is part of the pod template, so it stays.
pub fn runtime_args(func: &Function, module: &Module) -> Vec<String> {
    // The code sits where the module does: in the same chunk volume, or as a layer of the
    // same OCI artifact.
    let location = match &module.location {
        ModuleLocation::ConfigMaps { .. } => MODULE_DIR.to_string(),
        ModuleLocation::Oci { reference } => format!("{}{reference}", wasmless_artifact::oci::SCHEME),
    };
    args_with_locations(func, module, location.clone(), location)
}

/// [`runtime_args`] with the module and its code read from the given `--module` and
/// `--code` locations.
pub(super) fn args_with_locations(
    func: &Function,
    module: &Module,
    location: String,
    code_location: String,
) -> Vec<String> {
    let mut args = vec![
        "--module".into(),
        location,
        "--module-digest".into(),
        module.digest.to_string(),
    ];
    args.extend(function_args(func));
    if let Some(code) = &module.code {
        args.extend([
            "--code".into(),
            code_location,
            "--code-digest".into(),
            code.digest.to_string(),
        ]);
    }
    args
}

/// The runtime's command line for serving the revisions of a traffic split side by side
/// (`--traffic`), each read from its directory under [`REVISIONS_DIR`] or its OCI artifact.
pub fn split_args(func: &Function, shares: &[Share]) -> Vec<String> {
    let mut args = function_args(func);
    args.extend(["--traffic".into(), routes_json(shares)]);
    args
}

/// `--traffic`'s JSON list (and [`ROUTES_ANNOTATION`]'s) for `shares`, each read from its
/// directory under [`REVISIONS_DIR`] or its OCI artifact.
pub fn routes_json(shares: &[Share]) -> String {
    routes_json_reading(shares, |_| true, "").expect("every revision mounted")
}

/// [`routes_json`] for a pod that has only the revisions `mounted` says under
/// [`REVISIONS_DIR`]: a revision in ConfigMaps it has not is read through the API
/// (`configmaps:<function>/<source digest>/<count>`) where `function` is given (the pod
/// runs as its chunk reader), else the pod cannot serve it (`None`).
pub fn routes_json_reading(shares: &[Share], mounted: impl Fn(&str) -> bool, function: &str) -> Option<String> {
    let mut targets = Vec::with_capacity(shares.len());
    for share in shares {
        let code = share.module.code.as_ref();
        let (module, code_location) = match &share.module.location {
            ModuleLocation::ConfigMaps { .. } if mounted(&share.revision) => {
                let dir = format!("{REVISIONS_DIR}/{}", share.revision);
                (dir.clone(), dir)
            }
            ModuleLocation::ConfigMaps { .. } if function.is_empty() => return None,
            ModuleLocation::ConfigMaps { count } => {
                let digest = &share.module.source_digest;
                let code_chunks = code.map_or(0, |code| code.chunks);
                (
                    format!("configmaps:{function}/{digest}/{count}"),
                    format!("configmaps:{function}/{digest}/{code_chunks}"),
                )
            }
            ModuleLocation::Oci { reference } => {
                let location = format!("{}{reference}", wasmless_artifact::oci::SCHEME);
                (location.clone(), location)
            }
        };
        targets.push(serde_json::json!({
            "revision": share.revision,
            "percent": share.percent,
            "tag": share.tag,
            "module": module,
            "moduleDigest": share.module.digest.to_string(),
            "code": code.map(|_| code_location),
            "codeDigest": code.map(|code| code.digest.to_string()),
        }));
    }
    Some(serde_json::Value::from(targets).to_string())
}

/// The ServiceAccount (and Role, and RoleBinding) of `function`'s pods where its revisions
/// are in ConfigMaps.
pub fn chunk_reader_name(function: &str) -> String {
    format!("{function}-chunk-reader")
}

/// The chunk ConfigMaps of `module` (the module's and its code's), by name.
pub fn chunk_configmap_names(function: &str, module: &Module) -> Vec<String> {
    let ModuleLocation::ConfigMaps { count } = module.location else {
        return Vec::new();
    };
    let mut names = Part::Module.configmap_names(function, &module.source_digest, count);
    if let Some(code) = &module.code {
        names.extend(Part::Code.configmap_names(function, &module.source_digest, code.chunks));
    }
    names
}

/// The identity `func`'s pods read its revisions' chunks with: a ServiceAccount whose Role
/// may `get` the ConfigMaps `chunks` names and nothing else (the admission policy refuses
/// any other rule under this name), so a revision built after a pod started can be
/// switched to in place.
pub fn chunk_reader_rbac(
    func: &Function,
    chunks: &std::collections::BTreeSet<String>,
) -> (ServiceAccount, Role, RoleBinding) {
    let name = chunk_reader_name(&func.name_any());
    let labels = labels_for(func, "chunk-reader");
    let account = ServiceAccount {
        metadata: meta(func, name.clone(), labels.clone()),
        ..Default::default()
    };
    let role = Role {
        metadata: meta(func, name.clone(), labels.clone()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(chunks.iter().cloned().collect()),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
    };
    let binding = super::own_account_binding(meta(func, name, labels));
    (account, role, binding)
}

/// The pod's own [`ROUTES_ANNOTATION`] as the file `--traffic-file` reads.
fn routes_volume() -> Volume {
    Volume {
        name: ROUTES_VOLUME.into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![DownwardAPIVolumeFile {
                path: ROUTES_FILE.into(),
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.annotations['{ROUTES_ANNOTATION}']"),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `hello-1 90%, hello-2 10% (canary)`: a split for people, in the pods' annotation and
/// the Function's status.
pub fn traffic_summary(shares: &[Share]) -> String {
    shares
        .iter()
        .map(|share| match &share.tag {
            Some(tag) => format!("{} {}% ({tag})", share.revision, share.percent),
            None => format!("{} {}%", share.revision, share.percent),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every runtime flag but where the module and its code are: the Function's name, ports,
/// limits and outbound policy.
fn function_args(func: &Function) -> Vec<String> {
    let limits = &func.spec.limits;
    let mut args: Vec<String> = [
        ("--function", func.name_any()),
        ("--port", ports::HTTP.to_string()),
        ("--admin-port", ports::ADMIN.to_string()),
        ("--memory-limit", limits.memory.clone()),
        ("--timeout", limits.timeout.clone()),
        ("--max-concurrency", limits.max_concurrency.to_string()),
        ("--max-request-body", limits.max_request_body.clone()),
        ("--cache-dir", CACHE_DIR.into()),
        // The module is pinned by digest and its ConfigMaps are never rewritten (their names
        // carry the source digest): there is nothing to watch for.
        ("--watch-interval", "0".into()),
        ("--drain-delay", format!("{DRAIN_DELAY_SECONDS}s")),
        ("--shutdown-grace", format!("{SHUTDOWN_GRACE_SECONDS}s")),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value])
    .collect();
    // Only when asked: a flag the runtime defaults anyway would change every Function's
    // pod template, and so restart every pod, when the operator is upgraded.
    if limits.isolation == Isolation::Shared {
        args.extend(["--isolation".into(), "shared".into()]);
    }
    if let Some(outbound) = &func.spec.outbound {
        for pattern in &outbound.allow {
            args.extend(["--outbound-allow".into(), pattern.clone()]);
        }
        args.extend([
            "--outbound-timeout".into(),
            outbound.timeout.clone(),
            "--outbound-max-response-body".into(),
            outbound.max_response_body.clone(),
            "--outbound-max-concurrency".into(),
            outbound.max_concurrency.to_string(),
        ]);
        if outbound.ca_bundle.is_some() {
            args.extend(["--outbound-ca".into(), format!("{OUTBOUND_CA_DIR}/{OUTBOUND_CA_FILE}")]);
        }
        for (index, header) in outbound.headers.iter().enumerate() {
            // The value is in the environment variable the runtime reads; the argument
            // names it, so no Secret value is ever written into the Deployment.
            let mut flag = format!("{} {} {}", header.url, header.name, outbound_header_env(index));
            if header.allow_insecure == Some(true) {
                // The runtime's own opt-in: it sends no header over plain http without it.
                flag.push_str(" allow-insecure");
            }
            args.extend(["--outbound-header".into(), flag]);
        }
    }
    args
}

/// Prefix of the container variables that are the handler's environment: the runtime hands
/// the handler every variable that has it, without it, and no other.
pub const HANDLER_ENV_PREFIX: &str = "WASMLESS_HANDLER_ENV_";
/// The pod's IP, from the downward API: the runtime refuses outbound calls to its own admin
/// port on it.
pub const POD_IP_ENV: &str = "WASMLESS_POD_IP";

/// The container variable holding the value of `outbound.headers[index]`, which the
/// runtime reads and the handler never sees.
pub fn outbound_header_env(index: usize) -> String {
    format!("WASMLESS_OUTBOUND_HEADER_{index}")
}

/// The runtime container's environment: the operator's settings, the pod's IP, the
/// outbound headers' Secrets, and the handler's `env`, each under [`HANDLER_ENV_PREFIX`].
/// Values from Secrets and ConfigMaps are references the kubelet resolves when the pod
/// starts: they are never in the Deployment, and the operator never reads them.
fn runtime_env(func: &Function, settings: &Settings) -> Vec<EnvVar> {
    let mut env: Vec<EnvVar> = runtime_settings_env(settings).collect();
    env.push(EnvVar {
        name: POD_IP_ENV.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    env.extend(function_env(func, Expansion::Kubelet));
    env
}

/// Whether a literal value is read by the kubelet, which expands `$(NAME)` and turns `$$`
/// into `$` (a pod's container), or taken as is (the pool's entry).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Expansion {
    Kubelet,
    None,
}

/// The Function's own variables: its outbound headers' values and its handler's `env`,
/// under the names the runtime reads them by.
pub(super) fn function_env(func: &Function, expansion: Expansion) -> Vec<EnvVar> {
    let mut env = Vec::new();
    let headers = func.spec.outbound.iter().flat_map(|outbound| &outbound.headers);
    env.extend(headers.enumerate().map(|(index, header)| {
        let secret = &header.value_from.secret_key_ref;
        EnvVar {
            name: outbound_header_env(index),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.name.clone(),
                    key: secret.key.clone(),
                    optional: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }));
    env.extend(func.spec.env.iter().map(|var| handler_env_var(var, expansion)));
    env
}

/// One variable of the handler's environment as a container variable. For the kubelet, a
/// literal value has every `$` doubled: it expands `$(NAME)` in container variables and
/// turns `$$` into `$`, and the handler must get exactly what the Function says.
fn handler_env_var(var: &crate::crd::EnvVar, expansion: Expansion) -> EnvVar {
    let source = var.value_from.as_ref();
    let literal = var.value.as_deref().unwrap_or_default();
    EnvVar {
        name: format!("{HANDLER_ENV_PREFIX}{}", var.name),
        value: match (source, expansion) {
            (Some(_), _) => None,
            (None, Expansion::Kubelet) => Some(literal.replace('$', "$$")),
            (None, Expansion::None) => Some(literal.to_string()),
        },
        value_from: source.map(|source| EnvVarSource {
            secret_key_ref: source.secret_key_ref.as_ref().map(|key| SecretKeySelector {
                name: key.name.clone(),
                key: key.key.clone(),
                optional: key.optional,
            }),
            config_map_key_ref: source.config_map_key_ref.as_ref().map(|key| ConfigMapKeySelector {
                name: key.name.clone(),
                key: key.key.clone(),
                optional: key.optional,
            }),
            ..Default::default()
        }),
    }
}

/// The Function's `envFrom`, each under [`HANDLER_ENV_PREFIX`] (and the entry's own prefix).
pub(super) fn handler_env_from(func: &Function) -> Vec<EnvFromSource> {
    func.spec
        .env_from
        .iter()
        .map(|source| EnvFromSource {
            prefix: Some(format!(
                "{HANDLER_ENV_PREFIX}{}",
                source.prefix.as_deref().unwrap_or_default()
            )),
            secret_ref: source.secret_ref.as_ref().map(|secret| SecretEnvSource {
                name: secret.name.clone(),
                optional: secret.optional,
            }),
            config_map_ref: source.config_map_ref.as_ref().map(|cm| ConfigMapEnvSource {
                name: cm.name.clone(),
                optional: cm.optional,
            }),
        })
        .collect()
}

/// One projected volume of the module's chunk ConfigMaps and its code's: the runtime reads
/// a directory of `NNNN.wasm.zst` chunks, and of `NNNN.cwasm.lz4` chunks for the code.
/// `None` for a module in a registry.
pub(super) fn chunk_volume(func: &Function, module: &Module, volume_name: &str) -> Option<Volume> {
    let ModuleLocation::ConfigMaps { count } = module.location else {
        return None;
    };
    let name = func.name_any();
    let code_chunks = module.code.as_ref().map_or(0, |code| code.chunks);
    let parts = (0..count)
        .map(|index| (Part::Module, index))
        .chain((0..code_chunks).map(|index| (Part::Code, index)));
    let sources = parts
        .map(|(part, index)| VolumeProjection {
            config_map: Some(ConfigMapProjection {
                name: part.configmap_name(&name, &module.source_digest, index),
                items: Some(vec![KeyToPath {
                    key: part.configmap_key().into(),
                    path: part.chunk_file_name(index),
                    ..Default::default()
                }]),
                optional: Some(false),
            }),
            ..Default::default()
        })
        .collect();
    Some(Volume {
        name: volume_name.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A rolling update that keeps every old pod serving until its replacement is ready.
pub(super) fn surge_strategy() -> DeploymentStrategy {
    DeploymentStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: Some(RollingUpdateDeployment {
            max_unavailable: Some(IntOrString::Int(0)),
            max_surge: Some(IntOrString::Int(1)),
        }),
    }
}

/// A probe of the runtime's admin port (`/readyz`, `/healthz`) every `period` seconds.
pub(super) fn admin_probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

pub(super) fn container_port(name: &str, port: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port.into(),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The kubelet's expansion of a container variable's value, after Kubernetes'
    /// `third_party/forked/golang/expansion/expand.go`: `$$` is `$`, `$(NAME)` is the value
    /// of an earlier variable (left as written when there is none), any other `$` stays.
    fn kubelet_expand(input: &str, defined: &BTreeMap<&str, &str>) -> String {
        let mut out = String::new();
        let mut rest = input;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(reference) = after.strip_prefix('(')
                && let Some(close) = reference.find(')')
            {
                let name = &reference[..close];
                match defined.get(name) {
                    Some(value) => out.push_str(value),
                    None => out.push_str(&format!("$({name})")),
                }
                rest = &reference[close + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn a_literal_value_reaches_the_handler_as_written() {
        let defined = BTreeMap::from([("WASMLESS_POD_IP", "10.0.0.7"), ("HOME", "/root")]);
        for value in [
            "plain",
            "$(WASMLESS_POD_IP)",
            "$$(HOME)",
            "a$$b",
            "$",
            "cost: 5$",
            "$(",
            "$(UNDEFINED)",
            "x$$$(HOME)y",
        ] {
            let var = crate::crd::EnvVar {
                name: "V".into(),
                value: Some(value.into()),
                value_from: None,
            };
            let container_var = handler_env_var(&var, Expansion::Kubelet);
            assert_eq!(container_var.name, "WASMLESS_HANDLER_ENV_V");
            let written = container_var.value.unwrap();
            assert_eq!(kubelet_expand(&written, &defined), value, "written as {written:?}");
        }
        // The expansion above is the kubelet's: unescaped, these would not arrive intact.
        assert_eq!(kubelet_expand("$(HOME)", &defined), "/root");
        assert_eq!(kubelet_expand("a$$b", &defined), "a$b");
    }
}
