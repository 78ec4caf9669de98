//! Outbound calls: a Go handler calling an upstream on loopback with plain net/http,
//! through the Function's allow-list, with the host's timeouts, caps, injected
//! credentials and refusals.

use crate::support::*;
use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{self, post};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Seen = Arc<Mutex<Vec<HeaderMap>>>;

/// An HTTP server on loopback that records the headers of every request it gets.
struct Upstream {
    address: SocketAddr,
    seen: Seen,
}

async fn record(
    State(seen): State<Seen>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    seen.lock().unwrap().push(request.headers().clone());
    next.run(request).await
}

impl Upstream {
    async fn start() -> Self {
        let seen = Seen::default();
        let router = Router::new()
            .route("/hello", routing::get(|| async { "hello from upstream" }))
            .route(
                "/redirect",
                routing::get(|| async { (axum::http::StatusCode::FOUND, [("location", "/hello")], "") }),
            )
            .route("/echo", post(|body: String| async move { format!("echo {body}") }))
            .route(
                "/slow",
                routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    "late"
                }),
            )
            .route("/big", routing::get(|| async { "x".repeat(64 << 10) }))
            .layer(axum::middleware::from_fn_with_state(seen.clone(), record));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { address, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// The handler's URL for calling `path` on this upstream through `route`.
    fn via(&self, runtime: &Runtime, route: &str, path: &str) -> String {
        runtime.url(&format!("{route}?url={}", percent(&self.url(path))))
    }
}

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn handler() -> std::path::PathBuf {
    with_digest_file(go_reactor("go-outbound", true))
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_net_http_reaches_an_allowed_upstream_and_nothing_else() {
    let upstream = Upstream::start().await;
    let allow = format!("http://{}", upstream.address);
    let runtime = Runtime::start(handler(), &["--outbound-allow", &allow, "--timeout", "3s"]);

    let (status, body) = get(upstream.via(&runtime, "/get", "/hello")).await;
    assert_eq!((status, body.as_str()), (200, "200 hello from upstream"));
    // Redirects are followed by Go's client, each hop checked by the host.
    let (_, body) = get(upstream.via(&runtime, "/get", "/redirect")).await;
    assert_eq!(body, "200 hello from upstream");
    let (_, body) = get(upstream.via(&runtime, "/own-transport", "/hello")).await;
    assert_eq!(body, "200 hello from upstream");
    let response = client()
        .post(upstream.via(&runtime, "/post", "/echo"))
        .body("ping")
        .send()
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), "200 echo ping");
    let (_, body) = get(upstream.via(&runtime, "/get", "/big")).await;
    assert_eq!(body.len(), 4 + (64 << 10), "the whole streamed body");

    // Another port of the same address is not on the list.
    let other = format!("http://127.0.0.1:{}/hello", free_port());
    let (_, body) = get(runtime.url(&format!("/get?url={}", percent(&other)))).await;
    assert!(body.starts_with("error: "), "{body}");
    assert!(
        body.contains("spec.outbound.allow"),
        "the error names the field to change: {body}"
    );

    let metrics = get(runtime.admin_url("/metrics")).await.1;
    let count = |status: &str| {
        sample(
            &metrics,
            "wasmless_outbound_requests_total",
            &[("host", "127.0.0.1"), ("status", status)],
        )
    };
    assert_eq!(count("200"), Some(5.0), "{metrics}");
    assert_eq!(count("302"), Some(1.0), "{metrics}");
    assert_eq!(count("denied"), Some(1.0), "{metrics}");
    let timed = sample(
        &metrics,
        "wasmless_outbound_request_duration_seconds_count",
        &[("host", "127.0.0.1")],
    );
    assert_eq!(timed, Some(6.0), "{metrics}");
    let logged = runtime.wait_for_log(&["\"outbound_calls\":2"]);
    assert!(logged.contains("outbound_ms"), "{logged}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_an_allow_list_every_call_is_denied_and_init_calls_fail_at_build_time() {
    let upstream = Upstream::start().await;
    let runtime = Runtime::start(handler(), &[]);
    let (status, body) = get(upstream.via(&runtime, "/get", "/hello")).await;
    assert_eq!(status, 200, "the handler answers with the error: {body}");
    assert!(
        body.contains("denied") && body.contains("spec.outbound.allow"),
        "{body}"
    );
    assert!(upstream.seen.lock().unwrap().is_empty(), "nothing reached the upstream");
    let (_, body) = get(runtime.url("/init")).await;
    assert!(body.contains("while the handler initialises"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_behave_as_in_native_go_and_a_hanging_upstream_never_holds_the_request() {
    let upstream = Upstream::start().await;
    let allow = format!("http://{}", upstream.address);
    let runtime = Runtime::start(handler(), &["--outbound-allow", &allow, "--timeout", "1s"]);
    for route in ["/client-timeout", "/context-timeout"] {
        let started = Instant::now();
        let (_, body) = get(format!("{}&ms=200", upstream.via(&runtime, route, "/slow"))).await;
        assert!(
            body.starts_with("error: ") && body.contains("timeout=true"),
            "{route}: {body}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{route}: {:?}",
            started.elapsed()
        );
        if route == "/context-timeout" {
            assert!(
                body.contains("deadline=true"),
                "errors.Is(err, context.DeadlineExceeded): {body}"
            );
        }
    }
    // No timeout of the handler's own: the request's (1s) ends it with a 504.
    let started = Instant::now();
    let (status, _) = get(upstream.via(&runtime, "/get", "/slow")).await;
    assert_eq!(status, 504);
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    // And the runtime serves on.
    let (_, body) = get(upstream.via(&runtime, "/get", "/hello")).await;
    assert_eq!(body, "200 hello from upstream");
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_over_the_cap_fail_the_call_not_the_request() {
    let upstream = Upstream::start().await;
    let allow = format!("http://{}", upstream.address);
    let runtime = Runtime::start(
        handler(),
        &["--outbound-allow", &allow, "--outbound-max-response-body", "1Ki"],
    );
    let (status, body) = get(upstream.via(&runtime, "/get", "/big")).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("maxResponseBody"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_injected_credential_reaches_the_upstream_and_never_the_handler() {
    let upstream = Upstream::start().await;
    let allow = format!("http://{}", upstream.address);
    let header = format!("{allow} Authorization WASMLESS_TEST_API_TOKEN");
    let secret = "Bearer s3cret-never-in-the-guest";
    let runtime = Runtime::start_with_env(
        handler(),
        &[
            "--outbound-allow",
            &allow,
            "--outbound-header",
            &header,
            "--env",
            "VISIBLE=yes",
        ],
        &[
            ("WASMLESS_TEST_API_TOKEN", secret),
            ("WASMLESS_HANDLER_ENV_FROM_SECRET", "handler-value"),
        ],
    );
    let (_, body) = get(upstream.via(&runtime, "/get", "/hello")).await;
    assert_eq!(body, "200 hello from upstream");
    let seen = upstream.seen.lock().unwrap().clone();
    assert_eq!(seen.last().unwrap()["authorization"], secret);

    let response = client()
        .get(runtime.url("/env"))
        .header("x-probe", "1")
        .send()
        .await
        .unwrap();
    let visible = response.text().await.unwrap();
    assert!(
        visible.contains("VISIBLE=yes") && visible.contains("FROM_SECRET=handler-value"),
        "{visible}"
    );
    assert!(visible.contains("X-Probe: 1"), "{visible}");
    assert!(!visible.contains("s3cret"), "the key reached the handler: {visible}");
    assert!(!runtime.logs().join("\n").contains("s3cret"), "the key reached the log");
}

#[tokio::test(flavor = "multi_thread")]
async fn names_cannot_lead_to_the_admin_port_or_the_metadata_service() {
    let runtime = Runtime::start(handler(), &["--outbound-allow", "http://*:*"]);
    let admin_port = runtime.admin_url("").rsplit(':').next().unwrap().to_string();
    for url in [
        format!("http://localhost:{admin_port}/metrics"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ] {
        let (_, body) = get(runtime.url(&format!("/get?url={}", percent(&url)))).await;
        assert!(body.starts_with("error: ") && body.contains("refused"), "{url}: {body}");
    }
    let metrics = get(runtime.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(
            &metrics,
            "wasmless_outbound_requests_total",
            &[("host", "*"), ("status", "denied")]
        ),
        Some(2.0),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rust_component_calls_through_the_same_policy_with_the_sdk() {
    let upstream = Upstream::start().await;
    let allow = format!("http://{}", upstream.address);
    let header = format!("{allow} X-Api-Key WASMLESS_TEST_COMPONENT_KEY");
    let runtime = Runtime::start_with_env(
        rust_echo_with_digest(),
        &["--outbound-allow", &allow, "--outbound-header", &header],
        &[("WASMLESS_TEST_COMPONENT_KEY", "component-key")],
    );
    let (_, body) = get(upstream.via(&runtime, "/fetch", "/hello")).await;
    assert_eq!(body, "200 hello from upstream");
    assert_eq!(
        upstream.seen.lock().unwrap().last().unwrap()["x-api-key"],
        "component-key"
    );
    let (_, body) = get(upstream.via(&runtime, "/fetch", "/big")).await;
    assert_eq!(body.len(), 4 + (64 << 10), "the whole body");

    let other = format!("http://127.0.0.1:{}/hello", free_port());
    let (_, body) = get(runtime.url(&format!("/fetch?url={}", percent(&other)))).await;
    assert!(
        body.contains("spec.outbound.allow") && body.ends_with("denied=true"),
        "{body}"
    );
    let (_, body) = get(runtime.url(&format!(
        "/fetch?url={}",
        percent("http://169.254.169.254/latest/meta-data/")
    )))
    .await;
    assert!(body.starts_with("error: ") && body.ends_with("denied=true"), "{body}");

    let metrics = get(runtime.admin_url("/metrics")).await.1;
    let count = |host: &str, status: &str| {
        sample(
            &metrics,
            "wasmless_outbound_requests_total",
            &[("host", host), ("status", status)],
        )
    };
    assert_eq!(count("127.0.0.1", "200"), Some(2.0), "{metrics}");
    assert_eq!(count("127.0.0.1", "denied"), Some(1.0), "{metrics}");
    assert_eq!(count("169.254.169.254", "denied"), Some(1.0), "{metrics}");
}
