//! Compiled code made once by the builder, so that a new pod compiles nothing.
//!
//! [`precompile`] is what the builder runs; [`ModuleSource::load_code`] and [`open`] are what a
//! starting runtime runs. Compiled code is native code, so the order is strict: the
//! stored bytes are checked against the pinned `--code-digest` before anything decodes
//! them, the header must name the module the runtime was pinned to, and only then does
//! the engine hash decide between loading the code and compiling the module here.

use crate::abi::Abi;
use crate::compile::Compiled;
use crate::engine::{self, CompileTarget};
use crate::load_phases::{LoadPhase, LoadPhases};
use crate::module_source::{LoadError, ModuleSource, chunk_file_paths};
use pages::PageBuffer;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use wasmless_artifact::{
    CODE_HEADER_BYTES, CodeHeader, CodeKind, Digest, Part, code_blocks, code_header, decoded_code_size,
    decompress_block, encode_code, split_for_blocks,
};
use wasmtime::Engine;
use wasmtime::component::Component;

pub mod mapped;
mod pages;
mod streaming;

/// Compiles a validated module for the portable target and writes the code artifact.
/// `engine` must come from [`engine::compiler_config`] with [`CompileTarget::Portable`].
pub fn precompile(engine: &Engine, abi: Abi, wasm: &[u8], module_digest: Digest) -> wasmtime::Result<Vec<u8>> {
    let cwasm = compile_native(engine, abi, wasm)?;
    Ok(package(
        engine,
        abi,
        &cwasm,
        module_digest,
        wasmless_artifact::guest_files::carried(wasm),
    ))
}

/// wasmtime's native code for `wasm`, as `engine` compiles it.
pub fn compile_native(engine: &Engine, abi: Abi, wasm: &[u8]) -> wasmtime::Result<Vec<u8>> {
    match abi {
        Abi::HttpComponent => engine.precompile_component(wasm),
        Abi::CgiCommand | Abi::GoReactor => engine.precompile_module(wasm),
    }
}

/// The code artifact a runtime loads with `--code`: `cwasm`, which `engine` compiled from
/// the module `module_digest`, behind the header that says so (and whether that module
/// carries files, which the runtime then reads it for).
pub fn package(engine: &Engine, abi: Abi, cwasm: &[u8], module_digest: Digest, module_files: bool) -> Vec<u8> {
    let header = CodeHeader {
        module_digest,
        engine: engine::engine_hash(engine),
        kind: code_kind(abi),
        target: engine::PORTABLE_TARGET.to_string(),
        module_files,
    };
    encode_code(&header, cwasm)
}

/// The engine the builder precompiles with: the runtime's, for the portable target.
pub fn precompile_engine() -> wasmtime::Result<Engine> {
    precompile_engine_with(None)
}

/// Where compiled functions are kept between compilations (Cranelift's incremental cache).
pub use wasmtime::CacheStore;

/// [`precompile_engine`], reusing the compiled functions `functions` holds (Cranelift's
/// incremental cache: an edited module compiles only what the edit changed). The code is
/// the same either way.
pub fn precompile_engine_with(functions: Option<std::sync::Arc<dyn wasmtime::CacheStore>>) -> wasmtime::Result<Engine> {
    let mut config = engine::compiler_config(&CompileTarget::Portable)?;
    if let Some(functions) = functions {
        config.enable_incremental_compilation(functions)?;
    }
    Engine::new(&config)
}

fn code_kind(abi: Abi) -> CodeKind {
    match abi {
        Abi::HttpComponent => CodeKind::Component,
        Abi::CgiCommand | Abi::GoReactor => CodeKind::Module,
    }
}

