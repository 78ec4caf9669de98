//! The build Job of one source digest, and the identity build Jobs run as in a namespace.

use super::build_source::{inline_source, source_volume};
use super::pod::{empty_dir, mount, oci_plain_http_env, restricted_container_security, restricted_pod_security};
use super::{MANAGED_BY_LABEL, MANAGER, job_name, labels_for, meta, source_configmap_name};
use crate::crd::{Function, Storage};
use crate::settings::{BuildCache, Settings};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
    PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIProjection, DownwardAPIVolumeFile, EnvVar, HostPathVolumeSource,
    KeyToPath, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, ProjectedVolumeSource,
    ResourceRequirements, ServiceAccount, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use std::collections::BTreeMap;
use wasmless_artifact::{Digest, build_cache as cache_layout, labels};

/// ServiceAccount (and Role, RoleBinding) the build Jobs run as, one per namespace.
pub const BUILDER_ACCOUNT: &str = "wasmless-builder";
/// Memory limit of the builder container (a Go build of a handler needs ~1 GiB).
pub const BUILDER_MEMORY_LIMIT: &str = "2Gi";
/// Compiler output kept on status: the start of it, where the first error is.
pub const MAX_BUILD_MESSAGE_BYTES: usize = 4096;

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
///
/// Its pod runs the builder in steps (docs/security.md, door 2): with a persistent cache,
/// `prepare-cache` makes the namespace's directory in it; `builder` compiles the author's
/// source — running the author's code, a Rust crate's procedural macros — with no
/// ServiceAccount token and only its namespace's cache directory; `publish`, which runs no
/// author code, validates the module, compiles it to native code through a cache no compile
/// step mounts, and publishes both with the builder's token, mounted into it alone.
pub fn build_job(func: &Function, settings: &Settings, digest: &Digest, publish: &str) -> Job {
    let name = func.name_any();
    let source_file = func.spec.language.source_file_name();
    let mut labels = labels_for(func, "builder");
    labels.insert(labels::SOURCE_DIGEST.into(), labels::digest_value(digest));
    let (annotations, source) = match inline_source(func, source_file) {
        Some((annotations, volume)) => (Some(annotations), volume),
        None => (
            None,
            source_volume(&source_configmap_name(&name, digest), source_file, func),
        ),
    };
    let ns = func.namespace().unwrap_or_default();
    let prepare = (settings.build_cache != BuildCache::None).then(|| prepare_container(settings, &ns));
    Job {
        metadata: meta(func, job_name(&name, digest), labels.clone()),
        spec: Some(JobSpec {
            // A source that does not build fails again if retried; anything else is retried
            // twice (see `failure_policy`).
            backoff_limit: Some(2),
            pod_failure_policy: Some(failure_policy()),
            // A hung compiler fails the build instead of blocking it forever.
            active_deadline_seconds: Some(900),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations,
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    service_account_name: Some(BUILDER_ACCOUNT.into()),
                    // The token is mounted into the publish step only (`token_volume`).
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    security_context: Some(restricted_pod_security()),
                    init_containers: Some(
                        prepare
                            .into_iter()
                            .chain([compile_container(func, settings, digest, &ns)])
                            .collect(),
                    ),
                    containers: vec![publish_container(func, settings, digest, publish, &ns)],
                    volumes: Some(
                        [
                            source,
                            empty_dir("work", "1Gi"),
                            empty_dir("tmp", "4Gi"),
                            empty_dir(PUBLISH_TMP_VOLUME, "2Gi"),
                            token_volume(),
                        ]
                        .into_iter()
                        .chain(cache_volume(&settings.build_cache))
                        .collect(),
                    ),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The compile step's container name: the one whose exit code says the source does not build.
pub const COMPILE_CONTAINER: &str = "builder";
/// The publish step's container name: its termination message is the build's result line.
pub const PUBLISH_CONTAINER: &str = "publish";
/// Where the compile step leaves the module and its result line for the publish step.
const MODULE_PATH: &str = "/work/module.wasm";
const BUILD_RESULT_PATH: &str = "/work/build.json";
/// The publish step's own scratch space: the compile step shares `/tmp` and `/work`, and
/// could plant a cache there that the publish step would take native code from.
const PUBLISH_TMP_VOLUME: &str = "publish-tmp";
const TOKEN_VOLUME: &str = "publisher-token";
/// Where Kubernetes clients look for a pod's token, its CA and namespace.
const TOKEN_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    }
}

fn builder_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), Quantity("500m".into())),
            ("memory".into(), Quantity("512Mi".into())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".into(),
            Quantity(BUILDER_MEMORY_LIMIT.into()),
        )])),
        ..Default::default()
    }
}

