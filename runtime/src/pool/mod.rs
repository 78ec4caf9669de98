//! The pool: one process serving many Functions, each on its own port. A Function is
//! loaded when it joins the table while the budget has room (`--pool-load-ahead`), else on
//! its first request — its code and module digests checked exactly as a
//! dedicated runtime checks them — with its own limits, env, outbound policy, metrics
//! label and log lines, and unloaded (least recently used first) when the loaded ones'
//! code passes the memory budget. Why ports: a request names its Function by the port it
//! arrives on, whatever the client's `Host` header says, so a Service can point at the
//! pool with nothing but a target port.

mod ahead;
pub mod api;
mod budget;
mod idle_code;
pub mod quarantine;
pub mod references;
mod shares;
pub mod source;
pub mod table;
pub mod trust;

use crate::config::Config;
use crate::tenant::Tenant;
use budget::Budget;
pub use shares::check_shares;
use shares::{Account, Caps, Slots};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};
use table::{Entry, Row, Table};
use tokio::sync::watch;
use wasmless_edge::Listeners;
use wasmless_host::code_cost::CodeCost;
use wasmless_host::limits::RequestLimits;
use wasmless_host::loader::EngineHost;
use wasmless_host::metrics::Metrics;
use wasmless_host::request_memory::SharedMemory;

/// One Function as `GET /pool` on the admin port shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FunctionStatus {
    pub port: u16,
    pub listening: bool,
    pub loaded: bool,
    pub error: Option<String>,
}

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
    budget: Budget,
    load_ahead: bool,
    by_port: RwLock<HashMap<u16, Arc<Tenant>>>,
    /// By the address of the listener that serves it: what a connection is bound to when
    /// it is accepted ([`wasmless_edge::AcceptedOn`]), so that it reaches the Function that
    /// held that listener, or nobody, whoever has the port since.
    by_listener: RwLock<HashMap<usize, Arc<Tenant>>>,
    /// By Function name in the table.
    held: Mutex<HashMap<String, Held>>,
    /// The last table applied, applied again when a port's quarantine ends.
    table: Mutex<Table>,
    /// Ports recently left, not yet given to another Function.
    quarantine: Mutex<quarantine::PortQuarantine>,
    /// When the table is next applied again for an entry waiting for its port.
    reapply_at: Mutex<Option<Instant>>,
    listeners: watch::Sender<Listeners>,
    /// Each table entry's last problem (and its port, when it says one), logged once
    /// rather than every sync, and shown by [`Pool::status`].
    reported: Mutex<HashMap<String, (String, Option<u16>)>>,
    /// A whole table has been applied: until then the pool is not ready.
    table_read: AtomicBool,
    /// `--max-concurrency` of the pool: requests running at once across its Functions,
    /// which the instance pool is sized for.
    permits: Arc<tokio::sync::Semaphore>,
    /// `--pool-request-memory`: what all requests' instances may hold together.
    memory: Arc<SharedMemory>,
    /// Each Function's account with it and its share of the request slots, by name, kept
    /// while the Function is in the table: an edit's new tenant shares them with the old
    /// one's requests still in flight, so that an edit never doubles a Function's share.
    accounts: Mutex<HashMap<String, Account>>,
    /// What one Function may have, whatever its entry asks: its share of the request
    /// slots, and the caps on its timeout and request body.
    caps: Caps,
}

impl Pool {
    /// An empty pool on `engine`: its table source ([`source::TableSource`]) feeds it
    /// [`Pool::apply`]. `config` is the pool's own (its limits the largest any Function
    /// may have).
    pub fn new(
        engine: EngineHost,
        metrics: Arc<Metrics>,
        config: &Config,
        admin_port: u16,
    ) -> (Arc<Self>, watch::Receiver<Listeners>) {
        let (listeners, receiver) = watch::channel(Listeners::default());
        let pool = Arc::new(Self {
            engine,
            metrics,
            limits: config.request_limits(),
            bind: config.bind,
            admin_port,
            budget: Budget {
                memory: config.pool_memory_budget,
                mapped: config.pool_mapped_code_budget,
            },
            load_ahead: config.pool_load_ahead,
            by_port: Default::default(),
            by_listener: Default::default(),
            held: Default::default(),
            table: Default::default(),
            quarantine: Mutex::new(quarantine::PortQuarantine::new(quarantine::PORT_QUARANTINE)),
            reapply_at: Default::default(),
            listeners,
            reported: Default::default(),
            table_read: AtomicBool::new(false),
            permits: Arc::new(tokio::sync::Semaphore::new(config.max_concurrency as usize)),
            memory: Arc::new(SharedMemory::new(
                usize::try_from(config.pool_request_memory).unwrap_or(usize::MAX),
                config.pool_share,
            )),
            caps: Caps::from_config(config),
            accounts: Default::default(),
        });
        (pool, receiver)
    }

