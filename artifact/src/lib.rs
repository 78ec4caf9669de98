//! The module storage format, written once and shared by the builder, the runtime and
//! the operator: the digest type, how a module is compressed and split into ConfigMap
//! chunks, the label and annotation keys, the OCI media types, and how a runtime asks its
//! node's store of verified code (`code_store`).
//!
//! It links neither wasmtime nor kube, so every part can depend on it.

mod chunks;
mod code;
pub mod code_store;
mod digest;
mod go_source;
pub mod guest_files;
pub mod ports;

pub use chunks::{
    ChunkError, MAX_CHUNK_BYTES, MAX_MODULE_BYTES, Part, chunk_file_name, chunks_configmap_names, compress_and_split,
    configmap_name, join_chunks, parse_chunk_file_name, reassemble, split_chunks,
};
pub use code::{
    BlockSpan, CODE_BLOCK_BYTES, CODE_HEADER_BYTES, CODE_PREAMBLE_BYTES, CodeBlock, CodeError, CodeHeader, CodeKind,
    CodePreamble, LIKELY_CODE_RATIO, MAX_CODE_BYTES, code_block_spans, code_blocks, code_header, code_preamble,
    decode_code, decode_code_into, decoded_code_size, decompress_block, decompress_code_into, encode_code,
    split_for_blocks,
};
pub use digest::{Digest, DigestError, DigestHasher};
pub use go_source::go_package;

/// ConfigMap key that holds one chunk of the zstd-compressed module.
pub const CHUNK_KEY: &str = "module.wasm.zst";

/// ConfigMap key that holds one chunk of the compiled code (see [`encode_code`]).
pub const CODE_CHUNK_KEY: &str = "code.cwasm.lz4";

/// File beside a module (`<module>.sha256`) or in a chunk directory that names the
/// digest the runtime must verify, when `--module-digest` is not given.
pub const DIGEST_FILE_NAME: &str = "module.sha256";

/// Prefix of the runtime container's variables that are the handler's environment: the
/// operator writes each of a Function's variables under it, and the runtime hands the
/// handler every variable that has it, without it, and no other.
pub const HANDLER_ENV_PREFIX: &str = "WASMLESS_HANDLER_ENV_";

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
    /// On compiled-code chunks: the full digest of the code artifact (the compressed bytes).
    pub const CODE_DIGEST: &str = "wasmless.io/code-digest";
    /// On compiled-code chunks: size in bytes of the code artifact as stored (compressed).
    pub const CODE_SIZE: &str = "wasmless.io/code-size";
    /// On compiled-code chunks: the engine compatibility hash it was compiled for.
    pub const ENGINE_HASH: &str = "wasmless.io/engine-hash";
    /// On compiled-code chunks: the CPU feature level it needs (`x86-64-v3`).
    pub const CODE_TARGET: &str = "wasmless.io/code-target";
}

/// The directories of a build Job's persistent cache under its root (a node's directory or
/// a claim), which the operator mounts into the steps of a build and the builder prepares:
/// each namespace has its own, and in it the compile step's and the publish step's, which no
/// compile step mounts (docs/security.md, door 2).
pub mod build_cache {
    /// A namespace's directory, relative to the root.
    pub fn namespace_dir(namespace: &str) -> String {
        format!("namespaces/{namespace}")
    }
    /// The compile step's directory of `namespace`, relative to the root.
    pub fn build_dir(namespace: &str) -> String {
        format!("{}/build", namespace_dir(namespace))
    }
    /// The publish step's directory of `namespace` (compiled code), relative to the root.
    pub fn published_dir(namespace: &str) -> String {
        format!("{}/published", namespace_dir(namespace))
    }
}

/// Media types of the Wasm OCI artifact layout.
pub mod oci {
    pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
    pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
    /// The compiled-code layer beside the module's: the code artifact, LZ4-compressed.
    pub const CODE_LAYER_MEDIA_TYPE: &str = "application/vnd.wasmless.code.v1+lz4";
    /// URL scheme the runtime and builder accept for OCI references.
    pub const SCHEME: &str = "oci://";
}

/// Exit status of `wasmless-builder build` when the source itself does not build (a
/// compile error, a bad source, a module without the expected ABI): building again gives
/// the same answer, so the operator's Job fails at once on it. Every other failure (the API
/// server, the registry, the disk) exits 1 and the Job retries it. Not 1 (any error
/// returned from `main`), 2 (clap's usage error) or 101 (a panic).
pub const EXIT_SOURCE_DOES_NOT_BUILD: i32 = 10;
