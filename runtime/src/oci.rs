//! Pulling a module from an OCI registry, always by digest.

use crate::module_source::LoadError;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use wasmless_artifact::{Digest, oci::LAYER_MEDIA_TYPE};

/// Pulls `reference` (no `oci://`). A reference pinned by manifest digest
/// (`repo@sha256:...`) is pulled as an artifact and its `application/wasm` layer taken;
/// otherwise the layer blob is fetched by the module digest, which must be pinned.
/// Returns the bytes and the digest they must match.
pub async fn pull(reference: &str, pinned: Option<Digest>) -> Result<(Vec<u8>, Digest), LoadError> {
    let error = |message: String| LoadError::Oci {
        reference: reference.to_string(),
        message,
    };
    let parsed: Reference = reference
        .parse()
        .map_err(|e| error(format!("not an OCI reference ({e}); write oci://registry/repo:tag")))?;
    let client = Client::new(ClientConfig {
        protocol: protocol_for(parsed.registry()),
        ..Default::default()
    });
    let auth = registry_auth();

    if parsed.digest().is_some() {
        let image = client
            .pull(&parsed, &auth, vec![LAYER_MEDIA_TYPE])
            .await
            .map_err(|e| error(e.to_string()))?;
        let layer = image
            .layers
            .into_iter()
            .find(|layer| layer.media_type == LAYER_MEDIA_TYPE)
            .ok_or_else(|| error(format!("the artifact has no {LAYER_MEDIA_TYPE} layer")))?;
        let expected = pinned.unwrap_or_else(|| Digest::of(&layer.data));
        return Ok((layer.data.to_vec(), expected));
    }

    let digest = pinned.ok_or_else(|| {
        error(
            "a tag can move: pass --module-digest sha256:<hex>, or pin the reference as repo@sha256:<manifest digest>"
                .into(),
        )
    })?;
    client
        .auth(&parsed, &auth, oci_client::RegistryOperation::Pull)
        .await
        .map_err(|e| error(e.to_string()))?;
    let mut bytes = Vec::new();
    client
        .pull_blob(&parsed, digest.to_string().as_str(), &mut bytes)
        .await
        .map_err(|e| error(e.to_string()))?;
    Ok((bytes, digest))
}

/// Registries on loopback (the tests', a developer's) speak plain HTTP; so does any
/// registry named in `WASMLESS_OCI_PLAIN_HTTP` (comma-separated), as in-cluster
/// registries often do. Everything else is HTTPS.
pub fn protocol_for(registry: &str) -> ClientProtocol {
    let host = registry.rsplit_once(':').map_or(registry, |(host, _)| host);
    let loopback = host == "localhost" || host.starts_with("127.") || host == "[::1]";
    let listed = std::env::var("WASMLESS_OCI_PLAIN_HTTP")
        .map(|list| list.split(',').any(|entry| entry.trim() == registry))
        .unwrap_or(false);
    if loopback || listed {
        ClientProtocol::Http
    } else {
        ClientProtocol::Https
    }
}

pub fn registry_auth() -> RegistryAuth {
    match (
        std::env::var("WASMLESS_OCI_USERNAME"),
        std::env::var("WASMLESS_OCI_PASSWORD"),
    ) {
        (Ok(user), Ok(password)) => RegistryAuth::Basic(user, password),
        _ => RegistryAuth::Anonymous,
    }
}
