//! A registry's manifest, parsed as oci-client parses it, and the layer the runtime pulls
//! from it (`wasmless_runtime::oci::layer_digest`); digests as registries write them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oci_client::manifest::OciManifest;
use wasmless_artifact::Digest;
use wasmless_artifact::oci::{CODE_LAYER_MEDIA_TYPE, LAYER_MEDIA_TYPE};
use wasmless_runtime::oci::layer_digest;

fuzz_target!(|body: &[u8]| {
    if let Ok(text) = std::str::from_utf8(body)
        && let Ok(digest) = text.parse::<Digest>()
    {
        // A digest reads back as written.
        assert_eq!(digest.to_string().parse::<Digest>().ok(), Some(digest));
    }
    let Ok(OciManifest::Image(manifest)) = serde_json::from_slice::<OciManifest>(body) else {
        return;
    };
    for media_type in [LAYER_MEDIA_TYPE, CODE_LAYER_MEDIA_TYPE] {
        if let Ok(digest) = layer_digest(&manifest, media_type) {
            // The digest pulled is the one a layer of that type names.
            assert!(
                manifest
                    .layers
                    .iter()
                    .any(|layer| layer.media_type == media_type && layer.digest.parse::<Digest>().ok() == Some(digest))
            );
        }
    }
});
