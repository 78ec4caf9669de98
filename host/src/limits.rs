//! What one request may use, and the store limiter that enforces its memory.

use crate::request_memory::{MemoryAccount, RequestShare};
use std::time::Duration;

/// Tables beyond this many elements are refused: no handler needs more, and each
/// element is host memory.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Requests a shared instance serves before a fresh one replaces it, unless set.
pub const DEFAULT_REQUESTS_PER_INSTANCE: u32 = 10_000;

/// Whether requests to a Go reactor share instances (`--isolation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Isolation {
    /// A fresh instance per request: nothing one request leaves in memory is seen by
    /// another.
    #[default]
    Request,
    /// Initialised instances are kept and reused, each serving one request at a time:
    /// what one request leaves in its instance's memory (globals, the heap, goroutines)
    /// is seen by the later requests that instance serves, as in one Go process. Go
    /// reactors only; other handlers get a fresh instance per request.
    Shared,
}

impl Isolation {
    pub fn name(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Shared => "shared",
        }
    }
}

#[derive(Debug, Clone)]
pub struct RequestLimits {
    pub memory_bytes: usize,
    pub timeout: Duration,
    pub max_request_body: usize,
    pub max_concurrency: u32,
    pub isolation: Isolation,
    /// With [`Isolation::Shared`]: requests one instance serves before it is replaced.
    pub requests_per_instance: u32,
    /// In a pool: the Function's account with the memory all its requests share with the
    /// other Functions' ([`crate::request_memory`]).
    pub shared_memory: Option<MemoryAccount>,
}

impl RequestLimits {
    /// What one request takes from the shared memory, in a pool.
    pub fn request_share(&self) -> Option<RequestShare> {
        self.shared_memory.as_ref().map(MemoryAccount::request)
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 64 << 20,
            timeout: Duration::from_secs(10),
            max_request_body: 1 << 20,
            max_concurrency: 64,
            isolation: Isolation::Request,
            requests_per_instance: DEFAULT_REQUESTS_PER_INSTANCE,
            shared_memory: None,
        }
    }
}

/// Refuses memory growth past the request's limit (`memory.grow` returns -1, as the
/// spec allows) and remembers that it did, so the failure that follows is reported as
/// out of memory rather than as an anonymous trap. In a pool it also takes every byte of
/// growth from the memory the pool's requests share, and refuses growth that does not
/// fit there, remembering that too until a later growth fits: a handler that fails
/// before it grows again failed for the refusal (Rust aborts at once, Go's runtime
/// prints and exits), and its request is told to retry, not that its handler is at
/// fault; one that caught the refusal and went on to grow failed for its own reasons.
pub struct RequestLimiter {
    memory_bytes: usize,
    /// Set when growth was refused; a shared instance clears it before each request.
    pub memory_exceeded: bool,
    /// Set when growth within the limit was refused for want of shared memory, cleared
    /// when a later growth fits.
    shared_refused: bool,
    /// In a pool: what the request holds of the shared memory, given back when the store
    /// (and the request's output) is dropped.
    share: Option<RequestShare>,
    /// What the last growth took from `share`, given back if wasmtime then refuses it.
    last_taken: usize,
}

impl RequestLimiter {
    pub fn new(limits: &RequestLimits, share: Option<RequestShare>) -> Self {
        Self {
            memory_bytes: limits.memory_bytes,
            memory_exceeded: false,
            shared_refused: false,
            share,
            last_taken: 0,
        }
    }

    /// Whether the last growth asked for was refused for want of shared memory, and none
    /// fitted since: a failure now is that refusal's.
    pub fn shared_memory_full(&self) -> bool {
        self.shared_refused
    }

    /// Forgets the refusals of a kept instance's last request, before its next.
    pub fn clear_refusals(&mut self) {
        self.memory_exceeded = false;
        self.shared_refused = false;
    }
}

impl wasmtime::ResourceLimiter for RequestLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.last_taken = 0;
        if desired > self.memory_bytes {
            self.memory_exceeded = true;
            return Ok(false);
        }
        // Past the module's own maximum wasmtime refuses the growth after asking here:
        // refused before anything is taken for it.
        if maximum.is_some_and(|maximum| desired > maximum) {
            return Ok(false);
        }
        if let Some(share) = &self.share {
            let more = desired.saturating_sub(current);
            if !share.take(more) {
                self.shared_refused = true;
                return Ok(false);
            }
            self.shared_refused = false;
            self.last_taken = more;
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        if let Some(share) = &self.share {
            share.give_back(std::mem::take(&mut self.last_taken));
        }
        tracing::debug!(%error, "a memory growth allowed by the limits failed");
        Ok(())
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request_memory::SharedMemory;
    use std::sync::Arc;
    use wasmtime::ResourceLimiter;

    const KI64: usize = 64 << 10;
    const MI: usize = 1 << 20;

    #[test]
    fn growth_that_does_not_happen_holds_nothing_of_the_shared_memory() {
        let shared = Arc::new(SharedMemory::new(10 * MI, 100));
        let account = shared.account();
        let limits = RequestLimits {
            shared_memory: Some(account.clone()),
            ..RequestLimits::default()
        };
        let mut limiter = RequestLimiter::new(&limits, limits.request_share());
        assert!(limiter.memory_growing(0, KI64, Some(KI64)).unwrap());
        assert_eq!(account.used(), KI64);
        // A module declaring one page asks for 8 MiB: wasmtime would refuse it anyway.
        assert!(!limiter.memory_growing(KI64, 8 * MI, Some(KI64)).unwrap());
        assert_eq!(account.used(), KI64);
        assert!(!limiter.shared_memory_full());
        // Allowed here, then refused by wasmtime: given back.
        assert!(limiter.memory_growing(KI64, 4 * MI, None).unwrap());
        assert_eq!(account.used(), 4 * MI);
        limiter.memory_grow_failed(wasmtime::Error::msg("refused")).unwrap();
        assert_eq!(account.used(), KI64);
        drop(limiter);
        assert_eq!(account.used(), 0);
    }

    /// A refusal for want of shared memory is the cause of a failure only until the
    /// handler grows again: one that caught it and went on fails for its own reasons.
    #[test]
    fn a_shared_memory_refusal_is_forgotten_once_a_later_growth_fits() {
        let shared = Arc::new(SharedMemory::new(4 * MI, 100));
        let account = shared.account();
        let limits = RequestLimits {
            shared_memory: Some(account.clone()),
            ..RequestLimits::default()
        };
        let mut limiter = RequestLimiter::new(&limits, limits.request_share());
        assert!(limiter.memory_growing(0, MI, None).unwrap());
        assert!(!limiter.memory_growing(MI, 8 * MI, None).unwrap(), "8 MiB do not fit 4");
        assert!(limiter.shared_memory_full(), "a failure now is the refusal's");
        assert!(!limiter.memory_exceeded, "within the request's own limit");
        assert!(limiter.memory_growing(MI, 2 * MI, None).unwrap());
        assert!(!limiter.shared_memory_full(), "it went on: a failure now is its own");
    }
}
