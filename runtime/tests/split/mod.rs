//! Several revisions of one Function in one runtime (`--traffic`): requests split by their
//! shares, a tag reaching its revision, each revision's own metrics, and a split that
//! names a module that does not match its digest refused before anything serves; and
//! `--traffic-file`, which moves a running runtime's requests from revision to revision
//! without one failing, and serves on when the file says something it cannot serve; and a
//! pod started before its Function's first build, which waits for a revision to be named.

use crate::pool::metrics;
use crate::support::*;
use std::path::Path;

/// A revision whose CGI answer is its own name, and its `--traffic` entry.
fn revision(dir: &Path, name: &str, percent: u8, tag: Option<&str>) -> serde_json::Value {
    let (module, digest) = write_module(
        dir,
        &format!("{name}.wasm"),
        &cgi_wat(&format!("Content-Type: text/plain\n\n{name}\n")),
    );
    serde_json::json!({
        "revision": name,
        "percent": percent,
        "tag": tag,
        "module": module,
        "moduleDigest": digest.to_string(),
    })
}

#[tokio::test]
async fn requests_split_by_share_and_a_tag_reaches_its_revision() {
    let dir = tempfile::tempdir().unwrap();
    let traffic = serde_json::json!([
        revision(dir.path(), "hello-1", 90, None),
        revision(dir.path(), "hello-2", 10, Some("canary")),
        revision(dir.path(), "hello-3", 0, Some("next")),
    ]);
    let runtime = Runtime::start_split(&traffic, &["--function", "hello"]);
    let client = client();
    let url = runtime.url("/");

    let mut answers = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..500 {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let header = response.headers()["wasmless-revision"].to_str().unwrap().to_string();
        let body = response.text().await.unwrap();
        assert_eq!(body.trim(), header, "the header names the revision that answered");
        *answers.entry(header).or_default() += 1;
    }
    assert_eq!(
        answers,
        [("hello-1".to_string(), 450), ("hello-2".to_string(), 50)].into(),
        "500 requests to one runtime split exactly 90/10"
    );

    for (tag, expected) in [("canary", "hello-2"), ("next", "hello-3")] {
        for _ in 0..5 {
            let response = client.get(&url).header("Wasmless-Tag", tag).send().await.unwrap();
            assert_eq!(response.text().await.unwrap().trim(), expected, "tag {tag}");
        }
    }
    let response = client.get(&url).header("Wasmless-Tag", "nope").send().await.unwrap();
    assert_eq!(response.status(), 404);
    let text = response.text().await.unwrap();
    assert!(
        !text.contains("canary") && !text.contains("next"),
        "an unknown tag's answer lists no tag: {text}"
    );
    assert!(text.contains("without that header"), "it says how to ask: {text}");

    let text = metrics(&runtime).await;
    let requests = |revision: &str| {
        sample(
            &text,
            "wasmless_requests_total",
            &[("function", "hello"), ("revision", revision), ("status", "200")],
        )
    };
    assert_eq!(requests("hello-1"), Some(450.0), "{text}");
    assert_eq!(requests("hello-2"), Some(55.0), "{text}");
    assert_eq!(requests("hello-3"), Some(5.0), "{text}");
}

#[test]
fn a_revision_whose_module_does_not_match_its_digest_stops_the_split_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let good = revision(dir.path(), "hello-1", 50, None);
    let mut bad = revision(dir.path(), "hello-2", 50, None);
    bad["moduleDigest"] = good["moduleDigest"].clone();
    let output = runtime_command_without_module()
        .arg("--traffic")
        .arg(serde_json::json!([good, bad]).to_string())
        .output()
        .unwrap();
    assert!(!output.status.success(), "a split with a mismatched module started");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("hello-2.wasm"), "{printed}");
    assert!(printed.to_lowercase().contains("digest"), "{printed}");

    let output = runtime_command_without_module()
        .args(["--traffic", "[]"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("at least one"));
}

/// Replaces `file` as the kubelet replaces a downward API file: a new file renamed over it.
fn write_traffic(file: &Path, traffic: &serde_json::Value) {
    write_traffic_text(file, &traffic.to_string());
}

