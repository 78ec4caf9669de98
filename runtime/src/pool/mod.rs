//! The pool: one process serving many Functions, each on its own port. A Function is
//! loaded on its first request — its code and module digests checked exactly as a
//! dedicated runtime checks them — with its own limits, env, outbound policy, metrics
//! label and log lines, and unloaded (least recently used first) when the loaded ones'
//! code passes the memory budget. Why ports: a request names its Function by the port it
//! arrives on, whatever the client's `Host` header says, so a Service can point at the
//! pool with nothing but a target port.

pub mod table;

use crate::config::Config;
use crate::edge::Listeners;
use crate::limits::RequestLimits;
use crate::loader::EngineHost;
use crate::metrics::Metrics;
use crate::tenant::Tenant;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;
use table::Entry;
use tokio::sync::watch;

/// A Function the pool holds: its table entry and what serves it.
struct Held {
    entry: Entry,
    tenant: Arc<Tenant>,
    listener: Arc<std::net::TcpListener>,
}

pub struct Pool {
    engine: EngineHost,
    metrics: Arc<Metrics>,
    limits: RequestLimits,
    bind: IpAddr,
    admin_port: u16,
    budget: u64,
    dir: PathBuf,
    by_port: RwLock<HashMap<u16, Arc<Tenant>>>,
    /// By table file name.
    held: Mutex<HashMap<String, Held>>,
    listeners: watch::Sender<Listeners>,
    /// Each table file's last error, logged once rather than every sync.
    reported: Mutex<HashMap<String, String>>,
    /// `--max-concurrency` of the pool: requests running at once across its Functions,
    /// which the instance pool is sized for.
    permits: Arc<tokio::sync::Semaphore>,
}

impl Pool {
    /// An empty pool on `engine`: [`Pool::sync`] reads the table. `config` is the pool's own
    /// (its limits the largest any Function may have).
    pub fn new(
        engine: EngineHost,
        metrics: Arc<Metrics>,
        config: &Config,
        dir: &Path,
        admin_port: u16,
    ) -> (Arc<Self>, watch::Receiver<Listeners>) {
        let (listeners, receiver) = watch::channel(Listeners::default());
        let pool = Arc::new(Self {
            engine,
            metrics,
            limits: RequestLimits::from_config(config),
            bind: config.bind,
            admin_port,
            budget: config.pool_memory_budget,
            dir: dir.to_path_buf(),
            by_port: Default::default(),
            held: Default::default(),
            listeners,
            reported: Default::default(),
            permits: Arc::new(tokio::sync::Semaphore::new(config.max_concurrency as usize)),
        });
        (pool, receiver)
    }

    /// The Function served on `port`.
    pub fn tenant(&self, port: u16) -> Option<Arc<Tenant>> {
        self.by_port.read().unwrap().get(&port).cloned()
    }

