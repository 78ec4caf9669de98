//! Memory for requests in flight that many Functions share (the pool's): every byte of
//! linear memory a request's instance grows to is taken from it when the instance asks
//! for it, and given back when the instance is dropped. A request whose growth does not
//! fit (in the pool, or in its Function's share of it) fails at once with a 503 and
//! `Retry-After`, instead of the pool's container going over its limit and being killed
//! with every Function it serves.
//!
//! Counted at growth, not reserved at admission: a request reserving its whole
//! `--memory-limit` up front would cut the pool to a dozen requests of the default 64 MiB
//! in flight, where most requests touch one or two. The price is that a refused request
//! may have started; the answer says to retry, and the log says why.

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Why something a request asked for was refused: the pool's memory for requests (or its
/// Function's share of it) is taken. A trap carrying it is answered with a 503.
#[derive(Debug, thiserror::Error)]
#[error(
    "the pool has no memory left for this request's {what} ({bytes} more bytes): --pool-request-memory, or this Function's share of it (--pool-share), is held by requests in flight; retry"
)]
pub struct Refused {
    /// What the bytes were for: `linear memory`, `output`, ...
    pub what: &'static str,
    pub bytes: usize,
}

/// The shared account: what the requests' instances hold now, and what they may.
#[derive(Debug)]
pub struct SharedMemory {
    /// `--pool-request-memory`.
    total: usize,
    /// The most one Function's requests may hold together.
    share: usize,
    used: AtomicUsize,
}

/// One Function's part of the account.
#[derive(Debug, Default)]
pub struct FunctionMemory {
    used: AtomicUsize,
}