fn write_traffic_text(file: &Path, text: &str) {
    let next = file.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, file).unwrap();
}

/// Asks `url` until it answers `body` (within 10 s): how long that took.
async fn until_answer(client: &reqwest::Client, url: &str, body: &str) -> std::time::Duration {
    let started = std::time::Instant::now();
    loop {
        let response = client.get(url).send().await.unwrap();
        if response.text().await.unwrap().trim() == body {
            return started.elapsed();
        }
        assert!(
            started.elapsed().as_secs() < 10,
            "{url} does not answer {body:?} after 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_traffic_file_moves_requests_between_revisions_in_place_and_nothing_fails() {
    let dir = tempfile::tempdir().unwrap();
    let one = revision(dir.path(), "hello-1", 100, None);
    let two = revision(dir.path(), "hello-2", 100, None);
    let file = dir.path().join("traffic.json");
    write_traffic(&file, &serde_json::json!([one]));
    let runtime = Runtime::start_traffic_file(&file, &["--function", "hello"]);
    let client = client();
    let url = runtime.url("/");

    // One revision serves as a Function with one revision does: no revision header.
    let response = client.get(&url).send().await.unwrap();
    assert!(response.headers().get("wasmless-revision").is_none());
    assert_eq!(response.text().await.unwrap().trim(), "hello-1");

    // Requests all along; none may fail.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loop_task = tokio::spawn({
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        async move {
            let (mut sent, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                sent += 1;
                match client.get(&url).send().await {
                    Ok(response) if response.status() == 200 => {}
                    Ok(response) => failed.push(response.status().to_string()),
                    Err(error) => failed.push(error.to_string()),
                }
            }
            (sent, failed)
        }
    });

    write_traffic(&file, &serde_json::json!([two]));
    let switched = until_answer(&client, &url, "hello-2").await;
    eprintln!("switched to hello-2 in {switched:?}");
    for _ in 0..20 {
        let body = client.get(&url).send().await.unwrap().text().await.unwrap();
        assert_eq!(body.trim(), "hello-2", "every request after the switch");
    }

    // What cannot be served changes nothing, and says why: a list that does not parse,
    // and a revision whose module does not match its digest.
    write_traffic_text(&file, "[{\"revision\": ");
    runtime.wait_for_log(&["the traffic file's new list cannot be served", "JSON list"]);
    let mut bad = revision(dir.path(), "hello-3", 100, None);
    bad["moduleDigest"] = one["moduleDigest"].clone();
    write_traffic(&file, &serde_json::json!([bad]));
    runtime.wait_for_log(&["the traffic file's new list cannot be served", "hello-3.wasm"]);
    for _ in 0..20 {
        let body = client.get(&url).send().await.unwrap().text().await.unwrap();
        assert_eq!(body.trim(), "hello-2", "the last list serves on");
    }

    // A revision that cannot be read yet (through the API: refused until the API server
    // sees the pod's widened Role) is tried again, and served once it can be, though the
    // list does not change again.
    let late = revision(dir.path(), "hello-4", 100, None);
    let module = std::path::PathBuf::from(late["module"].as_str().unwrap());
    let hidden = module.with_extension("hidden");
    std::fs::rename(&module, &hidden).unwrap();
    write_traffic(&file, &serde_json::json!([late]));
    runtime.wait_for_log(&["cannot be served yet; trying again", "hello-4.wasm"]);
    std::fs::rename(&hidden, &module).unwrap();
    until_answer(&client, &url, "hello-4").await;

    // A split, in place: exact shares and the revision header.
    let mut half_one = one.clone();
    half_one["percent"] = 50.into();
    let mut half_two = two.clone();
    half_two["percent"] = 50.into();
    write_traffic(&file, &serde_json::json!([half_one, half_two]));
    runtime.wait_for_log(&["serving the traffic file's revisions", "hello-1 50%, hello-2 50%"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (sent, failed) = loop_task.await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of {sent} requests failed: {failed:?}",
        failed.len()
    );
    assert!(sent > 50, "the loop ran: {sent} requests");
    let mut answers = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..100 {
        let response = client.get(&url).send().await.unwrap();
        let header = response.headers()["wasmless-revision"].to_str().unwrap().to_string();
        assert_eq!(response.text().await.unwrap().trim(), header);
        *answers.entry(header).or_default() += 1;
    }
    assert_eq!(answers, [("hello-1".into(), 50), ("hello-2".into(), 50)].into());
}

/// The pod of a new Function starts while its first build runs: its routes name nothing
/// (`[]`), and it opens its port only once the operator names a revision, then serves it.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_started_before_its_first_build_waits_for_a_revision_then_serves_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("traffic.json");
    write_traffic_text(&file, "[]");
    let one = revision(dir.path(), "hello-1", 100, None);
    let named_after = std::time::Duration::from_millis(700);
    let writer = std::thread::spawn({
        let file = file.clone();
        move || {
            std::thread::sleep(named_after);
            write_traffic(&file, &serde_json::json!([one]));
        }
    });
    let started = std::time::Instant::now();
    let runtime = Runtime::start_traffic_file(&file, &["--function", "hello"]);
    assert!(
        started.elapsed() >= named_after,
        "it served before a revision was named ({:?})",
        started.elapsed()
    );
    writer.join().unwrap();
    runtime.wait_for_log(&["no revision to serve yet"]);
    let (status, body) = get(runtime.url("/")).await;
    assert_eq!((status, body.trim()), (200, "hello-1"));
    assert_eq!(get(runtime.admin_url("/readyz")).await.0, 200);
}

