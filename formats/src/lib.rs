//! Every format Wasmless reads from bytes it did not write: a guest's response (CGI and
//! the Go reactor's encoding), a module's handler contract, a registry's manifest,
//! quantities in flags and Function specs, a handler's source and a Rust handler's
//! `Cargo.toml`, `function.yaml`, and the requests a guest asks the host to send.
//!
//! They live apart from the runtime, the builder and the CLI that use them so that the
//! fuzz targets (fuzz/, docs/fuzzing.md) link this crate alone: no wasmtime, no kube.

pub mod abi;
pub mod cargo_manifest;
pub mod cgi_response;
pub mod function_file;
pub mod oci_manifest;
pub mod outbound;
pub mod quantity;
pub mod reactor_response;
pub mod source;

pub use source::folder;
