//! Modules that already exist: a prebuilt one (`spec.module`), the chunk ConfigMaps a build
//! published, an OCI build recorded on status, and the one a Deployment serves.

use super::Context;
use crate::Error;
use crate::crd::{Function, ModuleImage, Revision};
use crate::module::{Code, Module, ModuleLocation};
use crate::objects::{self, MANAGER, ROUTES_ANNOTATION};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeMap;
use wasmless_artifact::{Digest, Part, annotations, labels};

/// A prebuilt module (`spec.module`): nothing to build, the runtime pulls it by digest.
pub(super) fn prebuilt_module(image: &ModuleImage) -> Result<Module, String> {
    let digest: Digest = image.digest.parse().map_err(|e| format!("module.digest: {e}"))?;
    let reference = image
        .image
        .strip_prefix(wasmless_artifact::oci::SCHEME)
        .unwrap_or(&image.image)
        .to_string();
    Ok(Module {
        digest,
        size: None,
        // A prebuilt module has no source: its own digest names it.
        source_digest: digest,
        location: ModuleLocation::Oci { reference },
        code: None,
    })
}

/// The annotations that say what a Deployment serves: its own, or (written by an operator
/// before routes moved out of the pod template) its pod template's.
fn serving_annotations(deployment: &Deployment) -> Option<&BTreeMap<String, String>> {
    let own = deployment.metadata.annotations.as_ref();
    match own.filter(|annotations| annotations.contains_key(ROUTES_ANNOTATION)) {
        Some(own) => Some(own),
        None => deployment
            .spec
            .as_ref()?
            .template
            .metadata
            .as_ref()?
            .annotations
            .as_ref(),
    }
}

/// The module a Deployment serves (its primary revision's), as its annotations record it.
pub(super) fn serving_module(deployment: &Deployment) -> Option<Module> {
    Module::from_pod_annotations(serving_annotations(deployment)?)
}

/// The revisions a Deployment serves, as its routes annotation records them.
pub(super) fn served_revisions(deployment: &Deployment) -> Vec<String> {
    let routes = serving_annotations(deployment)
        .and_then(|annotations| annotations.get(ROUTES_ANNOTATION))
        .and_then(|routes| objects::routes_of_document(routes))
        .and_then(|routes| serde_json::from_str::<Vec<serde_json::Value>>(&routes).ok())
        .unwrap_or_default();
    routes
        .iter()
        .filter_map(|route| Some(route.get("revision")?.as_str()?.to_string()))
        .collect()
}

/// The OCI module built from `digest`, as an earlier reconcile recorded it on status: a
/// kept revision's (the current build is the newest revision).
pub(super) fn oci_module_from_status(func: &Function, digest: &Digest) -> Option<Module> {
    // From the revisions only: `status.sourceDigest` names what is being built as soon as a
    // build starts, while `moduleDigest` and `moduleRef` still name what serves, the
    // previous build's module (taking those for the new source served the old code as the
    // new revision: an edit never took effect).
    let status = func.status.as_ref()?;
    let revision = status
        .revisions
        .iter()
        .find(|revision| revision.source_digest == digest.to_string())?;
    let module = oci_module(
        digest,
        &revision.module_digest,
        revision.code_digest.as_deref(),
        revision.module_ref.as_deref()?,
    )?;
    // Its size is on status while it is the module that serves.
    let size = status
        .module_size
        .filter(|_| status.module_digest.as_deref() == Some(revision.module_digest.as_str()))
        .and_then(|size| u64::try_from(size).ok());
    Some(Module { size, ..module })
}

/// An OCI module from the digests and `oci://` reference status records of it.
fn oci_module(
    source_digest: &Digest,
    module_digest: &str,
    code_digest: Option<&str>,
    module_ref: &str,
) -> Option<Module> {
    let reference = module_ref.strip_prefix(wasmless_artifact::oci::SCHEME)?;
    Some(Module {
        digest: module_digest.parse().ok()?,
        size: None,
        source_digest: *source_digest,
        code: code_digest
            .and_then(|d| d.parse().ok())
            .map(|digest| Code { digest, chunks: 0 }),
        location: ModuleLocation::Oci {
            reference: reference.to_string(),
        },
    })
}

