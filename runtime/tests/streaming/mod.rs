//! Go handlers that stream (runtime/tests/handlers/go-stream): a flushed event leaves when
//! it is flushed, a long export streams within the memory limit, and whatever ends a
//! stream (the handler, its timeout, a failure, the client) ends it cleanly or visibly,
//! and frees what the request held.

use crate::support::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn go_stream(flags: &[&str]) -> Runtime {
    Runtime::start(
        with_digest_file(go_reactor("go-stream", true)),
        &[&["--function", "stream"], flags].concat(),
    )
}

async fn metric(runtime: &Runtime, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    sample(&get(runtime.admin_url("/metrics")).await.1, name, labels)
}

/// The body's chunks, each with when it arrived.
async fn chunks(mut response: reqwest::Response) -> Vec<(Instant, bytes::Bytes)> {
    let mut chunks = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        chunks.push((Instant::now(), chunk));
    }
    chunks
}

/// A stream's text, and the time between its first chunk and its last.
async fn streamed_text(response: reqwest::Response) -> (String, Duration, usize) {
    let arrived = chunks(response).await;
    let text = arrived
        .iter()
        .map(|(_, chunk)| String::from_utf8_lossy(chunk))
        .collect();
    let spread = arrived.last().unwrap().0 - arrived[0].0;
    (text, spread, arrived.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_that_flushes_sends_each_event_as_it_flushes() {
    let runtime = go_stream(&[]);
    let response = client().get(runtime.url("/sse?n=5&ms=300")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["transfer-encoding"], "chunked");
    // While the stream is open, the request is in flight.
    let in_flight = metric(&runtime, "wasmless_requests_in_flight", &[]).await;
    let (text, spread, count) = streamed_text(response).await;
    let expected: String = (0..5).map(|i| format!("id: {i}\ndata: event {i}\n\n")).collect();
    assert_eq!(text, expected);
    // Four sleeps of 300 ms lie between the first event and the last: the first left
    // before them, not with the last.
    assert!(
        spread >= Duration::from_millis(1000),
        "the first event came {spread:?} before the last, in {count} chunks"
    );
    assert_eq!(in_flight, Some(1.0));
    let line = runtime.wait_for_log(&["\"message\":\"request\"", "\"end\":\"complete\""]);
    assert!(line.contains("\"first_byte_ms\""), "{line}");
    assert!(line.contains(&format!("\"body_bytes\":{}", expected.len())), "{line}");
    assert_eq!(metric(&runtime, "wasmless_requests_in_flight", &[]).await, Some(0.0));

    // A head flushed before any body leaves with its status.
    let started = Instant::now();
    let response = client().get(runtime.url("/flush-head")).send().await.unwrap();
    let head_after = started.elapsed();
    assert_eq!(response.status(), 201);
    assert_eq!(response.text().await.unwrap(), "after the head\n");
    assert!(
        started.elapsed() - head_after >= Duration::from_millis(250),
        "the head came with the body"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_21_mb_export_streams_within_a_64_mib_limit_and_a_small_answer_stays_whole() {
    let runtime = go_stream(&["--memory-limit", "64Mi"]);
    let bytes = 21 << 20;
    let response = client()
        .get(runtime.url(&format!("/csv?bytes={bytes}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/csv");
    assert!(response.headers().get("content-length").is_none());
    let body = response.bytes().await.unwrap();
    assert_eq!(body.len(), bytes);
    let rows: Vec<&[u8]> = body.split(|b| *b == b'\n').filter(|row| !row.is_empty()).collect();
    assert_eq!(rows.len(), bytes / 64);
    assert!(
        rows.last()
            .unwrap()
            .starts_with(format!("{:010},", bytes / 64 - 1).as_bytes())
    );

    // What fits a buffer is sent whole, with its length, as before.
    let response = client().get(runtime.url("/small")).send().await.unwrap();
    assert_eq!(response.headers()["content-length"], "2");
    assert!(response.headers().get("transfer-encoding").is_none());
    assert_eq!(response.text().await.unwrap(), "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_ends_a_stream_cleanly_and_frees_its_permit() {
    let runtime = go_stream(&["--timeout", "1s", "--max-concurrency", "1"]);
    let started = Instant::now();
    let response = client().get(runtime.url("/forever?ms=100")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    // An SSE client sees a normal end, and may reconnect.
    let text = response.text().await.expect("the stream ends cleanly at the timeout");
    assert!(text.starts_with("data: tick 0\n\ndata: tick 1\n\n"), "{text}");
    let ended = started.elapsed();
    assert!(ended >= Duration::from_millis(900), "ended after {ended:?}");
    assert_eq!(
        metric(&runtime, "wasmless_traps_total", &[("kind", "timeout")]).await,
        Some(1.0)
    );
    runtime.wait_for_log(&["\"end\":\"timeout\""]);
    // The permit went with the stream.
    assert_eq!(get(runtime.url("/small")).await, (200, "ok".into()));
    let cpu = runtime.cpu_time();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        runtime.cpu_time() - cpu < Duration::from_millis(200),
        "the handler kept running"
    );
}

/// A handler asleep in a host call is stopped at its deadline, not when it wakes: its
/// permit is free again for the next request.
#[tokio::test(flavor = "multi_thread")]
async fn a_handler_asleep_past_its_timeout_is_stopped_at_the_deadline() {
    let runtime = go_stream(&["--timeout", "1s", "--max-concurrency", "1"]);
    let started = Instant::now();
    let (status, _) = get(runtime.url("/sleep?ms=20000")).await;
    assert_eq!(status, 504);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(get(runtime.url("/small")).await, (200, "ok".into()));
    assert_eq!(get(runtime.url("/sleep?ms=10")).await, (200, "slept".into()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failure_after_the_head_cuts_the_stream() {
    let runtime = go_stream(&["--memory-limit", "32Mi", "--max-concurrency", "1"]);
    for (path, kind) in [("/panic-after", "exit"), ("/grow-after", "memory")] {
        let response = client().get(runtime.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert!(
            response.text().await.is_err(),
            "{path}: the client sees a cut body, not a whole one"
        );
        assert_eq!(
            metric(&runtime, "wasmless_traps_total", &[("kind", kind)]).await,
            Some(1.0),
            "{path}"
        );
        assert_eq!(get(runtime.url("/small")).await, (200, "ok".into()), "after {path}");
    }
    runtime.wait_for_log(&["handler failed after sending its response headers"]);
    runtime.wait_for_log(&["\"end\":\"exit\""]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_declared_content_length_is_held_to() {
    let runtime = go_stream(&[]);
    let response = client()
        .get(runtime.url("/length?declared=300000&write=300000"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-length"], "300000");
    assert!(response.headers().get("transfer-encoding").is_none());
    assert_eq!(response.bytes().await.unwrap().len(), 300_000);
    // hyper lets go of a body whose length is all out; that is no client leaving.
    let line = runtime.wait_for_log(&["\"message\":\"request\"", "\"body_bytes\":300000"]);
    assert!(line.contains("\"end\":\"complete\""), "{line}");
    // Short of its length, or past it, the body cannot be whole: the client sees it cut,
    // as from native Go, never a length the body does not have.
    for path in [
        "/length?declared=300000&write=200000",
        "/length?declared=100&write=300000",
    ] {
        let response = client().get(runtime.url(path)).send().await.unwrap();
        assert!(response.bytes().await.is_err(), "{path}");
    }
    runtime.wait_for_log(&["http: wrote more than the declared Content-Length"]);
    runtime.wait_for_log(&["\"end\":\"short_body\""]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_or_stops_reading_holds_nothing_past_its_request() {
    let runtime = go_stream(&["--timeout", "2s", "--max-concurrency", "1"]);
    let mut response = client().get(runtime.url("/forever?ms=50")).send().await.unwrap();
    assert!(response.chunk().await.unwrap().is_some());
    drop(response);
    runtime.wait_for_log(&["\"end\":\"client_gone\""]);
    assert_eq!(get(runtime.url("/small")).await, (200, "ok".into()));
    assert_eq!(metric(&runtime, "wasmless_requests_in_flight", &[]).await, Some(0.0));
    assert_eq!(metric(&runtime, "wasmless_traps_total", &[]).await, None);

    // A client that asks for 50 MB and reads none of it: the handler waits on it (the
    // host holds a part, not the response) until its timeout, then lets go.
    let address = runtime
        .url("/")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut stalled = std::net::TcpStream::connect(&address).unwrap();
    stalled
        .write_all(b"GET /csv?bytes=50000000 HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut head = [0; 64];
    let _ = stalled.read(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert_eq!(get(runtime.url("/small")).await, (200, "ok".into()));
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shared_instance_serves_on_after_a_stream_and_is_replaced_after_a_timeout() {
    let runtime = go_stream(&["--isolation", "shared", "--timeout", "1s"]);
    assert_eq!(get(runtime.url("/count")).await.1, "1");
    assert_eq!(get(runtime.url("/sse?n=2&ms=10")).await.0, 200);
    assert_eq!(
        get(runtime.url("/count")).await.1,
        "2",
        "the instance that streamed serves on"
    );
    let _ = client()
        .get(runtime.url("/forever?ms=100"))
        .send()
        .await
        .unwrap()
        .text()
        .await;
    assert_eq!(
        get(runtime.url("/count")).await.1,
        "1",
        "a timed-out instance is not kept"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rust_component_streams_through_the_sdk_and_is_logged_at_its_end() {
    let runtime = Runtime::start(rust_echo_with_digest(), &["--function", "rust-stream"]);
    let response = client().get(runtime.url("/events?n=4&ms=300")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let in_flight = metric(&runtime, "wasmless_requests_in_flight", &[]).await;
    let (text, spread, _) = streamed_text(response).await;
    let expected: String = (0..4).map(|i| format!("data: event {i}\n\n")).collect();
    assert_eq!(text, expected);
    assert!(spread >= Duration::from_millis(800), "the events came together");
    assert_eq!(in_flight, Some(1.0));
    let line = runtime.wait_for_log(&["\"message\":\"request\"", "\"path\":\"/events\""]);
    assert!(line.contains("\"end\":\"complete\""), "{line}");
}
