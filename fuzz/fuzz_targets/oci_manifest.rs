//! A registry's manifest body, as the runtime parses it (`wasmless_formats::oci_manifest`),
//! and the layer it pulls from it; digests as registries write them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_artifact::Digest;
use wasmless_artifact::oci::{CODE_LAYER_MEDIA_TYPE, LAYER_MEDIA_TYPE};
use wasmless_formats::oci_manifest;

fuzz_target!(|body: &[u8]| {
    if let Ok(text) = std::str::from_utf8(body)
        && let Ok(digest) = text.parse::<Digest>()
    {
        // A digest reads back as written.
        assert_eq!(digest.to_string().parse::<Digest>().ok(), Some(digest));
    }
    let Ok(manifest) = oci_manifest::parse(body) else {
        return;
    };
    for media_type in [LAYER_MEDIA_TYPE, CODE_LAYER_MEDIA_TYPE] {
        if let Ok(digest) = manifest.layer_digest(media_type) {
            // The digest pulled is the one the first layer of that type names.
            let first = manifest.layers.iter().find(|layer| layer.media_type == media_type).unwrap();
            assert_eq!(first.digest.parse::<Digest>().ok(), Some(digest));
        }
    }
});
