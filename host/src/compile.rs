//! Compiling a module once per process, and once per node with the on-disk cache.

use crate::abi::Abi;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmless_artifact::Digest;
use wasmtime::component::Component;
use wasmtime::{Engine, Precompiled};

/// Compiled code for either contract.
#[derive(Clone)]
pub enum Compiled {
    Component(Component),
    Module(wasmtime::Module),
}

impl Compiled {
    /// The contract this code speaks; a core module's is read from its exports.
    pub fn abi(&self) -> Abi {
        match self {
            Self::Component(_) => Abi::HttpComponent,
            Self::Module(module) => crate::abi::of_module(module),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// The compiled code came from the cache directory.
    Hit,
    /// Compiled now (and written to the cache directory, if there is one).
    Miss,
    /// No cache directory was given.
    Disabled,
    /// The builder's precompiled code, pinned by digest: nothing compiled, no cache read.
    Precompiled,
}

impl CacheOutcome {
    /// Where the code came from, in the "module loaded" log line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hit => "cache hit",
            Self::Miss => "compiled",
            Self::Disabled => "compiled (no cache)",
            Self::Precompiled => "precompiled",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot compile the module: {0}")]
pub struct CompileError(String);

/// Compiles `bytes`, or loads the code a previous process compiled for the same digest
/// and the same wasmtime version and settings.
pub fn compile(
    engine: &Engine,
    abi: Abi,
    bytes: &[u8],
    digest: &Digest,
    cache_dir: Option<&Path>,
    module_files: bool,
) -> Result<(Compiled, CacheOutcome), CompileError> {
    let Some(cache_dir) = cache_dir else {
        return Ok((compile_fresh(engine, abi, bytes)?, CacheOutcome::Disabled));
    };
    let path = cache_path(engine, cache_dir, digest);
    if let Some((compiled, _)) = load_entry(engine, &path) {
        // An entry an older runtime wrote has no mark: a later restart would then spare
        // reading the module, and serve it without its files.
        if module_files && let Err(err) = std::fs::write(files_mark(&path), b"") {
            tracing::warn!(path = %path.display(), error = %err, "cannot mark the compiled-code cache entry");
        }
        return Ok((compiled, CacheOutcome::Hit));
    }
    let serialized = match abi {
        Abi::HttpComponent => engine.precompile_component(bytes),
        Abi::CgiCommand | Abi::GoReactor => engine.precompile_module(bytes),
    }
    .map_err(|e| CompileError(format!("{e:?}")))?;
    // The mark first: an entry is never found without it when its module carries files.
    let marked = match module_files {
        true => std::fs::create_dir_all(cache_dir).and_then(|()| std::fs::write(files_mark(&path), b"")),
        false => Ok(()),
    };
    if let Err(err) = marked.and_then(|()| write_atomically(&path, &serialized)) {
        tracing::warn!(path = %path.display(), error = %err, "cannot write the compiled-code cache; continuing without it");
    }
    // SAFETY: `serialized` was produced by this engine a moment ago.
    let compiled = unsafe {
        match abi {
            Abi::HttpComponent => Component::deserialize(engine, &serialized).map(Compiled::Component),
            Abi::CgiCommand | Abi::GoReactor => {
                wasmtime::Module::deserialize(engine, &serialized).map(Compiled::Module)
            }
        }
    }
    .map_err(|e| CompileError(format!("{e:?}")))?;
    Ok((compiled, CacheOutcome::Miss))
}

/// The code a previous process compiled for `digest`, found without the module's
/// bytes: entries are written only for modules that passed the digest check, under
/// that digest, so a hit needs neither reading nor hashing the module again — unless the
/// module carries files (`true`: the entry's mark), which only the module holds.
pub fn load_cached(engine: &Engine, digest: &Digest, cache_dir: &Path) -> Option<(Compiled, Abi, bool)> {
    let path = cache_path(engine, cache_dir, digest);
    let (compiled, abi) = load_entry(engine, &path)?;
    Some((compiled, abi, files_mark(&path).exists()))
}

/// Beside a cache entry whose module carries files (`guest_files`).
fn files_mark(entry: &Path) -> PathBuf {
    entry.with_extension("files")
}

fn load_entry(engine: &Engine, path: &Path) -> Option<(Compiled, Abi)> {
    if !path.exists() {
        return None;
    }
    let loaded = Engine::detect_precompiled_file(path).and_then(|kind| {
        let abi = match kind {
            Some(Precompiled::Component) => Abi::HttpComponent,
            Some(Precompiled::Module) => Abi::CgiCommand,
            None => wasmtime::bail!("not compiled code"),
        };
        let compiled = deserialize(engine, abi, path)?;
        let abi = compiled.abi();
        Ok((compiled, abi))
    });
    match loaded {
        Ok(loaded) => Some(loaded),
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err, "ignoring unusable compiled-code cache entry");
            None
        }
    }
}

fn compile_fresh(engine: &Engine, abi: Abi, bytes: &[u8]) -> Result<Compiled, CompileError> {
    match abi {
        Abi::HttpComponent => Component::new(engine, bytes).map(Compiled::Component),
        Abi::CgiCommand | Abi::GoReactor => wasmtime::Module::new(engine, bytes).map(Compiled::Module),
    }
    .map_err(|e| CompileError(format!("{e:?}")))
}

fn deserialize(engine: &Engine, abi: Abi, path: &Path) -> wasmtime::Result<Compiled> {
    // SAFETY: the cache directory is the runtime's own (an emptyDir in the pod) and its
    // entries are written only by `write_atomically` above; wasmtime itself rejects
    // code from another version or configuration.
    unsafe {
        match abi {
            Abi::HttpComponent => Component::deserialize_file(engine, path).map(Compiled::Component),
            Abi::CgiCommand | Abi::GoReactor => wasmtime::Module::deserialize_file(engine, path).map(Compiled::Module),
        }
    }
}

/// `<digest hex>-<engine hash>.cwasm`: a new wasmtime or new engine settings miss.
fn cache_path(engine: &Engine, cache_dir: &Path, digest: &Digest) -> PathBuf {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    cache_dir.join(format!("{}-{:016x}.cwasm", digest.hex(), hasher.finish()))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}
