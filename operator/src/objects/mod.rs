//! The Kubernetes objects the operator writes for a Function, as pure functions of the
//! Function, the operator's settings and the module being served. Nothing here talks to
//! the API. The runtime's Deployment is in `runtime`, the build Job and the builder's
//! identity in `builder`; the names, labels and smaller objects here.

mod build_source;
mod builder;
mod pod;
mod pool;
mod runtime;

pub use builder::{
    BUILDER_ACCOUNT, BUILDER_MEMORY_LIMIT, MAX_BUILD_MESSAGE_BYTES, build_job, builder_rbac, cut_message,
    publish_target,
};
pub use pod::{NON_ROOT_UID, OCI_PLAIN_HTTP_ENV};
pub use pool::{
    DEFAULT_POOL_MEMORY_BUDGET, NAMESPACE_ENV, POOL_COMPONENT, POOL_ENTRY_COMPONENT, POOL_ENTRY_KEY, POOL_NAME,
    POOL_PORTS, free_pool_port, pool_args, pool_deployment, pool_deployment_selector, pool_entry, pool_entry_name,
    pool_entry_port, pool_entry_selector, pool_pod_selector, pool_rbac,
};
pub use runtime::{
    DRAIN_DELAY_SECONDS, HANDLER_ENV_PREFIX, POD_IP_ENV, REVISIONS_DIR, ROUTES_ANNOTATION, ROUTES_COMPONENT,
    ROUTES_VOLUME, SHUTDOWN_GRACE_SECONDS, Serving, Share, TERMINATION_GRACE_PERIOD_SECONDS, TRAFFIC_ANNOTATION,
    chunk_configmap_names, chunk_reader_name, chunk_reader_rbac, deployment, mounted_revisions, outbound_header_env,
    primary, reads_chunks_through_api, reads_routes_documents, routes_configmap, routes_configmap_document,
    routes_configmap_name, routes_document, routes_generation, routes_json, routes_json_for, routes_json_reading,
    routes_of_document, runtime_args, split_args, traffic_summary,
};
pub use runtime::{Expansion, function_args, function_env, handler_env_from};
pub use runtime::{TEMPLATE_DIGEST_ANNOTATION, WAITING_ANNOTATION, waits_for_first_build};

use crate::crd::{Function, Language};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use std::collections::BTreeMap;
use wasmless_artifact::{Digest, labels, ports};

/// Field manager of every server-side apply.
pub const MANAGER: &str = "wasmless-operator";
/// Which part of a function an object belongs to: `runtime`, `builder` or `source`.
pub const COMPONENT_LABEL: &str = "wasmless.io/component";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Key of the source in the source ConfigMap.
pub const SOURCE_KEY: &str = "source";

/// sha256 over what determines the module: language, builder version and source —
/// the same digest the builder computes for a single-file source.
pub fn source_digest(language: Language, builder_version: &str, source: &str) -> Digest {
    Digest::of_source(language.as_str(), builder_version, source.as_bytes())
}

/// The source digest of a Function's inline source and its `files`: [`source_digest`] when
/// it has no files (so a Function that never had files keeps its digest), else the digest
/// the builder computes over the directory the build Job mounts (the source under
/// [`Language::source_file_name`] and each file under its name).
pub fn spec_source_digest(func: &Function, builder_version: &str) -> Digest {
    let source = func.spec.inline_source().unwrap_or_default();
    if func.spec.files.is_empty() {
        return source_digest(func.spec.language, builder_version, source);
    }
    let mut files = vec![(func.spec.language.source_file_name(), source.as_bytes())];
    files.extend(
        func.spec
            .files
            .iter()
            .map(|(name, text)| (name.as_str(), text.as_bytes())),
    );
    wasmless_formats::source::files_digest(func.spec.language.as_str(), builder_version, &files)
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
/// must never read the newer source and label its module with the older digest. The
/// source under [`SOURCE_KEY`], each of `spec.files` under its key
/// (`build_source::file_key`, never `source`; the names `FunctionSpec::problems` checked).
pub fn source_configmap(func: &Function, source: &str, digest: &Digest) -> ConfigMap {
    let mut labels = labels_for(func, "source");
    labels.insert(labels::SOURCE_DIGEST.into(), labels::digest_value(digest));
    let mut meta = meta(func, source_configmap_name(&func.name_any(), digest), labels);
    meta.annotations = Some(BTreeMap::from([(
        crate::module::SOURCE_DIGEST_ANNOTATION.into(),
        digest.to_string(),
    )]));
    ConfigMap {
        metadata: meta,
        data: Some(
            std::iter::once((SOURCE_KEY.to_string(), source.to_string()))
                .chain(
                    func.spec
                        .files
                        .iter()
                        .map(|(name, text)| (build_source::file_key(func.spec.language, name), text.clone())),
                )
                .collect(),
        ),
        immutable: Some(true),
        ..Default::default()
    }
}

/// Prometheus's scrape annotations, on the pod template and the Service.
fn prometheus_annotations() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("prometheus.io/scrape".into(), "true".into()),
        ("prometheus.io/port".into(), ports::ADMIN.to_string()),
        ("prometheus.io/path".into(), "/metrics".into()),
    ])
}

/// Where a Function's Service sends its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The Function's own runtime pods, their `http` port.
    Pods,
    /// The namespace's pool, on the Function's port there.
    Pool { port: u16 },
}

/// The Function's Service: `spec.serverPort` to the runtime pods' HTTP port (or to the
/// Function's port in the pool), and the admin port as `metrics`. Its name, ClusterIP and
/// ports stay whatever the route: only the selector and the target port change, in one
/// update.
pub fn service(func: &Function, route: Route) -> Service {
    let labels = labels_for(func, "runtime");
    let mut meta = meta(func, service_name(func), labels.clone());
    meta.annotations = Some(prometheus_annotations());
    let port = |name: &str, port: i32, target: IntOrString| ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(target),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let (selector, http_target) = match route {
        Route::Pods => (labels, IntOrString::String("http".into())),
        Route::Pool { port } => (pool_pod_selector(), IntOrString::Int(port.into())),
    };
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector),
            ports: Some(vec![
                port("http", func.spec.server_port, http_target),
                port("metrics", ports::ADMIN.into(), IntOrString::String("metrics".into())),
            ]),
            // Written, not left out: a Service that sent to the pods of a first build
            // before they were ready (`waiting_service`) stops once this is applied.
            publish_not_ready_addresses: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Service of a new Function while its first build runs: to its pods, ready or not.
/// They wait for the build with their port closed, so a request meanwhile is refused as
/// it would be with no endpoint; but their addresses are in the Service's EndpointSlice
/// from the moment they have one, so kube-proxy has programmed them before the build
/// ends, and the first answer waits only for a pod to load what was built (not for its
/// readiness probe, the EndpointSlice and every node's kube-proxy after it).
pub fn waiting_service(func: &Function) -> Service {
    let mut service = service(func, Route::Pods);
    if let Some(spec) = service.spec.as_mut() {
        spec.publish_not_ready_addresses = Some(true);
    }
    service
}

/// The RoleBinding `metadata` names: the Role of that name bound to the ServiceAccount of
/// that name in its namespace, the one shape the admission policy lets the operator write.
fn own_account_binding(metadata: ObjectMeta) -> k8s_openapi::api::rbac::v1::RoleBinding {
    use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
    let name = metadata.name.clone().unwrap_or_default();
    let namespace = metadata.namespace.clone();
    RoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace,
            ..Default::default()
        }]),
    }
}
