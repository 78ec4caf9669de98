//! The operator's settings: images, default storage, registry. Read from flags and
//! environment by the binary, built directly by the tests.

use crate::crd::Storage;

#[derive(Clone, Debug)]
pub struct Settings {
    /// Image of `wasmless-runtime` for the function pods.
    pub runtime_image: String,
    /// Image of `wasmless-builder` for the build Jobs.
    pub builder_image: String,
    /// Part of every source digest: a new builder rebuilds every function once.
    pub builder_version: String,
    /// Storage of Functions that do not set `spec.storage`.
    pub default_storage: Storage,
    /// Registry (`host[:port][/prefix]`) for OCI storage; without it `storage: oci` is refused on status.
    pub oci_registry: Option<String>,
    /// Registries (comma-separated `host:port`) spoken to over plain HTTP, passed to the
    /// builder and the runtime as `WASMLESS_OCI_PLAIN_HTTP`.
    pub oci_plain_http: Option<String>,
    /// The Go module proxy (a `GOPROXY` value) build Jobs fetch the modules of a handler's
    /// go.mod from, passed to the builder as `WASMLESS_GOPROXY`; without it such handlers
    /// fail to build with a message naming this setting.
    pub go_proxy: Option<String>,
    /// The crates registry (a sparse index URL) build Jobs fetch the dependencies of a Rust
    /// handler's Cargo.toml from, passed to the builder as `WASMLESS_CARGO_REGISTRY`; without
    /// it such handlers fail to build with a message naming this setting.
    pub cargo_registry: Option<String>,
}

impl Settings {
    /// Settings with the given images, ConfigMap storage and no registry.
    pub fn new(runtime_image: impl Into<String>, builder_image: impl Into<String>) -> Self {
        let builder_image = builder_image.into();
        Self {
            runtime_image: runtime_image.into(),
            builder_version: builder_image.clone(),
            builder_image,
            default_storage: Storage::ConfigMap,
            oci_registry: None,
            oci_plain_http: None,
            go_proxy: None,
            cargo_registry: None,
        }
    }
}