/// Why a runtime will not run the code it was given, and will not start: the bytes are
/// not what was pinned, or not made from the pinned module.
#[derive(Debug, thiserror::Error)]
pub enum CodeRefused {
    #[error(
        "compiled code digest mismatch: expected {expected}, but {code} has {actual}; refusing to load it (rebuild the function, or drop --code to compile the module here)"
    )]
    DigestMismatch {
        code: String,
        expected: Digest,
        actual: Digest,
    },
    #[error(
        "the compiled code {code} was made from module {compiled_from}, not from the pinned module {pinned}; refusing to load it"
    )]
    OtherModule {
        code: String,
        compiled_from: Digest,
        pinned: Digest,
    },
}

/// Why pinned code cannot be used here, though nothing is wrong with it: the module is
/// compiled instead, and the reason counted in `wasmless_compile_fallbacks_total`.
#[derive(Debug, thiserror::Error)]
pub enum Fallback {
    #[error("cannot read the compiled code: {0}")]
    Unavailable(LoadError),
    #[error("the compiled code does not decode: {0}")]
    Malformed(wasmless_artifact::CodeError),
    #[error("this CPU lacks {missing} of {target}, which the code was compiled for")]
    Cpu { target: String, missing: String },
    #[error(
        "the code was compiled by another wasmtime version or configuration (engine {code}, this runtime {runtime})"
    )]
    Engine { code: String, runtime: String },
    #[error("wasmtime refused the compiled code: {0}")]
    Deserialize(String),
}

impl Fallback {
    /// The `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Malformed(_) => "malformed",
            Self::Cpu { .. } => "cpu",
            Self::Engine { .. } => "engine",
            Self::Deserialize(_) => "deserialize",
        }
    }
}

/// The outcome of trying the code: refused (nothing runs), fall back, or loaded (mapped
/// from a file, or in the process's own memory).
pub enum Opened {
    /// Loaded; `bool`: the module carries files, which only it holds (the code's header).
    Loaded(Compiled, Abi, Residence, bool),
    Fallback(Fallback),
}

/// Where loaded code lives, which decides what of it the process pays for alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// In the process's own memory: all of it is private.
    Copied,
    /// Mapped from a file: clean page-cache pages, paged in where touched. `metadata`:
    /// bytes of what wasmtime decodes into the process's own memory as it loads the code.
    Mapped { metadata: u64 },
    /// Mapped from the node's store's file: as `Mapped`, but the file is the node's one
    /// copy, on the node's disk, whose pages every process on the node mapping it shares.
    Stored { metadata: u64 },
}

impl Residence {
    pub fn name(self) -> &'static str {
        match self {
            Self::Copied => "in memory",
            Self::Mapped { .. } => "mapped from a file",
            Self::Stored { .. } => "mapped from the node's store",
        }
    }
}

/// Where the compiled code comes from, parsed from `--code` as `--module` is: a file, a
/// directory of chunks (`0000.cwasm.lz4`, ...), or `oci://registry/repo[@digest]` (the blob
/// pinned by `--code-digest` in that repository).
pub type CodeSource = ModuleSource;

/// Code whose stored bytes matched the pinned digest, decompressed and waiting for
/// [`open`] to check its header and load it; with the time its fetch and verification took,
/// and the stored bytes themselves when they were asked to be kept (for the node's store).
pub struct VerifiedCode(CodeImage, LoadPhases, Option<StoredBytes>);

impl VerifiedCode {
    fn new(image: CodeImage) -> Self {
        Self(image, LoadPhases::default(), None)
    }

    /// How long fetching and verifying this code took.
    pub fn phases(&self) -> &LoadPhases {
        &self.1
    }

    /// The code as stored (compressed), which hashed to the pinned digest, if kept.
    pub fn take_stored(&mut self) -> Option<StoredBytes> {
        self.2.take()
    }
}

/// The stored bytes of verified code, as they were read.
pub struct StoredBytes(StoredMemory);

enum StoredMemory {
    Vec(Vec<u8>),
    Pages(PageBuffer),
}

impl StoredBytes {
    pub fn bytes(&self) -> &[u8] {
        match &self.0 {
            StoredMemory::Vec(bytes) => bytes,
            StoredMemory::Pages(pages) => pages.bytes(),
        }
    }
}

