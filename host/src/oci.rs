//! Pulling a module from an OCI registry, always by digest.

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use wasmless_artifact::{Digest, oci::LAYER_MEDIA_TYPE};
use wasmless_formats::oci_manifest;

/// Why a pull failed; the module source's `LoadError` carries it.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("cannot pull {reference}: {message}")]
    Pull { reference: String, message: String },
    #[error("module digest mismatch: expected {expected}, but {module} has {actual}; refusing to run it")]
    LayerMismatch {
        module: String,
        expected: Digest,
        actual: Digest,
    },
}

/// Pulls `reference` (no `oci://`). A reference pinned by manifest digest
/// (`repo@sha256:...`) names its `application/wasm` layer; otherwise the layer blob is
/// fetched by the module digest, which must be pinned. Returns the bytes and the digest
/// they must match.
pub async fn pull(reference: &str, pinned: Option<Digest>) -> Result<(Vec<u8>, Digest), OciError> {
    let registry = Registry::connect(reference).await?;
    let digest = match pinned {
        // Pinned twice: the manifest's layer must be the module pinned, or both are named.
        Some(digest) if registry.reference.digest().is_some() => {
            let layer = registry.layer_digest(LAYER_MEDIA_TYPE).await?;
            if layer != digest {
                return Err(OciError::LayerMismatch {
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
pub async fn pull_blob(reference: &str, digest: &Digest) -> Result<Vec<u8>, OciError> {
    Registry::connect(reference).await?.blob(digest).await
}

struct Registry {
    client: Client,
    reference: Reference,
    auth: RegistryAuth,
    text: String,
}

impl Registry {
    async fn connect(reference: &str) -> Result<Self, OciError> {
        let error = |message: String| OciError::Pull {
            reference: reference.to_string(),
            message,
        };
        let parsed: Reference = reference
            .parse()
            .map_err(|e| error(format!("not an OCI reference ({e}); write oci://registry/repo:tag")))?;
        let client = client(protocol_for(parsed.registry()));
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

    fn error(&self, message: impl Into<String>) -> OciError {
        OciError::Pull {
            reference: self.text.clone(),
            message: message.into(),
        }
    }

    /// The digest of the manifest's layer of `media_type`. oci-client fetches the manifest
    /// (checked against the reference's digest when it has one); its bytes are parsed by
    /// the fuzzed `oci_manifest`.
    async fn layer_digest(&self, media_type: &str) -> Result<Digest, OciError> {
        let (body, _) = self
            .client
            .pull_manifest_raw(&self.reference, &self.auth, oci_manifest::ACCEPTED_MEDIA_TYPES)
            .await
            .map_err(|e| self.error(e.to_string()))?;
        oci_manifest::parse(&body)
            .and_then(|manifest| manifest.layer_digest(media_type))
            .map_err(|e| self.error(e.to_string()))
    }

    async fn blob(&self, digest: &Digest) -> Result<Vec<u8>, OciError> {
        let mut bytes = Vec::new();
        self.client
            .pull_blob(&self.reference, digest.to_string().as_str(), &mut bytes)
            .await
            .map_err(|e| self.error(e.to_string()))?;
        Ok(bytes)
    }
}

/// An OCI client for `protocol`. The crates here link one rustls provider, ring (kube's),
/// and reqwest without its own (`rustls-tls-no-provider`) panics unless a process default
/// is installed: this installs ring if no one has yet.
pub fn client(protocol: ClientProtocol) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::new(ClientConfig {
        protocol,
        ..Default::default()
    })
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
