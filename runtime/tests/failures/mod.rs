//! A handler that fails, spins or overreaches fails only its own request, with its own
//! status; a module that does not verify never starts.

use crate::support::*;
use serde_json::Value;
use std::time::Duration;
use wasmless_artifact::Digest;

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

/// Each serving thread runs every request of its connections (edge/src/lib.rs), so a
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

/// A handler asleep in a host call past its timeout is stopped at the deadline, not when it
/// wakes: the client gets its 504 then, and the request's slot is free for the next one.
/// (Go's reactor: `tests/streaming`.)
#[tokio::test(flavor = "multi_thread")]
async fn handlers_asleep_in_a_host_call_are_stopped_at_their_deadline() {
    let dir = tempfile::tempdir().unwrap();
    // A command that sleeps 20 s in one `poll_oneoff`: a monotonic-clock subscription.
    let sleeper = wat::parse_str(
        r#"(module
            (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (func (export "_start")
                (i32.store (i32.const 16) (i32.const 1))
                (i64.store (i32.const 24) (i64.const 20000000000))
                (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))))"#,
    )
    .unwrap();
    let (command, digest) = write_module(dir.path(), "sleeper.wasm", &sleeper);
    let digest = digest.to_string();
    let one_slot = ["--timeout", "1s", "--max-concurrency", "1"];
    let cases = [
        ("a component", rust_echo_with_digest(), "/sleep?ms=20000", Vec::new()),
        ("a CGI command", command, "/", vec!["--module-digest", digest.as_str()]),
    ];
    for (kind, module, path, extra) in cases {
        let args: Vec<&str> = one_slot.iter().copied().chain(extra).collect();
        let runtime = Runtime::start(&module, &args);
        for attempt in ["first", "second"] {
            let started = std::time::Instant::now();
            let (status, text) = get(runtime.url(path)).await;
            assert_eq!(status, 504, "{kind}, {attempt} request: {text}");
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "{kind}, {attempt} request: answered after {:?}, when it woke, not at its 1 s deadline",
                started.elapsed()
            );
        }
    }
}
