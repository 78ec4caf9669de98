//! The objects the operator writes for a Function, as pure functions of the Function,
//! the operator's settings and the module being served. Nothing here talks to the API.

use crate::crd::{Function, Isolation, Language, Storage};
use crate::settings::Settings;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
    PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    EmptyDirVolumeSource, EnvVar, HTTPGetAction, KeyToPath, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, SeccompProfile, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, Volume,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use std::collections::BTreeMap;
use wasmless_artifact::{Digest, Part, annotations, labels};

/// Field manager of every server-side apply.
pub const MANAGER: &str = "wasmless-operator";
/// ServiceAccount (and Role, RoleBinding) the build Jobs run as, one per namespace.
pub const BUILDER_ACCOUNT: &str = "wasmless-builder";
/// Which part of a function an object belongs to: `runtime`, `builder` or `source`.
pub const COMPONENT_LABEL: &str = "wasmless.io/component";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Pod template annotations that record which module a Deployment serves, so a
/// failed or running build can keep serving it.
pub const CHUNK_COUNT_ANNOTATION: &str = annotations::CHUNK_COUNT;
pub const SOURCE_DIGEST_ANNOTATION: &str = "wasmless.io/source-digest";
pub const MODULE_REF_ANNOTATION: &str = "wasmless.io/module-ref";
/// Pod template annotation: how many chunk ConfigMaps the compiled code has.
pub const CODE_CHUNK_COUNT_ANNOTATION: &str = "wasmless.io/code-chunk-count";
/// Key of the source in the source ConfigMap.
pub const SOURCE_KEY: &str = "source";

pub const HTTP_PORT: i32 = 8080;
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
/// Environment variable naming registries spoken to over plain HTTP (builder and runtime).
pub const OCI_PLAIN_HTTP_ENV: &str = "WASMLESS_OCI_PLAIN_HTTP";
pub const ADMIN_PORT: i32 = 9090;
/// The UID the images run as (distroless's `nonroot`).
pub const NON_ROOT_UID: i64 = 65532;
/// Memory limit of the builder container (a Go build of a handler needs ~1 GiB).
pub const BUILDER_MEMORY_LIMIT: &str = "2Gi";
/// Compiler output kept on status: the start of it, where the first error is.
pub const MAX_BUILD_MESSAGE_BYTES: usize = 4096;

/// A built module and where the runtime finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    pub digest: Digest,
    pub size: Option<u64>,
    /// The source it was built from (names the chunk ConfigMaps).
    pub source_digest: Digest,
    pub location: ModuleLocation,
    /// The builder's compiled code, stored beside the module: absent for a prebuilt module
    /// and for builds made before there was any (their pods compile the module).
    pub code: Option<Code>,
}

/// Compiled code, pinned by the digest of the stored artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    pub digest: Digest,
    /// Its chunk ConfigMaps `<fn>-code-<10 hex of source digest>-<i>`, when the module is
    /// stored in ConfigMaps (for OCI, the code is a layer of the module's artifact).
    pub chunks: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleLocation {
    /// `count` chunk ConfigMaps `<fn>-module-<10 hex of source digest>-<i>`.
    ConfigMaps { count: usize },
    /// An OCI reference the runtime pulls (`registry/repo@sha256:...`, without `oci://`).
    Oci { reference: String },
}

impl Module {
    /// What status.moduleRef says about it.
    pub fn reference(&self, function: &str) -> String {
        match &self.location {
            ModuleLocation::ConfigMaps { count } => format!(
                "configmap://{}-module-{}-{{0..{}}}",
                function,
                self.source_digest.short(),
                count.saturating_sub(1)
            ),
            ModuleLocation::Oci { reference } => format!("{}{reference}", wasmless_artifact::oci::SCHEME),
        }
    }
}

/// sha256 over what determines the module: language, builder version and source —
/// the same digest the builder computes for a single-file source.
pub fn source_digest(language: Language, builder_version: &str, source: &str) -> Digest {
    Digest::of_source(language.as_str(), builder_version, source.as_bytes())
}

pub fn source_configmap_name(function: &str, source_digest: &Digest) -> String {
    format!("{function}-source-{}", source_digest.short())
}

pub fn job_name(function: &str, source_digest: &Digest) -> String {
    format!("{function}-build-{}", source_digest.short())
}

pub fn service_name(func: &Function) -> String {
    func.spec.service.clone().unwrap_or_else(|| func.name_any())
}

pub fn url(func: &Function) -> String {
    format!(
        "http://{}.{}.svc.cluster.local:{}",
        service_name(func),
        func.namespace().unwrap_or_default(),
        func.spec.server_port
    )
}