/// A waiting pod told to stop (its Function deleted, or its build failed) stops at once.
#[test]
fn a_pod_waiting_for_its_first_build_stops_at_once_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("traffic.json");
    write_traffic_text(&file, "[]");
    let mut child = runtime_command_without_module()
        .arg("--traffic-file")
        .arg(&file)
        .args(["--function", "hello"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "it waits, not exits");
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still waiting 3 s after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn runtime_command_without_module() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wasmless-runtime"));
    command.args(["--bind", "127.0.0.1", "--port", "0", "--admin-port", "0"]);
    command
}

/// An operator's pod: its own routes annotation (empty until the operator switches it) and
/// its Function's routes ConfigMap, each `{"generation", "routes"}`: the highest generation
/// serves, the pod's own on a tie, and a pod started after a switch serves what the
/// Function's file says without its own.
#[tokio::test(flavor = "multi_thread")]
async fn of_two_traffic_files_the_higher_generation_serves_and_the_pods_own_wins_a_tie() {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own.json");
    let function = dir.path().join("function.json");
    let (one, two) = (
        revision(dir.path(), "hello-1", 100, None),
        revision(dir.path(), "hello-2", 100, None),
    );
    let document = |generation: u64, target: &serde_json::Value| serde_json::json!({ "generation": generation, "routes": [target] });
    write_traffic_text(&own, "");
    write_traffic(&function, &document(1, &two));
    let runtime = Runtime::start_revisions(
        [
            "--traffic-file".into(),
            format!("{},{}", own.display(), function.display()),
        ],
        &["--function", "hello"],
    );
    let client = client();
    let url = runtime.url("/");
    assert_eq!(
        get(url.clone()).await.1.trim(),
        "hello-2",
        "the Function's file, the pod's own empty"
    );

    // A switch in place: the pod's own file, a generation up.
    write_traffic(&own, &document(2, &one));
    until_answer(&client, &url, "hello-1").await;
    // The Function's file catches up, the same generation with other locations: the pod's own serves on.
    write_traffic(&function, &document(2, &two));
    tokio::time::sleep(wasmless_runtime::split::FOLLOW_INTERVAL * 5).await;
    assert_eq!(
        get(url.clone()).await.1.trim(),
        "hello-1",
        "a tie goes to the pod's own file"
    );
    // A later generation in the Function's file (its pod was not switched in time) serves.
    write_traffic(&function, &document(3, &two));
    until_answer(&client, &url, "hello-2").await;
    // A broken file is passed over with a clear error, and the good one serves on.
    write_traffic_text(&own, "{\"generation\": 9}");
    runtime.wait_for_log(&["the traffic file's new list cannot be served", "own.json", "routes"]);
    assert_eq!(get(url).await.1.trim(), "hello-2");
}
