//! The operator's metrics and its admin endpoints.

use crate::harness::*;
use serde_json::json;
use std::sync::Arc;
use wasmless_operator::crd::Function;
use wasmless_operator::{Context, Metrics, error_policy};
use wasmless_testkit::FakeApiServer;

#[tokio::test]
async fn reconciles_and_errors_are_counted() {
    let fake = FakeApiServer::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::default().register(&mut registry);
    let ctx = Arc::new(Context::new(fake.client(), settings(), metrics, None));
    let h = Harness {
        ctx,
        client: fake.client(),
        fake: Some(fake.clone()),
        ns: "default".into(),
    };
    h.create("hello", json!({"source": HELLO})).await;
    fake.fail(http::Method::PATCH, "/jobs/", 1);
    let error = h.reconcile("hello").await.unwrap_err();
    error_policy(Arc::new(h.function("hello").await), &error, h.ctx.clone());
    h.reconcile("hello").await.unwrap();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("wasmless_operator_reconciles_total 2"), "{text}");
    assert!(
        text.contains(r#"wasmless_operator_reconcile_errors_total{error="kube"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("wasmless_operator_reconcile_duration_seconds_count 2"),
        "{text}"
    );
}

/// A harness on the in-memory API server whose metrics are in `registry`.
fn counted(registry: &mut prometheus_client::registry::Registry) -> Harness {
    let fake = FakeApiServer::new();
    let metrics = Metrics::default().register(registry);
    Harness {
        ctx: Arc::new(Context::new(fake.client(), settings(), metrics, None)),
        client: fake.client(),
        fake: Some(fake),
        ns: "default".into(),
    }
}

fn exposition(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

fn builds(function: &str, result: &str, count: u32) -> String {
    format!(
        r#"wasmless_operator_builds_total{{function="{function}",function_namespace="default",result="{result}"}} {count}"#
    )
}

#[tokio::test]
async fn build_outcomes_are_counted_once_by_result() {
    let mut registry = prometheus_client::registry::Registry::default();
    let h = counted(&mut registry);
    h.create("hello", json!({"source": "package handlers\n\nfunc Handler( {\n"}))
        .await;
    h.reconcile("hello").await.unwrap();
    let text = exposition(&registry);
    for result in ["succeeded", "failed", "deadline_exceeded", "oom_killed"] {
        assert!(
            text.contains(&builds("hello", result, 0)),
            "{result} exported at 0 before any build ends: {text}"
        );
    }

    h.fail_build("hello", "./handler.go:3:15: syntax error: unexpected {, expected )")
        .await;
    h.reconcile("hello").await.unwrap();
    // Reconciled again (a watch event, a restart of the watch): the same failure.
    h.reconcile("hello").await.unwrap();
    let text = exposition(&registry);
    assert!(text.contains(&builds("hello", "failed", 1)), "{text}");
    assert!(text.contains(&builds("hello", "succeeded", 0)), "{text}");

    // The source fixed: a second build, which succeeds, counted once too.
    h.update_spec("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    h.finish_build("hello", &wasm("hello")).await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    h.reconcile("hello").await.unwrap();
    let text = exposition(&registry);
    assert!(text.contains(&builds("hello", "succeeded", 1)), "{text}");
    assert!(text.contains(&builds("hello", "failed", 1)), "{text}");

    h.create("slow", json!({"source": HELLO_V2})).await;
    h.reconcile("slow").await.unwrap();
    let killed = json!({"exitCode": 137, "reason": "Error", "message": "compiling Go to WebAssembly..."});
    h.fail_build_with("slow", killed, "DeadlineExceeded").await;
    h.reconcile("slow").await.unwrap();
    let text = exposition(&registry);
    assert!(text.contains(&builds("slow", "deadline_exceeded", 1)), "{text}");
    assert!(text.contains(&builds("slow", "failed", 0)), "{text}");
}

#[tokio::test]
async fn a_step_that_fails_between_does_not_count_the_build_again() {
    let mut registry = prometheus_client::registry::Registry::default();
    let h = counted(&mut registry);
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    h.finish_build("hello", &wasm("hello")).await;
    h.reconcile("hello").await.unwrap();
    // Reading the module ConfigMaps fails once: Built says ReconcileError, then Built again.
    h.fake.as_ref().unwrap().fail(http::Method::GET, "/configmaps", 1);
    let error = h.reconcile("hello").await.unwrap_err();
    error_policy(Arc::new(h.function("hello").await), &error, h.ctx.clone());
    assert_eq!(condition(&h.function("hello").await, "Built").reason, "ReconcileError");
    h.reconcile("hello").await.unwrap();
    assert_eq!(condition(&h.function("hello").await, "Built").reason, "Built");
    let text = exposition(&registry);
    assert!(text.contains(&builds("hello", "succeeded", 1)), "{text}");
}

#[tokio::test]
async fn replicas_are_served_for_every_function_the_controller_knows() {
    use kube::runtime::{reflector, watcher};
    let mut registry = prometheus_client::registry::Registry::default();
    let h = counted(&mut registry);
    let text = exposition(&registry);
    assert!(
        !text.contains("wasmless_function_replicas{"),
        "no series before the controller runs: {text}"
    );

    let (store, mut writer) = reflector::store::<Function>();
    h.ctx.metrics.watch(store);
    ready_function(&h, "hello", json!({"source": HELLO, "replicas": 1})).await;
    h.scale("hello", 3).await;
    // The first reconcile rolls the Deployment out; the second reads its status back.
    h.reconcile("hello").await.unwrap();
    h.reconcile("hello").await.unwrap();
    let hello = h.function("hello").await;
    writer.apply_watcher_event(&watcher::Event::Apply(hello.clone()));
    let text = exposition(&registry);
    let series = |state: &str, value: i32| {
        format!(
            r#"wasmless_function_replicas{{function="hello",function_namespace="default",state="{state}"}} {value}"#
        )
    };
    assert!(text.contains(&series("desired", 3)), "{text}");
    assert!(
        text.contains(&series("ready", 1)),
        "the rollout to 3 has not happened: {text}"
    );
    assert!(text.contains("# TYPE wasmless_function_replicas gauge"), "{text}");

    // A deleted Function's series go with it.
    writer.apply_watcher_event(&watcher::Event::Delete(hello));
    let text = exposition(&registry);
    assert!(
        !text.contains(r#"wasmless_function_replicas{function="hello""#),
        "{text}"
    );
}

/// GET `path` over plain HTTP/1.1; the status code and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn admin_endpoints_serve_metrics_health_and_readiness() {
    use wasmless_operator::admin::{AdminState, router};
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::default().register(&mut registry);
    let state = AdminState::new(registry);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, router(state.clone())).into_future());

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(
        http_get(addr, "/readyz").await.0,
        503,
        "not ready before the controller can run"
    );
    state.set_ready();
    assert_eq!(http_get(addr, "/readyz").await.0, 200);

    let fake = FakeApiServer::new();
    let h = Harness {
        ctx: Arc::new(Context::new(fake.client(), settings(), metrics, None)),
        client: fake.client(),
        fake: Some(fake.clone()),
        ns: "default".into(),
    };
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("wasmless_operator_reconciles_total 1"), "{body}");
    assert!(
        body.contains("wasmless_operator_reconcile_duration_seconds_bucket"),
        "{body}"
    );
}
