//! ConfigMap chunks: zstd-compressed, split at 900 KiB, named by the source digest,
//! labelled and annotated as DESIGN.md says, written by server-side apply.

use super::{PublishError, Published};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeMap;
use wasmless_artifact::{CHUNK_KEY, Digest, annotations, chunks_configmap_names, compress_and_split, labels};

const FIELD_MANAGER: &str = "wasmless-builder";

pub async fn publish(
    namespace: &str,
    function: &str,
    wasm: &[u8],
    digest: &Digest,
    source_digest: &Digest,
) -> Result<Published, PublishError> {
    // kube and the OCI client bring two TLS providers (ring and aws-lc-rs); rustls then
    // needs to be told which one, or it panics. Another caller may have chosen already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .map_err(|e| PublishError::KubeConfig(e.to_string()))?;
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let chunks = compress_and_split(wasm);
    let names = chunks_configmap_names(function, source_digest, chunks.len());
    let owner = function_owner(function);
    for (index, (chunk, name)) in chunks.into_iter().zip(&names).enumerate() {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_string()),
                labels: Some(BTreeMap::from([
                    (labels::FUNCTION.to_string(), function.to_string()),
                    (labels::SOURCE_DIGEST.to_string(), labels::digest_value(source_digest)),
                    (labels::MODULE_DIGEST.to_string(), labels::digest_value(digest)),
                ])),
                annotations: Some(BTreeMap::from([
                    (annotations::MODULE_DIGEST.to_string(), digest.to_string()),
                    (annotations::MODULE_SIZE.to_string(), wasm.len().to_string()),
                    (annotations::CHUNK_COUNT.to_string(), names.len().to_string()),
                    (annotations::CHUNK_INDEX.to_string(), index.to_string()),
                ])),
                owner_references: owner.clone().map(|owner| vec![owner]),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([(CHUNK_KEY.to_string(), ByteString(chunk))])),
            immutable: Some(true),
            ..Default::default()
        };
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&config_map),
        )
        .await
        .map_err(|e| PublishError::ConfigMap {
            name: name.clone(),
            message: e.to_string(),
        })?;
    }
    Ok(Published {
        location: format!("configmap://{namespace}/{function}"),
        config_maps: names,
    })
}

/// In a build Job the operator passes the Function's UID, so the chunks are deleted
/// with the Function.
fn function_owner(function: &str) -> Option<OwnerReference> {
    let uid = std::env::var("WASMLESS_FUNCTION_UID")
        .ok()
        .filter(|uid| !uid.is_empty())?;
    Some(OwnerReference {
        api_version: "wasmless.io/v1alpha1".into(),
        kind: "Function".into(),
        name: function.to_string(),
        uid,
        controller: Some(false),
        block_owner_deletion: Some(false),
    })
}
