//! Snapshotting a Go reactor at build time: run its `_initialize` (Go's runtime
//! start-up and every package initialiser, `net/http`'s included) once, in wasmtime,
//! and write a module whose memory and globals start where `_initialize` left them
//! (wasmtime-wizer). Then every request starts from there, and pays for none of it.
//!
//! The initialisers run with a fixed clock ([`SnapshotClock`]), a fixed random source,
//! no environment, one argument and a read-only `/` holding the Function's files, or
//! nothing ([`GuestRoot`]; [`start_up`] says what a user reads when they fail), so that the same module snapshots to the same bytes.
//! What that freezes, and how a request sees current values anyway, is in
//! `docs/architecture.md` ("The Go reactor"); the short of it: the SDK reads the
//! environment and the arguments again and reseeds Go's random generator per request,
//! and the run-time clock is always later than the snapshot's.

mod start_up;

use crate::clocks::SnapshotClock;
use crate::guest_root::GuestRoot;
use rand::SeedableRng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmless_artifact::guest_files::GuestFile;
use wasmtime::{CacheStore, Engine, Instance, Linker, Module, Store, StoreLimits, StoreLimitsBuilder, Val};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wizer::{InstanceState, SnapshotVal, ValType, Wizer};

/// `_initialize` may run this long before the build gives up on it.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// And grow memory this far.
const INITIALIZE_MEMORY: usize = 1 << 30;
/// Active data segments closer than this are merged, with the zeros between them.
const MERGE_GAP: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("the reactor cannot be snapshotted: {0}")]
    Unsupported(String),
    /// What the guest wrote to stderr and stdout comes first: a Go panic's message and
    /// stack, a `log.Fatal`'s line, as `go run` would show them.
    #[error(
        "the handler's start-up failed (Go's runtime start-up and its package initialisers, run once when it is built): {0}"
    )]
    Initialize(String),
    #[error("cannot rewrite the snapshot's data segments: {0}")]
    Segments(String),
}

/// A snapshotted reactor, and what making it took.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub wasm: Vec<u8>,
    /// Bytes of linear memory an instance starts with.
    pub memory_bytes: u64,
    /// Data segments Wizer wrote, and what was left after [`compact_data_segments`].
    pub segments_written: usize,
    pub segments_kept: usize,
    pub seconds: f64,
}

struct InitState {
    wasi: WasiP1Ctx,
    limits: StoreLimits,
}

/// Runs `_initialize` of the reactor `wasm` and returns the initialised module.
pub fn snapshot(wasm: &[u8]) -> Result<Snapshot, SnapshotError> {
    snapshot_with(wasm, None)
}

/// [`snapshot`], compiling the module for its one run with the builder's precompile
/// configuration where this CPU can run it, and through `functions` (Cranelift's
/// incremental cache) when given: the functions an edit did not change are not compiled
/// again, here or in the precompile that follows, which compiles the same bodies.
pub fn snapshot_with(wasm: &[u8], functions: Option<Arc<dyn CacheStore>>) -> Result<Snapshot, SnapshotError> {
    snapshot_with_files(wasm, functions, &[])
}