fn owner(func: &Function) -> Vec<OwnerReference> {
    use kube::Resource;
    func.controller_owner_ref(&()).into_iter().collect()
}

fn labels_for(func: &Function, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::FUNCTION.to_string(), func.name_any()),
        (COMPONENT_LABEL.to_string(), component.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
    ])
}

/// The runtime pods' label selector in its string form (`a=b,c=d`), as the scale
/// subresource carries it.
pub fn runtime_selector(func: &Function) -> String {
    labels_for(func, "runtime")
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn meta(func: &Function, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: func.namespace(),
        labels: Some(labels),
        owner_references: Some(owner(func)),
        ..Default::default()
    }
}

/// The source of one digest, immutable: a build Job pending while the source changes
/// must never read the newer source and label its module with the older digest.
pub fn source_configmap(func: &Function, source: &str, digest: &Digest) -> ConfigMap {
    let mut labels = labels_for(func, "source");
    labels.insert(labels::SOURCE_DIGEST.into(), labels::digest_value(digest));
    let mut meta = meta(func, source_configmap_name(&func.name_any(), digest), labels);
    meta.annotations = Some(BTreeMap::from([(SOURCE_DIGEST_ANNOTATION.into(), digest.to_string())]));
    ConfigMap {
        metadata: meta,
        data: Some(BTreeMap::from([(SOURCE_KEY.into(), source.to_string())])),
        immutable: Some(true),
        ..Default::default()
    }
}

fn restricted_container_security() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NON_ROOT_UID),
        run_as_group: Some(NON_ROOT_UID),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..Default::default()
    }
}

fn restricted_pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NON_ROOT_UID),
        run_as_group: Some(NON_ROOT_UID),
        fs_group: Some(NON_ROOT_UID),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

