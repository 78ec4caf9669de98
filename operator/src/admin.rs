//! The operator's own HTTP endpoints: `/metrics` (OpenMetrics text), `/healthz`, `/readyz`.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct AdminState {
    pub registry: Registry,
    /// Set once the process can do its job (as leader or as a standby waiting for the Lease).
    pub ready: AtomicBool,
}

impl AdminState {
    pub fn new(registry: Registry) -> Arc<Self> {
        Arc::new(Self {
            registry,
            ready: AtomicBool::new(false),
        })
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }
}

pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<Arc<AdminState>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding metrics failed".into(),
        ),
    }
}

async fn readyz(State(state): State<Arc<AdminState>>) -> StatusCode {
    if state.ready.load(Ordering::Relaxed) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}
