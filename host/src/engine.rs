//! The one wasmtime `Engine` of the process: pooling allocator sized from the limits,
//! epoch interruption driven by a ticker thread, and code generated for a fixed CPU
//! feature level, so that the builder's precompiled code loads on every node of it.

use crate::limits::RequestLimits;
use std::time::{Duration, Instant};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline};

/// How often the epoch advances; a request's timeout is rounded up to this.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Memory, tables and stacks of a finished instance stay mapped up to these sizes, so
/// the next instance in that slot skips the `mmap`/`madvise` calls; this bounds the
/// memory the pool keeps resident per slot. With `pagemap_scan` the memory's bound is
/// on the pages a request dirtied, which are copied back from the image: a Go reactor
/// request dirties less than 1 MiB, and 4 or 16 MiB measured no faster (criterion, Go
/// reactor, fresh instance: 43 µs at 1 MiB, 49–62 µs at 4–16 MiB, 253 µs at 0, 233 µs
/// with `pagemap_scan` off).
const MEMORY_KEEP_RESIDENT: usize = 1 << 20;
const TABLE_KEEP_RESIDENT: usize = 64 << 10;
const STACK_KEEP_RESIDENT: usize = 128 << 10;

/// Idle slots that stay warm for the module that last used them (its image mapped, up to
/// [`MEMORY_KEEP_RESIDENT`] of its pages kept), past which a module new to a slot takes the
/// least recently used warm one instead of a cold one. wasmtime's default is 100: in a
/// pool that served a hundred Go Functions, each kept a warm slot of ~1.3 MiB of its own
/// and ~3.6 MiB of its image's pages (`bench/cluster.sh defaults`, 2026-12-07), whether it
/// was still called or not. A slot of one module is always reused by that module first,
/// so a dedicated pod keeps all of its slots warm whatever this says; in a pool, a
/// Function whose slot went to another maps its image again (~0.2 ms for a Go reactor).
const WARM_SLOTS: u32 = 16;

/// The CPU feature level compiled code is generated for.
///
/// x86-64-v3 (AVX2, BMI1/2, FMA, LZCNT, MOVBE on top of v2's SSE4.2 and POPCNT): every x86
/// server CPU since Intel Haswell (2013) and AMD Zen (2017), so every node a cloud rents
/// today. Cranelift uses LZCNT/TZCNT for `clz`/`ctz`, BMI2 for shifts and VEX encodings
/// for floats and SIMD, so v3 code is as good as code for the exact host for the handlers
/// we build; AVX-512 (v4) is barely used by Cranelift and missing on many AMD and desktop
/// CPUs. A node without v3 still serves: its runtime compiles for itself (see
/// [`CompileTarget::for_this_host`]). On arm64 the level is the ARMv8.0 baseline.
#[cfg(target_arch = "x86_64")]
pub const PORTABLE_TARGET: &str = "x86-64-v3";
#[cfg(target_arch = "x86_64")]
const PORTABLE_TRIPLE: &str = "x86_64-unknown-linux-gnu";
#[cfg(target_arch = "aarch64")]
pub const PORTABLE_TARGET: &str = "aarch64";
#[cfg(target_arch = "aarch64")]
const PORTABLE_TRIPLE: &str = "aarch64-unknown-linux-gnu";

/// What an engine generates code for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileTarget {
    /// [`PORTABLE_TARGET`]: what the builder precompiles for.
    Portable,
    /// Whatever this CPU has, because it lacks part of the portable level (listed).
    Host { missing: Vec<&'static str> },
}

impl CompileTarget {
    /// The portable level if this CPU has all of it, the host's own features otherwise.
    pub fn for_this_host() -> Self {
        let missing = missing_portable_features();
        if missing.is_empty() {
            Self::Portable
        } else {
            Self::Host { missing }
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Portable => PORTABLE_TARGET,
            Self::Host { .. } => "host",
        }
    }
}

/// The features of [`PORTABLE_TARGET`] this CPU lacks.
#[cfg(target_arch = "x86_64")]
fn missing_portable_features() -> Vec<&'static str> {
    let has = [
        ("sse4.2", std::is_x86_feature_detected!("sse4.2")),
        ("popcnt", std::is_x86_feature_detected!("popcnt")),
        ("cmpxchg16b", std::is_x86_feature_detected!("cmpxchg16b")),
        ("avx", std::is_x86_feature_detected!("avx")),
        ("avx2", std::is_x86_feature_detected!("avx2")),
        ("bmi1", std::is_x86_feature_detected!("bmi1")),
        ("bmi2", std::is_x86_feature_detected!("bmi2")),
        ("fma", std::is_x86_feature_detected!("fma")),
        ("lzcnt", std::is_x86_feature_detected!("lzcnt")),
    ];
    has.into_iter().filter(|(_, has)| !has).map(|(name, _)| name).collect()
}

#[cfg(target_arch = "aarch64")]
fn missing_portable_features() -> Vec<&'static str> {
    Vec::new()
}

