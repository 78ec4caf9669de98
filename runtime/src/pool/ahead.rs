//! Ahead of a Function's first request: its code loaded while the pool has room, else
//! staged in the node's store.

use super::Pool;
use crate::tenant::Tenant;
use std::sync::{Arc, Weak};
use wasmless_host::loader::Staged;

impl Pool {
    /// Loads Functions new to the table in the background, one at a time, while the loaded
    /// code stays under three quarters of the budget: a Function just deployed is likely to
    /// be called, and its first request should not wait for its code to be fetched and
    /// loaded; with a node's store, staged there first and loaded from it. Past that share,
    /// Functions load on their first request as before, so a warm load never unloads one
    /// that serves; with a node's store, their code is staged there instead (read, verified
    /// and put, not loaded), so that request maps the node's copy.
    pub(super) fn warm(self: &Arc<Self>, added: Vec<Arc<Tenant>>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if added.is_empty() || !self.load_ahead {
            return;
        }
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut stage_first = true;
            for tenant in added {
                let Some(pool) = Weak::upgrade(&pool) else { return };
                // Gone from the table meanwhile: nothing to warm.
                if !pool.by_port.read().unwrap().values().any(|t| Arc::ptr_eq(t, &tenant)) {
                    continue;
                }
                let room = pool.budget.has_room_ahead(pool.loaded_cost());
                drop(pool);
                if room {
                    if stage_first {
                        stage_first = stage_before_load(&tenant).await;
                    }
                    // The last load's put first: a put that finds another on its way is
                    // not made.
                    tenant.loader.puts_done().await;
                    if let Err(error) = tenant.warm().await {
                        tracing::warn!(function = %tenant.function, %error, "could not load ahead of its first request (it is tried again on that request)");
                    }
                    continue;
                }
                match tenant.stage().await {
                    Staged::NoStore => return,
                    Staged::Failed(why) => {
                        tracing::info!(function = %tenant.function, why, "could not stage the code in the node's store (its first request reads it)");
                    }
                    // Busy with other namespaces' puts, or unwell: the rest load on their
                    // first requests, which put what they read.
                    Staged::StoreRefused(why) => {
                        tracing::info!(function = %tenant.function, why, "the node's store took no staged code: the rest of these Functions are not staged");
                        return;
                    }
                    Staged::Put => tracing::info!(function = %tenant.function, "code staged in the node's store"),
                    Staged::Held | Staged::NoCode => {}
                }
            }
        });
    }
}

/// Stages the code of a Function about to be loaded ahead, so that its load maps the node's
/// copy, which every process on the node shares: loaded from a copy of its own, it would
/// keep that copy (on the pod's disk, in its memory) for as long as it stays loaded.
/// Whether to stage the next ones: not without a store, nor once the store refused (busy
/// or unwell), where each would be read twice.
async fn stage_before_load(tenant: &Tenant) -> bool {
    match tenant.stage().await {
        Staged::NoStore => false,
        Staged::StoreRefused(why) => {
            tracing::info!(function = %tenant.function, why, "the node's store took no staged code: these Functions load from copies of their own");
            false
        }
        Staged::Failed(why) => {
            tracing::info!(function = %tenant.function, why, "could not stage the code in the node's store: it loads from a copy of its own");
            true
        }
        Staged::Put | Staged::Held | Staged::NoCode => true,
    }
}
