//! The function port's edge: its own accept loop (in place of `axum::serve`), so that
//! every connection gets the limits a port facing anyone needs — a cap on open
//! connections, a time limit on headers, a size limit on them, an idle timeout on
//! keep-alive — and so that shutdown can drain politely.
//!
//! A crate of its own, the HTTP edge apart from what it serves: it is given a router, its
//! limits and an [`EdgeMetrics`] to count in, and knows nothing else of the runtime.
//!
//! The timeouts are one watchdog per connection, not hyper's `header_read_timeout`:
//! hyper arms that timer as soon as it waits for a request head, which on a keep-alive
//! connection includes the idle time after a response, so an idle connection would be
//! cut at the header timeout. Here the connection is in one of three states — waiting
//! for a head (from connecting, or from the first byte after an idle gap), idle between
//! requests, or serving a request — and each has its own deadline (serving has none here:
//! the handler's `--timeout` and the body's `--body-read-timeout` bound it).
//!
//! One thread per core, each with a single-threaded tokio runtime, accepts from the same
//! listener and serves its connections from start to end: a request is read, run and
//! answered where it arrived, with no task handed between threads. On two cores that
//! costs 12–15% less CPU per request than tokio's work-stealing runtime, whose workers
//! park and wake each other around every request. The price is that a connection stays
//! on its thread: a long handler yields at every epoch tick (`engine::arm_timeout`), so
//! its neighbours wait a tick at a time, and a thread busy with one serves new
//! connections later than an idle one, which takes them.

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{HeaderValue, Request, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tower::ServiceExt;

mod activity;
use activity::{Activity, State, Tracked, WatchedIo};

/// The port a request's connection was accepted on, put in its extensions here.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalPort(pub u16);
/// The limits of the edge, from the command line.
#[derive(Debug, Clone)]
pub struct EdgeLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_header_size: usize,
    pub max_connections: usize,
    /// Connections open at once through one listener: all of them for a dedicated
    /// runtime; in a pool, one Function's share (`--pool-share`), so that one Function's
    /// clients cannot hold every connection the pool takes.
    pub max_connections_per_listener: usize,
}

/// Why the edge refused a client (the runtime counts it in `wasmless_refused_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Headers not complete within `--header-read-timeout`: the connection is closed.
    HeaderTimeout,
    /// Request line and headers over `--max-header-size` (or too many headers): 431.
    HeaderTooLarge,
    /// `--max-connections` open already (or the listener's share): 503, connection closed.
    ConnectionLimit,
}

/// Where the edge counts what it does (the runtime's metrics).
pub trait EdgeMetrics: Send + Sync + 'static {
    fn refuse(&self, refusal: Refusal);
    /// A connection was accepted: counted open until the guard is dropped.
    fn connection_open(&self) -> Box<dyn Send>;
}

/// Where the server is in its life; only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Serving,
    /// SIGTERM came: still accepting and serving, every response says `Connection: close`.
    Draining,
    /// The listener is closed; connections finish their request in flight and close.
    Closing,
}

