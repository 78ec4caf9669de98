//! Go handlers as snapshotted reactors (the builder's default for Go): they answer as
//! the same handlers do over CGI, and nothing the snapshot froze, nor anything one
//! request leaves behind, reaches another request.

use crate::support::*;
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn reactor(name: &str) -> std::path::PathBuf {
    with_digest_file(go_reactor(name, true))
}

/// Status, the headers a handler controls, and the body (JSON with the connection's
/// port taken out, which differs per connection).
async fn answer(response: reqwest::Response) -> (u16, Vec<(String, String)>, String) {
    let status = response.status().as_u16();
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(name, _)| *name != "date")
        .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_string()))
        .collect();
    headers.sort();
    let text = response.text().await.unwrap();
    let body = match serde_json::from_str::<Value>(&text) {
        Ok(mut json) => {
            if let Some(remote) = json.get_mut("remoteAddr") {
                let address = remote.as_str().unwrap().to_string();
                assert!(address.starts_with("127.0.0.1:"), "{address}");
                *remote = Value::from("127.0.0.1:<port>");
            }
            json.to_string()
        }
        Err(_) => text,
    };
    (status, headers, body)
}

/// One request of the comparison, made against a base URL.
type MakeRequest<'a> = Box<dyn Fn(&str) -> reqwest::RequestBuilder + 'a>;