type CodeResult = Result<Result<VerifiedCode, Fallback>, CodeRefused>;

/// `result` with `fetch` (none when the code was read as it was hashed) and the time since
/// `verifying` recorded, when it is code to open.
fn timed(mut result: CodeResult, fetch: Option<std::time::Duration>, verifying: std::time::Instant) -> CodeResult {
    if let Ok(Ok(code)) = &mut result {
        if let Some(fetch) = fetch {
            code.1.add(LoadPhase::Fetch, fetch);
        }
        code.1.since(LoadPhase::Verify, verifying);
    }
    result
}

impl ModuleSource {
    /// Reads the stored bytes and checks them against `pinned`, decompressing them on
    /// other threads while they are read and hashed. `Ok(Err(..))`: the code is
    /// unavailable or does not decode, and the module can be compiled instead.
    pub async fn load_code(&self, pinned: Digest, keep_stored: bool) -> CodeResult {
        let started = std::time::Instant::now();
        let code = self.to_string();
        let (files, chunks_of) = match self {
            Self::File(path) => (vec![path.clone()], None),
            Self::ChunkDir(dir) => match chunk_file_paths(dir, Part::Code).await {
                Ok(paths) => (paths, Some(dir.clone())),
                Err(error) => return Ok(Err(Fallback::Unavailable(error))),
            },
            Self::Oci(reference) => {
                let blob = match crate::oci::pull_blob(reference, &pinned).await {
                    Ok(blob) => blob,
                    Err(error) => return Ok(Err(Fallback::Unavailable(error.into()))),
                };
                let (fetch, verifying) = (started.elapsed(), std::time::Instant::now());
                let verified =
                    blocking(move || keeping(verify_and_decode(code, &blob, pinned), || blob, keep_stored)).await;
                return timed(verified, Some(fetch), verifying);
            }
            // The stored chunks joined as a chunk directory's are (each within the chunk
            // size), then checked as an OCI blob is: in memory, the digest first.
            Self::ConfigMaps(chunks) => {
                let stored = match chunks.fetch(Part::Code).await {
                    Ok(stored) => stored,
                    Err(error) => return Ok(Err(Fallback::Unavailable(error.into()))),
                };
                let joined = match wasmless_artifact::join_chunks(&stored) {
                    Ok(joined) => joined,
                    Err(source) => return Ok(Err(Fallback::Unavailable(LoadError::Chunks { dir: code, source }))),
                };
                drop(stored);
                let (fetch, verifying) = (started.elapsed(), std::time::Instant::now());
                let verified =
                    blocking(move || keeping(verify_and_decode(code, &joined, pinned), || joined, keep_stored)).await;
                return timed(verified, Some(fetch), verifying);
            }
        };
        let verified = blocking(move || match streaming::StoredFiles::open(files, chunks_of) {
            Ok(stored) => streaming::read_verify_and_decode(code, stored, pinned, keep_stored),
            Err(error) => Ok(Err(Fallback::Unavailable(error))),
        })
        .await;
        timed(verified, None, started)
    }
}

/// `result` with the stored bytes kept in it, when asked to be.
fn keeping(mut result: CodeResult, stored: impl FnOnce() -> Vec<u8>, keep: bool) -> CodeResult {
    if keep && let Ok(Ok(code)) = &mut result {
        code.2 = Some(StoredBytes(StoredMemory::Vec(stored())));
    }
    result
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked.into_panic()))
}

/// Decompressed code beyond this many times its stored size is decompressed only once
/// verified.
const LIKELY_RATIO: usize = wasmless_artifact::LIKELY_CODE_RATIO;

