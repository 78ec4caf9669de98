//! Several revisions of one Function in one runtime (`--traffic`): requests split by their
//! shares, a tag reaching its revision, each revision's own metrics, and a split that
//! names a module that does not match its digest refused before anything serves.

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
        text.contains("canary, next"),
        "an unknown tag lists the known ones: {text}"
    );

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

fn runtime_command_without_module() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wasmless-runtime"));
    command.args(["--bind", "127.0.0.1", "--port", "0", "--admin-port", "0"]);
    command
}