    /// The Function served on `port`.
    pub fn tenant(&self, port: u16) -> Option<Arc<Tenant>> {
        self.by_port.read().unwrap().get(&port).cloned()
    }

    /// The Function a connection was accepted for, while its listener serves it: `None`
    /// once that Function left the pool (or its port), whoever holds the port since.
    pub fn tenant_on(&self, accepted: &wasmless_edge::AcceptedOn) -> Option<Arc<Tenant>> {
        self.by_listener.read().unwrap().get(&accepted.key()).cloned()
    }

    /// Functions the table names and the pool serves.
    pub fn len(&self) -> usize {
        self.by_port.read().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a whole table has been applied (the pool's readiness).
    pub fn table_read(&self) -> bool {
        self.table_read.load(Ordering::SeqCst)
    }

    /// Brings the pool in line with `table`, the whole of it: new Functions get a port
    /// (nothing loads until a request comes), changed ones are replaced (requests in
    /// flight finish on the old), removed ones are unloaded and their port closed, with
    /// the connections made to it. An entry that cannot be used is logged, and if it
    /// served before, its Function keeps serving as it was.
    pub fn apply(self: &Arc<Self>, table: Table) {
        let held = self.held.lock().unwrap();
        *self.table.lock().unwrap() = table;
        self.sync(held);
    }

    /// Applies the last table again: an entry that waited for its port may have it now.
    fn reapply(self: &Arc<Self>) {
        self.sync(self.held.lock().unwrap());
    }

    /// [`Pool::apply`]'s work, on the last table, with `held` locked throughout so that a
    /// re-application never runs on a table older than one applied meanwhile.
    fn sync(self: &Arc<Self>, mut held: MutexGuard<'_, HashMap<String, Held>>) {
        let table = self.table.lock().unwrap().clone();
        self.reported.lock().unwrap().retain(|name, _| table.contains_key(name));
        let now = Instant::now();
        let mut changed = false;
        held.retain(|name, old| {
            let keep = table.contains_key(name);
            if !keep {
                tracing::info!(function = %old.tenant.function, port = old.entry.port, "removed from the pool");
                self.release(name, old, now);
                changed = true;
            }
            keep
        });
        let mut joined = Vec::new();
        for (name, row) in by_claim(table) {
            if let Some(tenant) = self.place(&mut held, &name, row, now) {
                joined.push(tenant);
                changed = true;
            }
        }
        let by_port = held
            .values()
            .map(|held| (held.entry.port, held.tenant.clone()))
            .collect();
        let by_listener = held
            .values()
            .map(|held| (Arc::as_ptr(&held.listener).addr(), held.tenant.clone()))
            .collect();
        let listeners: Vec<_> = held.values().map(|held| held.listener.clone()).collect();
        *self.by_port.write().unwrap() = by_port;
        *self.by_listener.write().unwrap() = by_listener;
        drop(held);
        if changed {
            self.listeners.send_replace(Arc::new(listeners));
        }
        self.table_read.store(true, Ordering::SeqCst);
        self.warm(joined);
    }

    /// Brings `name`'s Function in line with its row: the tenant it is now served with,
    /// when that is a new one.
    fn place(
        self: &Arc<Self>,
        held: &mut HashMap<String, Held>,
        name: &str,
        row: Row,
        now: Instant,
    ) -> Option<Arc<Tenant>> {
        let origin = row.origin;
        let entry = match row.entry {
            Ok(entry) => entry,
            Err(problem) => {
                self.report(name, format!("{origin}: {problem}"), None);
                return None;
            }
        };
        if let Some(old) = held
            .get_mut(name)
            .filter(|old| old.entry != entry && old.entry.same_but_route(&entry))
        {
            // Only where the Service routes changed: the loaded Function serves on.
            old.tenant.served_by_pods.store(entry.served_by_pods, Ordering::Relaxed);
            tracing::info!(
                function = %old.tenant.function,
                port = entry.port,
                served_by_pods = entry.served_by_pods,
                "the Function's Service moved"
            );
            old.entry = entry;
            self.reported.lock().unwrap().remove(name);
            return None;
        }
        if held.get(name).is_some_and(|old| old.entry == entry) {
            // Back to what serves (after a bad change, say): nothing is wrong any more.
            self.reported.lock().unwrap().remove(name);
            return None;
        }
        if let Some(problem) = self.port_problem(held, name, entry.port, now) {
            self.report(name, format!("{origin}: {problem}"), Some(entry.port));
            return None;
        }
        // The same Function on the same port keeps its listener, and so the connections
        // made to it: an edit reaches them at their next request, and drops none.
        let reused = held.get(name).filter(|old| old.entry.port == entry.port);
        let listener = match reused {
            Some(old) => Ok(old.listener.clone()),
            None => self.listen(entry.port),
        };
        let added = listener.and_then(|listener| {
            let tenant = self.tenant_for(&entry)?;
            tenant.served_by_pods.store(entry.served_by_pods, Ordering::Relaxed);
            Ok(Held {
                entry: entry.clone(),
                tenant: Arc::new(tenant),
                listener,
            })
        });
        match added {
            Ok(new) => {
                tracing::info!(function = %new.tenant.function, port = entry.port, "serving from the pool");
                let tenant = new.tenant.clone();
                if let Some(old) = held.insert(name.to_string(), new) {
                    if old.entry.port == entry.port {
                        self.forget(&old);
                    } else {
                        self.release(name, &old, now);
                    }
                }
                self.reported.lock().unwrap().remove(name);
                Some(tenant)
            }
            Err(problem) => {
                self.report(name, format!("{origin}: {problem}"), Some(entry.port));
                None
            }
        }
    }

    /// Why `name` cannot have `port` now: another Function holds it (the one that held it
    /// first keeps it), or left it too recently ([`quarantine`]).
    fn port_problem(
        self: &Arc<Self>,
        held: &HashMap<String, Held>,
        name: &str,
        port: u16,
        now: Instant,
    ) -> Option<String> {
        if let Some((other, _)) = held
            .iter()
            .find(|(other, held)| *other != name && held.entry.port == port)
        {
            return Some(format!(
                "port {port} is {other}'s already: the Function that held it first keeps it; give this one another port"
            ));
        }
        let mut quarantine = self.quarantine.lock().unwrap();
        let wait = quarantine.wait(port, name, now)?;
        let period = quarantine.period();
        drop(quarantine);
        self.reapply_after(wait.remaining);
        Some(format!(
            "port {port} was Function {}'s until {:.0}s ago, and a port is not given to another Function for {}s, so that none of its clients reaches this one: it is served on that port in {}s",
            wait.previous,
            (period - wait.remaining).as_secs_f64(),
            period.as_secs(),
            wait.remaining.as_secs_f64().ceil(),
        ))
    }

    /// Applies the table again once `wait` has passed (one timer for the earliest wait).
    fn reapply_after(self: &Arc<Self>, wait: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let at = Instant::now() + wait;
        {
            let mut pending = self.reapply_at.lock().unwrap();
            if pending.is_some_and(|pending| pending <= at) {
                return;
            }
            *pending = Some(at);
        }
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let Some(pool) = Weak::upgrade(&pool) else { return };
            {
                let mut pending = pool.reapply_at.lock().unwrap();
                if *pending == Some(at) {
                    *pending = None;
                }
            }
            pool.reapply();
        });
    }

