//! The runtime Deployment serving a module, and `runtime_args`: the one place the runtime's
//! flags are written (the operator's half of the contract with `wasmless-runtime`'s `Config`).

use super::pod::{empty_dir, mount, oci_plain_http_env, restricted_container_security, restricted_pod_security};
use super::{labels_for, meta, prometheus_annotations};
use crate::crd::{Function, Isolation};
use crate::module::{Module, ModuleLocation};
use crate::settings::Settings;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, ContainerPort, EnvVar, HTTPGetAction, KeyToPath, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use wasmless_artifact::{Part, ports};

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
/// The runtime's compiled-code cache, an emptyDir.
const CACHE_DIR: &str = "/cache";

/// The runtime Deployment serving `module`. Everything in the pod template is a function
/// of the spec and the module digest, so an unchanged module applies an identical
/// template and restarts nothing.
pub fn deployment(func: &Function, settings: &Settings, module: &Module) -> Deployment {
    let labels = labels_for(func, "runtime");
    let mut annotations = prometheus_annotations();
    module.write_pod_annotations(&mut annotations);
    let mut volumes = vec![empty_dir("cache", "512Mi")];
    let mut mounts = vec![mount("cache", CACHE_DIR, false)];
    if let Some(chunks) = chunk_volume(func, module) {
        volumes.push(chunks);
        mounts.push(mount("module", MODULE_DIR, true));
    }
    let container = Container {
        volume_mounts: Some(mounts),
        ..runtime_container(func, settings, module)
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
            // Keep every old pod serving until its replacement is ready.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    // A handler has no business with the Kubernetes API.
                    automount_service_account_token: Some(false),
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

/// The `runtime` container, without its volume mounts.
fn runtime_container(func: &Function, settings: &Settings, module: &Module) -> Container {
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Default::default()
    };
    Container {
        name: "runtime".into(),
        image: Some(settings.runtime_image.clone()),
        args: Some(runtime_args(func, module)),
        ports: Some(vec![
            container_port("http", ports::HTTP),
            container_port("metrics", ports::ADMIN),
        ]),
        readiness_probe: Some(probe("/readyz", 2)),
        liveness_probe: Some(probe("/healthz", 10)),
        env: Some(oci_plain_http_env(settings).collect()).filter(|env: &Vec<EnvVar>| !env.is_empty()),
        resources: func.spec.resources.clone(),
        security_context: Some(restricted_container_security()),
        ..Default::default()
    }
}

/// The runtime's command line for serving `module` as `func` asks: the operator's half of
/// the contract whose other half is `wasmless_runtime::config::Config` (the `cli` crate's
/// tests parse these with it). Their order is part of the pod template, so it stays.
pub fn runtime_args(func: &Function, module: &Module) -> Vec<String> {
    let limits = &func.spec.limits;
    // The code sits where the module does: in the same chunk volume, or as a layer of the
    // same OCI artifact.
    let location = match &module.location {
        ModuleLocation::ConfigMaps { .. } => MODULE_DIR.to_string(),
        ModuleLocation::Oci { reference } => format!("{}{reference}", wasmless_artifact::oci::SCHEME),
    };
    let mut args: Vec<String> = [
        ("--module", location.clone()),
        ("--module-digest", module.digest.to_string()),
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
    for var in &func.spec.env {
        args.extend(["--env".into(), format!("{}={}", var.name, var.value)]);
    }
    if let Some(code) = &module.code {
        args.extend([
            "--code".into(),
            location,
            "--code-digest".into(),
            code.digest.to_string(),
        ]);
    }
    args
}

/// One projected volume of the module's chunk ConfigMaps and its code's: the runtime reads
/// a directory of `NNNN.wasm.zst` chunks, and of `NNNN.cwasm.lz4` chunks for the code.
/// `None` for a module in a registry.
fn chunk_volume(func: &Function, module: &Module) -> Option<Volume> {
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
        name: "module".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn container_port(name: &str, port: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port.into(),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}