/// Hashing the stored bytes and decompressing them are both on a new pod's start path (the
/// Goless sample: ~3 ms to hash its 5.5 MB, ~7.5 ms of LZ4 on one core), so they share the
/// cores the pod may use: one thread hashes and then joins the others in decompressing
/// blocks. The digest still decides before anything else does: LZ4 only copies bytes into
/// a buffer of its own (the decoder is bounds-checked against any input), and nothing
/// reads that buffer — no header is parsed, no code is mapped — unless the digest matches.
/// An announced size far beyond what LZ4 makes of code is decompressed only once
/// verified, so unpinned bytes cannot make the runtime map a gigabyte.
fn verify_and_decode(
    code: String,
    stored: &[u8],
    pinned: Digest,
) -> Result<Result<VerifiedCode, Fallback>, CodeRefused> {
    let plausible = decoded_code_size(stored).is_ok_and(|size| size <= stored.len().saturating_mul(LIKELY_RATIO));
    let (actual, decoded) = if plausible {
        let (actual, decoded) = CodeImage::decompress_while(stored, || Digest::of(stored));
        (actual, Some(decoded))
    } else {
        (Digest::of(stored), None)
    };
    if actual != pinned {
        return Err(CodeRefused::DigestMismatch {
            code,
            expected: pinned,
            actual,
        });
    }
    let decoded = decoded.unwrap_or_else(|| CodeImage::decompress_while(stored, || ()).1);
    Ok(decoded.map(VerifiedCode::new).map_err(Fallback::Malformed))
}

/// Runs `first` on a thread of its own, then `decompress` there too, while `decompress`
/// runs on the other [`decompressing_threads`] (this one included); returns what `first`
/// returned once every thread is done.
fn with_decompressing_threads<T: Send>(first: impl FnOnce() -> T + Send, decompress: impl Fn() + Sync) -> T {
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            let result = first();
            decompress();
            result
        });
        for _ in 2..decompressing_threads() {
            scope.spawn(&decompress);
        }
        decompress();
        first
            .join()
            .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked))
    })
}

/// Threads that decompress a new pod's code: the cores it may use (its CPU limit counts),
/// up to four; the blocks of the Goless sample's code keep that many busy.
fn decompressing_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(2, 4)
}

/// Whether this process's one image run in place ([`open`]) is taken. One, not one per
/// load: an image run in place is never freed, and a pod whose revisions are switched in
/// place loads code again, so every later load is copied into wasmtime's own memory, which
/// the module's last clone gives back. A pool takes it at start ([`run_nothing_in_place`]).
static IN_PLACE_TAKEN: AtomicBool = AtomicBool::new(false);

/// Copies every load of this process: for the pool, whose Functions come and go, so the
/// Function loaded first (an eviction later) does not keep its code outside the budget for
/// the life of the process.
pub fn run_nothing_in_place() {
    IN_PLACE_TAKEN.store(true, Ordering::Release);
}

