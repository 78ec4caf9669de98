//! Metrics, the Prometheus scrape of the admin port, and the request log.

use crate::support::*;
use serde_json::Value;
use std::time::Duration;
use wasmless_artifact::Digest;

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
    // A module read from a file, compiled here or found in the tests' compiled-code cache
    // (a hit is timed as the compile phase too): no fetch, no files; one compile, one link.
    let phase = |phase| sample(&metrics, "wasmless_load_phase_seconds_count", &[("phase", phase)]);
    assert_eq!((phase("compile"), phase("link")), (Some(1.0), Some(1.0)), "{metrics}");
    assert_eq!((phase("fetch"), phase("files")), (None, None), "{metrics}");
    // The process's memory as the kernel shares it, read at the scrape.
    let memory = |kind| {
        sample(
            &metrics,
            "wasmless_process_memory_bytes",
            &[("function", "counted"), ("kind", kind)],
        )
    };
    let (rss, pss, private) = (
        memory("rss").unwrap(),
        memory("pss").unwrap(),
        memory("private").unwrap(),
    );
    assert!(private > 0.0 && private <= pss && pss <= rss, "{metrics}");
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