/// The complete chunk set built from `digest`, if the builder published one, with the
/// compiled code's chunks when those are complete too. The chunks get the Function as
/// their owner here, in case the builder did not know its UID.
pub(super) async fn find_chunks(
    ctx: &Context,
    func: &Function,
    ns: &str,
    digest: &Digest,
) -> Result<Option<Module>, Error> {
    let name = func.name_any();
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{}={},{}={}",
        labels::FUNCTION,
        name,
        labels::SOURCE_DIGEST,
        labels::digest_value(digest)
    );
    // Names, labels and annotations are all it needs: not the chunks' megabytes of data.
    let found = configmaps
        .list_metadata(&ListParams::default().labels(&selector))
        .await?;
    let Some(module) = complete_chunks(&found.items, Part::Module, &name, digest) else {
        return Ok(None);
    };
    let Ok(module_digest) = module.module_digest.parse::<Digest>() else {
        return Ok(None);
    };
    // Code made from another module than the one found is not this build's: never serve it.
    let code = complete_chunks(&found.items, Part::Code, &name, digest)
        .filter(|code| code.module_digest == module.module_digest)
        .and_then(|code| {
            Some(Code {
                digest: code.annotation(annotations::CODE_DIGEST).parse().ok()?,
                chunks: code.chunks.len(),
            })
        });
    let owner = func.controller_owner_ref(&());
    for cm in &found.items {
        adopt(&configmaps, cm, owner.as_ref()).await?;
    }
    Ok(Some(Module {
        digest: module_digest,
        size: module.annotation(annotations::MODULE_SIZE).parse().ok(),
        source_digest: *digest,
        location: ModuleLocation::ConfigMaps {
            count: module.chunks.len(),
        },
        code,
    }))
}

/// A kept revision's module, where its build stored it: its chunk ConfigMaps (still all
/// there, and holding the module the revision recorded), or its OCI reference.
pub(super) async fn revision_module(
    ctx: &Context,
    func: &Function,
    ns: &str,
    revision: &Revision,
) -> Result<Option<Module>, Error> {
    let Ok(source_digest) = revision.source_digest.parse::<Digest>() else {
        return Ok(None);
    };
    if revision
        .module_ref
        .as_deref()
        .is_some_and(|reference| reference.starts_with(wasmless_artifact::oci::SCHEME))
    {
        return Ok(oci_module_from_status(func, &source_digest));
    }
    let found = find_chunks(ctx, func, ns, &source_digest).await?;
    Ok(found.filter(|module| module.digest.to_string() == revision.module_digest))
}

/// One part's chunk ConfigMaps, all present and agreeing on the module digest.
struct ChunkSet<'a> {
    chunks: Vec<&'a PartialObjectMeta<ConfigMap>>,
    module_digest: String,
}

impl ChunkSet<'_> {
    fn annotation(&self, key: &str) -> String {
        self.chunks[0].annotations().get(key).cloned().unwrap_or_default()
    }
}

fn complete_chunks<'a>(
    found: &'a [PartialObjectMeta<ConfigMap>],
    part: Part,
    function: &str,
    digest: &Digest,
) -> Option<ChunkSet<'a>> {
    let annotation =
        |cm: &PartialObjectMeta<ConfigMap>, key: &str| cm.annotations().get(key).cloned().unwrap_or_default();
    let first_name = part.configmap_name(function, digest, 0);
    let first = found.iter().find(|cm| cm.name_any() == first_name)?;
    let module_digest = annotation(first, annotations::MODULE_DIGEST);
    let count = annotation(first, annotations::CHUNK_COUNT).parse::<usize>().ok()?;
    let chunks = part
        .configmap_names(function, digest, count)
        .into_iter()
        .map(|name| {
            found
                .iter()
                .find(|cm| cm.name_any() == name && annotation(cm, annotations::MODULE_DIGEST) == module_digest)
        })
        .collect::<Option<Vec<_>>>()?;
    (!chunks.is_empty()).then_some(ChunkSet { chunks, module_digest })
}

/// Makes the Function the owner of a chunk the builder published without knowing its UID.
async fn adopt(
    configmaps: &Api<ConfigMap>,
    cm: &PartialObjectMeta<ConfigMap>,
    owner: Option<&OwnerReference>,
) -> Result<(), Error> {
    let Some(owner) = owner else { return Ok(()) };
    if cm.owner_references().iter().any(|o| o.uid == owner.uid) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": cm.name_any(), "ownerReferences": [owner] },
    });
    configmaps
        .patch(
            &cm.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}