/// Checks that verified code was made from `module` for this engine, and loads it into
/// `engine`: mapped from a file written in `mapped_dir` when there is one (the pool),
/// else in memory. Runs on a blocking thread: it maps megabytes. Writing the file is
/// counted to `phases` as `place`.
pub fn open(
    engine: &Engine,
    target: &CompileTarget,
    source: &CodeSource,
    code: VerifiedCode,
    module: &Digest,
    mapped_dir: Option<&std::path::Path>,
    phases: &mut LoadPhases,
) -> Result<Opened, CodeRefused> {
    let VerifiedCode(image, _, _) = code;
    let header = match code_header(image.decompressed()) {
        Ok(header) => header,
        Err(error) => return Ok(Opened::Fallback(Fallback::Malformed(error))),
    };
    if let Some(fallback) = check_header(engine, target, source, &header, module)? {
        return Ok(Opened::Fallback(fallback));
    }
    if let Some(dir) = mapped_dir {
        let metadata = mapped::metadata_bytes(image.code());
        let writing = std::time::Instant::now();
        let written = mapped::write_unlinked(dir, image.code());
        phases.since(LoadPhase::Place, writing);
        // SAFETY: the file holds the bytes checked above, and its writer is gone.
        let loaded = written
            .map_err(wasmtime::Error::from)
            .and_then(|file| unsafe { mapped::load(engine, header.kind, file) });
        match loaded {
            Ok(compiled) => {
                return Ok(loaded_or_fallback(
                    Ok(compiled),
                    Residence::Mapped { metadata },
                    header.module_files,
                ));
            }
            Err(error) => tracing::warn!(
                dir = %dir.display(),
                error = %format!("{error:#}"),
                "cannot map the code from a file: loading a copy into memory"
            ),
        }
    }
    let in_place = engine::CODE_RUNS_IN_PLACE && !IN_PLACE_TAKEN.swap(true, Ordering::AcqRel);
    // SAFETY: the bytes are the pinned artifact (digest checked by `verify_and_decode`), made
    // by the builder from the pinned module for an engine whose compatibility hash equals
    // this one's, and wasmtime checks the ELF header, flags and this CPU again as it loads
    // them. In place (`deserialize_raw`), the image's pages become the code: the image is
    // then kept for the life of the process (below). Otherwise wasmtime copies the code
    // into memory of its own, freed with the last clone of the module, and the image is
    // unmapped after.
    let loaded = unsafe {
        match (header.kind, in_place) {
            (CodeKind::Component, true) => {
                Component::deserialize_raw(engine, image.code_in_place()).map(Compiled::Component)
            }
            (CodeKind::Module, true) => {
                wasmtime::Module::deserialize_raw(engine, image.code_in_place()).map(Compiled::Module)
            }
            (CodeKind::Component, false) => Component::deserialize(engine, image.code()).map(Compiled::Component),
            (CodeKind::Module, false) => wasmtime::Module::deserialize(engine, image.code()).map(Compiled::Module),
        }
    };
    match (in_place, loaded.is_ok()) {
        // The module (and every instance and clone of it) runs from these pages, and
        // wasmtime does not say when the last of them is gone: they stay mapped until the
        // process exits, as a binary's own code does.
        (true, true) => std::mem::forget(image),
        (true, false) => IN_PLACE_TAKEN.store(false, Ordering::Release),
        (false, _) => {}
    }
    Ok(loaded_or_fallback(loaded, Residence::Copied, header.module_files))
}

/// Whether `code` would run here for `module` (its header checked as [`open`] checks it),
/// without loading it: what staging may put in the node's store. Why not, if not.
pub fn runs_here(
    engine: &Engine,
    target: &CompileTarget,
    source: &CodeSource,
    code: &VerifiedCode,
    module: &Digest,
) -> Result<(), String> {
    let header = code_header(code.0.decompressed()).map_err(|error| Fallback::Malformed(error).to_string())?;
    match check_header(engine, target, source, &header, module) {
        Ok(None) => Ok(()),
        Ok(Some(fallback)) => Err(fallback.to_string()),
        Err(refused) => Err(refused.to_string()),
    }
}

/// Whether code of `header` may run for `module` on this engine: refused when it was made
/// from another module, a fallback when this engine or CPU cannot run it.
fn check_header(
    engine: &Engine,
    target: &CompileTarget,
    source: &CodeSource,
    header: &CodeHeader,
    module: &Digest,
) -> Result<Option<Fallback>, CodeRefused> {
    if header.module_digest != *module {
        return Err(CodeRefused::OtherModule {
            code: source.to_string(),
            compiled_from: header.module_digest,
            pinned: *module,
        });
    }
    if let CompileTarget::Host { missing } = target {
        return Ok(Some(Fallback::Cpu {
            target: header.target.clone(),
            missing: missing.join(", "),
        }));
    }
    let runtime = engine::engine_hash(engine);
    if header.engine != runtime {
        return Ok(Some(Fallback::Engine {
            code: header.engine.clone(),
            runtime,
        }));
    }
    Ok(None)
}

