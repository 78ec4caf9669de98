//! The one wasmtime `Engine` of the process: pooling allocator sized from the limits,
//! epoch interruption driven by a ticker thread.

use crate::limits::RequestLimits;
use std::time::Duration;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances; a request's timeout is rounded up to this.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Memory, tables and stacks of a finished instance stay mapped up to these sizes, so
/// the next instance in that slot skips the `mmap`/`madvise` calls; this bounds the
/// memory the pool keeps resident per slot.
const MEMORY_KEEP_RESIDENT: usize = 1 << 20;
const TABLE_KEEP_RESIDENT: usize = 64 << 10;
const STACK_KEEP_RESIDENT: usize = 128 << 10;

pub fn build_engine(limits: &RequestLimits) -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling_config(limits)));
    let engine = Engine::new(&config)?;
    start_epoch_ticker(&engine);
    Ok(engine)
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

/// Epoch ticks a request may run for.
pub fn deadline_ticks(timeout: Duration) -> u64 {
    (timeout.as_nanos().div_ceil(EPOCH_TICK.as_nanos()) as u64).max(1)
}
