//! Traces: two runtimes sending OTLP to a real OpenTelemetry Collector (built from its Go
//! modules by scripts/lib.sh), which writes the spans to a file this test reads.

use crate::support::*;
use serde_json::Value;
use std::time::{Duration, Instant};
use wasmless_testkit::otelcol::{Collector, Span, children, one};

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Function `a` (a Go handler) calls Function `b` (a Rust component), which calls itself:
/// one trace from the caller's traceparent through both runtimes, each hop the child of
/// the outbound call that made it, the header injected by the host and seen by the
/// handler as an ordinary one. A trap is an error span. With the collector gone,
/// requests go on and the drops are counted and logged as a count.
#[tokio::test(flavor = "multi_thread")]
async fn one_trace_across_functions_with_errors_marked_and_drops_counted() {
    let mut collector = Collector::start();
    // `b` by the standard variables, with resource attributes of its own; `a` by the flag.
    let b = Runtime::start_with_env(
        rust_echo_with_digest(),
        &["--function", "b", "--outbound-allow", "http://127.0.0.1:*"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint()),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let b_digest = wasmless_artifact::Digest::of(&std::fs::read(rust_echo()).unwrap()).to_string();
    let a = Runtime::start_with_env(
        with_digest_file(go_reactor("go-outbound", true)),
        &[
            "--function",
            "a",
            "--outbound-allow",
            "http://127.0.0.1:*",
            "--otlp-endpoint",
            &collector.endpoint(),
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "200")],
    );

    // a -> b/fetch -> b/ (the echo: the headers its handler saw).
    let innermost = b.url("/echo-headers");
    let middle = b.url(&format!("/fetch?url={}", percent(&innermost)));
    let url = a.url(&format!("/get?url={}", percent(&middle)));
    let response = client()
        .get(&url)
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    // "200 200 {echo}": b's echo saw a traceparent of this trace, one it did not write.
    assert!(body.starts_with("200 200 "), "{body}");
    assert!(body.contains(&format!("00-{CALLER_TRACE}-")), "{body}");

    let servers = |spans: &[Span]| {
        spans
            .iter()
            .filter(|span| span.trace_id == CALLER_TRACE && span.kind == 2)
            .count()
    };
    // a: server, handler, instantiate, call; b /fetch the same; b's echo: server, handler,
    // instantiate.
    let spans = collector.wait_for("the 11 spans of the caller's trace", |spans| {
        servers(spans) == 3 && spans.iter().filter(|s| s.trace_id == CALLER_TRACE).count() == 11
    });
    let trace: Vec<Span> = spans.into_iter().filter(|s| s.trace_id == CALLER_TRACE).collect();

    // a's server span continues the caller's trace.
    let a_server = one(&trace, "a's server span", |s| s.service == "a" && s.kind == 2);
    assert_eq!(a_server.parent, CALLER_SPAN);
    assert_eq!(a_server.name, "GET");
    assert_eq!(a_server.attributes["http.request.method"], "GET");
    assert_eq!(a_server.attributes["url.path"], "/get");
    assert_eq!(a_server.attributes["http.response.status_code"], "200");
    assert_eq!(a_server.attributes["faas.name"], "a");
    assert!(a_server.attributes["wasmless.module.digest"].starts_with("sha256:"));
    let a_handler = one(&trace, "a's handler span", |s| {
        s.service == "a" && s.name == "handler" && s.parent == a_server.span_id
    });
    let under_a_handler: Vec<&str> = children(&trace, a_handler).iter().map(|s| s.name.as_str()).collect();
    assert!(under_a_handler.contains(&"GET"), "{under_a_handler:?}");
    let a_call = one(&trace, "a's outbound call", |s| s.service == "a" && s.kind == 3);
    assert_eq!(a_call.parent, a_handler.span_id);
    assert_eq!(a_call.attributes["http.response.status_code"], "200");
    assert!(a_call.attributes["url.full"].ends_with("/fetch"), "{a_call:?}");

    // b's first server span is the child of a's call; its own call's is the child of b's
    // handler; and the innermost server span the child of that.
    let b_fetch = one(&trace, "b's /fetch server span", |s| {
        s.service == "b" && s.kind == 2 && s.attributes["url.path"] == "/fetch"
    });
    assert_eq!(b_fetch.parent, a_call.span_id);
    assert_eq!(b_fetch.attributes["wasmless.module.digest"], b_digest);
    assert_eq!(b_fetch.resource["deployment.environment.name"], "test");
    let b_handler = one(&trace, "b's handler span", |s| {
        s.service == "b" && s.name == "handler" && s.parent == b_fetch.span_id
    });
    let b_instantiate = children(&trace, b_handler);
    assert!(
        b_instantiate.iter().any(|s| s.name == "instantiate"),
        "{b_instantiate:?}"
    );
    let b_call = one(&trace, "b's outbound call", |s| s.service == "b" && s.kind == 3);
    assert_eq!(b_call.parent, b_handler.span_id);
    let b_echo = one(&trace, "b's echo server span", |s| {
        s.service == "b" && s.kind == 2 && s.attributes["url.path"] == "/echo-headers"
    });
    assert_eq!(b_echo.parent, b_call.span_id);
    assert!(body.contains(&b_call.span_id), "b's echo saw its caller's span: {body}");
    assert!(trace.iter().all(|s| s.status != 2), "no errors: {trace:#?}");
    // The trace just checked, as the collector wrote it, for docs/trace.svg
    // (e2e/trace_picture.py draws it; docs/architecture.md says how to run both).
    if let Some(path) = std::env::var_os("WASMLESS_TRACE_SPANS") {
        std::fs::copy(&collector.spans_file, &path).unwrap();
    }

    // The request's log line joins the trace.
    let line = a.wait_for_log(&["\"message\":\"request\"", "\"path\":\"/get\""]);
    let line: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line["span"]["trace_id"], CALLER_TRACE, "{line}");
    assert_eq!(line["span"]["span_id"], a_server.span_id.as_str(), "{line}");

    // The request's bucket of the duration histogram names the trace as its exemplar.
    let metrics = get(a.admin_url("/metrics")).await.1;
    let exemplar = format!("# {{trace_id=\"{CALLER_TRACE}\"}}");
    assert!(
        metrics.lines().any(|line| {
            line.starts_with("wasmless_request_duration_seconds_bucket{")
                && line.contains("function=\"a\",method=\"GET\",status=\"200\"")
                && line.contains(&exemplar)
        }),
        "no bucket of a's GET has the exemplar {exemplar}:\n{metrics}"
    );

    // A trap: the handler span is in error with a `trap` event, the server span in error
    // with its status.
    let (status, _) = get(b.url("/panic")).await;
    assert_eq!(status, 500);
    let spans = collector.wait_for("the trap's spans", |spans| {
        spans
            .iter()
            .any(|s| s.kind == 2 && s.attributes.get("url.path").is_some_and(|p| p == "/panic"))
    });
    let panic_server = one(&spans, "the /panic server span", |s| {
        s.kind == 2 && s.attributes["url.path"] == "/panic"
    });
    assert_eq!(panic_server.status, 2, "{panic_server:?}");
    assert_eq!(panic_server.attributes["http.response.status_code"], "500");
    let panic_handler = one(&spans, "the /panic handler span", |s| {
        s.name == "handler" && s.parent == panic_server.span_id
    });
    assert_eq!(panic_handler.status, 2, "{panic_handler:?}");
    assert!(
        panic_handler
            .events
            .iter()
            .any(|e| e.contains("trap") || e.contains("failed")),
        "{panic_handler:?}"
    );

    // The collector gone: requests still succeed, spans are dropped and counted, and the
    // log says so in a line or two, not one per span.
    collector.stop();
    let metrics_url = a.admin_url("/metrics");
    let dropped = |metrics: &str| sample(metrics, "wasmless_trace_spans_dropped_total", &[("function", "a")]);
    assert_eq!(dropped(&get(metrics_url.clone()).await.1), Some(0.0));
    let started = Instant::now();
    for _ in 0..50 {
        let (status, body) = get(a.url(&format!("/get?url={}", percent(&b.url("/"))))).await;
        assert_eq!(status, 200, "{body}");
    }
    // Each request is at least 4 spans in a (server, handler, instantiate, call): none
    // may wait for the collector.
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let count = dropped(&get(metrics_url.clone()).await.1).unwrap();
        if count >= 150.0 {
            break;
        }
        assert!(Instant::now() < deadline, "only {count} spans counted dropped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.wait_for_log(&["trace spans dropped"]);
    let drop_lines = a.logs().iter().filter(|l| l.contains("trace spans dropped")).count();
    assert!(drop_lines <= 2, "{drop_lines} lines about drops");
    // Nothing was written meanwhile: the collector really was down.
    assert!(
        collector
            .spans()
            .iter()
            .all(|s| s.attributes.get("url.path").is_none_or(|p| p != "/"))
    );

    // The collector back on its port: after the pause that followed the last failed
    // export (5 s), a's requests are traced again.
    let collector = Collector::start_on(collector.port);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_eq!(get(a.url("/init")).await.0, 200);
        if collector
            .spans()
            .iter()
            .any(|s| s.service == "a" && s.kind == 2 && s.attributes["url.path"] == "/init")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a's traces did not resume with the collector back"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Off by default: no endpoint, no export, no trace ids in the log, and the counter at 0.
#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_traced() {
    let runtime = Runtime::start(rust_echo_with_digest(), &["--function", "quiet"]);
    let response = client()
        .get(runtime.url("/"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let line = runtime.wait_for_log(&["\"message\":\"request\""]);
    assert!(!line.contains("trace_id"), "{line}");
    let metrics = get(runtime.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(&metrics, "wasmless_trace_spans_dropped_total", &[("function", "quiet")]),
        Some(0.0),
        "{metrics}"
    );
}