    /// `old` no longer serves: its port and the connections made to it close (the edge
    /// closes each connection once its listener is gone), and the port waits before
    /// another Function may have it.
    fn release(&self, name: &str, old: &Held, now: Instant) {
        self.quarantine.lock().unwrap().free(old.entry.port, name, now);
        self.accounts.lock().unwrap().remove(&*old.tenant.function);
        self.forget(old);
    }

    /// What the code the pool holds loaded costs.
    fn loaded_cost(&self) -> CodeCost {
        self.by_port
            .read()
            .unwrap()
            .values()
            .filter_map(|tenant| Some(tenant.handler.load().as_ref()?.code))
            .sum()
    }

    /// Each Function of the table: its port, whether the pool listens on it and has its
    /// code loaded, and what is wrong with it (its entry, or its last load), for the admin
    /// port's `/pool`. An entry that never served has the port it asked for (0 when it
    /// does not say one) and is not listening.
    pub fn status(&self) -> BTreeMap<String, FunctionStatus> {
        let held = self.held.lock().unwrap();
        let reported = self.reported.lock().unwrap();
        let mut functions: BTreeMap<String, FunctionStatus> = held
            .iter()
            .map(|(name, held)| {
                let status = FunctionStatus {
                    port: held.entry.port,
                    listening: true,
                    loaded: held.tenant.handler.load().is_some(),
                    error: held.tenant.last_error(),
                };
                (name.clone(), status)
            })
            .collect();
        for (name, (problem, port)) in reported.iter() {
            let status = functions.entry(name.clone()).or_insert(FunctionStatus {
                port: port.unwrap_or(0),
                listening: false,
                loaded: false,
                error: None,
            });
            // What is wrong with the entry comes first: it is what a writer of the table fixes.
            status.error = Some(problem.clone());
        }
        functions
    }

