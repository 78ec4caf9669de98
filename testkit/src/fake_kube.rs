//! An in-memory Kubernetes API that serves ConfigMaps (server-side apply, get, list),
//! enough for the builder's publishing; with a kubeconfig that points at it.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct FakeKube {
    pub config_maps: Arc<Mutex<BTreeMap<(String, String), Value>>>,
    /// Status codes the next applies are answered with instead of being stored, one each
    /// (a busy API server: 409, 429, 500, 503 …).
    pub apply_failures: Arc<Mutex<std::collections::VecDeque<u16>>>,
    /// Every apply received, failed or not: `(namespace, name)`.
    pub applies: Arc<Mutex<Vec<(String, String)>>>,
}

pub struct RunningFakeKube {
    pub state: FakeKube,
    pub kubeconfig: tempfile::NamedTempFile,
}

impl FakeKube {
    pub async fn start() -> RunningFakeKube {
        let state = FakeKube::default();
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/configmaps", get(list))
            .route("/api/v1/namespaces/{ns}/configmaps/{name}", get(read).patch(apply))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let kubeconfig = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            kubeconfig.path(),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{address}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\ncurrent-context: fake\n"
            ),
        )
        .unwrap();
        RunningFakeKube { state, kubeconfig }
    }
}

async fn list(State(state): State<FakeKube>, Path(ns): Path<String>) -> axum::Json<Value> {
    let items: Vec<Value> = state
        .config_maps
        .lock()
        .unwrap()
        .iter()
        .filter(|((n, _), _)| *n == ns)
        .map(|(_, v)| v.clone())
        .collect();
    axum::Json(
        json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

async fn read(
    State(state): State<FakeKube>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<axum::Json<Value>, StatusCode> {
    state
        .config_maps
        .lock()
        .unwrap()
        .get(&(ns, name))
        .cloned()
        .map(axum::Json)
        .ok_or(StatusCode::NOT_FOUND)
}

/// Server-side apply, as far as a fresh object goes: the applied object is stored whole.
async fn apply(
    State(state): State<FakeKube>,
    Path((ns, name)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: String,
) -> Result<axum::Json<Value>, (StatusCode, String)> {
    state.applies.lock().unwrap().push((ns.clone(), name.clone()));
    if let Some(code) = state.apply_failures.lock().unwrap().pop_front() {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": "InternalError", "message": "injected failure"});
        return Err((status, body.to_string()));
    }
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type != "application/apply-patch+yaml" {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("expected server-side apply, got {content_type}"),
        ));
    }
    let mut object: Value = serde_json::from_str(&body).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))?;
    object["metadata"]["resourceVersion"] = json!("1");
    object["metadata"]["uid"] = json!(format!("uid-{name}"));
    state.config_maps.lock().unwrap().insert((ns, name), object.clone());
    Ok(axum::Json(object))
}