/// [`snapshot_with`], the initialisers running in a working directory of `files` (the
/// Function's files beside its handler), as every request will.
pub fn snapshot_with_files(
    wasm: &[u8],
    functions: Option<Arc<dyn CacheStore>>,
    files: &[GuestFile],
) -> Result<Snapshot, SnapshotError> {
    // On a thread of its own: wasmtime-wasi's synchronous host functions start a Tokio
    // runtime of their own, which panics on a thread that is already driving one (a
    // caller's async task).
    std::thread::scope(|scope| {
        scope
            .spawn(|| snapshot_here(wasm, functions, files))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn snapshot_here(
    wasm: &[u8],
    functions: Option<Arc<dyn CacheStore>>,
    files: &[GuestFile],
) -> Result<Snapshot, SnapshotError> {
    let started = Instant::now();
    let mut wizer = Wizer::new();
    wizer.init_func("_initialize");
    let (context, instrumented) = wizer
        .instrument(wasm)
        .map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;

    let unsupported = |e: wasmtime::Error| SnapshotError::Unsupported(format!("{e:#}"));
    let mut config =
        crate::engine::compiler_config(&crate::engine::CompileTarget::for_this_host()).map_err(unsupported)?;
    if let Some(functions) = functions {
        config.enable_incremental_compilation(functions).map_err(unsupported)?;
    }
    let engine = Engine::new(&config).map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;
    let module = Module::new(&engine, &instrumented).map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;
    let mut linker = Linker::new(&engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut InitState| &mut state.wasi)
        .map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;
    refuse_host_calls(&mut linker).map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;
    let clock = SnapshotClock::default();
    // One stream for both, so their lines keep the order the guest wrote them in.
    let output = start_up::KeptOutput::default();
    let root = GuestRoot::new(None, files).map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;
    let mut wasi = WasiCtxBuilder::new();
    root.preopen(&mut wasi)
        .map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;
    let wasi = wasi
        .args(&["function"])
        .stdout(output.clone())
        .stderr(output.clone())
        .wall_clock(clock.clone())
        .monotonic_clock(clock)
        .secure_random(rand::rngs::StdRng::seed_from_u64(0))
        .insecure_random(rand::rngs::StdRng::seed_from_u64(1))
        .insecure_random_seed(0)
        .build_p1();
    let state = InitState {
        wasi,
        limits: StoreLimitsBuilder::new().memory_size(INITIALIZE_MEMORY).build(),
    };
    let mut store = Store::new(&engine, state);
    store.limiter(|state| &mut state.limits);
    store.set_epoch_deadline(1);
    store.epoch_deadline_trap();
    let _deadline = Deadline::start(&engine, INITIALIZE_TIMEOUT);

    let instance = linker
        .instantiate(&mut store, &module)
        .map_err(|e| SnapshotError::Initialize(format!("{e:#}")))?;
    let initialize = instance
        .get_typed_func::<(), ()>(&mut store, "_initialize")
        .map_err(|e| SnapshotError::Unsupported(format!("no _initialize export: {e:#}")))?;
    initialize
        .call(&mut store, ())
        .map_err(|e| SnapshotError::Initialize(start_up::failure(&e, &output.contents(), INITIALIZE_TIMEOUT)))?;

    let mut state = Initialised { store, instance };
    let raw =
        block_on(wizer.snapshot(&context, &mut state)).map_err(|e| SnapshotError::Unsupported(format!("{e:#}")))?;
    let raw = keep_instrumented_exports(&raw, &instrumented)?;
    let compacted = compact_data_segments(&raw)?;
    Ok(Snapshot {
        memory_bytes: compacted.memory_bytes,
        segments_written: compacted.segments_before,
        segments_kept: compacted.segments_after,
        wasm: compacted.wasm,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The snapshot with the exports of the module that ran `_initialize` (Wizer's
/// `__wizer_global_<i>` and `__wizer_memory_<i>` beside the module's own), less
/// `_initialize` itself, which must not run again. Wizer takes its exports out of the
/// snapshot, but wasmtime compiles every function of a module differently when the
/// module's exports differ: with them kept, the precompile that follows finds every
/// function the snapshot's run compiled in the incremental cache (measured on the Goless
/// sample: 3,123 functions compiled again without, none with). They expose nothing: only
/// the host sees a module's exports.
fn keep_instrumented_exports(snapshot: &[u8], instrumented: &[u8]) -> Result<Vec<u8>, SnapshotError> {
    use wasm_encoder::{ExportKind, ExportSection, RawSection};
    use wasmparser::{ExternalKind, Parser, Payload};
    let bad = |e: wasmparser::BinaryReaderError| SnapshotError::Segments(e.to_string());
    let mut exports = ExportSection::new();
    for payload in Parser::new(0).parse_all(instrumented) {
        if let Payload::ExportSection(reader) = payload.map_err(bad)? {
            for export in reader {
                let export = export.map_err(bad)?;
                if export.name == "_initialize" {
                    continue;
                }
                let kind = match export.kind {
                    ExternalKind::Func | ExternalKind::FuncExact => ExportKind::Func,
                    ExternalKind::Table => ExportKind::Table,
                    ExternalKind::Memory => ExportKind::Memory,
                    ExternalKind::Global => ExportKind::Global,
                    ExternalKind::Tag => ExportKind::Tag,
                };
                exports.export(export.name, kind, export.index);
            }
        }
    }
    let mut module = wasm_encoder::Module::new();
    for payload in Parser::new(0).parse_all(snapshot) {
        let payload = payload.map_err(bad)?;
        if let Some((id, range)) = payload.as_section() {
            if matches!(payload, Payload::ExportSection(_)) {
                module.section(&exports);
            } else {
                module.section(&RawSection {
                    id,
                    data: &snapshot[range],
                });
            }
        }
    }
    Ok(module.finish())
}

/// The `wasmless` imports (the outbound calls of host/src/outbound_abi, a streamed
/// response's of host/src/handler/stream.rs), each answering that it cannot work here:
/// a call made while the handler initialises would be made once, at build time, and its
/// answer frozen into every instance. A package `init` that calls out fails the build with
/// the SDK's error for it; there is no request to stream a response to.
fn refuse_host_calls(linker: &mut Linker<InitState>) -> wasmtime::Result<()> {
    use wasmless_formats::outbound::{
        ERRNO_UNAVAILABLE, HTTP_CLOSE, HTTP_FINISH, HTTP_READ_BODY, HTTP_READ_HEAD, HTTP_START, HTTP_WRITE_BODY,
        IMPORT_MODULE,
    };
    linker.func_wrap(IMPORT_MODULE, HTTP_START, |_: u32, _: u32, _: u32, _: u32| {
        ERRNO_UNAVAILABLE
    })?;
    linker.func_wrap(IMPORT_MODULE, HTTP_WRITE_BODY, |_: u32, _: u32, _: u32| {
        ERRNO_UNAVAILABLE
    })?;
    linker.func_wrap(IMPORT_MODULE, HTTP_FINISH, |_: u32, _: u32| ERRNO_UNAVAILABLE)?;
    linker.func_wrap(IMPORT_MODULE, HTTP_READ_HEAD, |_: u32, _: u32, _: u32| {
        ERRNO_UNAVAILABLE
    })?;
    linker.func_wrap(IMPORT_MODULE, HTTP_READ_BODY, |_: u32, _: u32, _: u32, _: u32| {
        ERRNO_UNAVAILABLE
    })?;
    linker.func_wrap(IMPORT_MODULE, HTTP_CLOSE, |_: u32| ERRNO_UNAVAILABLE)?;
    use wasmless_formats::reactor_response::{RESPONSE_START, RESPONSE_WRITE};
    linker.func_wrap(IMPORT_MODULE, RESPONSE_START, |_: u32, _: u32| ERRNO_UNAVAILABLE)?;
    linker.func_wrap(IMPORT_MODULE, RESPONSE_WRITE, |_: u32, _: u32| ERRNO_UNAVAILABLE)?;
    Ok(())
}

/// Interrupts `_initialize` once `timeout` has passed (the store's deadline is one
/// epoch), unless the snapshot is done and this is dropped first.
struct Deadline(Option<std::sync::mpsc::Sender<()>>);

impl Deadline {
    fn start(engine: &Engine, timeout: Duration) -> Self {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let engine = engine.clone();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(timeout) {
                engine.increment_epoch();
            }
        });
        Self(Some(done))
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        drop(self.0.take());
    }
}

struct Initialised {
    store: Store<InitState>,
    instance: Instance,
}

impl InstanceState for Initialised {
    async fn global_get(&mut self, name: &str, _: ValType) -> SnapshotVal {
        let global = self
            .instance
            .get_global(&mut self.store, name)
            .expect("Wizer exports every global it snapshots");
        match global.get(&mut self.store) {
            Val::I32(x) => SnapshotVal::I32(x),
            Val::I64(x) => SnapshotVal::I64(x),
            Val::F32(x) => SnapshotVal::F32(x),
            Val::F64(x) => SnapshotVal::F64(x),
            Val::V128(x) => SnapshotVal::V128(x.as_u128()),
            // Wizer refuses modules with mutable reference-typed globals before this.
            other => unreachable!("global of a type Wizer does not snapshot: {other:?}"),
        }
    }

    async fn memory_contents(&mut self, name: &str, contents: impl FnOnce(&[u8]) + Send) {
        let memory = self
            .instance
            .get_memory(&mut self.store, name)
            .expect("Wizer exports every memory it snapshots");
        contents(memory.data(&self.store));
    }
}

/// Wizer's snapshot is `async` for hosts whose reads are; ours are not, so its future
/// is ready the first time it is polled.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::yield_now();
    }
}

/// A module with fewer data segments.
pub struct Compacted {
    pub wasm: Vec<u8>,
    pub segments_before: usize,
    pub segments_after: usize,
    pub memory_bytes: u64,
}

/// Wizer keeps the module's original data segments, emptied, as passive segments (so
/// that indices `memory.init` and `data.drop` use stay valid) and writes one active
/// segment per non-zero run of memory: for Go, ~48k empty passive segments and ~10k
/// active ones. Instantiation walks every segment, so that costs ~120 µs per request;
/// merging the active segments across short runs of zeros and dropping the passive ones
/// (when no code refers to a segment by index) leaves a few hundred, and ~2 µs.
pub fn compact_data_segments(wasm: &[u8]) -> Result<Compacted, SnapshotError> {
    use wasm_encoder::{DataSection, RawSection};
    use wasmparser::{DataKind, Operator, Parser, Payload};
    let bad = |e: wasmparser::BinaryReaderError| SnapshotError::Segments(e.to_string());

    // Whether any code names a data segment; if so, every segment keeps its index.
    let (indexed, memory_pages) = segment_use(wasm)?;

    let mut module = wasm_encoder::Module::new();
    let mut before = 0;
    let mut after = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(bad)?;
        match &payload {
            Payload::DataCountSection { .. } if !indexed => continue,
            Payload::DataSection(reader) => {
                let mut section = DataSection::new();
                // (memory, offset, bytes), merged below.
                let mut active: Vec<(u32, u64, Vec<u8>)> = Vec::new();
                for segment in reader.clone() {
                    let segment = segment.map_err(bad)?;
                    before += 1;
                    match segment.kind {
                        DataKind::Passive if indexed => {
                            section.passive(segment.data.iter().copied());
                            after += 1;
                        }
                        DataKind::Passive => {}
                        DataKind::Active {
                            memory_index,
                            offset_expr,
                        } => {
                            let offset = match offset_expr.get_operators_reader().read().map_err(bad)? {
                                Operator::I32Const { value } => u64::from(value as u32),
                                Operator::I64Const { value } => value as u64,
                                // Not a constant: keep the segment as it is.
                                _ => {
                                    return Err(SnapshotError::Segments(
                                        "an active data segment has a non-constant offset".into(),
                                    ));
                                }
                            };
                            if indexed {
                                section.active(
                                    memory_index,
                                    &const_offset(wasm, memory_index, offset),
                                    segment.data.iter().copied(),
                                );
                                after += 1;
                            } else {
                                active.push((memory_index, offset, segment.data.to_vec()));
                            }
                        }
                    }
                }
                for (memory, offset, data) in merge_active_segments(active) {
                    section.active(memory, &const_offset(wasm, memory, offset), data);
                    after += 1;
                }
                module.section(&section);
            }
            other => {
                if let Some((id, range)) = other.as_section() {
                    module.section(&RawSection { id, data: &wasm[range] });
                }
            }
        }
    }
    let compacted = module.finish();
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(&compacted)
        .map_err(|e| SnapshotError::Segments(format!("the rewritten module does not validate: {e}")))?;
    Ok(Compacted {
        wasm: compacted,
        segments_before: before,
        segments_after: after,
        memory_bytes: memory_pages * 65536,
    })
}

/// Whether any code names a data segment by index (`memory.init`, `data.drop`), and the
/// initial pages of all memories.
fn segment_use(wasm: &[u8]) -> Result<(bool, u64), SnapshotError> {
    use wasmparser::{Operator, Parser, Payload};
    let bad = |e: wasmparser::BinaryReaderError| SnapshotError::Segments(e.to_string());
    let mut indexed = false;
    let mut memory_pages = 0u64;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(bad)? {
            Payload::CodeSectionEntry(body) => {
                let mut ops = body.get_operators_reader().map_err(bad)?;
                while !ops.eof() {
                    if matches!(
                        ops.read().map_err(bad)?,
                        Operator::MemoryInit { .. } | Operator::DataDrop { .. }
                    ) {
                        indexed = true;
                    }
                }
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    memory_pages += memory.map_err(bad)?.initial;
                }
            }
            _ => {}
        }
    }
    Ok((indexed, memory_pages))
}

