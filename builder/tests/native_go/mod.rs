//! Handlers written for native Go, built by the builder and served by the runtime, answer
//! exactly as the same source does under native Go net/http: the same status, content
//! type, encoding and body bytes, request for request.

use crate::support::*;
use axum::Router;
use axum::routing::{get, post};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

const HANDLER: &str = include_str!("handler.go");
const WEBHOOK_KEY: &str = "the-webhook-key";

/// An upstream both servers call: `/echo` and a `/slow` that outlasts the handler's timeout.
async fn upstream() -> String {
    let router = Router::new()
        .route("/echo", post(|body: String| async move { format!("echo {body}") }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{address}")
}

/// The handler under native Go net/http, as Goless ran it.
struct Native(Child, String);

impl Native {
    fn start(dir: &Path, upstream: &str) -> Self {
        std::fs::create_dir_all(dir.join("handlers")).unwrap();
        std::fs::write(dir.join("handlers/handler.go"), HANDLER).unwrap();
        std::fs::write(
            dir.join("main.go"),
            "package main\n\nimport (\n\t\"function/handlers\"\n\t\"net/http\"\n\t\"os\"\n)\n\nfunc main() {\n\thttp.HandleFunc(\"/\", handlers.Handler)\n\thttp.ListenAndServe(\"127.0.0.1:\"+os.Getenv(\"PORT\"), nil)\n}\n",
        )
        .unwrap();
        // As a Go user starts: `go mod init`, which names this Go's version.
        for args in [&["mod", "init", "function"][..], &["build", "-o", "server", "."]] {
            let status = Command::new(std::env::var("WASMLESS_GO").unwrap_or_else(|_| "go".into()))
                .args(args)
                .current_dir(dir)
                .envs([
                    ("GOFLAGS", "-mod=mod"),
                    ("GOPROXY", "off"),
                    ("GOTOOLCHAIN", "local"),
                    ("GOWORK", "off"),
                ])
                .status()
                .unwrap();
            assert!(status.success(), "go {args:?} of the native server");
        }
        let port = wasmless_testkit::free_port();
        let child = Command::new(dir.join("server"))
            .env("PORT", port.to_string())
            .env("WEBHOOK_KEY", WEBHOOK_KEY)
            .env("UPSTREAM", upstream)
            .spawn()
            .unwrap();
        Self(child, format!("http://127.0.0.1:{port}"))
    }
}

impl Drop for Native {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request of the comparison, made against a base URL.
type MakeRequest<'a> = Box<dyn Fn(&str) -> reqwest::RequestBuilder + 'a>;

/// What a client sees of an answer, less what differs by nature (Date).
async fn answer(request: reqwest::RequestBuilder) -> (u16, Option<String>, Option<String>, Vec<u8>) {
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap().to_string())
    };
    let (content_type, encoding) = (header("content-type"), header("content-encoding"));
    let status = response.status().as_u16();
    (status, content_type, encoding, response.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn handlers_written_for_native_go_answer_as_under_native_go() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = upstream().await;
    let native = Native::start(&dir.path().join("native"), &upstream);

    let source = dir.path().join("handler.go");
    std::fs::write(&source, HANDLER).unwrap();
    let output = dir.path().join("handler.wasm");
    let built = result(&build("go", &source, &output, &dir.path().join("cache"), &[]));
    let env = [
        ("WEBHOOK_KEY".to_string(), WEBHOOK_KEY.to_string()),
        ("UPSTREAM".to_string(), upstream.clone()),
    ];
    let ours = Served::start_with(
        output.to_str().unwrap(),
        built["digest"].as_str().unwrap(),
        &env,
        &["--outbound-allow", &upstream, "--max-request-body", "2Mi"],
    )
    .await;
    let ours_url = format!("http://{}", ours.address);
    let client = wasmless_testkit::http_client();
    // The native server is up once it answers.
    for _ in 0..100 {
        if client.get(format!("{}/", native.1)).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let upload: Vec<u8> = (0..900 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let signed = b"{\"event\":\"push\"}".to_vec();
    let signature = hmac_sha256_hex(WEBHOOK_KEY.as_bytes(), &signed);
    let requests: Vec<(&str, MakeRequest)> = vec![
        (
            "json",
            Box::new(|base| client.post(format!("{base}/json")).body(r#"{"name":"Ada","count":21}"#)),
        ),
        (
            "json, malformed",
            Box::new(|base| client.post(format!("{base}/json")).body("{nope")),
        ),
        (
            "webhook, signed",
            Box::new(|base| {
                client
                    .post(format!("{base}/webhook"))
                    .header("X-Signature", &signature)
                    .body(signed.clone())
            }),
        ),
        (
            "webhook, forged",
            Box::new(|base| {
                client
                    .post(format!("{base}/webhook"))
                    .header("X-Signature", "00")
                    .body(signed.clone())
            }),
        ),
        (
            "template",
            Box::new(|base| client.get(format!("{base}/template?name=%3Cscript%3E"))),
        ),
        ("gzip", Box::new(|base| client.get(format!("{base}/gzip")))),
        ("time zone", Box::new(|base| client.get(format!("{base}/timezone")))),
        (
            "upload",
            Box::new(|base| client.post(format!("{base}/upload")).body(upload.clone())),
        ),
        ("outbound POST", Box::new(|base| client.get(format!("{base}/call")))),
        (
            "outbound timeout",
            Box::new(|base| client.get(format!("{base}/call-timeout"))),
        ),
        ("own status", Box::new(|base| client.get(format!("{base}/teapot")))),
        ("Go 1.22 route", Box::new(|base| client.get(format!("{base}/items/42")))),
        (
            "Go 1.22 route, rest of the path",
            Box::new(|base| client.get(format!("{base}/items/7/files/a/b.txt"))),
        ),
        (
            "Go 1.22 route, wrong method",
            Box::new(|base| client.delete(format!("{base}/items/42"))),
        ),
        (
            "server-sent events",
            Box::new(|base| client.get(format!("{base}/events"))),
        ),
        ("CSV export", Box::new(|base| client.get(format!("{base}/export")))),
    ];
    for (what, request) in &requests {
        let theirs = answer(request(&native.1)).await;
        let mine = answer(request(&ours_url)).await;
        assert_eq!(
            (mine.0, &mine.1, &mine.2),
            (theirs.0, &theirs.1, &theirs.2),
            "{what}: status, content type, encoding; ours {:?}, native {:?}",
            String::from_utf8_lossy(&mine.3),
            String::from_utf8_lossy(&theirs.3)
        );
        assert!(
            mine.3 == theirs.3,
            "{what}: the body; ours {:?}, native {:?}",
            String::from_utf8_lossy(&mine.3),
            String::from_utf8_lossy(&theirs.3)
        );
    }
    // And the answers are the ones meant, not two equal failures.
    let (status, _, _, body) = answer(requests[2].1(&ours_url)).await;
    assert_eq!(
        (status, String::from_utf8_lossy(&body).as_ref()),
        (200, "verified 16 bytes")
    );
    let (_, _, _, body) = answer(client.get(format!("{ours_url}/timezone"))).await;
    assert_eq!(String::from_utf8_lossy(&body), "Wed, 01 Jul 2026 08:00:00 -0400");
    let (_, _, _, body) = answer(client.get(format!("{ours_url}/call"))).await;
    assert_eq!(String::from_utf8_lossy(&body), "200 echo ping");
    let (_, _, _, body) = answer(client.get(format!("{ours_url}/call-timeout"))).await;
    assert_eq!(String::from_utf8_lossy(&body), "timed out: true");
    let (status, _, _, body) = answer(client.get(format!("{ours_url}/items/42"))).await;
    assert_eq!((status, String::from_utf8_lossy(&body).as_ref()), (200, "item 42"));
    let (_, _, _, body) = answer(client.get(format!("{ours_url}/items/7/files/a/b.txt"))).await;
    assert_eq!(String::from_utf8_lossy(&body), "item 7, file a/b.txt");
    let response = client.delete(format!("{ours_url}/items/42")).send().await.unwrap();
    assert_eq!(response.status(), 405);
    assert_eq!(response.headers()["allow"], "GET, HEAD");
    // Each event leaves when it is flushed, as from native Go: the first one 200 ms (two
    // sleeps) before the body ends, not with it.
    let mut response = client.get(format!("{ours_url}/events")).send().await.unwrap();
    let first = response.chunk().await.unwrap().expect("a first event");
    assert!(first.starts_with(b"event: progress\ndata: {\"step\":1}"), "{first:?}");
    let at_first = std::time::Instant::now();
    while response.chunk().await.unwrap().is_some() {}
    assert!(
        at_first.elapsed() >= Duration::from_millis(150),
        "the events came together"
    );
    // The export (21 MB, at the runtime's default memory limit of 64 MiB) was compared
    // whole above: it streamed, rather than running out of memory.
    let response = client.get(format!("{ours_url}/export")).send().await.unwrap();
    assert!(response.headers().get("content-length").is_none());
    assert!(response.bytes().await.unwrap().len() > 20 << 20);
}

/// HMAC-SHA256 (RFC 2104) in hex, with the runtime's own sha2.
fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    let outer = Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}