/// How often at most the "connection limit reached" warning is logged.
const LIMIT_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// What a client over `--max-connections` reads before its connection is closed.
fn connection_limit_response() -> Vec<u8> {
    let body = "too many connections: this function's limit is reached; retry\n";
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What the serving threads share.
struct Edge {
    router: Router,
    limits: Arc<EdgeLimits>,
    metrics: Arc<dyn EdgeMetrics>,
    /// `--max-connections`, across all threads.
    connections: Arc<Semaphore>,
    /// Each listener's share of them, by the listener's address (as [`AcceptedOn`]), across
    /// all threads: held by the listener's accept loops, so it lives as long as one does.
    per_listener: Mutex<std::collections::HashMap<usize, std::sync::Weak<Semaphore>>>,
    /// When the connection limit was last logged, and how many were refused since.
    limit_warning: Mutex<(Option<Instant>, u64)>,
    refusal: Vec<u8>,
}

/// The listening sockets the edge accepts on: one for a dedicated runtime, one per
/// Function for the pool, which adds and removes them as Functions come and go. A
/// connection lives no longer than its listener is in the set: once it is removed, each
/// of its connections finishes the request it is serving and closes.
pub type Listeners = Arc<Vec<Arc<std::net::TcpListener>>>;

/// The listener a connection was accepted on, in each of its requests' extensions: what
/// the pool binds the connection to, so that it reaches the Function that listener was
/// opened for, or nobody, whoever is given the port later. The weak reference keeps the
/// listener's allocation, and so its address, from being reused by another listener while
/// the connection lives: the address identifies it.
#[derive(Debug, Clone)]
pub struct AcceptedOn(std::sync::Weak<std::net::TcpListener>);

impl AcceptedOn {
    pub fn new(listener: &Arc<std::net::TcpListener>) -> Self {
        Self(Arc::downgrade(listener))
    }

    /// The listener's address, as `Arc::as_ptr(listener).addr()` gives it.
    pub fn key(&self) -> usize {
        self.0.as_ptr().addr()
    }
}

/// One listener's accept loop on a serving thread. Dropping it stops the loop, and tells
/// the connections it accepted that their listener is gone.
struct Accepting {
    task: tokio::task::AbortHandle,
    _served: watch::Sender<()>,
}

impl Drop for Accepting {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts on every listener in `listeners` (as it changes) with `threads` threads (at
/// least one) and serves `router` on every connection until `phase` reaches
/// [`Phase::Closing`]; then stops accepting and returns once every connection is closed.
pub async fn serve(
    listeners: watch::Receiver<Listeners>,
    router: Router,
    limits: EdgeLimits,
    metrics: Arc<dyn EdgeMetrics>,
    phase: watch::Receiver<Phase>,
    threads: usize,
) -> std::io::Result<()> {
    let edge = Arc::new(Edge {
        router,
        connections: Arc::new(Semaphore::new(limits.max_connections)),
        per_listener: Mutex::default(),
        limits: Arc::new(limits),
        metrics,
        limit_warning: Mutex::new((None, 0)),
        refusal: connection_limit_response(),
    });
    let mut finished = Vec::new();
    for index in 0..threads.max(1) {
        let (edge, phase, listeners) = (edge.clone(), phase.clone(), listeners.clone());
        let (done, result) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("wasmless-http-{index}"))
            .spawn(move || {
                let _ = done.send(serve_thread(listeners, edge, phase));
            })?;
        finished.push(result);
    }
    for result in finished {
        result
            .await
            .map_err(|_| std::io::Error::other("a serving thread panicked"))??;
    }
    Ok(())
}

/// One serving thread: its own runtime, an accept loop per listener (started and stopped
/// as the set changes) until closing, then waiting for its connections to finish.
fn serve_thread(
    mut listeners: watch::Receiver<Listeners>,
    edge: Arc<Edge>,
    mut phase: watch::Receiver<Phase>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        // Every connection task holds a sender; `recv` returns `None` once all are gone.
        let (open_tx, mut all_closed) = mpsc::channel::<()>(1);
        // By the listener's address in memory: the same socket keeps its accept loop, and
        // its connections.
        let mut accepting: std::collections::HashMap<usize, Accepting> = Default::default();
        loop {
            let current = listeners.borrow_and_update().clone();
            let keep: std::collections::HashSet<usize> =
                current.iter().map(|listener| Arc::as_ptr(listener).addr()).collect();
            accepting.retain(|key, _| keep.contains(key));
            for listener in current.iter() {
                let key = Arc::as_ptr(listener).addr();
                if accepting.contains_key(&key) {
                    continue;
                }
                let (served, listener_served) = watch::channel(());
                let bound = Bound {
                    on: AcceptedOn::new(listener),
                    served: listener_served,
                };
                let listener = TcpListener::from_std(listener.try_clone()?)?;
                let task = tokio::spawn(accept(listener, bound, edge.clone(), phase.clone(), open_tx.clone()));
                let task = task.abort_handle();
                accepting.insert(key, Accepting { task, _served: served });
            }
            // A set that can no longer change (its sender gone) is served as it is.
            let changes = async {
                if listeners.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = changes => {}
                () = closing(&mut phase) => break,
            }
        }
        // Connections are closing already (the phase says so).
        drop(accepting);
        // An aborted accept loop drops its sender when the runtime next polls it.
        drop(open_tx);
        let _ = all_closed.recv().await;
        Ok(())
    })
}

/// What a connection is bound to when it is accepted: its listener, and word of the
/// listener leaving the set (the sender dropped).
#[derive(Clone)]
struct Bound {
    on: AcceptedOn,
    served: watch::Receiver<()>,
}

