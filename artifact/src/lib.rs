//! The module storage format, written once and shared by the builder, the runtime and
//! the operator: the digest type, how a module is compressed and split into ConfigMap
//! chunks, the label and annotation keys, and the OCI media types.
//!
//! It links neither wasmtime nor kube, so every part can depend on it.

mod chunks;
mod digest;
mod go_source;

pub use chunks::{
    ChunkError, MAX_CHUNK_BYTES, MAX_MODULE_BYTES, chunk_file_name, chunks_configmap_names, compress_and_split,
    configmap_name, parse_chunk_file_name, reassemble,
};
pub use digest::{Digest, DigestError};
pub use go_source::go_package;

/// ConfigMap key that holds one chunk of the zstd-compressed module.
pub const CHUNK_KEY: &str = "module.wasm.zst";

/// File beside a module (`<module>.sha256`) or in a chunk directory that names the
/// digest the runtime must verify, when `--module-digest` is not given.
pub const DIGEST_FILE_NAME: &str = "module.sha256";

/// Labels on every module ConfigMap.
pub mod labels {
    pub const FUNCTION: &str = "wasmless.io/function";
    pub const SOURCE_DIGEST: &str = "wasmless.io/source-digest";
    pub const MODULE_DIGEST: &str = "wasmless.io/module-digest";

    /// The value of a digest label. A label value holds at most 63 characters, so the
    /// full `sha256:<64 hex>` cannot be one; the 10 hex digits of [`crate::Digest::short`]
    /// (the same as in the chunk ConfigMap names) are used, and the full digests are in
    /// the annotations.
    pub fn digest_value(digest: &crate::Digest) -> String {
        digest.short()
    }
}

/// Annotations on every module ConfigMap.
pub mod annotations {
    /// The full `sha256:<hex>` digest of the uncompressed `.wasm` bytes.
    pub const MODULE_DIGEST: &str = "wasmless.io/module-digest";
    /// Size in bytes of the uncompressed module.
    pub const MODULE_SIZE: &str = "wasmless.io/module-size";
    /// How many chunks make the module.
    pub const CHUNK_COUNT: &str = "wasmless.io/chunk-count";
    /// This chunk's index, from 0.
    pub const CHUNK_INDEX: &str = "wasmless.io/chunk-index";
}

/// Media types of the Wasm OCI artifact layout.
pub mod oci {
    pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
    pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
    /// URL scheme the runtime and builder accept for OCI references.
    pub const SCHEME: &str = "oci://";
}
