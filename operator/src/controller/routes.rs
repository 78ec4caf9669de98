//! Step 4, the routes: the Function's routes ConfigMap, which every pod started from now on
//! serves (its generation ordered against each pod's own routes annotation), and whether a
//! change of routes needs pods of a new template at all. A rollback, a split's shares or a
//! promotion between revisions the running pods can already load is a change of routes
//! only: the pod template stays as it is (no pod rolls), the running pods are switched in
//! place, and pods started later read the new routes from the ConfigMap. A new build still
//! rolls, so new pods have it mounted rather than read through the API.

use super::{Context, Doing, READY, StepError, apply};
use crate::crd::Function;
use crate::objects;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};

/// Writes `func`'s routes ConfigMap with `routes` (a routes list), a generation above the
/// one it held when they differ; returns the generation they have now. One of that name
/// the operator did not make (not labelled as its routes, which only the operator may be:
/// an owner reference anyone may copy) is refused, not taken over.
pub(super) async fn write(ctx: &Context, func: &Function, ns: &str, routes: &str) -> Result<u64, StepError> {
    let name = objects::routes_configmap_name(&func.name_any());
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let live = apply::get_owned(&configmaps, &name, func)
        .await
        .doing(READY, || format!("reading the routes ConfigMap {name}"))?;
    if let Some(live) = live.as_ref()
        && live.labels().get(objects::COMPONENT_LABEL).map(String::as_str) != Some(objects::ROUTES_COMPONENT)
    {
        return Err(crate::Error::NotOwner {
            kind: "ConfigMap".into(),
            name: name.clone(),
        })
        .doing(READY, || format!("writing the routes ConfigMap {name}"));
    }
    let generation = next_generation(live.as_ref().and_then(objects::routes_configmap_document), routes);
    let desired = objects::routes_configmap(func, objects::routes_document(generation, routes));
    apply::apply_if_changed_with(&configmaps, live.as_ref(), &desired)
        .await
        .doing(READY, || format!("applying the routes ConfigMap {name}"))?;
    Ok(generation)
}

/// The generation `routes` get after `live` (the ConfigMap's document): the same when they
/// are its routes, else one more (1 for the first; a bare list is generation 0).
fn next_generation(live: Option<&str>, routes: &str) -> u64 {
    let Some(live) = live else { return 1 };
    let generation = objects::routes_generation(live).unwrap_or(0);
    let same = objects::routes_of_document(live)
        .zip(serde_json::from_str::<serde_json::Value>(routes).ok())
        .is_some_and(|(live, routes)| serde_json::from_str::<serde_json::Value>(&live).ok() == Some(routes));
    if same { generation } else { generation.saturating_add(1) }
}