/// Active segments `(memory, offset, bytes)` sorted, and merged across gaps of zeros of at
/// most `MERGE_GAP` bytes.
fn merge_active_segments(mut active: Vec<(u32, u64, Vec<u8>)>) -> Vec<(u32, u64, Vec<u8>)> {
    active.sort_by_key(|(memory, offset, _)| (*memory, *offset));
    let mut merged: Vec<(u32, u64, Vec<u8>)> = Vec::new();
    for (memory, offset, data) in active {
        if let Some((last_memory, last_offset, last_data)) = merged.last_mut() {
            let end = *last_offset + last_data.len() as u64;
            if *last_memory == memory && offset >= end && offset - end <= MERGE_GAP {
                last_data.resize((offset - *last_offset) as usize, 0);
                last_data.extend_from_slice(&data);
                continue;
            }
        }
        merged.push((memory, offset, data));
    }
    merged
}

/// The offset expression of an active segment of `memory`: `i64.const` for a 64-bit memory.
fn const_offset(wasm: &[u8], memory: u32, offset: u64) -> wasm_encoder::ConstExpr {
    if memory_is_64(wasm, memory) {
        wasm_encoder::ConstExpr::i64_const(offset as i64)
    } else {
        wasm_encoder::ConstExpr::i32_const(offset as u32 as i32)
    }
}