/// A step of the build as a container of the builder's image.
fn step_container(
    name: &str,
    settings: &Settings,
    args: Vec<String>,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> Container {
    Container {
        name: name.into(),
        image: Some(settings.builder_image.clone()),
        args: Some(args),
        env: Some(env),
        security_context: Some(restricted_container_security()),
        // The compiler's output reaches status even if the builder dies before writing
        // /dev/termination-log.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        resources: Some(builder_resources()),
        ..Default::default()
    }
}

/// The persistent cache's root, mounted whole into the prepare step only.
fn prepare_container(settings: &Settings, ns: &str) -> Container {
    let args = ["prepare-cache", "--root", CACHE_ROOT_MOUNT, "--namespace", ns];
    let mut container = step_container(
        "prepare-cache",
        settings,
        args.map(String::from).to_vec(),
        Vec::new(),
        vec![mount(CACHE_VOLUME, CACHE_ROOT_MOUNT, false)],
    );
    container.resources = None;
    container
}

/// The compile step: the source mounted at `/src`, the module written to `/work`, its
/// namespace's cache directory (only) at `/cache`, and no token.
fn compile_container(func: &Function, settings: &Settings, digest: &Digest, ns: &str) -> Container {
    // A source with files is the directory of them all.
    let source = if func.spec.files.is_empty() {
        format!("/src/{}", func.spec.language.source_file_name())
    } else {
        "/src".to_string()
    };
    let args = [
        "build",
        "--language",
        func.spec.language.as_str(),
        "--source",
        &source,
        "--output",
        MODULE_PATH,
        "--no-code",
        "--result-file",
        BUILD_RESULT_PATH,
    ];
    // Only where set, so a build Job without it is the same object it always was.
    let go_proxy = settings.go_proxy.clone().map(|proxy| env("WASMLESS_GOPROXY", proxy));
    let cargo_registry = settings
        .cargo_registry
        .clone()
        .map(|registry| env("WASMLESS_CARGO_REGISTRY", registry));
    let fixed_env = [
        // The builder labels the chunks with the operator's digest (over language,
        // builder version and source), which it cannot compute itself.
        env("WASMLESS_SOURCE_DIGEST", digest.to_string()),
        env("HOME", "/tmp".into()),
    ];
    // With a persistent cache the builder keeps every cache in it; without, in the emptyDir.
    let cache_env = match settings.build_cache {
        BuildCache::None => vec![
            env("GOCACHE", "/tmp/go-cache".into()),
            env("CARGO_TARGET_DIR", "/tmp/target".into()),
        ],
        _ => vec![
            env("WASMLESS_BUILD_CACHE", BUILD_CACHE_MOUNT.into()),
            env("WASMLESS_COMPILER_CACHES_IN_CACHE_DIR", "true".into()),
        ],
    };
    let cache_mount = (settings.build_cache != BuildCache::None).then(|| VolumeMount {
        sub_path: Some(cache_layout::build_dir(ns)),
        ..mount(CACHE_VOLUME, BUILD_CACHE_MOUNT, false)
    });
    step_container(
        COMPILE_CONTAINER,
        settings,
        args.map(String::from).to_vec(),
        fixed_env
            .into_iter()
            .chain(cache_env)
            .chain(go_proxy)
            .chain(cargo_registry)
            .collect(),
        [
            mount("source", "/src", true),
            mount("work", "/work", false),
            mount("tmp", "/tmp", false),
        ]
        .into_iter()
        .chain(cache_mount)
        .collect(),
    )
}

/// The publish step: the module and result line from `/work`, read only; the code cache
/// that publish steps alone mount; the builder's token.
fn publish_container(func: &Function, settings: &Settings, digest: &Digest, publish: &str, ns: &str) -> Container {
    let args = [
        "publish",
        "--language",
        func.spec.language.as_str(),
        "--module",
        MODULE_PATH,
        "--build-result",
        BUILD_RESULT_PATH,
        "--publish",
        publish,
    ];
    let code_cache = match settings.build_cache {
        BuildCache::None => "/publish-tmp/code-cache",
        _ => CODE_CACHE_MOUNT,
    };
    let fixed_env = [
        env("WASMLESS_SOURCE_DIGEST", digest.to_string()),
        // The chunks it publishes are owned by the Function, so they are collected with
        // it, even from a build that failed half-way or outlived its Function.
        env("WASMLESS_FUNCTION_UID", func.uid().unwrap_or_default()),
        env("WASMLESS_CODE_CACHE", code_cache.into()),
        env("HOME", "/publish-tmp".into()),
        env("TMPDIR", "/publish-tmp".into()),
    ];
    let cache_mount = (settings.build_cache != BuildCache::None).then(|| VolumeMount {
        sub_path: Some(cache_layout::published_dir(ns)),
        ..mount(CACHE_VOLUME, CODE_CACHE_MOUNT, false)
    });
    step_container(
        PUBLISH_CONTAINER,
        settings,
        args.map(String::from).to_vec(),
        fixed_env.into_iter().chain(oci_plain_http_env(settings)).collect(),
        [
            mount("work", "/work", true),
            mount(PUBLISH_TMP_VOLUME, "/publish-tmp", false),
            mount(TOKEN_VOLUME, TOKEN_MOUNT, true),
        ]
        .into_iter()
        .chain(cache_mount)
        .collect(),
    )
}

/// The builder's token, CA and namespace, as the kubelet would mount them into every
/// container, for the publish step alone.
fn token_volume() -> Volume {
    Volume {
        name: TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(3607),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.namespace".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Where build Jobs' compile step mounts its namespace's directory of the persistent cache.
pub const BUILD_CACHE_MOUNT: &str = "/cache";
/// Where the publish step mounts the code cache, and the prepare step the cache's root.
const CODE_CACHE_MOUNT: &str = "/code-cache";
const CACHE_ROOT_MOUNT: &str = "/cache-root";
const CACHE_VOLUME: &str = "build-cache";

/// The persistent build cache's volume: only build Jobs get it (function pods never), and
/// each step a directory of it (see [`build_job`]).
fn cache_volume(cache: &BuildCache) -> Option<Volume> {
    let volume = |volume: Volume| Volume {
        name: CACHE_VOLUME.into(),
        ..volume
    };
    match cache {
        BuildCache::None => None,
        BuildCache::HostPath(path) => Some(volume(Volume {
            host_path: Some(HostPathVolumeSource {
                path: path.clone(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            ..Default::default()
        })),
        BuildCache::Claim(claim) => Some(volume(Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.clone(),
                read_only: None,
            }),
            ..Default::default()
        })),
    }
}

/// A source that does not build (the builder's EXIT_SOURCE_DOES_NOT_BUILD) fails again if
/// retried: it ends the Job at once. A pod lost to an eviction or a preemption does not
/// count; anything else (the API server or the registry failing the publish, out of
/// memory, a node failing) counts against the Job's backoff limit.
fn failure_policy() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "FailJob".into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    // The compile step's, or the publish step's for a module that does not
                    // validate there.
                    container_name: None,
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
    let binding = super::own_account_binding(builder_meta(namespace));
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
    let end = message.floor_char_boundary(MAX_BUILD_MESSAGE_BYTES - MARK.len());
    format!("{}{MARK}", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::build_source::{INLINE_SOURCE_BYTES, SOURCE_ANNOTATION};
    use serde_json::json;

    fn function(spec: serde_json::Value) -> Function {
        serde_json::from_value(json!({
            "apiVersion": "wasmless.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": "hello", "namespace": "shop", "uid": "u"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn job(func: &Function) -> PodTemplateSpec {
        let settings = Settings::new("runtime:1", "builder:1");
        let digest = Digest::of(b"source");
        build_job(func, &settings, &digest, "configmap://shop/hello")
            .spec
            .unwrap()
            .template
    }

    fn source_volume_of(template: &PodTemplateSpec) -> Volume {
        let spec = template.spec.as_ref().unwrap();
        spec.volumes
            .iter()
            .flatten()
            .find(|v| v.name == "source")
            .unwrap()
            .clone()
    }

    #[test]
    fn a_small_source_travels_in_the_build_pods_annotations_a_large_one_in_its_configmap() {
        let small = function(json!({
            "language": "go", "source": "package handlers\n",
            "files": {"go.mod": "module function\n", "go.sum": ""},
        }));
        let template = job(&small);
        let annotations = template.metadata.as_ref().unwrap().annotations.clone().unwrap();
        assert_eq!(annotations[SOURCE_ANNOTATION], "package handlers\n");
        assert_eq!(annotations["wasmless.io/file.go.mod"], "module function\n");
        let items = source_volume_of(&template).downward_api.unwrap().items.unwrap();
        let paths: Vec<(&str, &str)> = items
            .iter()
            .map(|item| (item.path.as_str(), item.field_ref.as_ref().unwrap().field_path.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                ("handler.go", "metadata.annotations['wasmless.io/source']"),
                ("go.mod", "metadata.annotations['wasmless.io/file.go.mod']"),
                ("go.sum", "metadata.annotations['wasmless.io/file.go.sum']"),
            ]
        );

        // Past the annotations' budget, or a file name that is no annotation name: the
        // source ConfigMap, as before.
        let large = function(json!({"language": "go", "source": "x".repeat(INLINE_SOURCE_BYTES + 1)}));
        let odd = function(
            json!({"language": "go", "source": "package handlers\n", "files": {"_helper.go": "package handlers\n"}}),
        );
        for func in [large, odd] {
            let template = job(&func);
            assert!(template.metadata.as_ref().unwrap().annotations.is_none());
            let volume = source_volume_of(&template);
            assert_eq!(
                volume.config_map.unwrap().name,
                source_configmap_name("hello", &Digest::of(b"source"))
            );
        }
    }
}