async fn accept(
    listener: TcpListener,
    bound: Bound,
    edge: Arc<Edge>,
    phase: watch::Receiver<Phase>,
    open_tx: mpsc::Sender<()>,
) {
    let Edge {
        router,
        limits,
        metrics,
        connections,
        ..
    } = &*edge;
    let local_port = LocalPort(listener.local_addr().map_or(0, |addr| addr.port()));
    let listener_connections = {
        let mut per_listener = edge.per_listener.lock().unwrap();
        // A listener whose every accept loop ended has no more use for its count.
        per_listener.retain(|_, semaphore| semaphore.strong_count() > 0);
        match per_listener.get(&bound.on.key()).and_then(std::sync::Weak::upgrade) {
            Some(semaphore) => semaphore,
            None => {
                let semaphore = Arc::new(Semaphore::new(limits.max_connections_per_listener));
                per_listener.insert(bound.on.key(), Arc::downgrade(&semaphore));
                semaphore
            }
        }
    };
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, or a connection reset before it was
                // accepted: nothing to do but wait a little rather than spin.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permits = listener_connections
            .clone()
            .try_acquire_owned()
            .and_then(|listener| Ok((listener, connections.clone().try_acquire_owned()?)));
        let Ok(permit) = permits else {
            metrics.refuse(Refusal::ConnectionLimit);
            {
                let mut warning = edge.limit_warning.lock().unwrap();
                let (last_warning, refused_since_warning) = &mut *warning;
                *refused_since_warning += 1;
                if last_warning.is_none_or(|at| at.elapsed() >= LIMIT_WARNING_INTERVAL) {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        max_connections_per_listener = limits.max_connections_per_listener,
                        port = local_port.0,
                        refused = *refused_since_warning,
                        "connection limit reached: new connections are answered 503 and closed (--max-connections, in a pool a Function's --pool-share of it)"
                    );
                    *last_warning = Some(Instant::now());
                    *refused_since_warning = 0;
                }
            }
            // Never wait on this client: what does not fit in the socket buffer is lost.
            let _ = stream.try_write(&edge.refusal);
            continue;
        };
        let open = metrics.connection_open();
        let connection = Connection {
            router: router.clone(),
            limits: limits.clone(),
            metrics: metrics.clone(),
            phase: phase.clone(),
            remote,
            local_port,
            bound: bound.clone(),
        };
        let open_tx = open_tx.clone();
        tokio::spawn(async move {
            connection.run(stream).await;
            drop((permit, open, open_tx));
        });
    }
}

struct Connection {
    router: Router,
    limits: Arc<EdgeLimits>,
    metrics: Arc<dyn EdgeMetrics>,
    phase: watch::Receiver<Phase>,
    remote: SocketAddr,
    local_port: LocalPort,
    bound: Bound,
}

impl Connection {
    async fn run(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(WatchedIo {
            inner: stream,
            activity: activity.clone(),
        });
        let service = {
            let router = self.router.clone();
            let phase = self.phase.clone();
            let remote = self.remote;
            let local_port = self.local_port;
            let accepted_on = self.bound.on.clone();
            let activity = activity.clone();
            hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let done = activity.request_started();
                request.extensions_mut().insert(ConnectInfo(remote));
                request.extensions_mut().insert(local_port);
                request.extensions_mut().insert(accepted_on.clone());
                let answer = router.clone().oneshot(request.map(Body::new));
                let phase = phase.clone();
                async move {
                    let Ok(mut response) = answer.await;
                    if *phase.borrow() >= Phase::Draining {
                        // Tell keep-alive clients to come back through the load balancer.
                        response
                            .headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, Infallible>(response.map(|body| Tracked::new(body, done)))
                }
            })
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .keep_alive(true)
            .header_read_timeout(None)
            .max_header_size(self.limits.max_header_size);
        if self.limits.max_header_size > DEFAULT_MAX_BUF_SIZE {
            builder.max_buf_size(self.limits.max_header_size);
        }
        let connection = builder.serve_connection(io, service);
        let mut connection = std::pin::pin!(connection);
        let mut phase = self.phase.clone();
        let mut served = self.bound.served.clone();
        let mut closing = false;
        loop {
            let changed = activity.changed.notified();
            let deadline = activity.deadline(self.limits.header_read_timeout, self.limits.idle_timeout);
            tokio::select! {
                biased;
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        if error.is_parse_too_large() {
                            self.metrics.refuse(Refusal::HeaderTooLarge);
                        }
                        tracing::debug!(remote = %self.remote, %error, "connection ended with an error");
                    }
                    return;
                }
                () = self::closing(&mut phase), if !closing => {
                    // Idle connections close now; one serving a request answers it with
                    // `Connection: close` and then closes.
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = listener_gone(&mut served), if !closing => {
                    // Its Function left the pool, or its port: the same, so that a client
                    // keeping its connection never reaches whoever has the port next.
                    tracing::debug!(remote = %self.remote, port = self.local_port.0, "closing a connection whose listener closed");
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = changed => {}
                () = sleep_until(deadline) => {
                    match activity.state() {
                        State::Head if activity.expired(self.limits.header_read_timeout, self.limits.idle_timeout) => {
                            self.metrics.refuse(Refusal::HeaderTimeout);
                            tracing::debug!(remote = %self.remote, "closing a connection whose headers did not arrive in time");
                            return;
                        }
                        State::Idle if activity.expired(self.limits.header_read_timeout, self.limits.idle_timeout) => {
                            tracing::debug!(remote = %self.remote, "closing an idle connection");
                            return;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// hyper's own read buffer limit (8 KiB + 100 × 4 KiB); raised only for larger headers.
const DEFAULT_MAX_BUF_SIZE: usize = 8192 + 4096 * 100;

/// Resolves once the server is closing (or its phase can no longer change).
async fn closing(phase: &mut watch::Receiver<Phase>) {
    let _ = phase.wait_for(|phase| *phase >= Phase::Closing).await;
}

/// Resolves once the listener a connection came through has left the set.
async fn listener_gone(served: &mut watch::Receiver<()>) {
    // Nothing is ever sent: only the sender's end is news.
    while served.changed().await.is_ok() {}
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}