fn memory_is_64(wasm: &[u8], index: u32) -> bool {
    wasmparser::Parser::new(0)
        .parse_all(wasm)
        .filter_map(Result::ok)
        .find_map(|payload| match payload {
            wasmparser::Payload::MemorySection(reader) => reader
                .into_iter()
                .nth(index as usize)
                .and_then(Result::ok)
                .map(|m| m.memory64),
            _ => None,
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_segments_merge_across_short_gaps_and_empty_passive_ones_go() {
        let wasm = wat::parse_str(
            r#"(module (memory (export "memory") 1)
                (data "")
                (data (i32.const 0) "ab")
                (data (i32.const 10) "cd")
                (data (i32.const 1000) "ef"))"#,
        )
        .unwrap();
        let compacted = compact_data_segments(&wasm).unwrap();
        assert_eq!((compacted.segments_before, compacted.segments_after), (4, 2));
        assert_eq!(compacted.memory_bytes, 65536);
        let engine = Engine::default();
        let module = Module::new(&engine, &compacted.wasm).unwrap();
        let mut store = Store::new(&engine, ());
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        let memory = instance.get_memory(&mut store, "memory").unwrap();
        let data = memory.data(&store);
        assert_eq!(&data[..12], b"ab\0\0\0\0\0\0\0\0cd");
        assert_eq!(&data[1000..1002], b"ef");
    }

    #[test]
    fn segments_named_by_code_keep_their_indices() {
        let wasm = wat::parse_str(
            r#"(module (memory 1)
                (data "xyz")
                (data (i32.const 0) "ab")
                (data (i32.const 4) "cd")
                (func (memory.init 0 (i32.const 8) (i32.const 0) (i32.const 3))))"#,
        )
        .unwrap();
        let compacted = compact_data_segments(&wasm).unwrap();
        assert_eq!((compacted.segments_before, compacted.segments_after), (3, 3));
        assert!(wasmparser::Validator::new().validate_all(&compacted.wasm).is_ok());
    }
}
