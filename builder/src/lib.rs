//! `wasmless-builder`: turns a Function's handler source into a validated WebAssembly
//! module once — content-addressed, cached by source digest — and publishes it where
//! the runtime loads it from (ConfigMap chunks or an OCI registry).
//!
//! [`build`] reads like the steps: read and check the source ([`source`]), look in
//! the [`cache`], compile with the language's toolchain ([`toolchain`]), [`validate`]
//! the output for the ABI the runtime needs, snapshot a Go reactor after its
//! initialisation (`wasmless_host::snapshot`), and [`precompile`] it to native code
//! once, so that no pod compiles it (the code is cached too: [`precompile_cached`]).
//! [`publish`] ships the result.

pub mod cache;
pub mod command;
pub mod flags;
pub mod publish;
pub mod publish_step;
// The handler's source and its checks: a format of bytes we did not write, fuzzed apart.
pub use wasmless_formats::source;
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
    #[error("cannot compile the module to native code: {0}")]
    Precompile(String),
    #[error(transparent)]
    Snapshot(#[from] wasmless_host::snapshot::SnapshotError),
    /// The handler's go.mod needs modules and no module proxy is configured.
    #[error(
        "go.mod requires {modules}, and no Go module proxy is configured for builds: set {GO_PROXY_ENV} (`wasmless build`, `wasmless dev`, or the builder's --go-proxy); on a cluster, the operator's --go-proxy flag (WASMLESS_GOPROXY in its environment, Helm value builder.goProxy)"
    )]
    NoModuleProxy { modules: String },
    /// The module proxy could not be reached or failed: not the source's fault.
    #[error("the Go module proxy failed (a retry may succeed):\n{0}")]
    ModuleProxy(String),
    /// The handler's Cargo.toml has dependencies and no crates registry is configured.
    #[error(
        "Cargo.toml depends on {crates}, and no crates registry is configured for builds: set {CARGO_REGISTRY_ENV} to a sparse index (sparse+https://…/) for `wasmless build`, `wasmless dev`, or the builder's --cargo-registry; on a cluster, the operator's --cargo-registry flag (WASMLESS_CARGO_REGISTRY in its environment, Helm value builder.cargoRegistry)"
    )]
    NoCratesRegistry { crates: String },
    /// The crates registry could not be reached or failed: not the source's fault.
    #[error("the crates registry failed (a retry may succeed):\n{0}")]
    CratesRegistry(String),
}

/// The builder's setting naming the Go module proxy (a `GOPROXY` value), read by
/// `wasmless-builder build`, `wasmless build` and `wasmless dev`, and set on build Jobs by
/// the operator.
pub const GO_PROXY_ENV: &str = "WASMLESS_GOPROXY";

/// The builder's setting naming the crates registry (a sparse index URL) that Rust handlers
/// with dependencies in their Cargo.toml build through, in place of crates.io; read and set
/// as [`GO_PROXY_ENV`] is.
pub const CARGO_REGISTRY_ENV: &str = "WASMLESS_CARGO_REGISTRY";

