//! `wasmless-operator`: runs the Function controller, serves /metrics, /healthz and /readyz,
//! and (by default) reconciles only while holding the leader Lease.

use anyhow::Context as _;
use clap::Parser;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use wasmless_operator::admin::AdminState;
use wasmless_operator::crd::Storage;
use wasmless_operator::flags::Args;
use wasmless_operator::leader::LeaseLock;
use wasmless_operator::{Context, Metrics};

/// The admin port (`/metrics`, `/healthz`, `/readyz`), served in the background.
async fn serve_admin(address: SocketAddr, state: Arc<AdminState>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding {address}"))?;
    let app = wasmless_operator::admin::router(state);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "metrics server stopped");
        }
    });
    Ok(())
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
    // The operator's own spans are made with OpenTelemetry's API (their times are the
    // build's), so the log's subscriber needs no layer for them.
    let traces =
        wasmless_telemetry::Traces::start(args.otlp_endpoint.as_deref(), "wasmless-operator", "wasmless-operator")
            .context("--otlp-endpoint")?;
    if args.default_storage == Storage::Oci && args.oci_registry.is_none() {
        anyhow::bail!("--default-storage oci needs --oci-registry");
    }
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("wasmless-operator-{}", std::process::id()));
    let settings = args.settings();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let mut registry = Registry::default();
    let metrics = Metrics::default().register(&mut registry);
    let state = AdminState::new(registry);
    serve_admin(args.metrics_addr, state.clone()).await?;
    let mut ctx = Context::new(client.clone(), settings, metrics, Some(identity.clone()));
    if let Some(traces) = &traces {
        ctx = ctx.with_traces(wasmless_operator::controller::ApplyTraces::new(traces.tracer()));
    }
    let ctx = Arc::new(ctx);
    let lease = LeaseLock::new(
        client,
        &args.lease_namespace,
        &args.lease_name,
        &identity,
        Duration::from_secs(15),
    );
    if args.leader_election {
        // A standby replica is healthy and ready: it is waiting, as it should.
        state.set_ready();
        tracing::info!(lease = %args.lease_name, %identity, "waiting for the leader lease");
        tokio::select! {
            () = lease.acquire() => {}
            () = shutdown_signal() => return Ok(()),
        }
    }
    state.set_ready();
    tracing::info!(namespace = ?args.watch_namespace, "starting the Function controller");
    let controller = wasmless_operator::run(ctx, args.watch_namespace.as_deref(), shutdown_signal());
    let outcome = if args.leader_election {
        tokio::select! {
            () = controller => {
                // Stopped by SIGTERM (a rollout, a drain): the standby takes over now rather
                // than when the Lease expires.
                lease.release().await;
                Ok(())
            }
            // Dropping the controller stops every reconcile; exiting lets the Deployment
            // restart this replica as a standby.
            lost = lease.keep() => Err(anyhow::anyhow!("stopped leading: {lost}")),
        }
    } else {
        controller.await;
        Ok(())
    };
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    outcome
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
