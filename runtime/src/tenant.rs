//! One Function as this process serves it: its loader (its limits, env and outbound
//! policy on the process's shared engine), where its module comes from and the digests it
//! is pinned to, its concurrency permits, and its handler once loaded. A dedicated pod
//! holds one tenant, loaded before it reports ready; the pool holds many, each loaded on
//! its first request and unloaded when its memory budget needs the room.

use crate::ServeError;
use crate::config::Config;
use arc_swap::ArcSwapOption;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::Semaphore;
use wasmless_artifact::Digest;
use wasmless_host::handler::LoadedHandler;
use wasmless_host::load_phases::LoadPhase;
use wasmless_host::loader::{EngineHost, FromStore, Loader, Staged};
use wasmless_host::metrics::Metrics;
use wasmless_host::module_source::ModuleSource;
use wasmless_host::{limits, precompiled};
use wasmless_outbound as outbound;

type CodeResult = Result<Result<precompiled::VerifiedCode, precompiled::Fallback>, precompiled::CodeRefused>;
type CodeFetch = tokio::task::JoinHandle<CodeResult>;

/// Starts reading and verifying `config`'s compiled code on other threads, for
/// [`Tenant::use_prefetched`]: a new pod does that while it makes the engine, since
/// neither needs the other and each takes milliseconds.
/// With a node's code store, nothing is read ahead: the store is asked first, and a hit
/// reads nothing.
pub fn fetch_code(config: &Config) -> Option<CodeFetch> {
    if config.code_store.is_some() {
        return None;
    }
    // A source that does not parse is refused by [`Tenant::new`], saying why.
    let code = precompiled::CodeSource::parse(config.code.as_ref()?).ok()?;
    let code_digest = config.code_digest?;
    Some(tokio::spawn(async move { code.load_code(code_digest, false).await }))
}

pub struct Tenant {
    pub function: Arc<str>,
    /// Which revision of the Function this is, where one process serves several.
    pub revision: Option<Arc<str>>,
    pub loader: Arc<Loader>,
    /// `None` until the first load, and again once unloaded.
    pub handler: ArcSwapOption<LoadedHandler>,
    pub permits: Arc<Semaphore>,
    /// The pool's permits, shared by all its Functions: its instance slots.
    pub host_permits: Option<Arc<Semaphore>>,
    pub source: ModuleSource,
    /// `--module-digest`, as given (the digest file beside the module is read at load).
    pub pinned: Option<Digest>,
    code: Option<(precompiled::CodeSource, Option<Digest>)>,
    /// One load at a time: the requests that arrive meanwhile wait for it.
    loading: tokio::sync::Mutex<()>,
    /// Code being read and verified since before the engine was made (a new pod).
    prefetched: std::sync::Mutex<Option<CodeFetch>>,
    /// Told each time a load finishes, and what it took (the pool's accounting).
    on_load: Option<Box<dyn Fn(std::time::Duration) + Send + Sync>>,
    /// When a request last used it, in milliseconds since the process started (the
    /// pool's least-recently-used order).
    last_used: AtomicU64,
    /// The `last_used` at which the loaded handler's mapped code was last let go of
    /// ([`Tenant::release_code`]), `u64::MAX` if it was not since it loaded.
    code_released_at: AtomicU64,
    /// Why the last load failed, until one succeeds (the pool's `/pool`).
    last_error: std::sync::Mutex<Option<String>>,
    /// In a pool: the Function is served by its own pods now, and each answer here closes
    /// its connection (the table entry's `servedByPods`).
    pub served_by_pods: std::sync::atomic::AtomicBool,
}

impl Tenant {
    /// The tenant `config` describes, on `engine`. Nothing is read or loaded yet.
    /// `process_env`: the variables whose `WASMLESS_HANDLER_ENV_*` join the handler's env,
    /// and where `--outbound-header` values are read.
    pub fn new(
        engine: &EngineHost,
        config: &Config,
        metrics: Arc<Metrics>,
        admin_port: u16,
        process_env: impl Iterator<Item = (String, String)>,
    ) -> Result<Self, ServeError> {
        let limits = config.request_limits();
        Self::with_limits(engine, config, limits, metrics, admin_port, process_env)
    }

