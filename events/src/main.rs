//! `wasmless-events`: delivers the events of every Function's triggers (docs/architecture.md,
//! "Events"). Follows the Functions, runs a delivery per trigger from NATS JetStream to the
//! Function's own Pods, serves the publishing ingress (`ingress.rs`) and `/metrics`.
//! Replicas share each trigger's durable consumer, so they share its work with no leader.

use anyhow::Context as _;
use clap::Parser;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use wasmless_events::broker::jetstream::JetStream;
use wasmless_events::identity::TokenReviewer;
use wasmless_events::journal::Journal;
use wasmless_events::metrics::{EventMetrics, IngressMetrics};
use wasmless_events::running::Running;
use wasmless_events::watch;
use wasmless_events::{credentials, ingress, report};

#[derive(Parser, Debug)]
#[command(
    name = "wasmless-events",
    version,
    about = "Delivers Functions' events: NATS JetStream messages to their Services as CloudEvents"
)]
struct Args {
    /// The NATS server with JetStream.
    #[arg(
        long,
        env = "WASMLESS_NATS_URL",
        default_value = "nats://nats.wasmless-system.svc:4222"
    )]
    nats_url: String,
    /// The Secret, in this component's namespace, holding the broker's password for the
    /// user `wasmless-events`; made with a random one when missing (the installed broker
    /// reads it too). Empty: the broker asks for none, or `--nats-url` carries it.
    #[arg(long, env = "WASMLESS_NATS_PASSWORD_SECRET", default_value = "")]
    nats_password_secret: String,
    /// What each namespace's stream holds at most, in bytes; a publish past it is refused.
    /// The broker reserves it whole for every namespace with a trigger, so its store
    /// (9 GB as installed) holds that divided by this many namespaces' streams.
    #[arg(long, env = "WASMLESS_NAMESPACE_MAX_BYTES", default_value_t = wasmless_events::broker::jetstream::NAMESPACE_BYTES)]
    namespace_max_bytes: i64,
    /// Where the publishing ingress is served: `POST /publish/<namespace>/<subject>` with a
    /// ServiceAccount token of that namespace for the audience `wasmless-events`.
    #[arg(long, env = "WASMLESS_INGRESS_ADDR", default_value = "0.0.0.0:8080")]
    ingress_addr: SocketAddr,
    /// Where `/metrics` is served.
    #[arg(long, env = "WASMLESS_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    metrics_addr: SocketAddr,
    /// Events being delivered at once, over every trigger of every namespace: what one
    /// namespace's triggers can hold of this process's sockets and memory.
    #[arg(long, env = "WASMLESS_MAX_IN_FLIGHT", default_value_t = 256)]
    max_in_flight: usize,
    /// This replica's name, on the Events it writes (`reportingInstance`).
    #[arg(long, env = "WASMLESS_POD_NAME", default_value = "wasmless-events")]
    pod_name: String,
    /// Follow the Functions of this namespace only (default: every namespace).
    #[arg(long, env = "WASMLESS_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // rustls panics on the first TLS connection unless a provider is chosen; the
    // workspace links ring alone.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    let kube = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let credentials = if args.nats_password_secret.is_empty() {
        None
    } else {
        let namespace = kube.default_namespace().to_string();
        let password = credentials::ensure_password(kube.clone(), &namespace, &args.nats_password_secret).await?;
        Some((credentials::USER.to_string(), password))
    };
    let broker = Arc::new(
        connect(&args.nats_url, credentials)
            .await
            .with_namespace_bytes(args.namespace_max_bytes),
    );
    let mut registry = Registry::default();
    let metrics = EventMetrics::register(&mut registry);
    let ingress_metrics = IngressMetrics::register(&mut registry);
    serve_metrics(args.metrics_addr, registry).await?;
    let publishing = ingress::router(
        broker.clone(),
        Arc::new(TokenReviewer::new(kube.clone())),
        ingress_metrics.clone(),
    );
    serve_ingress(args.ingress_addr, publishing, ingress_metrics)?;
    let journal = Journal::start(kube.clone(), args.pod_name.clone());
    let mut running = Running::new(broker, kube.clone(), metrics, journal, args.max_in_flight);
    tokio::spawn(report::keep_reporting(kube.clone(), running.progresses()));
    tracing::info!(nats = %args.nats_url, namespace = ?args.watch_namespace, "following Functions' triggers");
    let api = watch::functions_api(kube, args.watch_namespace.as_deref());
    tokio::select! {
        () = watch::follow_functions(api, &mut running) => {}
        _ = tokio::signal::ctrl_c() => {}
        () = terminated() => {}
    }
    Ok(())
}

/// The broker, waited for: installed together, the broker starts only once the first
/// replica has made its password, and a restart loop would only slow that down.
async fn connect(url: &str, credentials: Option<(String, String)>) -> JetStream {
    loop {
        match JetStream::connect(url, credentials.clone()).await {
            Ok(broker) => return broker,
            Err(error) => {
                tracing::warn!(%error, "waiting for the broker");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
}

async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut signal) => {
            signal.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn serve_metrics(address: SocketAddr, registry: Registry) -> anyhow::Result<()> {
    let registry = Arc::new(Mutex::new(registry));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                let mut text = String::new();
                let encoded = prometheus_client::encoding::text::encode(&mut text, &registry.lock().expect("registry"));
                match encoded {
                    Ok(()) => (http::StatusCode::OK, [(http::header::CONTENT_TYPE, OPENMETRICS)], text),
                    Err(_) => (
                        http::StatusCode::INTERNAL_SERVER_ERROR,
                        [(http::header::CONTENT_TYPE, "text/plain")],
                        "the metrics could not be written\n".to_string(),
                    ),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding --metrics-addr {address}"))?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "metrics server stopped");
        }
    });
    Ok(())
}

/// The ingress faces every pod of the cluster: it is served through the runtime's edge,
/// which caps connections and limits the time and size of a request's headers, so that
/// slow or huge heads cannot hold the process's memory.
fn serve_ingress(address: SocketAddr, app: axum::Router, metrics: IngressMetrics) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(address).with_context(|| format!("binding --ingress-addr {address}"))?;
    listener.set_nonblocking(true)?;
    let limits = wasmless_edge::EdgeLimits {
        header_read_timeout: std::time::Duration::from_secs(10),
        idle_timeout: std::time::Duration::from_secs(60),
        max_header_size: 16 << 10,
        max_connections: 1024,
        max_connections_per_listener: 1024,
    };
    let (listeners_tx, listeners) = tokio::sync::watch::channel(Arc::new(vec![Arc::new(listener)]));
    let (phase_tx, phase) = tokio::sync::watch::channel(wasmless_edge::Phase::Serving);
    tokio::spawn(async move {
        // The edge serves while the phase's sender lives, and stops when it is dropped.
        let _serving = (listeners_tx, phase_tx);
        if let Err(error) = wasmless_edge::serve(listeners, app, limits, Arc::new(metrics), phase, 1).await {
            tracing::error!(%error, "the ingress stopped");
        }
    });
    Ok(())
}

#[cfg(test)]
mod flags_reference_test {
    use clap::CommandFactory;

    #[test]
    fn flags_reference() {
        let page = wasmless_testkit::flags_reference::page(
            super::Args::command(),
            "The events component: follows Functions' `spec.triggers` and delivers their events from NATS JetStream to each Function's Service (`docs/architecture.md`, \"Events\").",
        );
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        wasmless_testkit::flags_reference::check(root, "docs/reference/wasmless-events.md", &page);
    }
}
