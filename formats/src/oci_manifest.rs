//! A registry's image manifest, read for the layer that holds a module or its compiled code.
//! The runtime has oci-client fetch the manifest's bytes (and check them against a pinned
//! manifest digest) and parses them here, so the parser of what a registry answers is ours,
//! small, and fuzzed (`oci_manifest`).

use serde::Deserialize;
use serde::de::IgnoredAny;
use wasmless_artifact::{Digest, DigestError};

const OCI_IMAGE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_IMAGE_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The manifests the runtime asks a registry for: an artifact is an image manifest, never an
/// index.
pub const ACCEPTED_MEDIA_TYPES: &[&str] = &[OCI_IMAGE_MANIFEST, DOCKER_IMAGE_MANIFEST];

/// An image manifest, as much of it as the runtime reads: the layers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    pub media_type: Option<String>,
    pub layers: Vec<Layer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Layer {
    pub media_type: String,
    pub digest: String,
}

/// What an index looks like from outside: `manifests` instead of `layers`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shape {
    manifests: Option<IgnoredAny>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error(
        "the reference names an image index, not an artifact's manifest: pin the artifact's own manifest (repo@sha256:...)"
    )]
    Index,
    #[error("the registry's manifest does not parse: {0}")]
    Malformed(String),
    #[error("the manifest is schema version {0}, not 2")]
    SchemaVersion(u32),
    #[error("the manifest is a {0}, not an image manifest")]
    MediaType(String),
    #[error("the artifact has no {0} layer")]
    NoLayer(String),
    #[error("layer digest: {0}")]
    LayerDigest(DigestError),
}

/// Parses a manifest body as a registry answers it.
pub fn parse(body: &[u8]) -> Result<ImageManifest, ManifestError> {
    if let Ok(Shape { manifests: Some(_) }) = serde_json::from_slice::<Shape>(body) {
        return Err(ManifestError::Index);
    }
    let manifest: ImageManifest = serde_json::from_slice(body).map_err(|e| ManifestError::Malformed(e.to_string()))?;
    if manifest.schema_version != 2 {
        return Err(ManifestError::SchemaVersion(manifest.schema_version));
    }
    match manifest.media_type.as_deref() {
        None | Some(OCI_IMAGE_MANIFEST | DOCKER_IMAGE_MANIFEST) => Ok(manifest),
        Some(other) => Err(ManifestError::MediaType(other.to_string())),
    }
}

impl ImageManifest {
    /// The digest of the first layer of `media_type`.
    pub fn layer_digest(&self, media_type: &str) -> Result<Digest, ManifestError> {
        let layer = self
            .layers
            .iter()
            .find(|layer| layer.media_type == media_type)
            .ok_or_else(|| ManifestError::NoLayer(media_type.to_string()))?;
        layer.digest.parse().map_err(ManifestError::LayerDigest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &str = "application/wasm";
    const HEX: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    fn manifest(media_type: &str, layers: &str) -> String {
        format!(r#"{{"schemaVersion":2,"mediaType":"{media_type}","config":{{}},"layers":[{layers}]}}"#)
    }

    #[test]
    fn the_layer_of_a_media_type_is_found() {
        let body = manifest(
            OCI_IMAGE_MANIFEST,
            &format!(
                r#"{{"mediaType":"other","digest":"sha256:{HEX}","size":1}},{{"mediaType":"{MODULE}","digest":"sha256:{}","size":2}}"#,
                "1".repeat(64)
            ),
        );
        let parsed = parse(body.as_bytes()).unwrap();
        assert_eq!(
            parsed.layer_digest(MODULE).unwrap().to_string(),
            format!("sha256:{}", "1".repeat(64))
        );
        assert_eq!(
            parsed.layer_digest("application/x-code"),
            Err(ManifestError::NoLayer("application/x-code".into()))
        );
    }

    #[test]
    fn indexes_and_other_shapes_are_named() {
        let index = format!(r#"{{"schemaVersion":2,"manifests":[{{"digest":"sha256:{HEX}"}}]}}"#);
        assert_eq!(parse(index.as_bytes()), Err(ManifestError::Index));
        assert_eq!(
            parse(manifest("application/vnd.oci.artifact.manifest.v1+json", "").as_bytes()),
            Err(ManifestError::MediaType(
                "application/vnd.oci.artifact.manifest.v1+json".into()
            ))
        );
        assert!(matches!(parse(b"<html>"), Err(ManifestError::Malformed(_))));
        let bad = manifest(
            DOCKER_IMAGE_MANIFEST,
            &format!(r#"{{"mediaType":"{MODULE}","digest":"md5:00"}}"#),
        );
        assert!(matches!(
            parse(bad.as_bytes()).unwrap().layer_digest(MODULE),
            Err(ManifestError::LayerDigest(_))
        ));
    }
}
