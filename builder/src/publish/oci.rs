//! The Wasm OCI artifact layout: a `application/vnd.wasm.config.v0+json` config, an
//! `application/wasm` layer holding the module and, beside it, a layer holding its
//! compiled code (`application/vnd.wasmless.code.v1+lz4`), pushed with `oci-client`.

use super::{PublishError, Published};
use crate::CompiledCode;
use oci_client::Reference;
use oci_client::client::{Config, ImageLayer};
use wasmless_artifact::annotations;
use wasmless_artifact::oci::{CODE_LAYER_MEDIA_TYPE, CONFIG_MEDIA_TYPE, LAYER_MEDIA_TYPE, SCHEME};
use wasmless_host::oci::{protocol_for, registry_auth};

pub async fn publish(reference: &str, wasm: &[u8], code: Option<&CompiledCode>) -> Result<Published, PublishError> {
    let error = |message: String| PublishError::Oci {
        reference: reference.to_string(),
        message,
    };
    let parsed: Reference = reference.parse().map_err(|e| error(format!("{e}")))?;
    let client = wasmless_host::oci::client(protocol_for(parsed.registry()));
    let auth = registry_auth();
    // The module's layer first: tools that read the Wasm OCI layout take that one.
    let mut layers = vec![ImageLayer::new(wasm.to_vec(), LAYER_MEDIA_TYPE.to_string(), None)];
    if let Some(code) = code {
        let annotations = std::collections::BTreeMap::from([
            (annotations::MODULE_DIGEST.to_string(), code.module_digest.to_string()),
            (annotations::ENGINE_HASH.to_string(), code.engine.clone()),
            (annotations::CODE_TARGET.to_string(), code.target.to_string()),
        ]);
        layers.push(ImageLayer::new(
            code.artifact.clone(),
            CODE_LAYER_MEDIA_TYPE.to_string(),
            Some(annotations),
        ));
    }
    let config = Config::new(config_json(wasm.len()), CONFIG_MEDIA_TYPE.to_string(), None);
    client
        .push(&parsed, &layers, config, &auth, None)
        .await
        .map_err(|e| error(e.to_string()))?;
    let manifest = client
        .fetch_manifest_digest(&parsed, &auth)
        .await
        .map_err(|e| error(e.to_string()))?;
    let repository = format!("{}/{}", parsed.resolve_registry(), parsed.repository());
    Ok(Published {
        location: format!("{SCHEME}{repository}@{manifest}"),
        config_maps: Vec::new(),
        code_config_maps: Vec::new(),
    })
}

/// The config blob of the Wasm OCI artifact layout (wasm-pkg-tools' `vnd.wasm.config.v0`).
fn config_json(layer_size: usize) -> Vec<u8> {
    serde_json::json!({
        "created": null,
        "architecture": "wasm",
        "os": "wasip1",
        "layerDigests": [],
        "component": null,
        "size": layer_size,
    })
    .to_string()
    .into_bytes()
}
