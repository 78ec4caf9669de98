//! What the agent tells Prometheus on `--metrics-addr` (`/metrics`): its answers to each
//! namespace's runtimes, and the code each namespace holds on the node, read from the
//! store when scraped. The runtime's `wasmless_code_store_requests_total` counts the same
//! exchanges from the other side, per pod.

use crate::namespace::Namespace;
use crate::store::Store;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabels {
    namespace: String,
    op: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabel {
    namespace: String,
}

/// Every socket's answers, whichever thread gave them (as `ADMITTING` in `server`, one
/// per process).
static ANSWERS: LazyLock<Family<AnswerLabels, Counter>> = LazyLock::new(Family::default);

/// Counts an answer: `op` is `get`, `put` or `invalid` (a request that did not parse),
/// `result` the reply's word (`found`, `absent`, `corrupt`, `stored`, `refused`).
pub fn count_answer(namespace: &Namespace, op: &'static str, result: &'static str) {
    ANSWERS
        .get_or_create(&AnswerLabels {
            namespace: namespace.to_string(),
            op,
            result,
        })
        .inc();
}

/// The text exposition of the answers so far and of what `store` holds now.
pub fn render(store: &Store) -> String {
    let mut registry = Registry::default();
    registry.register(
        "wasmless_code_store_answers",
        "Requests of runtimes the node agent answered, by the runtime's namespace, the request (get, put, invalid) and the answer",
        ANSWERS.clone(),
    );
    let bytes = Family::<NamespaceLabel, Gauge>::default();
    let objects = Family::<NamespaceLabel, Gauge>::default();
    for (namespace, held_bytes, held_objects) in store.usage_by_namespace() {
        let label = NamespaceLabel {
            namespace: namespace.to_string(),
        };
        bytes
            .get_or_create(&label)
            .set(i64::try_from(held_bytes).unwrap_or(i64::MAX));
        objects
            .get_or_create(&label)
            .set(i64::try_from(held_objects).unwrap_or(i64::MAX));
    }
    registry.register(
        "wasmless_code_store_bytes",
        "Bytes of code a namespace holds in the node's store, as charged against --namespace-quota (code two namespaces hold counts in both)",
        bytes,
    );
    registry.register(
        "wasmless_code_store_objects",
        "Compiled Functions' code a namespace holds in the node's store",
        objects,
    );
    let (node_bytes, _) = store.usage();
    let node = Gauge::<i64>::default();
    node.set(i64::try_from(node_bytes).unwrap_or(i64::MAX));
    registry.register(
        "wasmless_code_store_node_bytes",
        "Bytes of code in the node's store, each file once, as charged against --store-budget",
        node,
    );
    let mut text = String::new();
    // Writing to a String does not fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

/// Serves `/metrics` at `address` on a thread of its own.
pub fn serve(address: SocketAddr, store: Arc<Store>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    tracing::info!(%address, "serving metrics");
    Ok(std::thread::spawn(move || runtime.block_on(accept(listener, store))))
}

/// Connections served at once: Prometheus needs one. Any pod may reach the port, and the
/// descriptors and memory a connection holds are the ones the agent serves code with.
const MAX_CONNECTIONS: usize = 4;
/// How long a connection may last, idle or not: a scrape takes milliseconds.
const CONNECTION_TIME: Duration = Duration::from_secs(10);

async fn accept(listener: tokio::net::TcpListener, store: Arc<Store>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // All taken: this one is closed at once, the ones being served go on.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let store = store.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let answer = hyper::service::service_fn(move |request| {
                let store = store.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&request, &store)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), answer);
            match tokio::time::timeout(CONNECTION_TIME, connection).await {
                Ok(Err(error)) => tracing::debug!(%error, "a metrics connection ended"),
                Err(_) => tracing::debug!("a metrics connection closed after {CONNECTION_TIME:?}"),
                Ok(Ok(())) => {}
            }
        });
    }
}

fn respond(request: &Request<hyper::body::Incoming>, store: &Store) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if request.uri().path() == "/metrics" {
        (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(store),
        )
    } else {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            "the agent serves /metrics\n".into(),
        )
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}
