//! The runtime binary, over real HTTP on loopback, serving handlers built with the
//! real toolchains: a Rust component built with the SDK, Goless handlers built with Go,
//! and small WAT commands.

mod adversarial;
mod reactor;
mod support;

use serde_json::Value;
use std::time::Duration;
use support::*;
use wasmless_artifact::{Digest, Part};

async fn get(url: String) -> (u16, String) {
    let response = client().get(url).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

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

/// Path of the Rust handler, with its digest file beside it (the runtime needs one).
fn rust_echo_with_digest() -> std::path::PathBuf {
    with_digest_file(rust_echo())
}

fn go_with_digest(name: &str) -> std::path::PathBuf {
    with_digest_file(go_handler(name))
}

fn with_digest_file(module: std::path::PathBuf) -> std::path::PathBuf {
    let digest = Digest::of(&std::fs::read(&module).unwrap());
    let mut sidecar = module.clone().into_os_string();
    sidecar.push(".sha256");
    std::fs::write(sidecar, digest.to_string()).unwrap();
    module
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_rust_handler_fails_only_its_own_request() {
    let runtime = Runtime::start(
        rust_echo_with_digest(),
        &["--timeout", "1s", "--memory-limit", "32Mi", "--function", "bad-rust"],
    );
    let rss_before = runtime.rss_bytes();

    let (status, text) = get(runtime.url("/panic")).await;
    assert_eq!(status, 500, "{text}");
    assert_eq!(get(runtime.url("/")).await.0, 200, "the server serves the next request");
    runtime.wait_for_log(&["handler panicked"]);
    runtime.wait_for_log(&["deliberate panic for the test", "\"stream\":\"stderr\""]);

    let (status, text) = get(runtime.url("/loop")).await;
    assert_eq!(status, 504, "{text}");
    assert_eq!(get(runtime.url("/")).await.0, 200);
    // The endless loop was stopped, not left spinning on a core.
    let cpu_after_loop = runtime.cpu_time();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_cpu = runtime.cpu_time() - cpu_after_loop;
    assert!(
        idle_cpu < Duration::from_millis(300),
        "the process kept burning CPU after the timeout: {idle_cpu:?}"
    );

    for _ in 0..3 {
        let (status, text) = get(runtime.url("/grow")).await;
        assert_eq!(status, 500, "{text}");
        assert!(text.contains("out of memory"), "{text}");
    }
    assert_eq!(get(runtime.url("/")).await.0, 200);
    let grown = runtime.rss_bytes().saturating_sub(rss_before);
    assert!(
        grown < 96 << 20,
        "RSS grew by {} MiB after three 32 MiB-limited requests",
        grown >> 20
    );

    let metrics = get(runtime.admin_url("/metrics")).await.1;
    for (kind, count) in [("trap", 1.0), ("timeout", 1.0), ("memory", 3.0)] {
        assert_eq!(
            sample(
                &metrics,
                "wasmless_traps_total",
                &[("kind", kind), ("function", "bad-rust")]
            ),
            Some(count),
            "{kind}\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_go_handler_fails_only_its_own_request() {
    let runtime = Runtime::start(
        go_with_digest("go-echo"),
        &["--timeout", "5s", "--memory-limit", "64Mi"],
    );
    let (status, text) = get(runtime.url("/panic")).await;
    assert_eq!(status, 500, "{text}");
    assert_eq!(get(runtime.url("/")).await.0, 200);
    runtime.wait_for_log(&["deliberate panic for the test"]);
    let (status, text) = get(runtime.url("/grow")).await;
    assert_eq!(status, 500, "{text}");
    assert_eq!(get(runtime.url("/")).await.0, 200);
}

/// Each serving thread runs every request of its connections (runtime/src/edge.rs), so a
/// handler that spins must give way: with spinners on every thread, a quick request is
/// still answered while they all run, not after their timeout.
#[tokio::test(flavor = "multi_thread")]
async fn spinning_handlers_on_every_thread_do_not_hold_up_a_quick_request() {
    let runtime = Runtime::start(rust_echo_with_digest(), &["--timeout", "20s"]);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spinners: Vec<_> = (0..2 * threads)
        .map(|_| tokio::spawn(get(runtime.url("/loop"))))
        .collect();
    let in_flight = || async {
        let metrics = client()
            .get(runtime.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        sample(&metrics, "wasmless_requests_in_flight", &[]).unwrap_or(0.0)
    };
    let mut waited = 0;
    while in_flight().await < spinners.len() as f64 {
        waited += 1;
        assert!(waited < 400, "the spinning requests never all started");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let (status, text) = get(runtime.url("/hello")).await;
    assert_eq!((status, text.as_str()), (200, "Hello, world!\n"));
    assert!(
        spinners.iter().all(|spinner| !spinner.is_finished()),
        "the quick request was answered only once a spinner had timed out"
    );
    for spinner in spinners {
        spinner.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_commands_get_their_status() {
    let cases: [(&str, Vec<u8>, u16); 5] = [
        ("trap", command_wat("unreachable"), 500),
        ("endless loop", command_wat("(loop $forever (br $forever))"), 504),
        (
            "memory hog",
            command_wat("(loop $more (br_if $more (i32.ne (memory.grow (i32.const 16)) (i32.const -1)))) unreachable"),
            500,
        ),
        ("non-zero exit", command_wat("(call $proc_exit (i32.const 3))"), 500),
        ("malformed CGI output", cgi_wat("this is not a header block"), 502),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, module, expected) in cases {
        let (path, digest) = write_module(dir.path(), &format!("{}.wasm", name.replace(' ', "-")), &module);
        let runtime = Runtime::start(
            &path,
            &[
                "--module-digest",
                &digest.to_string(),
                "--timeout",
                "500ms",
                "--memory-limit",
                "8Mi",
            ],
        );
        for _ in 0..2 {
            let (status, text) = get(runtime.url("/")).await;
            assert_eq!(status, expected, "{name}: {text}");
        }
        assert_eq!(
            get(runtime.admin_url("/healthz")).await.0,
            200,
            "{name}: the server is still up"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn request_limits_answer_413_and_503() {
    let runtime = Runtime::start(
        rust_echo_with_digest(),
        &["--max-request-body", "1Ki", "--max-concurrency", "1"],
    );
    let response = client()
        .post(runtime.url("/"))
        .body(vec![b'x'; 2048])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    assert!(response.text().await.unwrap().contains("1024-byte limit"));
    let response = client()
        .post(runtime.url("/"))
        .body(vec![b'x'; 1000])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "a body under the limit passes");

    let slow = tokio::spawn(get(runtime.url("/sleep?ms=1500")));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, text) = get(runtime.url("/")).await;
    assert_eq!(status, 503, "{text}");
    assert_eq!(slow.await.unwrap().0, 200, "the request in flight finishes");
    assert_eq!(get(runtime.url("/")).await.0, 200, "capacity is back");
}

#[tokio::test(flavor = "multi_thread")]
async fn handler_stderr_is_logged_and_requests_are_json_lines() {
    let runtime = Runtime::start(rust_echo_with_digest(), &["--function", "logger"]);
    assert_eq!(get(runtime.url("/stderr")).await.0, 200);
    runtime.wait_for_log(&["a line the handler wrote to stderr"]);
    let line = runtime.wait_for_log(&["\"message\":\"request\"", "/stderr"]);
    let entry: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(entry["status"], 200);
    assert!(entry["latency_ms"].as_f64().is_some(), "{line}");
    let span = &entry["span"];
    assert_eq!(span["function"], "logger");
    assert_eq!(span["method"], "GET");
    assert_eq!(span["path"], "/stderr");
    assert!(span["digest"].as_str().unwrap().starts_with("sha256:"), "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_digest_and_non_wasm_files_refuse_to_start() {
    let module = rust_echo();
    let actual = Digest::of(&std::fs::read(&module).unwrap());
    let expected = Digest::of(b"something else");
    let output = start_expecting_failure(&module, &["--module-digest", &expected.to_string()]);
    assert!(
        output.contains(&expected.to_string()) && output.contains(&actual.to_string()),
        "{output}"
    );
    assert!(output.contains("mismatch"), "{output}");

    let dir = tempfile::tempdir().unwrap();
    let (script, digest) = write_module(dir.path(), "script.wasm", b"#!/bin/sh\necho not wasm\n");
    let output = start_expecting_failure(&script, &["--module-digest", &digest.to_string()]);
    assert!(output.contains("not a WebAssembly module"), "{output}");
    assert!(!output.contains("panicked"), "{output}");

    let (text, digest) = write_module(dir.path(), "text.wasm", b"(module)");
    let output = start_expecting_failure(&text, &["--module-digest", &digest.to_string()]);
    assert!(output.contains("WebAssembly text"), "{output}");

    let (bare, _) = write_module(dir.path(), "bare.wasm", &cgi_wat("\n\n"));
    let output = start_expecting_failure(&bare, &[]);
    assert!(output.contains("--module-digest"), "{output}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_requests() {
    let runtime = Runtime::start(rust_echo_with_digest(), &["--function", "counted"]);
    for _ in 0..5 {
        assert_eq!(get(runtime.url("/")).await.0, 200);
    }
    for _ in 0..2 {
        assert_eq!(get(runtime.url("/?status=404")).await.0, 404);
    }
    // Invented methods share one series: a client cannot grow the metrics without bound.
    for method in ["BREW", "WHEN", "FROBNICATE"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = client().request(method, runtime.url("/")).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let response = client().get(runtime.admin_url("/metrics")).send().await.unwrap();
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .contains("openmetrics")
    );
    let metrics = response.text().await.unwrap();
    let labels = |status| [("function", "counted"), ("method", "GET"), ("status", status)];
    assert_eq!(
        sample(&metrics, "wasmless_requests_total", &labels("200")),
        Some(5.0),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "wasmless_requests_total", &labels("404")), Some(2.0));
    let other = [("function", "counted"), ("method", "other"), ("status", "200")];
    assert_eq!(
        sample(&metrics, "wasmless_requests_total", &other),
        Some(3.0),
        "{metrics}"
    );
    assert!(!metrics.contains("BREW"), "{metrics}");
    assert_eq!(
        sample(&metrics, "wasmless_request_duration_seconds_count", &labels("200")),
        Some(5.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "wasmless_instantiate_duration_seconds_count",
            &[("function", "counted")]
        ),
        Some(10.0)
    );
    assert_eq!(
        sample(&metrics, "wasmless_requests_in_flight", &[("function", "counted")]),
        Some(0.0)
    );
    assert!(sample(&metrics, "wasmless_module_load_seconds", &[("function", "counted")]).unwrap() > 0.0);
    let digest = Digest::of(&std::fs::read(rust_echo()).unwrap()).to_string();
    assert_eq!(
        sample(
            &metrics,
            "wasmless_module_info",
            &[("digest", &digest), ("abi", "wasi-http")]
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(get(runtime.admin_url("/readyz")).await.0, 200);
    assert_eq!(get(runtime.admin_url("/healthz")).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_scrapes_the_admin_port() {
    let runtime = Runtime::start(rust_echo_with_digest(), &["--function", "scraped"]);
    assert_eq!(get(runtime.url("/")).await.0, 200);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: wasmless\n    static_configs:\n      - targets: ['{}']\n",
            runtime.admin
        ),
    )
    .unwrap();
    let port = free_port();
    let mut prometheus = std::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prometheus must be installed (the README's test command installs it)");
    let query =
        format!("http://127.0.0.1:{port}/api/v1/query?query=wasmless_requests_total%7Bfunction%3D%22scraped%22%7D");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let result = loop {
        if let Ok(response) = client().get(&query).send().await
            && let Ok(body) = response.json::<Value>().await
            && body["data"]["result"].as_array().is_some_and(|r| !r.is_empty())
        {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "prometheus never returned wasmless_requests_total"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    let series = &result["data"]["result"][0];
    assert_eq!(series["metric"]["__name__"], "wasmless_requests_total");
    assert_eq!(series["metric"]["function"], "scraped");
    assert_eq!(series["metric"]["status"], "200");
    assert_eq!(series["value"][1], "1");
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_module_loads_and_compiled_code_is_cached() {
    let module = std::fs::read(go_handler("goless-sample")).unwrap();
    let digest = Digest::of(&module);
    let chunks = wasmless_artifact::compress_and_split(&module);
    let dir = tempfile::tempdir().unwrap();
    let chunk_dir = dir.path().join("module");
    std::fs::create_dir(&chunk_dir).unwrap();
    for (index, chunk) in chunks.iter().enumerate() {
        std::fs::write(chunk_dir.join(wasmless_artifact::chunk_file_name(index)), chunk).unwrap();
    }
    let cache = dir.path().join("cache");
    let args = [
        "--module-digest",
        &digest.to_string(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ];

    let first = Runtime::start(&chunk_dir, &args);
    first.wait_for_log(&["module loaded", "\"compiled_code\":\"compiled\""]);
    assert_eq!(get(first.url("/")).await.1, "This works!");
    drop(first);

    let second = Runtime::start(&chunk_dir, &args);
    second.wait_for_log(&["module loaded", "\"compiled_code\":\"cache hit\""]);
    assert_eq!(get(second.url("/")).await.1, "This works!");

    // A missing chunk is named, not a panic, when the module has to be read.
    std::fs::remove_file(chunk_dir.join(wasmless_artifact::chunk_file_name(0))).unwrap();
    let fresh_cache = dir.path().join("fresh-cache");
    let output = start_expecting_failure(
        &chunk_dir,
        &[
            "--module-digest",
            &digest.to_string(),
            "--cache-dir",
            fresh_cache.to_str().unwrap(),
        ],
    );
    assert!(output.contains("missing chunk 0"), "{output}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replaced_module_is_swapped_in_without_a_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("module.wasm");
    let publish = |body: &str| {
        // As a ConfigMap volume update does: new files renamed into place.
        let module = cgi_wat(&format!("Content-Type: text/plain\n\n{body}"));
        let staged = dir.path().join("staged.wasm");
        std::fs::write(&staged, &module).unwrap();
        let staged_digest = dir.path().join("staged.sha256");
        std::fs::write(&staged_digest, Digest::of(&module).to_string()).unwrap();
        std::fs::rename(&staged, &path).unwrap();
        std::fs::rename(&staged_digest, dir.path().join("module.wasm.sha256")).unwrap();
    };
    publish("version one");
    let runtime = Runtime::start(&path, &["--watch-interval", "100ms"]);
    assert_eq!(get(runtime.url("/")).await.1, "version one");

    let hammer = {
        let url = runtime.url("/");
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < deadline {
                let (status, text) = get(url.clone()).await;
                assert_eq!(status, 200, "a request failed during the swap: {text}");
                seen.push(text.clone());
                if text == "version two" {
                    break;
                }
            }
            seen
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish("version two");
    let seen = hammer.await.unwrap();
    assert_eq!(seen.last().map(String::as_str), Some("version two"), "never swapped");
    runtime.wait_for_log(&["swapped in the module replaced on disk"]);

    // A file that does not match its digest is refused, and the old module keeps serving.
    std::fs::write(&path, b"garbage").unwrap();
    runtime.wait_for_log(&["still serving the previous one"]);
    assert_eq!(get(runtime.url("/")).await.1, "version two");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_requests_in_flight_finish() {
    let mut runtime = Runtime::start(rust_echo_with_digest(), &[]);
    let slow = tokio::spawn(get(runtime.url("/sleep?ms=1500")));
    tokio::time::sleep(Duration::from_millis(400)).await;
    runtime.terminate();
    let (status, text) = slow.await.unwrap();
    assert_eq!((status, text.as_str()), (200, "slept\n"));
    assert!(runtime.wait().success());
    assert!(
        client().get(runtime.url("/")).send().await.is_err(),
        "no longer listening"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn module_is_pulled_from_an_oci_registry_by_digest() {
    let registry = Registry::start();
    let module = cgi_wat("Content-Type: text/plain\n\nfrom the registry\n");
    let digest = Digest::of(&module);
    let manifest = registry.push_wasm("functions/hello:v1", &module).await;

    // By tag, pinned by the module digest: the layer blob is fetched by that digest.
    let by_tag = format!("oci://{}/functions/hello:v1", registry.address);
    let runtime = Runtime::start(&by_tag, &["--module-digest", &digest.to_string()]);
    assert_eq!(get(runtime.url("/")).await.1, "from the registry\n");

    // By manifest digest.
    let by_manifest = format!("oci://{}/functions/hello@{manifest}", registry.address);
    let runtime = Runtime::start(&by_manifest, &["--module-digest", &digest.to_string()]);
    assert_eq!(get(runtime.url("/")).await.1, "from the registry\n");

    // A tag alone can move: refused. A wrong digest: refused, naming both.
    let output = start_expecting_failure(&by_tag, &[]);
    assert!(output.contains("--module-digest"), "{output}");
    let wrong = Digest::of(b"another module");
    let output = start_expecting_failure(&by_manifest, &["--module-digest", &wrong.to_string()]);
    assert!(
        output.contains(&wrong.to_string()) && output.contains(&digest.to_string()),
        "{output}"
    );

    // A restart with the compiled code cached needs no registry: one that is down
    // does not keep the function from coming back.
    let cache = tempfile::tempdir().unwrap();
    let cached = [
        "--module-digest",
        &digest.to_string(),
        "--cache-dir",
        cache.path().to_str().unwrap(),
    ];
    drop(Runtime::start(&by_manifest, &cached));
    let address = registry.address.clone();
    drop(registry);
    assert!(
        std::net::TcpStream::connect(&address).is_err(),
        "the registry should be down"
    );
    let runtime = Runtime::start(&by_manifest, &cached);
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"cache hit\""]);
    assert_eq!(get(runtime.url("/")).await.1, "from the registry\n");
}

/// The builder's step, as the builder runs it: the module compiled for the portable
/// target, in the artifact format.
fn precompile_for(engine: &wasmtime::Engine, module: &[u8]) -> Vec<u8> {
    let abi = wasmless_runtime::abi::detect(module).unwrap();
    wasmless_runtime::precompiled::precompile(engine, abi, module, Digest::of(module)).unwrap()
}

fn portable_engine() -> wasmtime::Engine {
    wasmless_runtime::precompiled::precompile_engine().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_pod_loads_precompiled_code_and_compiles_nothing() {
    let module = std::fs::read(go_handler("goless-sample")).unwrap();
    let digest = Digest::of(&module);
    let code = precompile_for(&portable_engine(), &module);
    let code_digest = Digest::of(&code);

    // The operator's volume: module chunks and code chunks side by side.
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("module");
    std::fs::create_dir(&volume).unwrap();
    for (index, chunk) in wasmless_artifact::compress_and_split(&module).iter().enumerate() {
        std::fs::write(volume.join(Part::Module.chunk_file_name(index)), chunk).unwrap();
    }
    for (index, chunk) in wasmless_artifact::split_chunks(&code).iter().enumerate() {
        std::fs::write(volume.join(Part::Code.chunk_file_name(index)), chunk).unwrap();
    }
    let empty_cache = dir.path().join("cache");
    let args = [
        "--module-digest",
        &digest.to_string(),
        "--code",
        volume.to_str().unwrap(),
        "--code-digest",
        &code_digest.to_string(),
        "--cache-dir",
        empty_cache.to_str().unwrap(),
    ];
    let runtime = Runtime::start(&volume, &args);
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(get(runtime.url("/")).await.1, "This works!");
    let metrics = get(runtime.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(&metrics, "wasmless_compile_fallbacks_total", &[]),
        None,
        "{metrics}"
    );
    // Nothing was compiled, so nothing went into the cache.
    assert!(
        std::fs::read_dir(&empty_cache).map_or(true, |mut entries| entries.next().is_none()),
        "the compiled-code cache should be empty"
    );
    drop(runtime);

    // The file form (`wasmless dev`, a local build) loads the same way.
    let (file, _) = write_module(dir.path(), "module.cwasm.lz4", &code);
    let file_args = [
        "--module-digest",
        &digest.to_string(),
        "--code",
        file.to_str().unwrap(),
        "--code-digest",
        &code_digest.to_string(),
    ];
    let runtime = Runtime::start(&volume, &file_args);
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(get(runtime.url("/")).await.1, "This works!");
}

#[tokio::test(flavor = "multi_thread")]
async fn tampered_or_unpinned_code_is_refused_and_nothing_runs() {
    let module = cgi_wat("Content-Type: text/plain\n\nhello\n");
    let dir = tempfile::tempdir().unwrap();
    let (module_path, digest) = write_module(dir.path(), "hello.wasm", &module);
    let code = precompile_for(&portable_engine(), &module);
    let code_digest = Digest::of(&code);

    let mut tampered = code.clone();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 1;
    let (tampered_path, _) = write_module(dir.path(), "tampered.cwasm.lz4", &tampered);
    let output = start_expecting_failure(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            tampered_path.to_str().unwrap(),
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    assert!(
        output.contains("compiled code digest mismatch") && output.contains(&code_digest.to_string()),
        "{output}"
    );
    assert!(!output.contains("serving"), "{output}");

    // Genuine code, but made from another module than the one pinned.
    let other = cgi_wat("Content-Type: text/plain\n\nother\n");
    let other_code = precompile_for(&portable_engine(), &other);
    let (other_path, other_digest) = write_module(dir.path(), "other.cwasm.lz4", &other_code);
    let output = start_expecting_failure(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            other_path.to_str().unwrap(),
            "--code-digest",
            &other_digest.to_string(),
        ],
    );
    assert!(output.contains("was made from module"), "{output}");

    // Code is never loaded unpinned.
    let (code_path, _) = write_module(dir.path(), "hello.cwasm.lz4", &code);
    let output = start_expecting_failure(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            code_path.to_str().unwrap(),
        ],
    );
    assert!(output.contains("--code-digest"), "{output}");
}

#[tokio::test(flavor = "multi_thread")]
async fn code_for_another_engine_falls_back_to_compiling_and_is_counted() {
    let module = std::fs::read(rust_echo()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (module_path, digest) = write_module(dir.path(), "echo.wasm", &module);
    // What another wasmtime configuration makes (here: another memory reservation).
    let mut config =
        wasmless_runtime::engine::compiler_config(&wasmless_runtime::engine::CompileTarget::Portable).unwrap();
    config.memory_reservation(1 << 28);
    let other_engine = wasmtime::Engine::new(&config).unwrap();
    let code = precompile_for(&other_engine, &module);
    let (code_path, code_digest) = write_module(dir.path(), "echo.cwasm.lz4", &code);

    let runtime = Runtime::start(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            code_path.to_str().unwrap(),
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    let log = runtime.wait_for_log(&["not using the precompiled code", "\"reason\":\"engine\""]);
    assert!(log.contains("another wasmtime version or configuration"), "{log}");
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"compiled (no cache)\""]);
    let (status, body) = get(runtime.url("/echo?x=1")).await;
    assert_eq!(status, 200, "{body}");
    let metrics = get(runtime.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(&metrics, "wasmless_compile_fallbacks_total", &[("reason", "engine")]),
        Some(1.0),
        "{metrics}"
    );

    // Code that cannot be read at all (a volume not mounted, a registry down): compiled too.
    let missing = dir.path().join("missing.cwasm.lz4");
    let runtime = Runtime::start(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            missing.to_str().unwrap(),
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    runtime.wait_for_log(&["not using the precompiled code", "\"reason\":\"unavailable\""]);
    assert_eq!(get(runtime.url("/echo")).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn compiled_code_is_pulled_from_the_modules_oci_artifact() {
    let registry = Registry::start();
    let module = cgi_wat("Content-Type: text/plain\n\nprecompiled from the registry\n");
    let digest = Digest::of(&module);
    let code = precompile_for(&portable_engine(), &module);
    let code_digest = Digest::of(&code);
    let manifest = registry
        .push_layers(
            "functions/hello:v1",
            &[
                (wasmless_artifact::oci::LAYER_MEDIA_TYPE, &module[..]),
                (wasmless_artifact::oci::CODE_LAYER_MEDIA_TYPE, &code[..]),
            ],
        )
        .await;
    let reference = format!("oci://{}/functions/hello@{manifest}", registry.address);
    let runtime = Runtime::start(
        &reference,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            &reference,
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(get(runtime.url("/")).await.1, "precompiled from the registry\n");
    // The module alone, by manifest digest, still loads from an artifact with two layers.
    let runtime = Runtime::start(&reference, &[]);
    assert_eq!(get(runtime.url("/")).await.1, "precompiled from the registry\n");
}
