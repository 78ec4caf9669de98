//! Step 4's configuration: the Secrets and ConfigMaps the pods read, looked up by metadata
//! only (the operator never receives a value), into the pod template's config hash, or the
//! objects missing.

use super::Context;
use crate::Error;
use crate::crd::Function;
use crate::references::{self, ConfigKind, Reference};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use wasmless_artifact::Digest;

/// The configuration the pods would start with.
pub(super) enum Config {
    /// Everything they need exists: the hash for the pod template (none when they read nothing).
    Complete(Option<Digest>),
    /// Objects that do not exist and are not optional, in words for the Ready condition.
    Missing(String),
}

/// Reads the resourceVersion of every object `func`'s pods read.
pub(super) async fn resolve(ctx: &Context, func: &Function, ns: &str) -> Result<Config, Error> {
    let wanted = references::references(&func.spec);
    let mut versions = Vec::with_capacity(wanted.len());
    for reference in &wanted {
        versions.push(resource_version(ctx, ns, reference).await?);
    }
    let missing: Vec<&Reference> = wanted
        .iter()
        .zip(&versions)
        .filter(|(reference, version)| version.is_none() && !reference.optional)
        .map(|(reference, _)| reference)
        .collect();
    if !missing.is_empty() {
        return Ok(Config::Missing(references::missing_message(&missing, ns)));
    }
    let hash = references::config_hash(wanted.iter().zip(versions.iter().map(Option::as_deref)));
    Ok(Config::Complete(hash))
}

/// The object's resourceVersion, `None` when it does not exist. A metadata-only GET: the
/// API server sends no `data`.
async fn resource_version(ctx: &Context, ns: &str, reference: &Reference) -> Result<Option<String>, Error> {
    let metadata = match reference.kind {
        ConfigKind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .get_metadata_opt(&reference.name)
            .await?
            .map(|object| object.metadata),
        ConfigKind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .get_metadata_opt(&reference.name)
            .await?
            .map(|object| object.metadata),
    };
    // An object that exists has a resourceVersion; an empty one still differs from absent.
    Ok(metadata.map(|metadata| metadata.resource_version.unwrap_or_default()))
}