fn empty_dir(name: &str, size_limit: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(size_limit.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        // `readOnly: false` is what the API server stores as no field at all.
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// Where the build publishes: `configmap://<ns>/<fn>` or `oci://<registry>/<ns>/<fn>:<10 hex>`.
pub fn publish_target(func: &Function, storage: Storage, settings: &Settings, digest: &Digest) -> Option<String> {
    let ns = func.namespace().unwrap_or_default();
    match storage {
        Storage::ConfigMap => Some(format!("configmap://{ns}/{}", func.name_any())),
        Storage::Oci => settings.oci_registry.as_ref().map(|registry| {
            format!(
                "oci://{}/{ns}/{}:{}",
                registry.trim_end_matches('/'),
                func.name_any(),
                digest.short()
            )
        }),
    }
}

/// The build Job of one source digest. Its name is deterministic, so an operator restart
/// or a repeated reconcile finds it instead of building again.
pub fn build_job(func: &Function, settings: &Settings, digest: &Digest, publish: &str) -> Job {
    let name = func.name_any();
    let source_file = func.spec.language.source_file_name();
    let mut labels = labels_for(func, "builder");
    labels.insert(labels::SOURCE_DIGEST.into(), labels::digest_value(digest));
    let env = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    };
    let container = Container {
        name: "builder".into(),
        image: Some(settings.builder_image.clone()),
        args: Some(vec![
            "build".into(),
            "--language".into(),
            func.spec.language.as_str().into(),
            "--source".into(),
            format!("/src/{source_file}"),
            "--output".into(),
            "/work/module.wasm".into(),
            "--publish".into(),
            publish.into(),
        ]),
        env: Some(
            vec![
                // The builder labels the chunks with the operator's digest (over language,
                // builder version and source), which it cannot compute itself.
                env("WASMLESS_SOURCE_DIGEST", digest.to_string()),
                // The chunks it publishes are owned by the Function, so they are collected with
                // it, even from a build that failed half-way or outlived its Function.
                env("WASMLESS_FUNCTION_UID", func.uid().unwrap_or_default()),
                env("HOME", "/tmp".into()),
                env("GOCACHE", "/tmp/go-cache".into()),
                env("CARGO_TARGET_DIR", "/tmp/target".into()),
            ]
            .into_iter()
            .chain(oci_plain_http_env(settings))
            .collect(),
        ),
        security_context: Some(restricted_container_security()),
        // The compiler's output reaches status even if the builder dies before writing
        // /dev/termination-log.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(vec![
            mount("source", "/src", true),
            mount("work", "/work", false),
            mount("tmp", "/tmp", false),
        ]),
        resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("500m".into())),
                ("memory".into(), Quantity("512Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".into(),
                Quantity(BUILDER_MEMORY_LIMIT.into()),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    Job {
        metadata: meta(func, job_name(&name, digest), labels.clone()),
        spec: Some(JobSpec {
            // A source that does not build (the builder's EXIT_SOURCE_DOES_NOT_BUILD) fails
            // again if retried: it ends the Job at once. A pod lost to an eviction or a
            // preemption does not count; anything else (the API server or the registry
            // failing the publish, out of memory, a node failing) is retried twice.
            backoff_limit: Some(2),
            pod_failure_policy: Some(PodFailurePolicy {
                rules: vec![
                    PodFailurePolicyRule {
                        action: "FailJob".into(),
                        on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                            container_name: Some("builder".into()),
                            operator: "In".into(),
                            values: vec![wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD],
                        }),
                        ..Default::default()
                    },
                    PodFailurePolicyRule {
                        action: "Ignore".into(),
                        on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                            type_: "DisruptionTarget".into(),
                            status: "True".into(),
                        }]),
                        ..Default::default()
                    },
                ],
            }),
            // A hung compiler fails the build instead of blocking it forever.
            active_deadline_seconds: Some(900),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    service_account_name: Some(BUILDER_ACCOUNT.into()),
                    // The builder writes the chunk ConfigMaps with this token.
                    automount_service_account_token: Some(true),
                    enable_service_links: Some(false),
                    security_context: Some(restricted_pod_security()),
                    containers: vec![container],
                    volumes: Some(vec![
                        Volume {
                            name: "source".into(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: source_configmap_name(&name, digest),
                                items: Some(vec![KeyToPath {
                                    key: SOURCE_KEY.into(),
                                    path: source_file.into(),
                                    ..Default::default()
                                }]),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        empty_dir("work", "1Gi"),
                        empty_dir("tmp", "4Gi"),
                    ]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The runtime Deployment serving `module`. Everything in the pod template is a function
/// of the spec and the module digest, so an unchanged module applies an identical
/// template and restarts nothing.
pub fn deployment(func: &Function, settings: &Settings, module: &Module) -> Deployment {
    let name = func.name_any();
    let spec = &func.spec;
    let labels = labels_for(func, "runtime");
    let module_arg = match &module.location {
        ModuleLocation::ConfigMaps { .. } => "/module".to_string(),
        ModuleLocation::Oci { reference } => format!("{}{reference}", wasmless_artifact::oci::SCHEME),
    };
    let mut args = vec![
        "--module".to_string(),
        module_arg,
        "--module-digest".into(),
        module.digest.to_string(),
        "--function".into(),
        name.clone(),
        "--port".into(),
        HTTP_PORT.to_string(),
        "--admin-port".into(),
        ADMIN_PORT.to_string(),
        "--memory-limit".into(),
        spec.limits.memory.clone(),
        "--timeout".into(),
        spec.limits.timeout.clone(),
        "--max-concurrency".into(),
        spec.limits.max_concurrency.to_string(),
        "--max-request-body".into(),
        spec.limits.max_request_body.clone(),
        "--cache-dir".into(),
        "/cache".into(),
        // The module is pinned by digest and its ConfigMaps are never rewritten (their names
        // carry the source digest): there is nothing to watch for.
        "--watch-interval".into(),
        "0".into(),
        "--drain-delay".into(),
        format!("{DRAIN_DELAY_SECONDS}s"),
        "--shutdown-grace".into(),
        format!("{SHUTDOWN_GRACE_SECONDS}s"),
    ];
    // Only when asked: a flag the runtime defaults anyway would change every Function's
    // pod template, and so restart every pod, when the operator is upgraded.
    if spec.limits.isolation == Isolation::Shared {
        args.extend(["--isolation".into(), "shared".into()]);
    }
    for var in &spec.env {
        args.push("--env".into());
        args.push(format!("{}={}", var.name, var.value));
    }
    let mut annotations = prometheus_annotations();
    if let Some(code) = &module.code {
        // The code sits where the module does: in the same chunk volume, or as a layer of
        // the same OCI artifact.
        let code_arg = match &module.location {
            ModuleLocation::ConfigMaps { .. } => "/module".to_string(),
            ModuleLocation::Oci { reference } => format!("{}{reference}", wasmless_artifact::oci::SCHEME),
        };
        args.extend([
            "--code".into(),
            code_arg,
            "--code-digest".into(),
            code.digest.to_string(),
        ]);
        annotations.insert(annotations::CODE_DIGEST.into(), code.digest.to_string());
        if code.chunks > 0 {
            annotations.insert(CODE_CHUNK_COUNT_ANNOTATION.into(), code.chunks.to_string());
        }
    }
    annotations.insert(annotations::MODULE_DIGEST.into(), module.digest.to_string());
    annotations.insert(SOURCE_DIGEST_ANNOTATION.into(), module.source_digest.to_string());
    if let Some(size) = module.size {
        annotations.insert(annotations::MODULE_SIZE.into(), size.to_string());
    }
    let mut volumes = vec![empty_dir("cache", "512Mi")];
    let mut mounts = vec![mount("cache", "/cache", false)];
    match &module.location {
        ModuleLocation::ConfigMaps { count } => {
            annotations.insert(CHUNK_COUNT_ANNOTATION.into(), count.to_string());
            // One projected volume: the runtime reads a directory of NNNN.wasm.zst chunks,
            // and of NNNN.cwasm.lz4 chunks for the compiled code.
            let code_chunks = module.code.as_ref().map_or(0, |code| code.chunks);
            let parts = (0..*count)
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
            volumes.push(Volume {
                name: "module".into(),
                projected: Some(ProjectedVolumeSource {
                    sources: Some(sources),
                    ..Default::default()
                }),
                ..Default::default()
            });
            mounts.push(mount("module", "/module", true));
        }
        ModuleLocation::Oci { reference } => {
            annotations.insert(MODULE_REF_ANNOTATION.into(), reference.clone());
        }
    }
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
    let container = Container {
        name: "runtime".into(),
        image: Some(settings.runtime_image.clone()),
        args: Some(args),
        ports: Some(vec![
            container_port("http", HTTP_PORT),
            container_port("metrics", ADMIN_PORT),
        ]),
        readiness_probe: Some(probe("/readyz", 2)),
        liveness_probe: Some(probe("/healthz", 10)),
        env: Some(oci_plain_http_env(settings).collect()).filter(|env: &Vec<EnvVar>| !env.is_empty()),
        resources: spec.resources.clone(),
        security_context: Some(restricted_container_security()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    Deployment {
        metadata: meta(func, name, labels.clone()),
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas),
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

/// The registries the operator was told to reach over plain HTTP, for the builder's push
/// and the runtime's pull (a registry on loopback needs no such word).
fn oci_plain_http_env(settings: &Settings) -> impl Iterator<Item = EnvVar> {
    settings.oci_plain_http.clone().into_iter().map(|registries| EnvVar {
        name: OCI_PLAIN_HTTP_ENV.into(),
        value: Some(registries),
        ..Default::default()
    })
}

fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

fn prometheus_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("prometheus.io/scrape".into(), "true".into()),
        ("prometheus.io/port".into(), ADMIN_PORT.to_string()),
        ("prometheus.io/path".into(), "/metrics".into()),
    ])
}

pub fn service(func: &Function) -> Service {
    let labels = labels_for(func, "runtime");
    let mut meta = meta(func, service_name(func), labels.clone());
    meta.annotations = Some(prometheus_annotations());
    let port = |name: &str, port: i32, target: &str| ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(target.into())),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(labels),
            ports: Some(vec![
                port("http", func.spec.server_port, "http"),
                port("metrics", ADMIN_PORT, "metrics"),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn builder_meta(namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(BUILDER_ACCOUNT.into()),
        namespace: Some(namespace.into()),
        labels: Some(BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGER.to_string())])),
        ..Default::default()
    }
}

/// The build Jobs' identity in a namespace: it may write ConfigMaps there and nothing else
/// (not even read them).
/// Shared by the namespace's Functions, so it carries no owner reference.
pub fn builder_rbac(namespace: &str) -> (ServiceAccount, Role, RoleBinding) {
    let account = ServiceAccount {
        metadata: builder_meta(namespace),
        ..Default::default()
    };
    let role = Role {
        metadata: builder_meta(namespace),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["configmaps".into()]),
            // The builder only server-side applies its chunks, which the API server
            // authorizes as `patch`, and as `create` for a chunk that did not exist.
            verbs: ["create", "patch"].map(String::from).to_vec(),
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: builder_meta(namespace),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: BUILDER_ACCOUNT.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: BUILDER_ACCOUNT.into(),
            namespace: Some(namespace.into()),
            ..Default::default()
        }]),
    };
    (account, role, binding)
}

/// The start of a compiler's output, at most [`MAX_BUILD_MESSAGE_BYTES`], cut on a
/// character boundary.
pub fn cut_message(message: &str) -> String {
    const MARK: &str = "\n… (cut to 4 KiB)";
    let message = message.trim_end();
    if message.len() <= MAX_BUILD_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut end = MAX_BUILD_MESSAGE_BYTES - MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &message[..end])
}