#[tokio::test(flavor = "multi_thread")]
async fn go_echo_answers_the_same_as_a_reactor_and_over_cgi() {
    let flags = [
        "--env",
        "GREETING=hello from the Function's env",
        "--timeout",
        "2s",
        "--memory-limit",
        "64Mi",
    ];
    let cgi = Runtime::start(with_digest_file(go_handler("go-echo")), &flags);
    let shared = Runtime::start(reactor("go-echo"), &[&flags[..], &["--isolation", "shared"]].concat());
    let reactor = Runtime::start(reactor("go-echo"), &flags);
    assert!(
        reactor
            .logs()
            .iter()
            .any(|line| line.contains("\"abi\":\"go-reactor\"")),
        "{:?}",
        reactor.logs()
    );
    let client = client();
    let requests: Vec<(&str, MakeRequest)> = vec![
        (
            "post with query, headers and body",
            Box::new(|base| {
                client
                    .post(format!("{base}/some/path?name=J%C3%BCrgen&status=201&empty="))
                    .header("X-Custom", "custom value")
                    .header("X-Multi", "one")
                    .header("X-Multi", "two")
                    .header("Authorization", "Bearer token")
                    .header("Content-Type", "text/plain")
                    .body("the request body")
            }),
        ),
        ("plain get", Box::new(|base| client.get(format!("{base}/")))),
        (
            "status chosen",
            Box::new(|base| client.get(format!("{base}/x?status=404"))),
        ),
        (
            "escaped path",
            Box::new(|base| client.get(format!("{base}/caf%C3%A9/a%20b?q=%20"))),
        ),
        (
            "put",
            Box::new(|base| client.put(format!("{base}/put")).body(vec![b'x'; 5000])),
        ),
        ("panic", Box::new(|base| client.get(format!("{base}/panic")))),
        (
            "sleep past the timeout",
            Box::new(|base| client.get(format!("{base}/sleep?ms=5000"))),
        ),
        (
            "unbounded allocation",
            Box::new(|base| client.get(format!("{base}/grow"))),
        ),
    ];
    for (what, request) in &requests {
        let over_cgi = answer(request(&cgi.url("")).send().await.unwrap()).await;
        let as_reactor = answer(request(&reactor.url("")).send().await.unwrap()).await;
        assert_eq!(as_reactor, over_cgi, "{what}");
        // Twice in a shared instance: the second time from an instance that served (or
        // replaced one that failed) the first.
        for _ in 0..2 {
            let in_shared = answer(request(&shared.url("")).send().await.unwrap()).await;
            assert_eq!(in_shared, over_cgi, "{what}, in a shared instance");
        }
    }
    // And the echo itself is right (the CGI path's own test says what right is).
    let (status, _, body) = answer(requests[0].1(&reactor.url("")).send().await.unwrap()).await;
    assert_eq!(status, 201);
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["query"]["name"], "Jürgen");
    assert_eq!(echo["headers"]["X-Multi"], "one, two");
    assert_eq!(echo["body"], "the request body");
    assert_eq!(echo["env"], "hello from the Function's env");
    reactor.wait_for_log(&["deliberate panic for the test"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn goless_sample_answers_this_works_as_a_reactor() {
    let runtime = Runtime::start(reactor("goless-sample"), &["--function", "hello"]);
    for path in ["/", "/any/other/path?x=1"] {
        let response = client().get(runtime.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/plain; charset=utf-8");
        assert_eq!(response.text().await.unwrap(), "This works!");
    }
}

async fn state(runtime: &Runtime) -> Value {
    let response = client().get(runtime.url("/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn unix_nanos() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_frozen_in_the_snapshot_or_left_by_a_request_leaks() {
    let module = reactor("go-state");
    let runtime = Runtime::start(&module, &["--env", "GREETING=first deploy", "--function", "stateful"]);
    let before = unix_nanos();
    let first = state(&runtime).await;
    let second = state(&runtime).await;
    let after = unix_nanos();

    // The Function's env and name as deployed, not as at build time.
    assert_eq!(first["env"], "first deploy");
    assert_eq!(first["args"], serde_json::json!(["stateful"]));
    // Real time, moving forward; positive durations within a request and since start-up.
    for seen in [&first, &second] {
        let now = seen["now"].as_i64().unwrap();
        assert!(before <= now && now <= after, "time.Now() is not the real time: {seen}");
        assert!(seen["elapsed"].as_i64().unwrap() >= 1_000_000, "a 1 ms sleep: {seen}");
        assert!(seen["sinceInit"].as_i64().unwrap() > 0, "{seen}");
    }
    assert!(second["now"].as_i64() > first["now"].as_i64());
    // Different random numbers from every generator.
    for generator in ["mathRand", "mathRandV2", "cryptoRand"] {
        assert_ne!(
            first[generator], second[generator],
            "{generator} repeats across requests"
        );
    }
    // Nothing an earlier request (or its goroutine) wrote.
    for seen in [&first, &second] {
        assert_eq!(seen["requests"], 1, "{seen}");
        assert_eq!(seen["leftover"], "nothing", "{seen}");
    }

    // The same snapshot deployed with another env sees that env.
    let redeployed = Runtime::start(&module, &["--env", "GREETING=second deploy"]);
    assert_eq!(state(&redeployed).await["env"], "second deploy");
    // Another process draws other numbers than the first did.
    let third = state(&redeployed).await;
    for generator in ["mathRand", "mathRandV2", "cryptoRand"] {
        assert_ne!(first[generator], third[generator], "{generator}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endless_loop_fails_only_its_own_request() {
    let runtime = Runtime::start(reactor("go-state"), &["--timeout", "500ms"]);
    let (status, text) = get(runtime.url("/loop")).await;
    assert_eq!(status, 504, "{text}");
    assert_eq!(state(&runtime).await["requests"], 1);
    let cpu_after_loop = runtime.cpu_time();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(runtime.cpu_time() - cpu_after_loop < Duration::from_millis(300));
}

/// Requests to a shared instance, and what each answered.
async fn shared_requests(runtime: &Runtime, paths: &[&str]) -> Vec<(u16, Value)> {
    let mut answers = Vec::new();
    for path in paths {
        let response = client().get(runtime.url(path)).send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        answers.push((status, serde_json::from_str(&text).unwrap_or(Value::from(text))));
    }
    answers
}

fn requests_counted(answers: &[(u16, Value)]) -> Vec<Value> {
    answers.iter().map(|(_, json)| json["requests"].clone()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_instances_keep_state_and_a_failure_replaces_only_its_instance() {
    let runtime = Runtime::start(
        reactor("go-state"),
        &[
            "--isolation",
            "shared",
            "--timeout",
            "500ms",
            "--memory-limit",
            "64Mi",
            "--env",
            "GREETING=as deployed",
            "--function",
            "stateful",
        ],
    );
    runtime.wait_for_log(&["module loaded", "\"isolation\":\"shared\""]);
    let before = unix_nanos();
    let first = state(&runtime).await;
    let second = state(&runtime).await;
    let after = unix_nanos();

    // What one Go process serving both would show: the global counter, and what the
    // first request left, seen by the second.
    assert_eq!((&first["requests"], &second["requests"]), (&1.into(), &2.into()));
    assert_eq!(first["leftover"], "nothing");
    assert_ne!(second["leftover"], "nothing", "{second}");
    // And, as in a fresh instance: env as deployed, real time, other random numbers.
    for seen in [&first, &second] {
        assert_eq!(seen["env"], "as deployed");
        assert_eq!(seen["args"], serde_json::json!(["stateful"]));
        let now = seen["now"].as_i64().unwrap();
        assert!(before <= now && now <= after, "time.Now() is not the real time: {seen}");
        assert!(seen["elapsed"].as_i64().unwrap() >= 1_000_000, "{seen}");
        assert!(seen["sinceInit"].as_i64().unwrap() > 0, "{seen}");
    }
    for generator in ["mathRand", "mathRandV2", "cryptoRand"] {
        assert_ne!(
            first[generator], second[generator],
            "{generator} repeats across requests"
        );
    }

    // A panic is a 500 for its request, and the instance (with its state) serves on, as a
    // Go process whose net/http recovered the panic would.
    let answers = shared_requests(&runtime, &["/panic", "/"]).await;
    assert_eq!(answers[0].0, 500, "{answers:?}");
    assert_eq!(
        (answers[1].0, &answers[1].1["requests"]),
        (200, &4.into()),
        "{answers:?}"
    );
    runtime.wait_for_log(&["deliberate panic after counting the request"]);

    // An endless loop is cut off (504) and its instance replaced: the next request starts
    // from the snapshot. The same for a request that runs out of memory (500).
    let answers = shared_requests(&runtime, &["/loop", "/", "/", "/grow", "/"]).await;
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [504, 200, 200, 500, 200], "{answers:?}");
    assert_eq!(
        requests_counted(&answers[1..3]),
        [1, 2],
        "a fresh instance after the timeout"
    );
    assert_eq!(
        requests_counted(&answers[4..]),
        [1],
        "a fresh instance after running out of memory"
    );
    let metrics = get(runtime.admin_url("/metrics")).await.1;
    for kind in ["timeout", "memory"] {
        assert_eq!(
            sample(&metrics, "wasmless_traps_total", &[("kind", kind)]),
            Some(1.0),
            "{kind}: {metrics}"
        );
    }
    // An instance that looped is gone, not spinning in the background.
    let cpu = runtime.cpu_time();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(runtime.cpu_time() - cpu < Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shared_instance_is_replaced_after_its_requests_per_instance() {
    let runtime = Runtime::start(
        reactor("go-state"),
        &["--isolation", "shared", "--requests-per-instance", "2"],
    );
    let answers = shared_requests(&runtime, &["/", "/", "/", "/", "/"]).await;
    assert_eq!(requests_counted(&answers), [1, 2, 1, 2, 1]);
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_isolation_leaves_other_handlers_a_fresh_instance_per_request() {
    // The same handler built as a CGI command: its instance ends with each request.
    let runtime = Runtime::start(with_digest_file(go_handler("go-state")), &["--isolation", "shared"]);
    runtime.wait_for_log(&["applies to Go reactors only", "\"abi\":\"cgi\""]);
    runtime.wait_for_log(&["module loaded", "\"isolation\":\"request\""]);
    let answers = shared_requests(&runtime, &["/", "/"]).await;
    assert_eq!(requests_counted(&answers), [1, 1]);
}

/// A reactor in WAT whose `wasmless_handle` names the response `address << 32 | length`,
/// with `data` at address 0.
fn wat_reactor(data: &[u8], packed: u64) -> Vec<u8> {
    let escaped: String = data.iter().map(|b| format!("\\{b:02x}")).collect();
    wat::parse_str(format!(
        r#"(module
            (memory (export "memory") 1)
            (data (i32.const 0) "{escaped}")
            (func (export "wasmless_request_buffer") (param i32) (result i32) (i32.const 4096))
            (func (export "wasmless_handle") (result i64) (i64.const {packed})))"#
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_response_outside_the_reactors_memory_fails_only_its_own_request() {
    // 200, no headers, body "ok".
    let good = [200u32.to_le_bytes(), 0u32.to_le_bytes(), 2u32.to_le_bytes()].concat();
    let good = [good, b"ok".to_vec()].concat();
    let packed = |address: u64, length: u64| address << 32 | length;
    let cases = [
        ("a well-formed response", packed(0, good.len() as u64), 200),
        ("a range past the end of memory", packed(65_000, 1_000), 502),
        ("a 4 GiB response", packed(0, u32::MAX as u64), 502),
        ("a truncated response", packed(0, 6), 502),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, packed, expected) in cases {
        let (path, digest) = write_module(dir.path(), "reactor.wasm", &wat_reactor(&good, packed));
        let runtime = Runtime::start(&path, &["--module-digest", &digest.to_string()]);
        for _ in 0..2 {
            let (status, text) = get(runtime.url("/")).await;
            assert_eq!(status, expected, "{name}: {text}");
            if expected == 200 {
                assert_eq!(text, "ok", "{name}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsnapshotted_reactor_still_serves() {
    let runtime = Runtime::start(
        with_digest_file(go_reactor("go-state", false)),
        &["--env", "GREETING=unsnapshotted"],
    );
    let first = state(&runtime).await;
    assert_eq!(first["env"], "unsnapshotted");
    assert_eq!(first["requests"], 1);
    runtime.wait_for_log(&["the reactor was not snapshotted"]);
}

#[test]
fn snapshotting_is_reproducible_and_merges_the_data_segments() {
    let built = std::fs::read(go_reactor("goless-sample", false)).unwrap();
    let first = wasmless_host::snapshot::snapshot(&built).unwrap();
    let second = wasmless_host::snapshot::snapshot(&built).unwrap();
    assert!(first.wasm == second.wasm, "two snapshots of one module differ");
    assert!(
        first.segments_written > 10_000 && first.segments_kept < 2_000,
        "{} segments before merging, {} after",
        first.segments_written,
        first.segments_kept
    );
    assert_eq!(
        wasmless_host::abi::detect(&first.wasm),
        Ok(wasmless_host::abi::Abi::GoReactor)
    );
    println!(
        "goless-sample snapshot: {} bytes, {} KiB of memory, {} → {} data segments, {:.2} s",
        first.wasm.len(),
        first.memory_bytes / 1024,
        first.segments_written,
        first.segments_kept,
        first.seconds
    );
}
