//! Turning verified module bytes into a [`LoadedHandler`]: ABI detection, compilation
//! (or the compiled-code cache), linking. The engine is built once and shared by every
//! module the process loads.

use crate::abi::{self, Abi, AbiError};
use crate::code_store::{CodeStore, CodeStoreError, Stored};
use crate::compile::{self, CacheOutcome, CompileError, Compiled};
use crate::engine::CompileTarget;
use crate::guest_root::GuestRoot;
use crate::handler::{LoadedHandler, Shared};
use crate::limits::{Isolation, RequestLimits};
use crate::load_phases::{LoadPhase, LoadPhases};
use crate::metrics::Metrics;
use crate::module_source::VerifiedModule;
use crate::precompiled::{self, CodeRefused, CodeSource, Fallback, Opened, Residence, VerifiedCode};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use wasmless_artifact::Digest;
use wasmless_outbound::Outbound;
use wasmtime::Engine;

mod staging;
pub use staging::Staged;

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error(transparent)]
    Abi(#[from] AbiError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("cannot link the module (does it import something outside WASI?): {0}")]
    Link(String),
    #[error("cannot set up wasmtime: {0}")]
    Engine(String),
    #[error(transparent)]
    CodeRefused(#[from] CodeRefused),
    #[error("the module's files cannot be read: {0}")]
    Files(String),
}

/// The files of a handler, made ready for its guests: `None` when it ships none.
pub type Files = Option<Arc<GuestRoot>>;

/// Code ready to link: compiled here, from the cache, or the builder's.
pub struct OpenedCode {
    compiled: Compiled,
    abi: Abi,
    residence: Residence,
    digest: Digest,
    cache: CacheOutcome,
    started: Instant,
    /// What the load took so far, step by step; [`Loader::link`] adds its own.
    pub phases: LoadPhases,
    /// The module carries files (the code's header, or the cache's mark): only the module
    /// holds them, so it is read before this code is linked.
    pub needs_files: bool,
}

impl OpenedCode {
    /// The builder's code for `module`, opened: read and verified here, or from the store.
    fn builders(
        compiled: Compiled,
        abi: Abi,
        residence: Residence,
        needs_files: bool,
        module: Digest,
        started: Instant,
        phases: LoadPhases,
    ) -> Self {
        Self {
            compiled,
            abi,
            residence,
            digest: module,
            cache: CacheOutcome::Precompiled,
            started,
            phases,
            needs_files,
        }
    }

    /// Whether this came from the compiled-code cache (a link that fails there falls back to
    /// the module).
    pub fn from_cache(&self) -> bool {
        self.cache == CacheOutcome::Hit
    }
}

/// What the node's store gave for a load ([`Loader::open_stored`]).
pub enum FromStore {
    Opened(OpenedCode),
    /// Read the code instead; `put`: and put it in the store after (it said it lacks it).
    Missing {
        put: bool,
    },
}

/// The engine every module of this process runs on, and where compiled code is cached:
/// made once, shared by each Function's [`Loader`].
#[derive(Clone)]
pub struct EngineHost {
    engine: Engine,
    target: CompileTarget,
    cache_dir: Option<PathBuf>,
    mapped_dir: Option<PathBuf>,
    code_store: Option<CodeStore>,
}

impl EngineHost {
    /// `limits` size the instance pool: its concurrency the slots, its memory the largest
    /// linear memory any Function may be allowed.
    pub fn new(limits: &RequestLimits, cache_dir: Option<PathBuf>) -> Result<Self, ModuleError> {
        let target = CompileTarget::for_this_host();
        if let CompileTarget::Host { missing } = &target {
            tracing::warn!(
                portable = crate::engine::PORTABLE_TARGET,
                missing = missing.join(", "),
                "this CPU lacks part of the portable feature level: compiling for this host, and precompiled code will not be used"
            );
        }
        let engine = crate::engine::build_engine(limits, &target).map_err(|e| ModuleError::Engine(format!("{e:?}")))?;
        if let Some(dir) = &cache_dir {
            GuestRoot::clear(dir);
        }
        Ok(Self {
            engine,
            target,
            cache_dir,
            mapped_dir: None,
            code_store: None,
        })
    }

    /// Asks `store` for the builder's code before reading it, and puts there what was read
    /// (`--code-store`).
    pub fn with_code_store(mut self, store: Option<CodeStore>) -> Self {
        self.code_store = store;
        self
    }

    /// Loads the builder's code by mapping a file written in the cache directory, not as a
    /// copy in memory: for the pool, where many Functions' code is loaded at once and
    /// what each holds alone is what its budget counts. Without a cache directory,
    /// nothing changes.
    pub fn mapping_code(mut self) -> Self {
        self.mapped_dir = self.cache_dir.as_deref().map(precompiled::mapped::dir_in);
        if let Some(dir) = &self.mapped_dir {
            // Files are unlinked as soon as they are made; one is left only by a process
            // that died in between, and only this process writes here.
            let _ = std::fs::remove_dir_all(dir);
        }
        self
    }
}

pub struct Loader {
    engine: Engine,
    target: CompileTarget,
    shared: Arc<Shared>,
    cache_dir: Option<PathBuf>,
    mapped_dir: Option<PathBuf>,
    code_store: Option<CodeStore>,
}

impl Loader {
    /// A loader with an engine of its own, sized by `limits`: a process serving one Function.
    pub fn new(
        limits: RequestLimits,
        env: Vec<(String, String)>,
        function: &str,
        metrics: Arc<Metrics>,
        outbound: Arc<Outbound>,
        cache_dir: Option<PathBuf>,
    ) -> Result<Self, ModuleError> {
        let host = EngineHost::new(&limits, cache_dir)?;
        Ok(Self::on(&host, limits, env, function, metrics, outbound))
    }

    /// A Function's loader on an engine made already: each request's store gets these
    /// limits, env and outbound policy.
    pub fn on(
        host: &EngineHost,
        limits: RequestLimits,
        env: Vec<(String, String)>,
        function: &str,
        metrics: Arc<Metrics>,
        outbound: Arc<Outbound>,
    ) -> Self {
        let shared = Arc::new(Shared {
            limits,
            env,
            metrics,
            function: function.to_string(),
            outbound,
            files: None,
        });
        Self {
            engine: host.engine.clone(),
            target: host.target.clone(),
            shared,
            cache_dir: host.cache_dir.clone(),
            mapped_dir: host.mapped_dir.clone(),
            code_store: host.code_store.clone(),
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub fn limits(&self) -> &RequestLimits {
        &self.shared.limits
    }

    /// The files a verified module carries, written out for its guests (off the async
    /// threads: up to 64 files).
    pub async fn files(&self, module: &VerifiedModule) -> Result<Files, ModuleError> {
        let files =
            wasmless_artifact::guest_files::read(&module.bytes).map_err(|e| ModuleError::Files(e.to_string()))?;
        if files.is_empty() {
            return Ok(None);
        }
        let base = self.cache_dir.clone();
        let root = tokio::task::spawn_blocking(move || GuestRoot::new(base.as_deref(), &files))
            .await
            .map_err(|e| ModuleError::Engine(e.to_string()))?
            .map_err(|e| ModuleError::Files(e.to_string()))?;
        Ok(Some(Arc::new(root)))
    }

    /// Compiles (off the async threads) and links a verified module, with its files.
    pub async fn load(&self, module: VerifiedModule) -> Result<LoadedHandler, ModuleError> {
        let started = Instant::now();
        let mut phases = LoadPhases::default();
        // What the bytes are first: a file that is no module is told as such.
        let abi = abi::detect(&module.bytes)?;
        let files = self.files(&module).await?;
        let compiling = Instant::now();
        if files.is_some() {
            phases.add(LoadPhase::Files, compiling - started);
        }
        let engine = self.engine.clone();
        let cache_dir = self.cache_dir.clone();
        let digest = module.digest;
        let carries_files = files.is_some();
        let (compiled, cache) = tokio::task::spawn_blocking(move || {
            compile::compile(
                &engine,
                abi,
                &module.bytes,
                &digest,
                cache_dir.as_deref(),
                carries_files,
            )
        })
        .await
        .map_err(|e| ModuleError::Engine(e.to_string()))??;
        phases.since(LoadPhase::Compile, compiling);
        // A hit is mapped from the cache's file, but its metadata is not measured here:
        // counted whole as private, as a copy is (the pool compiles only when the builder's
        // code cannot be used).
        let opened = OpenedCode {
            compiled,
            abi,
            residence: Residence::Copied,
            digest,
            cache,
            started,
            phases,
            needs_files: carries_files,
        };
        self.link(opened, files)
    }

    /// The code the compiled-code cache holds for `digest`, if it holds any, without
    /// reading the module: a restart then needs neither the module's source (a registry,
    /// say) nor the time to read and hash it.
    pub async fn open_cached(&self, digest: Digest, started: Instant) -> Option<OpenedCode> {
        let engine = self.engine.clone();
        let cache_dir = self.cache_dir.clone()?;
        let opening = Instant::now();
        let (compiled, abi, needs_files) =
            tokio::task::spawn_blocking(move || compile::load_cached(&engine, &digest, &cache_dir))
                .await
                .ok()??;
        Some(OpenedCode {
            compiled,
            abi,
            residence: Residence::Copied,
            digest,
            cache: CacheOutcome::Hit,
            started,
            phases: {
                let mut phases = LoadPhases::default();
                phases.since(LoadPhase::Compile, opening);
                phases
            },
            needs_files,
        })
    }

    /// The builder's code for `module` from the node's store, asked by `code_digest`, the
    /// digest it is pinned to: mapped from the store's file, nothing read or verified here.
    /// `Missing`: no store, the store does not hold it (or cannot be asked, or answers code
    /// of another module), or this host cannot run it; read it from `source` instead, whose
    /// checks decide. A store never fails a load.
    pub async fn open_stored(
        &self,
        source: &CodeSource,
        code_digest: Digest,
        module: Digest,
        started: Instant,
    ) -> Result<FromStore, ModuleError> {
        let Some(store) = self.code_store.clone() else {
            return Ok(FromStore::Missing { put: false });
        };
        let (engine, target, source) = (self.engine.clone(), self.target.clone(), source.clone());
        let asking = Instant::now();
        let (asked, opened) = tokio::task::spawn_blocking(move || match store.get(&code_digest) {
            Ok(Stored::Code(header, file)) => {
                let opened = precompiled::open_stored(&engine, &target, &source, &header, file, &module);
                (Ok("found"), Some(opened))
            }
            Ok(other) => (Ok(other.name()), None),
            Err(error) => (Err(error), None),
        })
        .await
        // A panic while asking or mapping (wasmtime's): read the code instead.
        .unwrap_or_else(|panicked| {
            let error = CodeStoreError::Unexpected(panicked.to_string(), "get");
            (Err(error), None)
        });
        let metrics = &self.shared.metrics;
        // Put after a miss only where the store answered that it lacks the code: a store
        // that cannot be asked, or is busy, is not sent megabytes.
        let put = match asked {
            Ok(result) => {
                metrics.code_store_request("get", result);
                true
            }
            Err(error) => {
                metrics.code_store_request("get", "error");
                tracing::warn!(%error, "cannot ask the node's code store: reading the code instead");
                false
            }
        };
        match opened {
            Some(Ok(Opened::Loaded(compiled, abi, residence, needs_files))) => {
                let mut phases = LoadPhases::default();
                phases.since(LoadPhase::Store, asking);
                let opened = OpenedCode::builders(compiled, abi, residence, needs_files, module, started, phases);
                Ok(FromStore::Opened(opened))
            }
            Some(Ok(Opened::Fallback(reason))) => {
                tracing::info!(reason = reason.reason(), error = %reason, "the stored code cannot run here: reading the code instead");
                Ok(FromStore::Missing { put: false })
            }
            // Code of another module under the pinned digest: the store's record is not what
            // the digest pins (the header is inside the bytes it covers). The code is read
            // here, whose check says whether it is the pin or the store that is wrong.
            Some(Err(refused)) => {
                tracing::warn!(error = %refused, "the node's code store answered code of another module: reading the code instead");
                Ok(FromStore::Missing { put: false })
            }
            None => Ok(FromStore::Missing { put }),
        }
    }

    /// Puts `stored`, verified against `code_digest`, in the node's store, off the
    /// request's path (nothing waits for it), one at a time: a put that finds another of
    /// this process on its way is made after it, unless too much code waits already (the
    /// next process that misses the code puts it; loads ahead wait for
    /// [`Loader::puts_done`] first).
    fn put_in_store(&self, code_digest: Digest, stored: precompiled::StoredBytes) {
        let Some(store) = self.code_store.clone() else {
            return;
        };
        let (metrics, size, putting) = (self.shared.metrics.clone(), stored.bytes().len(), store.clone());
        let put = move || {
            let _ = staging::put_now(&putting, &metrics, code_digest, stored, true);
        };
        if !store.put_in_turn(size, put) {
            tracing::info!(%code_digest, size, "not put in the node's store: too much code waits for this process's turn to put, or no thread to put it on");
        }
    }

    /// Opens the code the builder compiled for `module`, read and verified by
    /// [`CodeSource::load_code`] since `started`, so that nothing is compiled here.
    /// `Ok(None)`: the code cannot be used on this host (logged and counted); compile the
    /// module instead. `Err`: the code is not what was pinned, or not made from `module`,
    /// and nothing may run.
    /// `code_digest`: what it was verified against, under which a store keeps it.
    pub async fn open_precompiled(
        &self,
        source: &CodeSource,
        code: Result<Result<VerifiedCode, Fallback>, CodeRefused>,
        module: Digest,
        code_digest: Digest,
        started: Instant,
    ) -> Result<Option<OpenedCode>, ModuleError> {
        let mut phases = LoadPhases::default();
        let mut stored = None;
        let opened = match code? {
            Ok(mut verified) => {
                phases.extend(verified.phases());
                stored = verified.take_stored();
                let engine = self.engine.clone();
                let target = self.target.clone();
                let source = source.clone();
                let mapped_dir = self.mapped_dir.clone();
                let (opened, opening) = tokio::task::spawn_blocking(move || {
                    let (mut opening, started) = (LoadPhases::default(), Instant::now());
                    let opened = precompiled::open(
                        &engine,
                        &target,
                        &source,
                        verified,
                        &module,
                        mapped_dir.as_deref(),
                        &mut opening,
                    );
                    let placed = opening.get(LoadPhase::Place).unwrap_or_default();
                    opening.add(LoadPhase::Open, started.elapsed().saturating_sub(placed));
                    (opened, opening)
                })
                .await
                .map_err(|e| ModuleError::Engine(e.to_string()))?;
                phases.extend(&opening);
                opened?
            }
            Err(fallback) => Opened::Fallback(fallback),
        };
        match opened {
            Opened::Loaded(compiled, abi, residence, needs_files) => {
                // Code that loads here is worth keeping on the node.
                if let Some(stored) = stored {
                    self.put_in_store(code_digest, stored);
                }
                let opened = OpenedCode::builders(compiled, abi, residence, needs_files, module, started, phases);
                Ok(Some(opened))
            }
            Opened::Fallback(reason) => {
                self.shared.metrics.compile_fallback(reason.reason());
                tracing::warn!(code = %source, reason = reason.reason(), error = %reason, "not using the precompiled code: compiling the module here");
                Ok(None)
            }
        }
    }

    /// Links opened code with its module's files (`None` when [`OpenedCode::needs_files`]
    /// is false): a handler for requests.
    pub fn link(&self, opened: OpenedCode, files: Files) -> Result<LoadedHandler, ModuleError> {
        let OpenedCode {
            compiled,
            abi,
            residence,
            digest,
            cache,
            started,
            mut phases,
            needs_files,
        } = opened;
        if needs_files && files.is_none() {
            return Err(ModuleError::Files(
                "the compiled code says its module carries files, and the module was not read for them".into(),
            ));
        }
        let file_count = files.as_ref().map_or(0, |root| root.files());
        // The files are the module's: a module swapped in brings its own.
        let shared = match files {
            Some(files) => Arc::new(Shared {
                files: Some(files),
                ..(*self.shared).clone()
            }),
            None => self.shared.clone(),
        };
        let file_bytes = shared.files.as_ref().map_or(0, |root| root.bytes());
        let linking = Instant::now();
        let mut handler = LoadedHandler::new(&self.engine, compiled, abi, residence, digest, shared)
            .map_err(|e| ModuleError::Link(format!("{e:#}")))?;
        // On the disk the mapped code's files are on: the pool's mapped-code budget counts
        // them, so its cache volume holds them too.
        handler.code.mapped += file_bytes;
        phases.since(LoadPhase::Link, linking);
        let elapsed = started.elapsed();
        self.shared
            .metrics
            .module_loaded(digest.to_string(), abi.name(), elapsed, &phases);
        // What requests actually get: shared instances are for Go reactors only.
        let isolation = match abi {
            Abi::GoReactor => self.shared.limits.isolation,
            Abi::HttpComponent | Abi::CgiCommand => Isolation::Request,
        };
        tracing::info!(
            digest = %digest,
            abi = abi.name(),
            isolation = isolation.name(),
            compiled_code = cache.name(),
            code = residence.name(),
            files = file_count,
            load_ms = elapsed.as_secs_f64() * 1000.0,
            phases = %phases,
            "module loaded"
        );
        Ok(handler)
    }
}