    fn report(&self, name: &str, problem: String, port: Option<u16>) {
        let mut reported = self.reported.lock().unwrap();
        if reported.get(name).map(|(reported, _)| reported) != Some(&problem) {
            tracing::error!(problem = %problem, "a Function of the pool's table cannot be served; fix its entry (one that served before serves on as it was)");
        }
        reported.insert(name.to_string(), (problem, port));
    }

    fn forget(&self, held: &Held) {
        if held.tenant.unload() {
            self.metrics
                .pool_unloaded(self.loaded_count_except(&held.tenant), false, self.loaded_cost());
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
        let mut function_limits = config.request_limits();
        if function_limits.isolation == wasmless_host::limits::Isolation::Shared {
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
        if function_limits.timeout > self.caps.timeout {
            return Err(format!(
                "its --timeout is over the pool's --pool-max-timeout ({:?}): serve this Function from its own pods",
                self.caps.timeout
            ));
        }
        if function_limits.max_request_body > self.caps.max_request_body {
            return Err(format!(
                "its --max-request-body is over the pool's --pool-max-request-body ({} bytes): serve this Function from its own pods",
                self.caps.max_request_body
            ));
        }
        // Its share of the slots, and its own account with the requests' memory: one
        // Function's load gets 503s before it takes the pool from the others.
        function_limits.max_concurrency = function_limits.max_concurrency.min(self.caps.slots);
        let slots = {
            let mut accounts = self.accounts.lock().unwrap();
            let account = accounts.entry(config.function.clone()).or_insert_with(|| Account {
                memory: self.memory.account(),
                slots: Slots::new(function_limits.max_concurrency),
            });
            account.slots.resize(function_limits.max_concurrency);
            function_limits.shared_memory = Some(account.memory.clone());
            account.slots.semaphore.clone()
        };
        let metrics = Arc::new(self.metrics.for_function(&config.function));
        let variables = entry.resolved.0.iter().cloned();
        let mut tenant = Tenant::with_limits(
            &self.engine,
            &config,
            function_limits,
            metrics,
            self.admin_port,
            variables,
        )
        .map_err(|error| error.to_string())?;
        tenant.permits = slots;
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
        let mut loaded: Vec<(Arc<Tenant>, CodeCost)> = tenants
            .into_iter()
            .filter_map(|tenant| {
                let cost = tenant.handler.load().as_ref()?.code;
                Some((tenant, cost))
            })
            .collect();
        let mut total: CodeCost = loaded.iter().map(|(_, cost)| *cost).sum();
        self.metrics.pool_loaded(elapsed, loaded.len(), total);
        if self.budget.fits(total) {
            return;
        }
        let just_loaded = self.tenant(port);
        loaded.sort_by_key(|(tenant, _)| tenant.last_used());
        let mut count = loaded.len();
        for (tenant, cost) in loaded {
            if self.budget.fits(total) {
                break;
            }
            if just_loaded.as_ref().is_some_and(|just| Arc::ptr_eq(just, &tenant)) {
                continue;
            }
            if tenant.unload() {
                total = total - cost;
                count -= 1;
                self.metrics.pool_unloaded(count, true, total);
                tracing::info!(
                    function = %tenant.function,
                    private_bytes = cost.private,
                    mapped_bytes = cost.mapped,
                    "unloaded for the pool's budgets (it loads again on its next request)"
                );
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

/// The table in the order its entries claim ports: the oldest claim first (a ConfigMap's
/// creation time), then those that say none (files), each group by name.
fn by_claim(table: Table) -> Vec<(String, Row)> {
    let mut rows: Vec<(String, Row)> = table.into_iter().collect();
    // Stable: names stay in order within one time.
    rows.sort_by_key(|(_, row)| (row.claimed_since.is_none(), row.claimed_since.clone()));
    rows
}

#[cfg(test)]
mod tests;
