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
    /// What `/sink` said of each body it read.
    sunk: Arc<Mutex<Vec<String>>>,
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
        let sunk = Arc::new(Mutex::new(Vec::new()));
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
            .route(
                "/sink",
                routing::put({
                    let sunk = sunk.clone();
                    move |request: axum::extract::Request| async move {
                        let said = sink(request).await;
                        sunk.lock().unwrap().push(said.clone());
                        said
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(seen.clone(), record));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { address, seen, sunk }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// The handler's URL for calling `path` on this upstream through `route`.
    fn via(&self, runtime: &Runtime, route: &str, path: &str) -> String {
        runtime.url(&format!("{route}?url={}", percent(&self.url(path))))
    }
}

/// Reads a request body as it comes, and says how long it was, its SHA-256 and how it was
/// framed.
async fn sink(request: axum::extract::Request) -> String {
    use http_body_util::BodyExt;
    use sha2::Digest;
    let framing = match request.headers().get("content-length") {
        Some(length) => format!("content-length={}", length.to_str().unwrap()),
        None => format!("transfer-encoding={:?}", request.headers().get("transfer-encoding")),
    };
    let mut body = request.into_body();
    let (mut bytes, mut sum) = (0u64, sha2::Sha256::new());
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    bytes += data.len() as u64;
                    sum.update(&data);
                }
            }
            Err(error) => return format!("cut off after {bytes} bytes: {error}"),
        }
    }
    format!("bytes={bytes} sha256={} {framing}", hex(&sum.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    // Plain http on loopback, so opted in.
    let header = format!("{allow} Authorization WASMLESS_TEST_API_TOKEN allow-insecure");
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

/// An address of this host that is not loopback (what a pod's IP is to its pod), from the
/// route to a documentation address: no packet is sent. None on a host without a route.
fn an_address_of_this_host() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// In a pool, a Function allowed everywhere cannot read the pool's admin port (`/pool`,
/// `/metrics`: every neighbour's name and troubles), whether it names loopback literally
/// or calls the pool's own address, which the pool is not told.
#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_handler_cannot_call_its_pools_admin_port_on_any_address_of_the_pool() {
    let table = tempfile::tempdir().unwrap();
    let pool = Runtime::start_pool(table.path(), &["--bind", "0.0.0.0"]);
    let admin = pool.admin_url("").rsplit(':').next().unwrap().to_string();
    let module = handler();
    let digest = wasmless_artifact::Digest::of(&std::fs::read(&module).unwrap());
    let port = free_port();
    let literal = format!("http://127.0.0.1:{admin}");
    let args = [
        "--function",
        "prober",
        "--module",
        &module.display().to_string(),
        "--module-digest",
        &digest.to_string(),
        "--outbound-allow",
        "http://*:*",
        "--outbound-allow",
        &literal,
    ];
    let entry = serde_json::json!({ "port": port, "args": args });
    std::fs::write(table.path().join("prober.json"), entry.to_string()).unwrap();
    crate::pool::eventually("the pool to listen for prober", || async {
        client().get(crate::pool::at(port, "/env")).send().await.is_ok()
    })
    .await;

    let mut targets = vec![format!("{literal}/pool"), format!("http://localhost:{admin}/metrics")];
    match an_address_of_this_host() {
        Some(ip) => targets.push(format!("http://{ip}:{admin}/pool")),
        None => eprintln!("no address of this host but loopback: its own address is not tried"),
    }
    for url in targets {
        let (_, body) = get(crate::pool::at(port, &format!("/get?url={}", percent(&url)))).await;
        assert!(
            body.starts_with("error: ") && body.contains("admin port"),
            "{url}: {body}"
        );
    }
}

/// A credential over plain http is readable by anyone on the path: the runtime will not
/// send one there unless the header's entry says `allow-insecure` (what
/// `an_injected_credential_reaches_the_upstream_and_never_the_handler` does).
#[test]
fn a_credential_header_for_plain_http_needs_allow_insecure() {
    let allow = "http://127.0.0.1:8081";
    let header = format!("{allow} Authorization WASMLESS_TEST_API_TOKEN");
    let refused = start_expecting_failure(handler(), &["--outbound-allow", allow, "--outbound-header", &header]);
    assert!(
        refused.contains("plain http") && refused.contains("allowInsecure"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rust_component_calls_through_the_same_policy_with_the_sdk() {
    let upstream = Upstream::start().await;
    let allow = format!("http://{}", upstream.address);
    let header = format!("{allow} X-Api-Key WASMLESS_TEST_COMPONENT_KEY allow-insecure");
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

/// An upstream on loopback over TLS, with a certificate for the address 127.0.0.1 signed by
/// a CA made here (a cluster's internal CA, as far as the runtime can tell), offering
/// HTTP/2 and HTTP/1.1 by ALPN; it records the protocol of each request.
struct TlsUpstream {
    address: SocketAddr,
    ca_pem: String,
    versions: Arc<Mutex<Vec<axum::http::Version>>>,
}

impl TlsUpstream {
    async fn start() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "wasmless test internal CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![leaf.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
                )
                .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let versions = Arc::new(Mutex::new(Vec::new()));
        let seen = versions.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                tokio::spawn(async move {
                    // A client that does not trust the certificate hangs up here.
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                        seen.lock().unwrap().push(request.version());
                        let answer = format!("hello over TLS, {:?}", request.version());
                        async move {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                                bytes::Bytes::from(answer),
                            )))
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(tls);
                    if h2 {
                        let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                            .serve_connection(io, service)
                            .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    }
                });
            }
        });
        Self {
            address,
            ca_pem,
            versions,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn https_reaches_an_upstream_of_an_internal_ca_given_with_outbound_ca_and_says_what_to_set_without() {
    let upstream = TlsUpstream::start().await;
    let allow = format!("https://{}", upstream.address);
    let url = format!("/get?url={}", percent(&format!("https://{}/hello", upstream.address)));
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("internal-ca.pem");
    std::fs::write(&ca_file, &upstream.ca_pem).unwrap();

    // Mozilla's roots only: the call fails with the TLS errno, and the message says the
    // certificate is not trusted and which setting adds a CA.
    let runtime = Runtime::start(handler(), &["--outbound-allow", &allow]);
    let (status, body) = get(runtime.url(&url)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("error: ") && body.ends_with("errno=5"), "{body}");
    assert!(
        body.contains("is not trusted") && body.contains("--outbound-ca"),
        "the error says why and what to set: {body}"
    );
    assert!(upstream.versions.lock().unwrap().is_empty(), "no request went out");
    drop(runtime);

    // With the CA: the body comes back, over HTTP/2 as the upstream offered by ALPN.
    let ca = ca_file.to_str().unwrap();
    let runtime = Runtime::start(handler(), &["--outbound-allow", &allow, "--outbound-ca", ca]);
    let (_, body) = get(runtime.url(&url)).await;
    assert_eq!(body, "200 hello over TLS, HTTP/2.0");
    assert_eq!(
        upstream.versions.lock().unwrap().as_slice(),
        [axum::http::Version::HTTP_2]
    );

    // The same through the environment, and a file that is not PEM certificates stops the
    // runtime at start, saying so.
    let runtime = Runtime::start_with_env(
        handler(),
        &["--outbound-allow", &allow],
        &[("WASMLESS_OUTBOUND_CA", ca)],
    );
    let (_, body) = get(runtime.url(&url)).await;
    assert_eq!(body, "200 hello over TLS, HTTP/2.0");
    let not_pem = dir.path().join("not-pem.txt");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let refused = start_expecting_failure(handler(), &["--outbound-ca", not_pem.to_str().unwrap()]);
    assert!(
        refused.contains("--outbound-ca") && refused.contains("no PEM certificate"),
        "{refused}"
    );
}

/// An upstream whose `/hold` answers only once released, counting the requests it has at
/// once.
#[derive(Clone)]
struct Holding {
    address: SocketAddr,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
    release: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Holding {
    async fn start() -> Self {
        use std::sync::atomic::Ordering;
        let (release, _) = tokio::sync::watch::channel(false);
        let holding = Holding {
            address: "127.0.0.1:0".parse().unwrap(),
            in_flight: Arc::default(),
            most: Arc::default(),
            release: Arc::new(release),
        };
        let state = holding.clone();
        let router = Router::new()
            .route(
                "/hold",
                routing::get(move || async move {
                    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    state.most.fetch_max(now, Ordering::SeqCst);
                    let mut released = state.release.subscribe();
                    let _ = released.wait_for(|released| *released).await;
                    state.in_flight.fetch_sub(1, Ordering::SeqCst);
                    "released"
                }),
            )
            .route("/hello", routing::get(|| async { "hello" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self { address, ..holding }
    }

    fn via(&self, runtime: &Runtime, route: &str, path: &str) -> String {
        runtime.url(&format!(
            "{route}?url={}",
            percent(&format!("http://{}{path}", self.address))
        ))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_over_the_concurrency_cap_wait_for_a_slot_and_fail_with_the_limit_only_past_their_deadline() {
    use std::sync::atomic::Ordering;
    let upstream = Holding::start().await;
    let allow = format!("http://{}", upstream.address);
    let runtime = Runtime::start(
        handler(),
        &[
            "--outbound-allow",
            &allow,
            "--outbound-max-concurrency",
            "2",
            "--timeout",
            "20s",
        ],
    );
    // Two calls take both slots, and the upstream holds them.
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(get(upstream.via(&runtime, "/get", "/hold"))))
        .collect();
    let waited = Instant::now();
    while upstream.in_flight.load(Ordering::SeqCst) < 2 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the two calls never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A third, with a deadline of its own, waits for a slot; its deadline passes first, and
    // it fails with the limit (errno 7) named, as a timeout.
    let started = Instant::now();
    let (status, body) = get(format!(
        "{}&ms=400",
        upstream.via(&runtime, "/context-timeout", "/hello")
    ))
    .await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("maxConcurrency") && body.contains("--outbound-max-concurrency") && body.ends_with("errno=7"),
        "{body}"
    );
    assert!(body.contains("timeout=true deadline=true"), "{body}");
    assert!(
        elapsed >= Duration::from_millis(350) && elapsed < Duration::from_secs(3),
        "it waited for its deadline: {elapsed:?}"
    );

    // A fourth, with no deadline of its own but the call's (5s), waits for a slot, and
    // goes out once one is free.
    let waiting = tokio::spawn(get(upstream.via(&runtime, "/get", "/hello")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the fourth call did not wait");
    upstream.release.send_replace(true);
    for call in held {
        assert_eq!(call.await.unwrap().1, "200 released");
    }
    assert_eq!(waiting.await.unwrap().1, "200 hello");
    assert_eq!(
        upstream.most.load(Ordering::SeqCst),
        2,
        "never more than the cap at once"
    );

    let metrics = get(runtime.admin_url("/metrics")).await.1;
    let count = |status: &str| {
        sample(
            &metrics,
            "wasmless_outbound_requests_total",
            &[("host", "127.0.0.1"), ("status", status)],
        )
    };
    assert_eq!(count("error"), Some(1.0), "the call that hit the limit: {metrics}");
    assert_eq!(count("200"), Some(3.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn net_dial_and_listen_fail_with_an_error_that_says_to_use_net_http() {
    let runtime = Runtime::start(handler(), &[]);
    let (status, body) = get(runtime.url("/sockets?addr=example.com:80")).await;
    assert_eq!(status, 200, "{body}");
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines.len(), 6, "{body}");
    for line in &lines {
        assert!(
            line.contains("raw sockets are not available to handlers") && line.contains("spec.outbound.allow"),
            "{line}"
        );
    }
    assert!(
        lines[0].starts_with("Dial: dial tcp example.com:80: wasmless: "),
        "the address as written, not a DNS error: {}",
        lines[0]
    );
    assert!(
        lines[3].starts_with("Listen: listen tcp 127.0.0.1:0: wasmless: "),
        "{}",
        lines[3]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn request_bodies_stream_to_the_upstream_whatever_their_size() {
    let upstream = Upstream::start().await;
    let allow = format!("http://{}", upstream.address);
    let runtime = Runtime::start(
        handler(),
        &[
            "--outbound-allow",
            &allow,
            "--timeout",
            "60s",
            "--outbound-timeout",
            "60s",
        ],
    );
    // 64 MiB made by an io.Reader as it is sent, over the handler's whole memory limit
    // (64 MiB by default): it can only have gone a piece at a time.
    for (mib, length, framing) in [
        (64, "unknown", "transfer-encoding=Some(\"chunked\")".to_string()),
        (24, "known", format!("content-length={}", 24 << 20)),
    ] {
        let url = format!(
            "{}&mib={mib}&length={length}",
            upstream.via(&runtime, "/upload", "/sink")
        );
        let (status, body) = get(url).await;
        assert_eq!(status, 200, "{body}");
        let words: Vec<&str> = body.split(' ').collect();
        assert_eq!(words.len(), 6, "{body}");
        assert_eq!(words[0], "200", "{body}");
        assert_eq!(words[1], format!("bytes={}", mib << 20), "every byte arrived: {body}");
        let received = words[2].strip_prefix("sha256=").unwrap();
        let sent = words[4].strip_prefix("sent=").unwrap();
        assert_eq!(received, sent, "the bytes the handler made: {body}");
        assert_eq!(words[3], framing, "{body}");
        let sys: u64 = words[5].strip_prefix("sys=").unwrap().parse().unwrap();
        assert!(sys < 32 << 20, "the handler's memory grew with the body: {sys} bytes");
    }

    // A body whose reader fails half-way is abandoned: the handler gets the reader's error,
    // and the upstream sees the body cut off, never a shorter body as if it were whole.
    upstream.sunk.lock().unwrap().clear();
    let url = format!(
        "{}&mib=4&length=unknown&fail-at={}",
        upstream.via(&runtime, "/upload", "/sink"),
        1 << 20
    );
    let (_, body) = get(url).await;
    assert!(
        body.starts_with("error: ") && body.contains("the body's reader failed"),
        "{body}"
    );
    let waited = Instant::now();
    while upstream.sunk.lock().unwrap().is_empty() && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sunk = upstream.sunk.lock().unwrap().clone();
    assert!(
        sunk.len() == 1 && sunk[0].starts_with("cut off"),
        "the upstream took a cut body as whole: {sunk:?}"
    );
}