impl FunctionMemory {
    /// Bytes its requests' instances hold now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

impl SharedMemory {
    /// `total` bytes for all requests, at most `share_percent` of it for one Function's.
    pub fn new(total: usize, share_percent: u8) -> Self {
        let share = (total as u128 * u128::from(share_percent.min(100)) / 100) as usize;
        Self {
            total,
            share,
            used: AtomicUsize::new(0),
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// The most one Function's requests may hold together.
    pub fn share(&self) -> usize {
        self.share
    }

    /// Bytes all requests' instances hold now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty grant for one request of `function`.
    pub fn grant(self: &Arc<Self>, function: &Arc<FunctionMemory>) -> Grant {
        Grant {
            pool: self.clone(),
            function: function.clone(),
            held: 0,
        }
    }

    /// A new Function's part of the account.
    pub fn account(self: &Arc<Self>) -> MemoryAccount {
        MemoryAccount {
            shared: self.clone(),
            function: Arc::default(),
        }
    }

    /// Takes `bytes` for `function` when they fit both the pool and the Function's share.
    fn take(&self, function: &FunctionMemory, bytes: usize) -> bool {
        if !take_within(&function.used, bytes, self.share) {
            return false;
        }
        if !take_within(&self.used, bytes, self.total) {
            function.used.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn give_back(&self, function: &FunctionMemory, bytes: usize) {
        function.used.fetch_sub(bytes, Ordering::Relaxed);
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Adds `bytes` to `counter` unless that would pass `limit`.
fn take_within(counter: &AtomicUsize, bytes: usize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            used.checked_add(bytes).filter(|after| *after <= limit)
        })
        .is_ok()
}

/// One Function's account with the shared memory: where each of its requests' grants
/// comes from.
#[derive(Debug, Clone)]
pub struct MemoryAccount {
    shared: Arc<SharedMemory>,
    function: Arc<FunctionMemory>,
}

impl MemoryAccount {
    /// An empty grant for one of the Function's requests.
    pub fn grant(&self) -> Grant {
        self.shared.grant(&self.function)
    }

    /// Bytes the Function's requests hold now.
    pub fn used(&self) -> usize {
        self.function.used()
    }

    /// What one request takes from the account: its instance's linear memory and the
    /// output it writes, in one grant.
    pub fn request(&self) -> RequestShare {
        RequestShare {
            grant: Arc::new(Mutex::new(self.grant())),
        }
    }
}

/// One request's grant, shared by what takes memory for it (its store's limiter, its
/// stdout and stderr). Each says itself what it does when it is refused.
#[derive(Debug, Clone)]
pub struct RequestShare {
    grant: Arc<Mutex<Grant>>,
}

impl RequestShare {
    /// Takes `bytes` more for the request, when they fit.
    pub fn take(&self, bytes: usize) -> bool {
        self.grant.lock().unwrap().grow_by(bytes)
    }

    /// Gives back `bytes` taken for growth that then did not happen.
    pub fn give_back(&self, bytes: usize) {
        self.grant.lock().unwrap().give_back(bytes);
    }

    /// Bytes the request holds now.
    pub fn held(&self) -> usize {
        self.grant.lock().unwrap().held()
    }
}

/// What one request's instance holds of the shared memory; given back when dropped.
#[derive(Debug)]
pub struct Grant {
    pool: Arc<SharedMemory>,
    function: Arc<FunctionMemory>,
    held: usize,
}

impl Grant {
    /// Adds `more` bytes to what this request holds, when they fit; `false` leaves it as
    /// it was. Linear memory never shrinks, so neither does a grant until it is dropped.
    pub fn grow_by(&mut self, more: usize) -> bool {
        if more == 0 {
            return true;
        }
        if !self.pool.take(&self.function, more) {
            return false;
        }
        self.held += more;
        true
    }

    pub fn held(&self) -> usize {
        self.held
    }

    /// Gives back `bytes` of what this request holds: growth that was taken for but did
    /// not happen.
    pub fn give_back(&mut self, bytes: usize) {
        let bytes = bytes.min(self.held);
        self.pool.give_back(&self.function, bytes);
        self.held -= bytes;
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.pool.give_back(&self.function, self.held);
    }
}

/// A part of a request body the host holds, taken from the request's share of the pool's
/// memory until it is dropped (sent, or abandoned with its call).
struct ChargedPart {
    bytes: Vec<u8>,
    share: RequestShare,
}

impl AsRef<[u8]> for ChargedPart {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for ChargedPart {
    fn drop(&mut self) {
        self.share.give_back(self.bytes.len());
    }
}

/// `bytes` as a piece of a body, taken from `share` when there is one; `None` when they
/// do not fit it.
pub fn charged(share: Option<&RequestShare>, bytes: Vec<u8>) -> Option<Bytes> {
    let Some(share) = share else {
        return Some(Bytes::from(bytes));
    };
    if !share.take(bytes.len()) {
        return None;
    }
    Some(Bytes::from_owner(ChargedPart {
        bytes,
        share: share.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: usize = 1 << 20;

    #[test]
    fn a_function_holds_no_more_than_its_share_and_the_others_keep_the_rest() {
        let pool = Arc::new(SharedMemory::new(100 * MI, 50));
        let heavy = Arc::new(FunctionMemory::default());
        let light = Arc::new(FunctionMemory::default());
        let mut first = pool.grant(&heavy);
        assert!(first.grow_by(40 * MI));
        let mut second = pool.grant(&heavy);
        assert!(!second.grow_by(20 * MI), "over the heavy Function's half");
        assert_eq!(second.held(), 0);
        assert!(second.grow_by(10 * MI));
        let mut neighbour = pool.grant(&light);
        assert!(neighbour.grow_by(50 * MI), "the other half is the neighbour's to take");
        let other = Arc::new(FunctionMemory::default());
        let mut third = pool.grant(&other);
        assert!(!third.grow_by(MI), "the pool is full");
        assert_eq!(pool.used(), 100 * MI);
        drop(first);
        assert_eq!(heavy.used(), 10 * MI);
        assert_eq!(pool.used(), 60 * MI);
        assert!(third.grow_by(MI));
    }

    #[test]
    fn a_requests_memory_and_output_come_from_one_grant() {
        let pool = Arc::new(SharedMemory::new(10 * MI, 100));
        let account = pool.account();
        let request = account.request();
        let output = request.clone();
        assert!(request.take(6 * MI));
        assert!(!output.take(5 * MI), "6 MiB of memory and 5 of output do not fit 10");
        assert!(output.take(4 * MI));
        assert_eq!(request.held(), 10 * MI);
        assert_eq!(account.used(), 10 * MI);
        drop((request, output));
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn growth_counts_only_what_is_new_and_a_dropped_grant_gives_all_back() {
        let pool = Arc::new(SharedMemory::new(10 * MI, 100));
        let account = pool.account();
        let mut grant = account.grant();
        assert!(grant.grow_by(2 * MI));
        assert!(grant.grow_by(4 * MI));
        assert!(grant.grow_by(0));
        assert_eq!(pool.used(), 6 * MI);
        assert!(!grant.grow_by(5 * MI), "past the total");
        assert_eq!(grant.held(), 6 * MI);
        drop(grant);
        assert_eq!(pool.used(), 0);
        assert_eq!(account.used(), 0);
    }
}
