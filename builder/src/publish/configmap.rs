//! ConfigMap chunks of both parts (the module and its compiled code): zstd-compressed,
//! split at 900 KiB, named by the source digest, labelled and annotated as
//! docs/architecture.md ("Builder") says, written by server-side apply.

use super::{PublishError, Published};
use crate::{Built, CompiledCode};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeMap;
use wasmless_artifact::{Digest, Part, annotations, compress_and_split, labels, split_chunks};

const FIELD_MANAGER: &str = "wasmless-builder";

/// Writes the compiled code's chunks first and the module's last: the operator serves a
/// build once its module chunks are complete, and must find the code complete by then.
pub async fn publish(
    namespace: &str,
    function: &str,
    built: &Built,
    code: Option<&CompiledCode>,
    source_digest: &Digest,
) -> Result<Published, PublishError> {
    // rustls panics unless a TLS provider is chosen (the workspace links ring alone).
    // Another caller may have chosen already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .map_err(|e| PublishError::KubeConfig(e.to_string()))?;
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let chunk_set = ChunkSet {
        api: &api,
        namespace,
        function,
        source_digest,
        module_digest: &built.digest,
    };
    let code_config_maps = match code {
        Some(code) => {
            let annotations = [
                (annotations::CODE_DIGEST, code.digest.to_string()),
                (annotations::CODE_SIZE, code.artifact.len().to_string()),
                (annotations::ENGINE_HASH, code.engine.clone()),
                (annotations::CODE_TARGET, code.target.to_string()),
            ];
            chunk_set
                .write(Part::Code, split_chunks(&code.artifact), &annotations)
                .await?
        }
        None => Vec::new(),
    };
    let config_maps = chunk_set
        .write(
            Part::Module,
            compress_and_split(&built.wasm),
            &[(annotations::MODULE_SIZE, built.wasm.len().to_string())],
        )
        .await?;
    Ok(Published {
        location: format!("configmap://{namespace}/{function}"),
        config_maps,
        code_config_maps,
    })
}

struct ChunkSet<'a> {
    api: &'a Api<ConfigMap>,
    namespace: &'a str,
    function: &'a str,
    source_digest: &'a Digest,
    module_digest: &'a Digest,
}

impl ChunkSet<'_> {
    /// One immutable ConfigMap per chunk of `part`, labelled and annotated as docs/architecture.md
    /// says (the module digest on both parts: the code's is the module it was made from).
    async fn write(
        &self,
        part: Part,
        chunks: Vec<Vec<u8>>,
        extra_annotations: &[(&str, String)],
    ) -> Result<Vec<String>, PublishError> {
        let names = part.configmap_names(self.function, self.source_digest, chunks.len());
        let owner = function_owner(self.function);
        let mut writes = Vec::new();
        for (index, (chunk, name)) in chunks.into_iter().zip(&names).enumerate() {
            let mut annotations = BTreeMap::from([
                (annotations::MODULE_DIGEST.to_string(), self.module_digest.to_string()),
                (annotations::CHUNK_COUNT.to_string(), names.len().to_string()),
                (annotations::CHUNK_INDEX.to_string(), index.to_string()),
            ]);
            annotations.extend(extra_annotations.iter().map(|(k, v)| (k.to_string(), v.clone())));
            let config_map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(self.namespace.to_string()),
                    labels: Some(BTreeMap::from([
                        (labels::FUNCTION.to_string(), self.function.to_string()),
                        (
                            labels::SOURCE_DIGEST.to_string(),
                            labels::digest_value(self.source_digest),
                        ),
                        (
                            labels::MODULE_DIGEST.to_string(),
                            labels::digest_value(self.module_digest),
                        ),
                    ])),
                    annotations: Some(annotations),
                    owner_references: owner.clone().map(|owner| vec![owner]),
                    ..Default::default()
                },
                binary_data: Some(BTreeMap::from([(part.configmap_key().to_string(), ByteString(chunk))])),
                immutable: Some(true),
                ..Default::default()
            };
            writes.push(async move {
                apply_with_retries(self.api, name, &config_map)
                    .await
                    .map_err(|e| PublishError::ConfigMap {
                        name: name.clone(),
                        message: e.to_string(),
                    })
            });
        }
        // A few at a time: each write waits mostly on etcd's disk, which takes several at
        // once about as fast as one, so the chunks of an 11 MB module go in a third of the
        // time; more would only queue in the API server.
        futures::stream::iter(writes)
            .buffer_unordered(CONCURRENT_WRITES)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(names)
    }
}

/// Chunks written at once.
const CONCURRENT_WRITES: usize = 4;

/// Attempts at writing one chunk before the build gives up (and its Job retries the pod).
const ATTEMPTS: u32 = 5;

/// Server-side applies one chunk, retrying what a busy or restarting API server answers
/// (a conflict, throttling, a 5xx, a dropped connection) after 0.5 s, 1 s, 2 s, 4 s: a
/// chunk is content-addressed, so writing it again is harmless, and a build that fails
/// after minutes of compiling for a moment's API trouble is worse.
async fn apply_with_retries(api: &Api<ConfigMap>, name: &str, config_map: &ConfigMap) -> Result<(), kube::Error> {
    let mut delay = std::time::Duration::from_millis(500);
    for attempt in 1.. {
        match api
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(config_map),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(error) if attempt < ATTEMPTS && is_transient(&error) => {
                eprintln!("writing ConfigMap {name} failed ({error}); retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(error) => return Err(error),
        }
    }
    unreachable!("the loop returns on its last attempt")
}

fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 409 || status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
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