/// Whether pods of the `live` Deployment's template can serve `routes` as they are, so that
/// the change to the `desired` one is one of routes only: their templates differ in nothing
/// but the revisions they mount (the digests each records of its template without them
/// agree); every revision `live` mounts is still `kept` (its chunks exist for a new pod to
/// mount); the pods can load each revision of `routes`, mounted or through the API; and
/// none of those is newer than all the revisions `before` (what served until now) and
/// those `live` mounts, since a new build should be mounted in new pods. `kept` is newest
/// first.
pub(super) fn serves_in_place(
    live: &Deployment,
    desired: &Deployment,
    routes: &[objects::Share],
    kept: &[&str],
    before: &[String],
    function: &str,
) -> bool {
    let digest = |deployment: &Deployment| {
        deployment
            .metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(objects::TEMPLATE_DIGEST_ANNOTATION).cloned())
    };
    let Some(live_spec) = live.spec.as_ref().and_then(|spec| spec.template.spec.as_ref()) else {
        return false;
    };
    if digest(live).is_none() || digest(live) != digest(desired) {
        return false;
    }
    let mounted = objects::mounted_revisions(live_spec);
    let position = |revision: &str| kept.iter().position(|kept| *kept == revision);
    if !mounted.iter().all(|revision| position(revision).is_some()) {
        return false;
    }
    if objects::routes_json_for(live_spec, routes, function).is_none() {
        return false;
    }
    // Newest first: the smallest position among what the pods had is the newest of it.
    let newest_had = mounted
        .iter()
        .copied()
        .chain(before.iter().map(String::as_str))
        .filter_map(position)
        .min();
    routes
        .iter()
        .all(|share| match (position(&share.revision), newest_had) {
            (Some(at), Some(newest)) => at >= newest,
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::{Module, ModuleLocation};
    use k8s_openapi::api::apps::v1::DeploymentSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, Volume, VolumeMount};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use wasmless_artifact::Digest;

    fn share(revision: &str) -> objects::Share {
        let digest: Digest = format!("sha256:{}", "a".repeat(64)).parse().unwrap();
        objects::Share {
            revision: revision.into(),
            module: Module {
                digest,
                size: None,
                source_digest: digest,
                location: ModuleLocation::ConfigMaps { count: 1 },
                code: None,
            },
            percent: 100,
            tag: None,
        }
    }

    /// A Deployment whose template mounts `mounted`, reads other chunks through the API or
    /// not, and was written as `digest` says (its template without the revisions).
    fn deployment(mounted: &[&str], reader: bool, digest: &str) -> Deployment {
        let mounts = mounted
            .iter()
            .enumerate()
            .map(|(index, revision)| VolumeMount {
                name: format!("revision-{index}"),
                mount_path: format!("{}/{revision}", objects::REVISIONS_DIR),
                ..Default::default()
            })
            .collect();
        let volumes = (0..mounted.len())
            .map(|index| Volume {
                name: format!("revision-{index}"),
                ..Default::default()
            })
            .collect();
        let template = PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                service_account_name: reader.then(|| objects::chunk_reader_name("hello")),
                automount_service_account_token: Some(reader),
                containers: vec![Container {
                    name: "runtime".into(),
                    volume_mounts: Some(mounts),
                    ..Default::default()
                }],
                volumes: Some(volumes),
                ..Default::default()
            }),
        };
        Deployment {
            metadata: ObjectMeta {
                annotations: Some([(objects::TEMPLATE_DIGEST_ANNOTATION.to_string(), digest.to_string())].into()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                template,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const KEPT: [&str; 4] = ["hello-4", "hello-3", "hello-2", "hello-1"];

    #[test]
    fn a_rollback_to_the_standby_or_an_older_revision_is_a_change_of_routes_only() {
        let live = deployment(&["hello-4", "hello-3"], true, "same");
        let desired = deployment(&["hello-3", "hello-2"], true, "same");
        let before = ["hello-4".to_string()];
        for to in ["hello-3", "hello-1"] {
            assert!(
                serves_in_place(&live, &desired, &[share(to)], &KEPT, &before, "hello"),
                "{to}"
            );
        }
        // Back to the newest again, which the pods have mounted.
        assert!(serves_in_place(
            &live,
            &desired,
            &[share("hello-4")],
            &KEPT,
            &["hello-1".into()],
            "hello"
        ));
    }

    #[test]
    fn a_new_build_rolls_so_new_pods_mount_it() {
        let live = deployment(&["hello-3", "hello-2"], true, "same");
        let desired = deployment(&["hello-4", "hello-3"], true, "same");
        let before = ["hello-3".to_string()];
        assert!(!serves_in_place(
            &live,
            &desired,
            &[share("hello-4")],
            &KEPT,
            &before,
            "hello"
        ));
        // Recorded nowhere yet: just built.
        assert!(!serves_in_place(
            &live,
            &desired,
            &[share("hello-5")],
            &KEPT,
            &before,
            "hello"
        ));
    }

    #[test]
    fn anything_else_that_changed_rolls() {
        let live = deployment(&["hello-4", "hello-3"], true, "same");
        let before = ["hello-4".to_string()];
        let other = deployment(&["hello-3", "hello-2"], true, "other");
        assert!(!serves_in_place(
            &live,
            &other,
            &[share("hello-3")],
            &KEPT,
            &before,
            "hello"
        ));
        // Written by an operator that recorded no digest.
        let unrecorded = deployment(&["hello-4", "hello-3"], true, "");
        let mut unrecorded = unrecorded;
        unrecorded.metadata.annotations = None;
        assert!(!serves_in_place(
            &unrecorded,
            &live,
            &[share("hello-3")],
            &KEPT,
            &before,
            "hello"
        ));
        // Pods that cannot read an unmounted revision through the API.
        let no_reader = deployment(&["hello-4", "hello-3"], false, "same");
        assert!(!serves_in_place(
            &no_reader,
            &no_reader,
            &[share("hello-1")],
            &KEPT,
            &before,
            "hello"
        ));
        assert!(serves_in_place(
            &no_reader,
            &no_reader,
            &[share("hello-3")],
            &KEPT,
            &before,
            "hello"
        ));
        // A revision the live template mounts is no longer kept: a new pod could not start.
        let mounts_gone = deployment(&["hello-4", "hello-0"], true, "same");
        assert!(!serves_in_place(
            &mounts_gone,
            &live,
            &[share("hello-3")],
            &KEPT,
            &before,
            "hello"
        ));
    }

    #[test]
    fn the_generation_moves_only_when_the_routes_do() {
        let routes = r#"[{"revision":"hello-1"}]"#;
        assert_eq!(next_generation(None, routes), 1);
        let live = objects::routes_document(7, routes);
        assert_eq!(next_generation(Some(&live), routes), 7);
        assert_eq!(next_generation(Some(&live), r#"[{"revision":"hello-2"}]"#), 8);
        assert_eq!(next_generation(Some(routes), r#"[{"revision":"hello-2"}]"#), 1);
    }
}
