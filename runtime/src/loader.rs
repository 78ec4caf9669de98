//! Turning verified module bytes into a [`LoadedHandler`]: ABI detection, compilation
//! (or the compiled-code cache), linking. The engine is built once and shared by every
//! module the process loads.

use crate::abi::{self, Abi, AbiError};
use crate::compile::{self, CacheOutcome, CompileError, Compiled};
use crate::handler::{LoadedHandler, Shared};
use crate::limits::RequestLimits;
use crate::metrics::Metrics;
use crate::module_source::VerifiedModule;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use wasmless_artifact::Digest;
use wasmtime::Engine;

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
}

pub struct Loader {
    engine: Engine,
    shared: Arc<Shared>,
    cache_dir: Option<PathBuf>,
}

impl Loader {
    pub fn new(
        limits: RequestLimits,
        env: Vec<(String, String)>,
        function: &str,
        metrics: Arc<Metrics>,
        cache_dir: Option<PathBuf>,
    ) -> Result<Self, ModuleError> {
        let engine = crate::engine::build_engine(&limits).map_err(|e| ModuleError::Engine(format!("{e:?}")))?;
        let shared = Arc::new(Shared {
            limits,
            env,
            metrics,
            function: function.to_string(),
        });
        Ok(Self {
            engine,
            shared,
            cache_dir,
        })
    }

    pub fn limits(&self) -> &RequestLimits {
        &self.shared.limits
    }

    /// Compiles (off the async threads) and links a verified module.
    pub async fn load(&self, module: VerifiedModule) -> Result<LoadedHandler, ModuleError> {
        let started = Instant::now();
        let abi = abi::detect(&module.bytes)?;
        let engine = self.engine.clone();
        let cache_dir = self.cache_dir.clone();
        let digest = module.digest;
        let (compiled, cache) = tokio::task::spawn_blocking(move || {
            compile::compile(&engine, abi, &module.bytes, &digest, cache_dir.as_deref())
        })
        .await
        .map_err(|e| ModuleError::Engine(e.to_string()))??;
        self.link(compiled, abi, digest, cache, started)
    }

    /// Links the code the compiled-code cache holds for `digest`, if it holds any,
    /// without reading the module: a restart then needs neither the module's source
    /// (a registry, say) nor the time to read and hash it.
    pub async fn load_cached(&self, digest: Digest) -> Option<LoadedHandler> {
        let started = Instant::now();
        let engine = self.engine.clone();
        let cache_dir = self.cache_dir.clone()?;
        let (compiled, abi) = tokio::task::spawn_blocking(move || compile::load_cached(&engine, &digest, &cache_dir))
            .await
            .ok()??;
        match self.link(compiled, abi, digest, CacheOutcome::Hit, started) {
            Ok(handler) => Some(handler),
            Err(error) => {
                tracing::warn!(%error, "compiled-code cache entry does not link; loading the module instead");
                None
            }
        }
    }

    fn link(
        &self,
        compiled: Compiled,
        abi: Abi,
        digest: Digest,
        cache: CacheOutcome,
        started: Instant,
    ) -> Result<LoadedHandler, ModuleError> {
        let handler = LoadedHandler::new(&self.engine, compiled, abi, digest, self.shared.clone())
            .map_err(|e| ModuleError::Link(format!("{e:#}")))?;
        let elapsed = started.elapsed();
        self.shared
            .metrics
            .module_loaded(digest.to_string(), abi.name(), elapsed);
        tracing::info!(
            digest = %digest,
            abi = abi.name(),
            compiled_code_cache = match cache { CacheOutcome::Hit => "hit", CacheOutcome::Miss => "miss", CacheOutcome::Disabled => "off" },
            load_ms = elapsed.as_secs_f64() * 1000.0,
            "module loaded"
        );
        Ok(handler)
    }
}