    /// Functions the table names and the pool serves.
    pub fn len(&self) -> usize {
        self.by_port.read().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Brings the pool in line with its table: new Functions get a port (nothing loads
    /// until a request comes), changed ones are replaced (requests in flight finish on the
    /// old), removed ones are unloaded and their port closed. A file that cannot be used
    /// is logged, and if it served before, its Function keeps serving as it was.
    pub fn sync(self: &Arc<Self>) -> Result<(), table::TableError> {
        let table = table::read(&self.dir)?;
        let mut held = self.held.lock().unwrap();
        let mut changed = false;
        held.retain(|name, old| {
            let keep = table.contains_key(name);
            if !keep {
                tracing::info!(function = %old.tenant.function, port = old.entry.port, "removed from the pool");
                self.forget(old);
                changed = true;
            }
            keep
        });
        for (name, entry) in table {
            let entry = match entry {
                Ok(entry) => entry,
                Err(problem) => {
                    self.report(&name, format!("{name}.json: {problem}"));
                    continue;
                }
            };
            if held.get(&name).is_some_and(|old| old.entry == entry) {
                continue;
            }
            let taken = held
                .iter()
                .find(|(other, held)| **other != name && held.entry.port == entry.port);
            if let Some((other, _)) = taken {
                self.report(&name, format!("{name}.json: port {} is {other}'s already", entry.port));
                continue;
            }
            let reused = held.get(&name).filter(|old| old.entry.port == entry.port);
            let listener = match reused {
                Some(old) => Ok(old.listener.clone()),
                None => self.listen(entry.port),
            };
            let added = listener.and_then(|listener| {
                let tenant = self.tenant_for(&entry)?;
                Ok(Held {
                    entry: entry.clone(),
                    tenant: Arc::new(tenant),
                    listener,
                })
            });
            match added {
                Ok(new) => {
                    tracing::info!(function = %new.tenant.function, port = entry.port, "serving from the pool (loaded on its first request)");
                    if let Some(old) = held.insert(name.clone(), new) {
                        self.forget(&old);
                    }
                    self.reported.lock().unwrap().remove(&name);
                    changed = true;
                }
                Err(problem) => self.report(&name, format!("{name}.json: {problem}")),
            }
        }
        let by_port: HashMap<u16, Arc<Tenant>> = held
            .values()
            .map(|held| (held.entry.port, held.tenant.clone()))
            .collect();
        let listeners: Vec<_> = held.values().map(|held| held.listener.clone()).collect();
        *self.by_port.write().unwrap() = by_port;
        drop(held);
        if changed {
            self.listeners.send_replace(Arc::new(listeners));
        }
        Ok(())
    }

    /// Watches the table every `interval` until the process ends.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut last = table::fingerprint(&self.dir);
        loop {
            tokio::time::sleep(interval).await;
            let now = table::fingerprint(&self.dir);
            if now == last {
                continue;
            }
            last = now;
            if let Err(error) = self.sync() {
                tracing::warn!(%error, "cannot read the pool's table; serving on as before");
            }
        }
    }

    fn report(&self, name: &str, problem: String) {
        let mut reported = self.reported.lock().unwrap();
        if reported.get(name) != Some(&problem) {
            tracing::error!(problem = %problem, "a Function of the pool's table cannot be served; fix its file (one that served before serves on as it was)");
            reported.insert(name.to_string(), problem);
        }
    }

    fn forget(&self, held: &Held) {
        if held.tenant.unload() {
            self.metrics
                .pool_unloaded(self.loaded_count_except(&held.tenant), false);
        }
        held.tenant.metrics().forget_module();
    }

    fn listen(&self, port: u16) -> Result<Arc<std::net::TcpListener>, String> {
        if port == self.admin_port || port == 0 {
            return Err(format!(
                "port {port} cannot be a Function's: it is the pool's admin port, or zero"
            ));
        }
        let addr = SocketAddr::new(self.bind, port);
        let listener =
            std::net::TcpListener::bind(addr).map_err(|error| format!("cannot listen on {addr}: {error}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|error| format!("cannot listen on {addr}: {error}"))?;
        Ok(Arc::new(listener))
    }

    fn tenant_for(self: &Arc<Self>, entry: &Entry) -> Result<Tenant, String> {
        let config = Config::for_pooled_function(&entry.args).map_err(|error| {
            let text = error.render().to_string();
            format!("its args are not the runtime's: {}", text.trim())
        })?;
        let function_limits = RequestLimits::from_config(&config);
        if function_limits.isolation == crate::limits::Isolation::Shared {
            // Kept instances would hold the pool's instance slots while idle, and a
            // Function that keeps state between requests is not one to unload at will.
            return Err(
                "it asks for --isolation shared, which the pool does not serve: such a Function is served by its own pods"
                    .to_string(),
            );
        }
        if function_limits.memory_bytes > self.limits.memory_bytes {
            return Err(format!(
                "its --memory-limit is over the pool's ({} bytes): raise the pool's --memory-limit, or serve this Function from its own pods",
                self.limits.memory_bytes
            ));
        }
        let metrics = Arc::new(self.metrics.for_function(&config.function));
        let mut tenant = Tenant::new(&self.engine, &config, metrics, self.admin_port, std::iter::empty())
            .map_err(|error| error.to_string())?;
        tenant.host_permits = Some(self.permits.clone());
        let pool = Arc::downgrade(self);
        let port = entry.port;
        tenant.on_load(Box::new(move |elapsed| {
            if let Some(pool) = Weak::upgrade(&pool) {
                pool.loaded(port, elapsed);
            }
        }));
        Ok(tenant)
    }

    /// After the Function on `port` loaded: count it, and unload the least recently used
    /// others until the loaded code fits the budget again.
    fn loaded(&self, port: u16, elapsed: Duration) {
        let tenants: Vec<Arc<Tenant>> = self.by_port.read().unwrap().values().cloned().collect();
        let mut loaded: Vec<(Arc<Tenant>, u64)> = tenants
            .into_iter()
            .filter_map(|tenant| {
                let bytes = tenant.handler.load().as_ref()?.code_bytes as u64;
                Some((tenant, bytes))
            })
            .collect();
        let mut total: u64 = loaded.iter().map(|(_, bytes)| bytes).sum();
        self.metrics.pool_loaded(elapsed, loaded.len());
        if total <= self.budget {
            return;
        }
        let just_loaded = self.tenant(port);
        loaded.sort_by_key(|(tenant, _)| tenant.last_used());
        let mut count = loaded.len();
        for (tenant, bytes) in loaded {
            if total <= self.budget {
                break;
            }
            if just_loaded.as_ref().is_some_and(|just| Arc::ptr_eq(just, &tenant)) {
                continue;
            }
            if tenant.unload() {
                total -= bytes;
                count -= 1;
                self.metrics.pool_unloaded(count, true);
                tracing::info!(function = %tenant.function, code_bytes = bytes, "unloaded for the pool's memory budget (it loads again on its next request)");
            }
        }
    }

    fn loaded_count_except(&self, except: &Arc<Tenant>) -> usize {
        self.by_port
            .read()
            .unwrap()
            .values()
            .filter(|tenant| !Arc::ptr_eq(tenant, except) && tenant.handler.load().is_some())
            .count()
    }
}
