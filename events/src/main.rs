//! `wasmless-events`: delivers the events of every Function's triggers (docs/architecture.md,
//! "Events"). Follows the Functions, runs a delivery per trigger from NATS JetStream to the
//! Function's Service, and serves `/metrics`. Replicas share each trigger's durable
//! consumer, so they share its work with no leader.

use anyhow::Context as _;
use clap::Parser;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use wasmless_events::broker::jetstream::JetStream;
use wasmless_events::metrics::EventMetrics;
use wasmless_events::running::Running;
use wasmless_events::watch;

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
    /// Where `/metrics` is served.
    #[arg(long, env = "WASMLESS_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    metrics_addr: SocketAddr,
    /// Events being delivered at once, over every trigger of every namespace: what one
    /// namespace's triggers can hold of this process's sockets and memory.
    #[arg(long, env = "WASMLESS_MAX_IN_FLIGHT", default_value_t = 256)]
    max_in_flight: usize,
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
    let broker = Arc::new(JetStream::connect(&args.nats_url).await?);
    let mut registry = Registry::default();
    let metrics = EventMetrics::register(&mut registry);
    serve_metrics(args.metrics_addr, registry).await?;
    let mut running = Running::new(broker, kube.clone(), metrics, args.max_in_flight);
    tracing::info!(nats = %args.nats_url, namespace = ?args.watch_namespace, "following Functions' triggers");
    let api = watch::functions_api(kube, args.watch_namespace.as_deref());
    tokio::select! {
        () = watch::follow_functions(api, &mut running) => {}
        _ = tokio::signal::ctrl_c() => {}
        () = terminated() => {}
    }
    Ok(())
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
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding --metrics-addr {address}"))?;
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
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "metrics server stopped");
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
