//! Pulling a module from an OCI registry, always by digest.

use crate::module_source::LoadError;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use wasmless_artifact::{Digest, oci::LAYER_MEDIA_TYPE};

/// Pulls `reference` (no `oci://`). A reference pinned by manifest digest
/// (`repo@sha256:...`) names its `application/wasm` layer; otherwise the layer blob is
/// fetched by the module digest, which must be pinned. Returns the bytes and the digest
/// they must match.
pub async fn pull(reference: &str, pinned: Option<Digest>) -> Result<(Vec<u8>, Digest), LoadError> {
    let registry = Registry::connect(reference).await?;
    let digest = match pinned {
        // Pinned twice: the manifest's layer must be the module pinned, or both are named.
        Some(digest) if registry.reference.digest().is_some() => {
            let layer = registry.layer_digest(LAYER_MEDIA_TYPE).await?;
            if layer != digest {
                return Err(LoadError::DigestMismatch {
                    module: format!("{}{reference}", wasmless_artifact::oci::SCHEME),
                    expected: digest,
                    actual: layer,
                });
            }
            digest
        }
        Some(digest) => digest,
        None if registry.reference.digest().is_some() => registry.layer_digest(LAYER_MEDIA_TYPE).await?,
        None => {
            return Err(registry.error(
                "a tag can move: pass --module-digest sha256:<hex>, or pin the reference as repo@sha256:<manifest digest>",
            ));
        }
    };
    Ok((registry.blob(&digest).await?, digest))
}

/// Pulls the blob `digest` of the repository `reference` names (the compiled-code layer
/// beside a module); the caller checks the bytes against the digest.
pub async fn pull_blob(reference: &str, digest: &Digest) -> Result<Vec<u8>, LoadError> {
    Registry::connect(reference).await?.blob(digest).await
}

struct Registry {
    client: Client,
    reference: Reference,
    auth: RegistryAuth,
    text: String,
}

impl Registry {
    async fn connect(reference: &str) -> Result<Self, LoadError> {
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
        client
            .auth(&parsed, &auth, oci_client::RegistryOperation::Pull)
            .await
            .map_err(|e| error(e.to_string()))?;
        Ok(Self {
            client,
            reference: parsed,
            auth,
            text: reference.to_string(),
        })
    }

    fn error(&self, message: impl Into<String>) -> LoadError {
        LoadError::Oci {
            reference: self.text.clone(),
            message: message.into(),
        }
    }

    /// The digest of the manifest's layer of `media_type`.
    async fn layer_digest(&self, media_type: &str) -> Result<Digest, LoadError> {
        let (manifest, _) = self
            .client
            .pull_image_manifest(&self.reference, &self.auth)
            .await
            .map_err(|e| self.error(e.to_string()))?;
        layer_digest(&manifest, media_type).map_err(|e| self.error(e))
    }

    async fn blob(&self, digest: &Digest) -> Result<Vec<u8>, LoadError> {
        let mut bytes = Vec::new();
        self.client
            .pull_blob(&self.reference, digest.to_string().as_str(), &mut bytes)
            .await
            .map_err(|e| self.error(e.to_string()))?;
        Ok(bytes)
    }
}

/// The digest of `manifest`'s layer of `media_type`: the first such layer, as a
/// registry's manifest names it (fuzzed with the manifests a registry may answer).
pub fn layer_digest(manifest: &OciImageManifest, media_type: &str) -> Result<Digest, String> {
    let layer = manifest
        .layers
        .iter()
        .find(|layer| layer.media_type == media_type)
        .ok_or_else(|| format!("the artifact has no {media_type} layer"))?;
    layer.digest.parse().map_err(|e| format!("layer digest: {e}"))
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