/// Loads code the node's store handed over (`header`, and `file`: the `.cwasm`, verified
/// by the store against the pinned code digest, read-only and never written again),
/// mapped from that file, after the same header checks as [`open`]. Runs on a blocking
/// thread.
pub fn open_stored(
    engine: &Engine,
    target: &CompileTarget,
    source: &CodeSource,
    header: &CodeHeader,
    file: std::fs::File,
    module: &Digest,
) -> Result<Opened, CodeRefused> {
    if let Some(fallback) = check_header(engine, target, source, header, module)? {
        return Ok(Opened::Fallback(fallback));
    }
    let metadata = mapped::metadata_of_file(&file);
    // SAFETY: the store's file holds the code it checked against the pinned digest (the
    // digest this runtime asked for), and nothing writes to it: a root-owned read-only
    // file of a directory only the store's agent reaches, never rewritten in place.
    let loaded = unsafe { mapped::load(engine, header.kind, file) };
    Ok(loaded_or_fallback(
        loaded,
        Residence::Stored { metadata },
        header.module_files,
    ))
}

fn loaded_or_fallback(loaded: wasmtime::Result<Compiled>, residence: Residence, module_files: bool) -> Opened {
    match loaded {
        // A core module's ABI is read from its exports: the reactor is a core module too.
        Ok(compiled) => {
            let abi = compiled.abi();
            Opened::Loaded(compiled, abi, residence, module_files)
        }
        Err(error) => Opened::Fallback(Fallback::Deserialize(format!("{error:#}"))),
    }
}

/// The decompressed artifact in a [`PageBuffer`]. The code (after the 64 KiB header
/// block) is page-aligned, so `deserialize_raw` runs it in place, saving a copy of 10+ MB
/// (the engine's `ExecutableInPlace` makes its text executable); where that is not
/// available, or this process's one image in place is taken ([`IN_PLACE_TAKEN`]), wasmtime
/// copies the code and the buffer is returned to the system.
struct CodeImage(PageBuffer);

impl CodeImage {
    /// Decompresses `stored`'s blocks on [`decompressing_threads`] threads, one of which runs
    /// `alongside` first.
    fn decompress_while<T: Send>(
        stored: &[u8],
        alongside: impl FnOnce() -> T + Send,
    ) -> (T, Result<Self, wasmless_artifact::CodeError>) {
        let blocks = match code_blocks(stored) {
            Ok(blocks) => blocks,
            Err(error) => return (alongside(), Err(error)),
        };
        let len = blocks.last().map_or(0, |block| block.decompressed.end);
        let mut buffer = match PageBuffer::new(len) {
            Ok(buffer) => buffer,
            Err(e) => {
                let error = wasmless_artifact::CodeError::Decompress(format!("cannot map {len} bytes: {e}"));
                return (alongside(), Err(error));
            }
        };
        let failure = Mutex::new(None);
        let work = Mutex::new(blocks.iter().zip(split_for_blocks(&blocks, buffer.bytes_mut())));
        let decompress = || {
            loop {
                let Some((block, out)) = work.lock().expect("no panic holds the lock").next() else {
                    break;
                };
                if let Err(error) = decompress_block(block, out) {
                    failure.lock().expect("no panic holds the lock").get_or_insert(error);
                    break;
                }
            }
        };
        let result = with_decompressing_threads(alongside, decompress);
        drop(work);
        match failure.into_inner().expect("no panic holds the lock") {
            Some(error) => (result, Err(error)),
            None => (result, Ok(Self(buffer))),
        }
    }

    /// Header block and code, as decompressed.
    fn decompressed(&self) -> &[u8] {
        self.0.bytes()
    }

    /// The `.cwasm` bytes, for wasmtime to run where they are.
    fn code_in_place(&self) -> NonNull<[u8]> {
        // SAFETY: `CODE_HEADER_BYTES < len` (checked by `decoded_code_size`): the range
        // stays inside the mapping.
        let start = unsafe { self.0.memory.add(CODE_HEADER_BYTES) };
        NonNull::slice_from_raw_parts(start, self.0.len - CODE_HEADER_BYTES)
    }

    fn code(&self) -> &[u8] {
        // `CODE_HEADER_BYTES < len`, checked by `decoded_code_size`.
        &self.decompressed()[CODE_HEADER_BYTES..]
    }
}
