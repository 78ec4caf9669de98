//! `wasmless-builder`: turns a Function's handler source into a validated WebAssembly
//! module once — content-addressed, cached by source digest — and publishes it where
//! the runtime loads it from (ConfigMap chunks or an OCI registry).
//!
//! [`build`] reads like the steps: read and check the source ([`source`]), look in
//! the [`cache`], compile with the language's toolchain ([`toolchain`]), [`validate`]
//! the output for the ABI the runtime needs. [`publish`] ships the result.

pub mod cache;
pub mod command;
pub mod publish;
pub mod source;
pub mod toolchain;
pub mod validate;

pub use source::{Language, Source};

use std::path::PathBuf;
use wasmless_artifact::Digest;

/// The builder's version, part of every source digest: a new builder rebuilds.
pub const BUILDER_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Source(#[from] source::SourceError),
    #[error("{tool} failed to compile the handler:\n{message}")]
    Compile { tool: &'static str, message: String },
    #[error("{0}")]
    Toolchain(String),
    #[error(transparent)]
    Invalid(#[from] validate::ValidateError),
    #[error("build cache {path}: {source}")]
    Cache { path: PathBuf, source: std::io::Error },
}

impl BuildError {
    /// The message an operator puts on the Function's status: the compiler's own words
    /// for a compile error, the one-line reason otherwise.
    pub fn status_message(&self) -> String {
        match self {
            Self::Compile { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

/// Where a build runs and what it may use.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Built modules by source digest, the Rust target directory, Go's cache if none.
    pub cache_dir: PathBuf,
    /// Build Rust handlers from this `cargo vendor` directory, without the network.
    pub vendor_dir: Option<PathBuf>,
}

impl BuildOptions {
    pub fn with_cache_dir(cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            cache_dir: cache_dir.into(),
            vendor_dir: None,
        }
    }
}

/// The steps of a build, for progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Checking,
    Compiling,
    Validating,
}

impl Step {
    pub fn describe(self, language: Language) -> String {
        match self {
            Self::Checking => "checking the source".into(),
            Self::Compiling => format!("compiling {} to WebAssembly", language.name()),
            Self::Validating => "validating the module".into(),
        }
    }
}

/// A validated module.
#[derive(Debug, Clone)]
pub struct Built {
    pub wasm: Vec<u8>,
    pub digest: Digest,
    pub source_digest: Digest,
    /// Taken from the build cache: nothing was compiled.
    pub cached: bool,
}

pub fn build(source: &Source, options: &BuildOptions, progress: &dyn Fn(Step)) -> Result<Built, BuildError> {
    progress(Step::Checking);
    source.check()?;
    let source_digest = source.digest();
    let cache = cache::BuildCache::new(&options.cache_dir);
    if let Some(wasm) = cache.get(&source_digest) {
        // Cached modules were validated before they were stored; check again anyway,
        // since a cache directory can be written by anyone with access to it.
        if validate::validate(source.language, &wasm).is_ok() {
            let digest = Digest::of(&wasm);
            return Ok(Built {
                wasm,
                digest,
                source_digest,
                cached: true,
            });
        }
    }
    progress(Step::Compiling);
    let wasm = toolchain::compile(source, options)?;
    progress(Step::Validating);
    validate::validate(source.language, &wasm)?;
    cache.put(&source_digest, &wasm)?;
    let digest = Digest::of(&wasm);
    Ok(Built {
        wasm,
        digest,
        source_digest,
        cached: false,
    })
}