    /// [`Tenant::new`] with `limits` instead of `config`'s own (the pool's caps and
    /// shares applied).
    pub fn with_limits(
        engine: &EngineHost,
        config: &Config,
        limits: limits::RequestLimits,
        metrics: Arc<Metrics>,
        admin_port: u16,
        process_env: impl Iterator<Item = (String, String)>,
    ) -> Result<Self, ServeError> {
        let module = config.module.as_deref().ok_or(ServeError::NoModule)?;
        let process_env: Vec<(String, String)> = process_env.collect();
        let variable = |name: &str| {
            let found = process_env.iter().rev().find(|(variable, _)| variable == name);
            found.map(|(_, value)| value.clone())
        };
        // Calls to this runtime's own admin port are refused: the port as bound (it may be 0).
        let outbound = outbound::OutboundConfig {
            admin_port,
            ..config.outbound_with(variable)?
        };
        let outbound = Arc::new(outbound::Outbound::new(&outbound, metrics.clone())?);
        let permits = Arc::new(Semaphore::new(limits.max_concurrency as usize));
        let loader = Loader::on(
            engine,
            limits,
            config.handler_env(process_env.into_iter()),
            &config.function,
            metrics,
            outbound,
        );
        Ok(Self {
            function: config.function.as_str().into(),
            revision: None,
            loader: Arc::new(loader),
            handler: ArcSwapOption::empty(),
            permits,
            host_permits: None,
            source: ModuleSource::parse(module)?,
            pinned: config.module_digest,
            code: match &config.code {
                Some(code) => Some((precompiled::CodeSource::parse(code)?, config.code_digest)),
                None => None,
            },
            loading: tokio::sync::Mutex::new(()),
            prefetched: std::sync::Mutex::new(None),
            on_load: None,
            last_used: AtomicU64::new(0),
            code_released_at: AtomicU64::new(u64::MAX),
            last_error: std::sync::Mutex::new(None),
            served_by_pods: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn on_load(&mut self, hook: Box<dyn Fn(std::time::Duration) + Send + Sync>) {
        self.on_load = Some(hook);
    }

    /// The first load takes the code [`fetch_code`] started reading.
    pub fn use_prefetched(&self, fetch: Option<CodeFetch>) {
        *self.prefetched.lock().unwrap() = fetch;
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        self.loader.metrics()
    }

    /// The handler, loaded now unless it is already. Concurrent callers share one load.
    pub async fn handler(&self) -> Result<Arc<LoadedHandler>, ServeError> {
        self.touch();
        if let Some(handler) = self.handler.load_full() {
            return Ok(handler);
        }
        let _loading = self.loading.lock().await;
        if let Some(handler) = self.handler.load_full() {
            return Ok(handler);
        }
        let started = Instant::now();
        let loaded = self.load().await;
        *self.last_error.lock().unwrap() = loaded.as_ref().err().map(ToString::to_string);
        let handler = Arc::new(loaded?);
        self.code_released_at.store(u64::MAX, Ordering::Relaxed);
        self.handler.store(Some(handler.clone()));
        if let Some(hook) = &self.on_load {
            hook(started.elapsed());
        }
        Ok(handler)
    }

    /// Loads the handler ahead of a request, without counting as a use (the least recently
    /// used are unloaded first, and a load no request asked for is not a use).
    pub async fn warm(&self) -> Result<(), ServeError> {
        let last_used = self.last_used();
        let loaded = self.handler().await.map(drop);
        self.last_used.store(last_used, Ordering::Relaxed);
        loaded
    }

    /// Makes sure the node's store holds the Function's code, without loading it: for a
    /// pool with no room to load it ahead, so that its first request maps the node's copy.
    /// A Function with no pinned code, or a process with no store, stages nothing.
    pub async fn stage(&self) -> Staged {
        let Some((code, Some(code_digest))) = &self.code else {
            return Staged::NoCode;
        };
        let Some(module) = self.source.known_digest(self.pinned).await else {
            return Staged::NoCode;
        };
        self.loader.stage(code, *code_digest, module).await
    }

    /// Drops the loaded handler (requests running on it keep it until they finish).
    /// True if there was one.
    pub fn unload(&self) -> bool {
        self.handler.swap(None).is_some()
    }

    /// Why the last load failed, if the last load failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap().clone()
    }

    pub fn last_used(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }

    fn touch(&self) {
        self.last_used.store(Self::now_millis(), Ordering::Relaxed);
    }

    /// The clock of [`Tenant::last_used`]: milliseconds since the process first read it,
    /// plus one, so that 0 is never a use.
    pub fn now_millis() -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let millis = START.get_or_init(Instant::now).elapsed().as_millis() + 1;
        u64::try_from(millis).unwrap_or(u64::MAX)
    }

    /// The [`Tenant::last_used`] at which its loaded code was last let go of
    /// ([`Tenant::release_code`]); `u64::MAX` if not since it loaded.
    pub fn code_released_at(&self) -> u64 {
        self.code_released_at.load(Ordering::Relaxed)
    }

    /// Lets go of the loaded handler's mapped code (see `wasmless_host::mapped_text`), as
    /// idle since its use at `last_used`. The bytes of code that covered, 0 if none.
    pub fn release_code(&self, last_used: u64) -> u64 {
        let Some(handler) = self.handler.load_full() else {
            return 0;
        };
        self.code_released_at.store(last_used, Ordering::Relaxed);
        match handler.release_mapped_text() {
            Ok(bytes) => bytes as u64,
            Err(error) => {
                tracing::warn!(function = %self.function, %error, "cannot let go of an idle Function's mapped code");
                0
            }
        }
    }

    /// The builder's code first (from the node's store if it holds it, else read and
    /// verified: a new pod compiles nothing), then this node's cache (a restart), then the
    /// module itself, compiled here. Every digest is checked before anything runs.
    async fn load(&self) -> Result<LoadedHandler, ServeError> {
        let started = Instant::now();
        let prefetched = self.prefetched.lock().unwrap().take();
        let expected = self.source.known_digest(self.pinned).await;
        let mut opened = None;
        if let Some((code, code_digest)) = &self.code {
            let module = expected.ok_or(ServeError::CodeWithoutModuleDigest)?;
            let code_digest = code_digest.ok_or(ServeError::UnpinnedCode)?;
            opened = match self.loader.open_stored(code, code_digest, module, started).await? {
                FromStore::Opened(stored) => Some(stored),
                FromStore::Missing { put: keep_stored } => {
                    let loading = prefetched.unwrap_or_else(|| {
                        let code = code.clone();
                        tokio::spawn(async move { code.load_code(code_digest, keep_stored).await })
                    });
                    let loaded = loading
                        .await
                        .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked.into_panic()));
                    // Where the store lacks the code, the node's one copy is put there first.
                    if keep_stored {
                        self.loader
                            .open_through_store(code, loaded, module, code_digest, started)
                            .await?
                    } else {
                        self.loader
                            .open_precompiled(code, loaded, module, code_digest, started)
                            .await?
                    }
                }
            };
        }
        if opened.is_none()
            && let Some(digest) = expected
        {
            opened = self.loader.open_cached(digest, started).await;
        }
        // The digest read above is the one to check against; no second read of the digest file.
        let Some(mut opened) = opened else {
            return Ok(self.loader.load(self.source.load(expected).await?).await?);
        };
        // Only the module holds its files: read (and verified) when the code says it has them.
        let files = match opened.needs_files {
            true => {
                let reading = Instant::now();
                let module = self.source.load(expected).await?;
                let files = self.loader.files(&module).await?;
                opened.phases.since(LoadPhase::Files, reading);
                files
            }
            false => None,
        };
        let from_cache = opened.from_cache();
        match self.loader.link(opened, files) {
            Ok(handler) => Ok(handler),
            Err(error) if from_cache => {
                tracing::warn!(%error, "compiled-code cache entry does not link; loading the module instead");
                Ok(self.loader.load(self.source.load(expected).await?).await?)
            }
            Err(error) => Err(error.into()),
        }
    }
}
