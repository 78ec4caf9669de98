//! What the runtime's and the builder's pods share: the restricted security contexts,
//! scratch volumes and mounts, the node's code store, and the plain-HTTP registries setting.

use crate::settings::Settings;
use k8s_openapi::api::core::v1::{
    CSIVolumeSource, Capabilities, EmptyDirVolumeSource, EnvVar, PodSecurityContext, SeccompProfile, SecurityContext,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The UID the images run as (distroless's `nonroot`).
pub const NON_ROOT_UID: i64 = 65532;
/// Environment variable naming registries spoken to over plain HTTP (builder and runtime).
pub const OCI_PLAIN_HTTP_ENV: &str = "WASMLESS_OCI_PLAIN_HTTP";
pub const OTLP_ENDPOINT_ENV: &str = "WASMLESS_OTLP_ENDPOINT";

pub(super) fn restricted_container_security() -> SecurityContext {
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

pub(super) fn restricted_pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NON_ROOT_UID),
        run_as_group: Some(NON_ROOT_UID),
        fs_group: Some(NON_ROOT_UID),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

pub(super) fn empty_dir(name: &str, size_limit: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(size_limit.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        // `readOnly: false` is what the API server stores as no field at all.
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

const NODE_CODE_STORE_VOLUME: &str = "code-store";
const NODE_CODE_STORE_DIR: &str = "/code-store";

/// Where the node's code store is in use (`--node-code-store`), the store for a runtime pod (the pool's and a
/// Function's own): its volume and mount, and the `--code-store` socket in `args`.
pub(super) fn with_node_code_store(
    settings: &Settings,
    volumes: &mut Vec<Volume>,
    mounts: &mut Vec<VolumeMount>,
    args: &mut Vec<String>,
) {
    if settings.node_code_store.in_use() {
        volumes.push(node_code_store_volume());
        mounts.push(mount(NODE_CODE_STORE_VOLUME, NODE_CODE_STORE_DIR, true));
        args.extend(["--code-store".into(), format!("{NODE_CODE_STORE_DIR}/agent.sock")]);
    }
}

/// The node's code store: a directory the node agent serves the pod's namespace a socket
/// in (docs/plans/node-code-store.md). Read-only: the socket is reached, nothing written.
fn node_code_store_volume() -> Volume {
    Volume {
        name: NODE_CODE_STORE_VOLUME.into(),
        csi: Some(CSIVolumeSource {
            driver: "code.wasmless.io".into(),
            read_only: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The registries the operator was told to reach over plain HTTP, for the builder's push
/// and the runtime's pull (a registry on loopback needs no such word).
pub(super) fn oci_plain_http_env(settings: &Settings) -> impl Iterator<Item = EnvVar> {
    settings.oci_plain_http.clone().into_iter().map(|registries| EnvVar {
        name: OCI_PLAIN_HTTP_ENV.into(),
        value: Some(registries),
        ..Default::default()
    })
}

/// What every runtime the operator starts (a Function's pods, a pool) is told from the
/// operator's settings: the registries it pulls over plain HTTP, the collector it traces to.
pub(super) fn runtime_settings_env(settings: &Settings) -> impl Iterator<Item = EnvVar> {
    let otlp = settings.otlp_endpoint.clone().map(|endpoint| EnvVar {
        name: OTLP_ENDPOINT_ENV.into(),
        value: Some(endpoint),
        ..Default::default()
    });
    oci_plain_http_env(settings).chain(otlp)
}
