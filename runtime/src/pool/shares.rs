//! What one pooled Function may take of what the pool's requests share: its account of the
//! request memory and its slots, kept by name across edits, and the caps on its entry.

use crate::config::Config;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmless_host::request_memory::MemoryAccount;

/// What one Function holds of what the pool's requests share, whichever of its tenants
/// (before or after an edit) serves them.
pub(super) struct Account {
    pub memory: MemoryAccount,
    pub slots: Slots,
}

/// One Function's share of the request slots: a semaphore every tenant of the Function
/// takes its permits from, resized when an edit changes the share.
pub(super) struct Slots {
    pub semaphore: Arc<tokio::sync::Semaphore>,
    resize: Arc<Mutex<Resize>>,
}

/// Where a [`Slots`] stands: the share it should have, and the permits still to forget
/// for it to get there (held by requests in flight when it was made smaller).
#[derive(Default)]
struct Resize {
    size: u32,
    owed: u32,
    /// Counts the resizes, so that a forgetting task from an earlier one lets go.
    generation: u64,
    forgetting: Option<tokio::task::AbortHandle>,
}

impl Slots {
    pub fn new(size: u32) -> Self {
        Self {
            semaphore: Arc::new(tokio::sync::Semaphore::new(size as usize)),
            resize: Arc::new(Mutex::new(Resize {
                size,
                ..Resize::default()
            })),
        }
    }

    /// Makes the share `size` permits: more at once, fewer as soon as the requests in
    /// flight give theirs back (a task waits for them, ahead of new requests).
    pub fn resize(&self, size: u32) {
        let mut resize = self.resize.lock().unwrap();
        if resize.size == size && resize.owed == 0 {
            return;
        }
        if let Some(forgetting) = resize.forgetting.take() {
            forgetting.abort();
        }
        resize.generation += 1;
        // Permits the semaphore has in all, free or held: the earlier shrink's owed ones
        // were not forgotten (its task lets them go once it sees the new generation).
        let total = resize.size + std::mem::take(&mut resize.owed);
        resize.size = size;
        if size >= total {
            self.semaphore.add_permits((size - total) as usize);
            return;
        }
        let fewer = total - size;
        let rest = fewer - self.semaphore.forget_permits(fewer as usize) as u32;
        if rest == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                permits = rest,
                "a Function's share of the request slots shrank with no runtime to wait for the permits in flight: they are kept"
            );
            return;
        };
        resize.owed = rest;
        let generation = resize.generation;
        let (semaphore, state) = (self.semaphore.clone(), self.resize.clone());
        let task = runtime.spawn(async move {
            let Ok(permits) = semaphore.acquire_many_owned(rest).await else {
                return;
            };
            let mut resize = state.lock().unwrap();
            if resize.generation == generation {
                permits.forget();
                resize.owed = 0;
                resize.forgetting = None;
            }
        });
        resize.forgetting = Some(task.abort_handle());
    }
}

/// What one pooled Function may have at most.
#[derive(Debug, Clone)]
pub(super) struct Caps {
    pub slots: u32,
    pub timeout: Duration,
    pub max_request_body: usize,
}

impl Caps {
    pub fn from_config(config: &Config) -> Self {
        Self {
            slots: config.pool_share_of(config.max_concurrency as usize).max(1) as u32,
            timeout: config.pool_max_timeout,
            max_request_body: usize::try_from(config.pool_max_request_body).unwrap_or(usize::MAX),
        }
    }
}

/// Why the pool cannot start as configured: one Function's share of the request memory
/// must hold one request of the largest memory limit, or such a Function never runs.
pub fn check_shares(config: &Config) -> Result<(), String> {
    let share = config.pool_share_of(usize::try_from(config.pool_request_memory).unwrap_or(usize::MAX));
    if (share as u64) < config.memory_limit {
        return Err(format!(
            "--pool-share {}% of --pool-request-memory ({} bytes) is {share} bytes, less than --memory-limit ({} bytes), the memory of one request of the largest Function: raise --pool-request-memory or --pool-share, or lower --memory-limit",
            config.pool_share, config.pool_request_memory, config.memory_limit
        ));
    }
    Ok(())
}