impl BuildError {
    /// The message an operator puts on the Function's status: the compiler's own words
    /// for a compile error, the one-line reason otherwise.
    pub fn status_message(&self) -> String {
        match self {
            Self::Compile { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// Whether building the same source again fails the same way (the source or its
    /// module is at fault), as opposed to the machine the build ran on (a directory it
    /// could not write, a toolchain it could not start): only the latter is worth a retry.
    pub fn is_the_sources_fault(&self) -> bool {
        match self {
            Self::Source(source::SourceError::Read { .. }) => false,
            Self::Source(_)
            | Self::Compile { .. }
            | Self::Invalid(_)
            | Self::NoModuleProxy { .. }
            | Self::NoCratesRegistry { .. } => true,
            // Initialisers that fail or never finish do so on every build.
            Self::Snapshot(wasmless_host::snapshot::SnapshotError::Initialize(_)) => true,
            Self::Snapshot(_) => false,
            Self::Toolchain(_)
            | Self::Cache { .. }
            | Self::Precompile(_)
            | Self::ModuleProxy(_)
            | Self::CratesRegistry(_) => false,
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
    /// The `GOPROXY` of Go handlers with a `go.mod` that requires modules; without it
    /// they do not build (and a Go handler without a `go.mod` never needs one).
    pub go_proxy: Option<String>,
    /// Keep the compilers' own caches (Go's `GOCACHE`, Cargo's home with its registry) in
    /// `cache_dir` too, whatever the environment says: a build Job's persistent cache,
    /// where an edit compiles only what changed. Off, they are the user's own.
    pub compiler_caches_in_cache_dir: bool,
    /// The sparse index that Rust handlers whose Cargo.toml has dependencies build through
    /// (crates.io replaced by it); without it they do not build.
    pub cargo_registry: Option<String>,
}

impl BuildOptions {
    pub fn with_cache_dir(cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            cache_dir: cache_dir.into(),
            vendor_dir: None,
            go_proxy: None,
            compiler_caches_in_cache_dir: false,
            cargo_registry: None,
        }
    }

    /// With the module proxy [`GO_PROXY_ENV`] names, when set and not empty.
    pub fn with_go_proxy_from_env(mut self) -> Self {
        self.go_proxy = std::env::var(GO_PROXY_ENV).ok().filter(|p| !p.trim().is_empty());
        self
    }

    /// With the crates registry [`CARGO_REGISTRY_ENV`] names, when set and not empty.
    pub fn with_cargo_registry_from_env(mut self) -> Self {
        self.cargo_registry = std::env::var(CARGO_REGISTRY_ENV).ok().filter(|r| !r.trim().is_empty());
        self
    }
}

/// The steps of a build, for progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Checking,
    Compiling,
    Validating,
    Snapshotting,
    Precompiling,
}

impl Step {
    pub fn describe(self, language: Language) -> String {
        match self {
            Self::Checking => "checking the source".into(),
            Self::Compiling => format!("compiling {} to WebAssembly", language.name()),
            Self::Validating => "validating the module".into(),
            Self::Snapshotting => "initialising the Go reactor and snapshotting it".into(),
            Self::Precompiling => format!(
                "compiling the module to native code for {}",
                wasmless_host::engine::PORTABLE_TARGET
            ),
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
    /// For a Go reactor built now: its snapshot (none when taken from the cache).
    pub snapshot: Option<SnapshotReport>,
    /// The module cache's answer: `hit`, `miss`, or `corrupt` (then rebuilt).
    pub cache: &'static str,
    /// Why the cached entry was not used, when it failed its check.
    pub cache_problem: Option<String>,
    /// Seconds of the phases that ran.
    pub phases: Phases,
}

/// Seconds each phase of a build took; zero for one that did not run (a cache hit
/// compiles nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phases {
    /// Reading the source's checks and the cache.
    pub check: f64,
    /// The toolchain: the compiler and validating what it wrote.
    pub compile: f64,
    /// Initialising a Go reactor and snapshotting it.
    pub snapshot: f64,
}

/// What snapshotting a Go reactor made, and what it took.
#[derive(Debug, Clone)]
pub struct SnapshotReport {
    /// Linear memory an instance starts with.
    pub memory_bytes: u64,
    /// Data segments before and after merging them.
    pub segments_written: usize,
    pub segments_kept: usize,
    pub seconds: f64,
    /// Functions the snapshot's run found compiled in the cache, and compiled.
    pub functions: (usize, usize),
}

/// Compiled code for a built module: what a new pod loads instead of compiling.
#[derive(Debug, Clone)]
pub struct CompiledCode {
    /// The code artifact as stored: LZ4 of the header and wasmtime's `.cwasm`.
    pub artifact: Vec<u8>,
    /// Of `artifact`: what the runtime is pinned to.
    pub digest: Digest,
    /// The module it was compiled from.
    pub module_digest: Digest,
    /// The engine compatibility hash it was compiled for.
    pub engine: String,
    /// The CPU feature level it needs.
    pub target: &'static str,
    /// Time the compilation took (zero when taken from the cache).
    pub seconds: f64,
    /// The code cache's answer: `hit`, `miss`, `corrupt` (then compiled again), or `off`
    /// for [`precompile`], which does not look.
    pub cache: &'static str,
    /// Why the cached entry was not used, when it failed its check.
    pub cache_problem: Option<String>,
    /// Functions found compiled in the cache, and compiled, when the module was compiled
    /// through it.
    pub functions: Option<(usize, usize)>,
}

/// Compiles a built module with the runtime's engine configuration for the portable
/// target, without looking in a cache.
pub fn precompile(built: &Built) -> Result<CompiledCode, BuildError> {
    precompile_with(built, None)
}

/// [`precompile`], through the code cache in `cache_dir`: keyed by the module's digest,
/// the engine compatibility hash and the target, so a module compiled once by this engine
/// is never compiled again. Native code is only taken from an entry whose digest checks
/// (see [`cache`]), in a directory only build Jobs mount.
pub fn precompile_cached(built: &Built, cache_dir: &std::path::Path) -> Result<CompiledCode, BuildError> {
    precompile_with(built, Some(&cache::BuildCache::new(cache_dir)))
}

fn precompile_with(built: &Built, cache: Option<&cache::BuildCache>) -> Result<CompiledCode, BuildError> {
    let started = std::time::Instant::now();
    let functions = cache.map(cache::BuildCache::functions);
    let store = functions
        .clone()
        .map(|functions| functions as std::sync::Arc<dyn wasmless_host::precompiled::CacheStore>);
    let engine = wasmless_host::precompiled::precompile_engine_with(store)
        .map_err(|e| BuildError::Precompile(format!("{e:#}")))?;
    let engine_hash = wasmless_host::engine::engine_hash(&engine);
    let target = wasmless_host::engine::PORTABLE_TARGET;
    let code = |artifact: Vec<u8>, cache, cache_problem| CompiledCode {
        digest: Digest::of(&artifact),
        artifact,
        module_digest: built.digest,
        engine: engine_hash.clone(),
        target,
        seconds: started.elapsed().as_secs_f64(),
        cache,
        cache_problem,
        functions: functions.as_ref().map(|functions| functions.counts()),
    };
    let lookup = cache.map_or(cache::Lookup::Miss, |c| c.get_code(&built.digest, &engine_hash, target));
    let cache_problem = match lookup {
        cache::Lookup::Hit(artifact) => {
            match says_module_files(&artifact) == wasmless_artifact::guest_files::carried(&built.wasm) {
                true => return Ok(code(artifact, "hit", None)),
                // Code cached before its header said whether the module carries files: a
                // runtime loading it would not read the module for them.
                false => Some("its header does not say the module carries files".to_string()),
            }
        }
        cache::Lookup::Corrupt(why) => Some(why),
        cache::Lookup::Miss => None,
    };
    let abi = wasmless_host::abi::detect(&built.wasm).map_err(|e| BuildError::Precompile(e.to_string()))?;
    let artifact = wasmless_host::precompiled::precompile(&engine, abi, &built.wasm, built.digest)
        .map_err(|e| BuildError::Precompile(format!("{e:#}")))?;
    let answer = match (cache, &cache_problem) {
        (None, _) => "off",
        (Some(_), Some(_)) => "corrupt",
        (Some(_), None) => "miss",
    };
    if let Some(cache) = cache {
        cache.put_code(&built.digest, &engine_hash, target, &artifact)?;
    }
    Ok(code(artifact, answer, cache_problem))
}

/// What a code artifact's header says of its module's files (`false` when it does not read).
fn says_module_files(artifact: &[u8]) -> bool {
    wasmless_artifact::decode_code(artifact).is_ok_and(|(header, _)| header.module_files)
}

pub fn build(source: &Source, options: &BuildOptions, progress: &dyn Fn(Step)) -> Result<Built, BuildError> {
    let mut phases = Phases::default();
    let mut clock = std::time::Instant::now();
    let mut lap = move || {
        let now = std::time::Instant::now();
        let seconds = (now - clock).as_secs_f64();
        clock = now;
        seconds
    };
    progress(Step::Checking);
    source.check()?;
    let source_digest = source.digest(BUILDER_VERSION);
    let cache = cache::BuildCache::new(&options.cache_dir);
    let mut cache_problem = None;
    match cache.get_module(&source_digest) {
        // Cached modules were validated before they were stored; check again anyway: it
        // costs milliseconds, and a module that no longer validates is not served.
        cache::Lookup::Hit(wasm) => match validate::validate(source.language, &wasm) {
            Ok(_) => {
                phases.check = lap();
                let digest = Digest::of(&wasm);
                return Ok(Built {
                    wasm,
                    digest,
                    source_digest,
                    cached: true,
                    snapshot: None,
                    cache: "hit",
                    cache_problem: None,
                    phases,
                });
            }
            Err(error) => cache_problem = Some(format!("the cached module does not validate: {error}")),
        },
        cache::Lookup::Corrupt(why) => cache_problem = Some(why),
        cache::Lookup::Miss => {}
    }
    phases.check = lap();
    progress(Step::Compiling);
    let mut wasm = toolchain::compile(source, options)?;
    progress(Step::Validating);
    let abi = validate::validate(source.language, &wasm)?;
    phases.compile = lap();
    let mut snapshot = None;
    let files = guest_files(source);
    if abi == wasmless_host::abi::Abi::GoReactor {
        progress(Step::Snapshotting);
        let functions = cache.functions();
        let made = wasmless_host::snapshot::snapshot_with_files(&wasm, Some(functions.clone()), &files)?;
        validate::validate(source.language, &made.wasm)?;
        snapshot = Some(SnapshotReport {
            memory_bytes: made.memory_bytes,
            segments_written: made.segments_written,
            segments_kept: made.segments_kept,
            seconds: made.seconds,
            functions: functions.counts(),
        });
        wasm = made.wasm;
        phases.snapshot = lap();
    }
    // The files travel in the module, so its digest covers them wherever it is stored.
    let wasm = wasmless_artifact::guest_files::append(&wasm, &files);
    cache.put_module(&source_digest, &wasm)?;
    let digest = Digest::of(&wasm);
    Ok(Built {
        wasm,
        digest,
        source_digest,
        cached: false,
        snapshot,
        cache: if cache_problem.is_some() { "corrupt" } else { "miss" },
        cache_problem,
        phases,
    })
}

/// The files the handler ships (its data files), as its working directory holds them.
fn guest_files(source: &Source) -> Vec<wasmless_artifact::guest_files::GuestFile> {
    source
        .data_files
        .iter()
        .map(|file| wasmless_artifact::guest_files::GuestFile {
            name: file.name.clone(),
            bytes: file.bytes.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmless_artifact::guest_files::{self, GuestFile};

    fn built(wasm: Vec<u8>) -> Built {
        Built {
            digest: Digest::of(&wasm),
            source_digest: Digest::of(b"source"),
            wasm,
            cached: false,
            snapshot: None,
            cache: "miss",
            cache_problem: None,
            phases: Phases::default(),
        }
    }

    fn header(code: &CompiledCode) -> wasmless_artifact::CodeHeader {
        wasmless_artifact::decode_code(&code.artifact).unwrap().0
    }

    /// The code of a module that ships files says so, so a runtime reads the module for
    /// them; code cached before it said so is compiled again rather than served.
    #[test]
    fn code_says_its_module_carries_files_even_from_an_older_cache_entry() {
        let command = wat::parse_str(r#"(module (memory (export "memory") 1) (func (export "_start")))"#).unwrap();
        let files = [GuestFile {
            name: "countries.csv".into(),
            bytes: b"fr,France\n".to_vec(),
        }];
        let with_files = built(guest_files::append(&command, &files));
        let dir = tempfile::tempdir().unwrap();
        let code = precompile_cached(&with_files, dir.path()).unwrap();
        assert!(header(&code).module_files);
        assert!(!header(&precompile(&built(command.clone())).unwrap()).module_files);

        // As a builder before the header said it left the entry: the same code, no line.
        let old = wasmless_artifact::CodeHeader {
            module_files: false,
            ..header(&code)
        };
        let (_, cwasm) = wasmless_artifact::decode_code(&code.artifact).unwrap();
        let cache = cache::BuildCache::new(dir.path());
        let old_artifact = wasmless_artifact::encode_code(&old, &cwasm);
        cache
            .put_code(&with_files.digest, &code.engine, code.target, &old_artifact)
            .unwrap();
        let again = precompile_cached(&with_files, dir.path()).unwrap();
        assert_eq!(again.cache, "corrupt");
        assert!(header(&again).module_files);

        // A section the runtime would refuse fails the build instead, with the reason.
        let escaping = guest_files::append(
            &command,
            &[GuestFile {
                name: "../x".into(),
                bytes: Vec::new(),
            }],
        );
        let error = validate::validate(wasmless_formats::source::Language::Wasm, &escaping).unwrap_err();
        assert!(error.to_string().contains("files cannot be served"), "{error}");
    }
}