/// Everything that decides what compiled code looks like, shared by the runtime's engine
/// and the builder's precompilation: code from one loads in the other exactly when their
/// [`engine_hash`]es agree.
pub fn compiler_config(target: &CompileTarget) -> wasmtime::Result<Config> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    if *target == CompileTarget::Portable {
        config.target(PORTABLE_TRIPLE)?;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a Cranelift preset of x86 feature flags; the runtime only selects this
        // target on a CPU that has every one of them (`for_this_host`), and wasmtime checks
        // the host again before it runs code compiled with them.
        unsafe {
            config.cranelift_flag_enable(PORTABLE_TARGET);
        }
    }
    Ok(config)
}

/// The runtime's engine: [`compiler_config`] for this host, with the pooling allocator.
pub fn build_engine(limits: &RequestLimits, target: &CompileTarget) -> wasmtime::Result<Engine> {
    let mut config = compiler_config(target)?;
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling_config(limits)));
    if CODE_RUNS_IN_PLACE {
        config.with_custom_code_memory(Some(std::sync::Arc::new(ExecutableInPlace)));
    }
    let engine = Engine::new(&config)?;
    start_epoch_ticker(&engine);
    Ok(engine)
}

/// Whether precompiled code runs where it was decoded (`Module::deserialize_raw`), which
/// needs [`ExecutableInPlace`]: on x86-64 Linux, where the instruction cache needs no
/// flushing after code is written. Elsewhere wasmtime copies the code into memory of its own.
pub const CODE_RUNS_IN_PLACE: bool = cfg!(all(target_os = "linux", target_arch = "x86_64"));

/// Makes a range of code executable, and writable again, with `mprotect`: what wasmtime
/// does for the memory it maps itself, done for memory it was handed
/// (`deserialize_raw` of a decoded code artifact, saving a copy of 10+ MB on a new pod's
/// start). W^X holds: a range is never writable and executable at once.
struct ExecutableInPlace;

impl wasmtime::CustomCodeMemory for ExecutableInPlace {
    fn required_alignment(&self) -> usize {
        rustix::param::page_size()
    }

    fn publish_executable(&self, ptr: *const u8, len: usize) -> wasmtime::Result<()> {
        use rustix::mm::MprotectFlags;
        // SAFETY: wasmtime hands over a page-aligned range of code it owns and has finished
        // writing; nothing else holds a writable reference to it.
        unsafe { rustix::mm::mprotect(ptr.cast_mut().cast(), len, MprotectFlags::READ | MprotectFlags::EXEC) }
            .map_err(|e| wasmtime::Error::msg(format!("cannot make {len} bytes of code executable: {e}")))
    }

    fn unpublish_executable(&self, ptr: *const u8, len: usize) -> wasmtime::Result<()> {
        use rustix::mm::MprotectFlags;
        // SAFETY: wasmtime guarantees no code runs from this range any more.
        unsafe { rustix::mm::mprotect(ptr.cast_mut().cast(), len, MprotectFlags::READ | MprotectFlags::WRITE) }
            .map_err(|e| wasmtime::Error::msg(format!("cannot make {len} bytes of code writable: {e}")))
    }
}

/// Hex sha256 over `Engine::precompile_compatibility_hash()`: wasmtime's version, the
/// target and its flags, tunables and features. Stable across processes of one build,
/// unlike `DefaultHasher`, so it can be written into an artifact and compared later.
pub fn engine_hash(engine: &Engine) -> String {
    use std::hash::Hash;
    let mut hasher = Sha256Hasher(sha2::Sha256::default());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hex::encode(sha2::Digest::finalize(hasher.0))
}

struct Sha256Hasher(sha2::Sha256);

impl std::hash::Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        sha2::Digest::update(&mut self.0, bytes);
    }

    fn finish(&self) -> u64 {
        unreachable!("only the full digest is read")
    }
}

fn pooling_config(limits: &RequestLimits) -> PoolingAllocationConfig {
    // Requests in flight, plus those of a module being swapped out while the new one
    // serves, plus a few for the bench and warm-up.
    let slots = limits.max_concurrency * 2 + 4;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        // A Rust wasip2 component holds a handful of core instances, memories and tables.
        .total_core_instances(slots * 8)
        .total_memories(slots * 2)
        .total_tables(slots * 4)
        .total_stacks(slots)
        .max_memory_size(limits.memory_bytes.max(1 << 16))
        .max_unused_warm_slots(WARM_SLOTS)
        .linear_memory_keep_resident(MEMORY_KEEP_RESIDENT)
        .table_keep_resident(TABLE_KEEP_RESIDENT)
        .async_stack_keep_resident(STACK_KEEP_RESIDENT)
        .pagemap_scan(Enabled::Auto);
    pool
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until the engine is dropped.
fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasmless-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawning the epoch thread");
}

/// Arms a request's store: the guest traps with `Trap::Interrupt` at the first epoch tick
/// after `deadline` (wall time: time spent in the host, waiting for an outbound call,
/// counts as much as time spent computing), and until then yields at every tick. A
/// thread serves all of its connections (see `edge`), so a long handler holds up the
/// requests beside it for one tick at a time, not for its whole run.
pub fn arm_timeout<T: 'static>(store: &mut Store<T>, deadline: Instant) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if Instant::now() >= deadline {
            return Ok(UpdateDeadline::Interrupt);
        }
        // tokio's own yield: the other tasks and the I/O driver go first. A plain
        // self-wake (`Yield`) can be polled again at once, before anything else ran.
        Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
    });
}
