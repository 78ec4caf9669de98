//! Letting go of idle Functions' mapped code (`--pool-release-code-after`). A Function no
//! request used for that long stays loaded, but the pages of its code leave the pool
//! process's page tables (`wasmless_host::mapped_text`): what the pool holds resident
//! follows the Functions in use, not every Function it ever served. A Go request touches
//! most of its ~6 MiB of text, so without this a pool that served each of a hundred Go
//! Functions once holds ~540 MiB of their code mapped.

use super::Pool;
use crate::tenant::Tenant;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Whether a Function last used at `last_used`, whose code was last let go of as of its
/// use at `released_at`, is to be let go of at `now`, `after` milliseconds of idleness
/// being the setting (0: never).
/// A Function no request used (`last_used` 0: loaded ahead) has run none of its code.
fn due(now: u64, last_used: u64, released_at: u64, after: u64) -> bool {
    after > 0 && last_used > 0 && released_at != last_used && now.saturating_sub(last_used) >= after
}

/// How often the pool looks: a Function's code goes between `after` and 1.5 × `after`
/// after its last request began.
fn sweep_every(after: Duration) -> Duration {
    (after / 2).max(Duration::from_millis(100))
}

impl Pool {
    /// Starts letting go of the code of Functions idle for `after` (zero: never), for as
    /// long as the pool lives.
    pub fn release_idle_code(self: &Arc<Self>, after: Duration) {
        if after.is_zero() {
            return;
        }
        tokio::spawn(sweep(Arc::downgrade(self), after));
    }
}

async fn sweep(pool: Weak<Pool>, after: Duration) {
    let after_millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    loop {
        tokio::time::sleep(sweep_every(after)).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let tenants: Vec<Arc<Tenant>> = pool.by_port.read().unwrap().values().cloned().collect();
        let metrics = pool.metrics.clone();
        drop(pool);
        // madvise walks the page tables of each released range: off the request threads.
        let released = tokio::task::spawn_blocking(move || {
            let now = Tenant::now_millis();
            for tenant in tenants {
                let last_used = tenant.last_used();
                if due(now, last_used, tenant.code_released_at(), after_millis) && tenant.release_code(last_used) > 0 {
                    metrics.pool_idle_code_released();
                }
            }
        });
        if let Err(error) = released.await {
            tracing::warn!(%error, "letting go of idle Functions' code failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_goes_once_per_idle_spell_and_never_when_off() {
        // Used at 1000, idle for 10 s from 11000 on.
        assert!(!due(10_999, 1000, u64::MAX, 10_000), "not idle long enough");
        assert!(due(11_000, 1000, u64::MAX, 10_000));
        // Let go of as of the use at 1000: not again until another use.
        assert!(!due(60_000, 1000, 1000, 10_000));
        // Used again at 61000: due again once that use is 10 s old.
        assert!(!due(65_000, 61_000, 1000, 10_000));
        assert!(due(71_000, 61_000, 1000, 10_000));
        assert!(!due(u64::MAX, 1000, u64::MAX, 0), "0 is never");
        assert!(
            !due(60_000, 0, u64::MAX, 10_000),
            "loaded ahead, never used: nothing ran"
        );
    }

    #[test]
    fn the_pool_looks_twice_per_setting_and_not_in_a_busy_loop() {
        assert_eq!(sweep_every(Duration::from_secs(10)), Duration::from_secs(5));
        assert_eq!(sweep_every(Duration::from_millis(1)), Duration::from_millis(100));
    }
}
