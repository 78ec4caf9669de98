//! The routes a Function's pods serve from: `--traffic`'s JSON list, in a routes document
//! with its generation in the pods' routes annotation and their Function's routes
//! ConfigMap, and the split as people read it.

use super::*;
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec};
use std::collections::BTreeSet;

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

/// The name of a Function's routes ConfigMap.
pub fn routes_configmap_name(function: &str) -> String {
    format!("{function}-routes")
}

/// A routes document: `routes` (a [`routes_json`] list) with the generation that orders it
/// against the pod's own, as the runtime's `--traffic-file`s take it.
pub fn routes_document(generation: u64, routes: &str) -> String {
    let routes: serde_json::Value = serde_json::from_str(routes).expect("routes_json writes JSON");
    serde_json::json!({ "generation": generation, "routes": routes }).to_string()
}

/// The generation of a routes document (0 for a bare list, none when it is not one).
pub fn routes_generation(document: &str) -> Option<u64> {
    match serde_json::from_str::<serde_json::Value>(document).ok()? {
        serde_json::Value::Array(_) => Some(0),
        value => value.get("generation")?.as_u64(),
    }
}

/// The routes list of a routes document (a bare list is one).
pub fn routes_of_document(document: &str) -> Option<String> {
    match serde_json::from_str::<serde_json::Value>(document).ok()? {
        list @ serde_json::Value::Array(_) => Some(list.to_string()),
        mut value => Some(value.get_mut("routes")?.take().to_string()),
    }
}

/// A Function's routes ConfigMap: what every pod started from now serves (the routes
/// `document`), whatever pod template it started from. Labelled as a Wasmless object, so
/// only the operator writes it (`deploy/trusted-objects.yaml`).
pub fn routes_configmap(func: &Function, document: String) -> ConfigMap {
    ConfigMap {
        metadata: meta(
            func,
            routes_configmap_name(&func.name_any()),
            labels_for(func, ROUTES_COMPONENT),
        ),
        data: Some(BTreeMap::from([(ROUTES_FILE.to_string(), document)])),
        ..Default::default()
    }
}

/// The routes document in a routes ConfigMap.
pub fn routes_configmap_document(configmap: &ConfigMap) -> Option<&str> {
    configmap.data.as_ref()?.get(ROUTES_FILE).map(String::as_str)
}

/// The revisions a pod (or pod template) has mounted under [`REVISIONS_DIR`].
pub fn mounted_revisions(spec: &PodSpec) -> BTreeSet<&str> {
    spec.containers
        .iter()
        .flat_map(|container| container.volume_mounts.iter().flatten())
        .filter_map(|mount| mount.mount_path.strip_prefix(REVISIONS_DIR)?.strip_prefix('/'))
        .collect()
}

/// Whether pods of `spec` read revisions they have not mounted through the API, as
/// `function`'s chunk reader with its token.
pub fn reads_chunks_through_api(spec: &PodSpec, function: &str) -> bool {
    spec.service_account_name.as_deref() == Some(chunk_reader_name(function).as_str())
        && spec.automount_service_account_token == Some(true)
}

/// The routes of `shares` for pods of `spec`: each revision from its directory where they
/// have it mounted, else through the API where they may; `None` when they cannot serve one.
pub fn routes_json_for(spec: &PodSpec, shares: &[Share], function: &str) -> Option<String> {
    let mounted = mounted_revisions(spec);
    routes_json_reading(
        shares,
        |revision| mounted.contains(revision),
        if reads_chunks_through_api(spec, function) {
            function
        } else {
            ""
        },
    )
}

/// `template` without the revisions it mounts: the volumes and mounts under
/// [`REVISIONS_DIR`], which a change of routes alone need not change.
pub fn template_without_revisions(template: &PodTemplateSpec) -> PodTemplateSpec {
    let mut template = template.clone();
    if let Some(spec) = template.spec.as_mut() {
        let mut dropped = Vec::new();
        for container in &mut spec.containers {
            if let Some(mounts) = container.volume_mounts.as_mut() {
                mounts.retain(|mount| {
                    let revision = mount.mount_path.starts_with(&format!("{REVISIONS_DIR}/"));
                    if revision {
                        dropped.push(mount.name.clone());
                    }
                    !revision
                });
            }
        }
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|volume| !dropped.contains(&volume.name));
        }
    }
    template
}

/// Whether pods of `spec` read routes documents (`{"generation", "routes"}`): those that
/// mount their Function's routes ConfigMap; an older operator's read a bare list.
pub fn reads_routes_documents(spec: &PodSpec) -> bool {
    spec.volumes
        .iter()
        .flatten()
        .any(|volume| volume.name == FUNCTION_ROUTES_VOLUME)
}
