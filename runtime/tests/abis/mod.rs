//! Each handler ABI round-trips a request: a Rust component, Go over CGI, the Goless
//! sample, a WAT command.

use crate::support::*;
use serde_json::Value;

async fn echo_round_trip(runtime: &Runtime, flavour: &str) {
    let response = client()
        .post(runtime.url("/some/path?name=J%C3%BCrgen&status=201"))
        .header("X-Custom", "custom value")
        .header("Authorization", "Bearer token")
        .header("Content-Type", "text/plain")
        .body("the request body")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201, "status chosen by the handler");
    assert_eq!(response.headers()["x-echo"], flavour);
    assert_eq!(response.headers()["content-type"], "application/json");
    let echo: Value = response.json().await.unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/some/path");
    assert_eq!(echo["query"]["name"], "Jürgen");
    assert_eq!(echo["query"]["status"], "201");
    let header = |name: &str| {
        let headers = echo["headers"].as_object().unwrap();
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("x-custom").unwrap(), "custom value");
    assert_eq!(header("authorization").unwrap(), "Bearer token");
    assert_eq!(header("content-type").unwrap(), "text/plain");
    assert_eq!(echo["body"], "the request body");
    assert_eq!(echo["env"], "hello from the Function's env");

    let (status, text) = get(runtime.url("/")).await;
    assert_eq!(status, 200);
    assert!(text.contains("\"method\":\"GET\""), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rust_component_round_trips_the_request() {
    let runtime = Runtime::start(
        rust_echo_with_digest(),
        &["--env", "GREETING=hello from the Function's env"],
    );
    echo_round_trip(&runtime, "rust").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn go_handler_round_trips_the_request() {
    let runtime = Runtime::start(
        go_with_digest("go-echo"),
        &["--env", "GREETING=hello from the Function's env"],
    );
    echo_round_trip(&runtime, "go").await;
    let echo: Value = client()
        .get(runtime.url("/"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(echo["remoteAddr"].as_str().unwrap().starts_with("127.0.0.1:"), "{echo}");
}

#[tokio::test(flavor = "multi_thread")]
async fn goless_sample_answers_this_works() {
    let runtime = Runtime::start(go_with_digest("goless-sample"), &["--function", "hello"]);
    let (status, text) = get(runtime.url("/")).await;
    assert_eq!((status, text.as_str()), (200, "This works!"));
    let (status, text) = get(runtime.url("/any/other/path?x=1")).await;
    assert_eq!((status, text.as_str()), (200, "This works!"));
}

#[tokio::test(flavor = "multi_thread")]
async fn wat_command_speaks_cgi() {
    let dir = tempfile::tempdir().unwrap();
    let module = cgi_wat("Status: 202 Accepted\nContent-Type: text/plain\nX-Wat: yes\n\nhello from wat\n");
    let (path, digest) = write_module(dir.path(), "hello.wasm", &module);
    let runtime = Runtime::start(&path, &["--module-digest", &digest.to_string()]);
    let response = client().get(runtime.url("/")).send().await.unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(response.headers()["x-wat"], "yes");
    assert_eq!(response.text().await.unwrap(), "hello from wat\n");
}
