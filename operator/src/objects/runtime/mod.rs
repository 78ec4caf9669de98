//! The runtime Deployment serving a module: its pod template, volumes and probes. The
//! runtime's flags are written in `args`, its routes in `routes`, its environment in `env`,
//! and the identity that reads its chunks in `chunk_reader`.

mod args;
mod chunk_reader;
mod env;
mod routes;

pub(in crate::objects) use args::args_with_locations;
pub use args::{function_args, runtime_args, split_args};
pub use chunk_reader::{chunk_configmap_names, chunk_reader_name, chunk_reader_rbac};
use env::runtime_env;
pub use env::{Expansion, function_env, handler_env_from};
pub use env::{HANDLER_ENV_PREFIX, POD_IP_ENV, outbound_header_env};
pub use routes::{
    mounted_revisions, reads_chunks_through_api, reads_routes_documents, routes_configmap, routes_configmap_document,
    routes_configmap_name, routes_document, routes_generation, routes_json, routes_json_for, routes_json_reading,
    routes_of_document, template_without_revisions, traffic_summary,
};

use super::pod::{
    empty_dir, mount, restricted_container_security, restricted_pod_security, runtime_settings_env,
    with_node_code_store,
};
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
use std::collections::BTreeMap;
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
/// The pod annotation the runtime serves from first: its own `--traffic-file`, a routes
/// document ([`routes_document`]) naming the revisions requests go to, with where each is
/// and its digests. The operator writes it on a running pod to move the pod's requests to
/// other revisions in place; the pod template has none (a pod started later serves its
/// Function's [`routes_configmap`]). On the Deployment itself it records what serves.
pub const ROUTES_ANNOTATION: &str = "wasmless.io/routes";
/// Where the downward API volume puts [`ROUTES_ANNOTATION`].
const ROUTES_DIR: &str = "/etc/wasmless/routes";
const ROUTES_FILE: &str = "traffic.json";
/// The downward API volume of [`ROUTES_ANNOTATION`]: a pod without it (made by an older
/// operator) is never switched in place.
pub const ROUTES_VOLUME: &str = "routes";
/// Where the Function's [`routes_configmap`] is mounted: the pods' second `--traffic-file`.
const FUNCTION_ROUTES_DIR: &str = "/etc/wasmless/function-routes";
const FUNCTION_ROUTES_VOLUME: &str = "function-routes";
/// The pod template annotation of a new Function's pods, started while its first build
/// runs: the template that waits, which the build's reconcile keeps until one of its pods
/// has switched to what was built.
pub const WAITING_ANNOTATION: &str = "wasmless.io/waiting-for-first-build";
/// The Deployment annotation of its pod template's digest without the revisions it mounts
/// (`template_digest`): what a change of routes alone leaves as it is.
pub const TEMPLATE_DIGEST_ANNOTATION: &str = "wasmless.io/template-digest";
/// The component label of a Function's routes ConfigMap.
pub const ROUTES_COMPONENT: &str = "routes";
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
    if let Some(hash) = config_hash {
        annotations.insert(CONFIG_HASH_ANNOTATION.into(), hash.to_string());
    }
    if serving.routes.is_empty() {
        annotations.insert(WAITING_ANNOTATION.into(), "true".into());
    }
    let mut volumes = vec![
        empty_dir("cache", "512Mi"),
        routes_volume(),
        function_routes_volume(func),
    ];
    let mut mounts = vec![
        mount("cache", CACHE_DIR, false),
        mount(ROUTES_VOLUME, ROUTES_DIR, true),
        mount(FUNCTION_ROUTES_VOLUME, FUNCTION_ROUTES_DIR, true),
    ];
    for (index, share) in serving.mounted().enumerate() {
        let name = format!("revision-{index}");
        if let Some(chunks) = chunk_volume(func, &share.module, &name) {
            volumes.push(chunks);
            mounts.push(mount(&name, &format!("{REVISIONS_DIR}/{}", share.revision), true));
        }
    }
    if let Some(bundle) = outbound_ca(func) {
        volumes.push(outbound_ca_volume(bundle));
        mounts.push(mount("outbound-ca", OUTBOUND_CA_DIR, true));
    }
    let mut args = function_args(func);
    // The pod's own routes first: they win a tie of generations.
    args.extend([
        "--traffic-file".into(),
        format!("{ROUTES_DIR}/{ROUTES_FILE}"),
        "--traffic-file".into(),
        format!("{FUNCTION_ROUTES_DIR}/{ROUTES_FILE}"),
    ]);
    // The code the pool maps on this node, mapped here too: one copy for both.
    with_node_code_store(settings, &mut volumes, &mut mounts, &mut args);
    let container = Container {
        volume_mounts: Some(mounts),
        args: Some(args),
        ..runtime_container(func, settings)
    };
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
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
    };
    let mut annotations = serving_annotations(serving);
    annotations.insert(
        TEMPLATE_DIGEST_ANNOTATION.into(),
        template_digest(&template).to_string(),
    );
    let mut metadata = meta(func, func.name_any(), labels.clone());
    metadata.annotations = Some(annotations);
    Deployment {
        metadata,
        spec: Some(DeploymentSpec {
            replicas: Some(func.spec.replicas),
            revision_history_limit: Some(3),
            selector: LabelSelector {
                match_labels: Some(labels),
                ..Default::default()
            },
            strategy: Some(surge_strategy()),
            template,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The ConfigMap key of the Function's extra CA certificates, as the one file the runtime reads.
fn outbound_ca_volume(bundle: &crate::crd::CaBundle) -> Volume {
    Volume {
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
    }
}

/// The digest of a pod template as the operator wrote it, without the revisions it mounts:
/// two templates with the same digest differ in those alone, whatever the API server
/// defaulted or anyone else added to the live one.
fn template_digest(template: &PodTemplateSpec) -> Digest {
    Digest::of(&serde_json::to_vec(&template_without_revisions(template)).expect("a pod template serializes"))
}

/// What a Function's Deployment serves, on the Deployment itself (not its pod template,
/// which a change of routes alone leaves as it is): the primary revision's module (none
/// yet while a new Function's first build runs), the routes and a split's summary.
fn serving_annotations(serving: &Serving) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::new();
    if let Some(primary) = primary(&serving.routes) {
        primary.module.write_pod_annotations(&mut annotations);
    }
    annotations.insert(ROUTES_ANNOTATION.into(), routes_json(&serving.routes));
    if serving.is_split() {
        annotations.insert(TRAFFIC_ANNOTATION.into(), traffic_summary(&serving.routes));
    }
    annotations
}

/// The Function's [`routes_configmap`] as the pods' second traffic file.
fn function_routes_volume(func: &Function) -> Volume {
    Volume {
        name: FUNCTION_ROUTES_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: routes_configmap_name(&func.name_any()),
            optional: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether a Deployment's pod template is the one a new Function's pods wait for its first
/// build with (an older operator's named no revision in its routes annotation).
pub fn waits_for_first_build(deployment: &Deployment) -> bool {
    let annotations = deployment
        .spec
        .as_ref()
        .and_then(|spec| spec.template.metadata.as_ref()?.annotations.as_ref());
    annotations.is_some_and(|annotations| {
        annotations.contains_key(WAITING_ANNOTATION)
            || annotations.get(ROUTES_ANNOTATION).is_some_and(|routes| routes == "[]")
    })
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
