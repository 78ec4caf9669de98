//! The `wasmless` binary as a person uses it: `dev` on an example, editing the source
//! while requests keep coming; `build` and `serve` as front ends.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "cli/runtime_args.rs"]
mod runtime_args;

#[path = "cli/files.rs"]
mod files;

fn wasmless() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wasmless"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process whose stderr is collected, killed when dropped.
struct Running {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Running {
    fn spawn(command: &mut Command) -> Self {
        let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let collected = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = collected.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        Self { child, stderr }
    }

    fn wait_for_stderr(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.stderr.lock().unwrap().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in:\n{}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn get(url: &str) -> Result<(u16, String), reqwest::Error> {
    let response = wasmless_testkit::http_client().get(url).send().await?;
    Ok((response.status().as_u16(), response.text().await?))
}

async fn wait_for_body(url: &str, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((200, body)) = get(url).await
            && body == expected
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered {expected:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn copy_example(name: &str, to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(from.join("function.yaml"), to.join("function.yaml")).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_serves_an_example_and_swaps_in_each_edit() {
    let dir = tempfile::tempdir().unwrap();
    let function = dir.path().join("hello-go");
    copy_example("hello-go", &function);
    let (port, admin_port) = (free_port(), free_port());
    let dev = Running::spawn(
        wasmless()
            .args([
                "dev",
                "--port",
                &port.to_string(),
                "--admin-port",
                &admin_port.to_string(),
            ])
            .arg(&function)
            .env("WASMLESS_BUILD_CACHE", dir.path().join("cache")),
    );
    let url = format!("http://127.0.0.1:{port}/");
    wait_for_body(&url, "This works!").await;
    dev.wait_for_stderr("serving hello on");
    let (status, metrics) = get(&format!("http://127.0.0.1:{admin_port}/metrics")).await.unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("wasmless_requests_total{"), "{metrics}");

    // Requests keep coming while the source changes: none fails.
    let hammer = {
        let url = url.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let (status, body) = get(&url).await.expect("the server keeps answering");
                assert_eq!(status, 200, "{body}");
                if body == "Edited!" {
                    return;
                }
                assert!(Instant::now() < deadline, "the edit was never served");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let yaml = function.join("function.yaml");
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(&yaml, text.replace("This works!", "Edited!")).unwrap();
    hammer.await.unwrap();

    // A broken edit is reported with the compiler's words; the last good version serves on.
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(
        &yaml,
        text.replace("w.Write([]byte(\"Edited!\"))", "w.Write([]byte(\"Edited!\")"),
    )
    .unwrap();
    dev.wait_for_stderr("syntax error");
    dev.wait_for_stderr("still serving the previous version");
    assert_eq!(get(&url).await.unwrap(), (200, "Edited!".to_string()));
}

#[test]
fn dev_explains_what_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let output = wasmless().arg("dev").arg(dir.path()).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no function.yaml"), "{stderr}");

    let yaml = dir.path().join("function.yaml");
    std::fs::write(
        &yaml,
        "apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: x}\nspec: {language: go}\n",
    )
    .unwrap();
    let output = wasmless().arg("dev").arg(&yaml).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("spec.source"), "{stderr}");
}

/// A directory with a go.mod is built as that module by `dev` and `build`; with no module
/// proxy set, both say which setting to set before compiling anything.
#[test]
fn dev_and_build_of_a_module_directory_name_the_proxy_setting() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../builder/tests/modules/uuid");
    let project = dir.path().join("uuidfn");
    std::fs::create_dir(&project).unwrap();
    for name in ["handler.go", "go.mod", "go.sum"] {
        std::fs::copy(fixture.join(name), project.join(name)).unwrap();
    }
    let output = dir.path().join("out.wasm");
    let wasmless = || {
        let mut command = wasmless();
        command
            .env_remove("WASMLESS_GOPROXY")
            .env("WASMLESS_BUILD_CACHE", dir.path().join("cache"));
        command
    };
    let runs = [
        wasmless().arg("dev").arg(&project).output().unwrap(),
        wasmless()
            .args(["build", "--language", "go", "--source"])
            .arg(&project)
            .arg("--output")
            .arg(&output)
            .output()
            .unwrap(),
    ];
    for run in runs {
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{stderr}");
        assert!(
            stderr.contains("go.mod requires github.com/google/uuid v1.6.0") && stderr.contains("set WASMLESS_GOPROXY"),
            "{stderr}"
        );
    }
}

/// `wasmless dev` on a directory with go.mod and go.sum: built through WASMLESS_GOPROXY (a
/// proxy served here on loopback from what scripts/goproxy.sh downloaded at set-up), served,
/// and rebuilt when go.sum changes — which, tampered, fails with go's checksum error while
/// the last good version serves on.
#[tokio::test(flavor = "multi_thread")]
async fn dev_builds_a_module_directory_through_the_proxy_and_watches_go_sum() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let served = Command::new(root.join("scripts/goproxy.sh"))
        .arg("dir")
        .output()
        .unwrap();
    let served = String::from_utf8_lossy(&served.stdout).trim().to_string();
    assert!(
        !served.is_empty(),
        "no Go modules for the tests: run scripts/goproxy.sh (scripts/setup.sh does)"
    );
    let proxy_port = free_port();
    let _proxy = Running::spawn(
        Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &proxy_port.to_string(),
                "--directory",
            ])
            .arg(&served),
    );
    let listening = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", proxy_port)).is_err() {
        assert!(Instant::now() < listening, "python3 -m http.server never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("uuidfn");
    std::fs::create_dir(&project).unwrap();
    for name in ["handler.go", "go.mod", "go.sum"] {
        std::fs::copy(root.join("builder/tests/modules/uuid").join(name), project.join(name)).unwrap();
    }
    let (port, admin_port) = (free_port(), free_port());
    let mut dev = Running::spawn(
        wasmless()
            .args([
                "dev",
                "--port",
                &port.to_string(),
                "--admin-port",
                &admin_port.to_string(),
            ])
            .arg(&project)
            .env("WASMLESS_GOPROXY", format!("http://127.0.0.1:{proxy_port}"))
            .env("WASMLESS_BUILD_CACHE", dir.path().join("cache")),
    );
    let url = format!("http://127.0.0.1:{port}/orders");
    // A debug build snapshots a Go reactor in about a minute; give it several.
    let deadline = Instant::now() + Duration::from_secs(600);
    let body = loop {
        if let Ok((200, body)) = get(&url).await {
            break body;
        }
        let exited = dev.child.try_wait().unwrap();
        assert!(
            Instant::now() < deadline && exited.is_none(),
            "uuidfn never answered (dev: {exited:?}):\n{}",
            dev.stderr.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(body.contains("named 90f6f92d-9225-5d4a-95e7-4b9f27291d32"), "{body}");
    dev.wait_for_stderr("serving uuidfn on");

    let sum = std::fs::read_to_string(project.join("go.sum")).unwrap();
    std::fs::write(project.join("go.sum"), sum.replace("h1:NIva", "h1:AAAA")).unwrap();
    dev.wait_for_stderr("checksum mismatch");
    dev.wait_for_stderr("still serving the previous version");
    assert_eq!(get(&url).await.unwrap().0, 200);
}

/// An upstream on loopback that answers every request with `body`, and keeps each
/// request's head for the test to read.
fn upstream(body: &'static str) -> (u16, Arc<Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = heads.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            kept.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (port, heads)
}

/// `wasmless dev` serves a Function as the cluster would: its `spec.outbound` allows the
/// calls it lists (and no others), the headers it injects are sent, and values that live in
/// Secrets are given with `--secret`; without them it says which flag to add.
#[tokio::test(flavor = "multi_thread")]
async fn dev_serves_outbound_calls_env_and_secrets_as_the_cluster_does() {
    let (upstream_port, heads) = upstream("rate 1.08");
    let upstream = format!("http://127.0.0.1:{upstream_port}");
    let dir = tempfile::tempdir().unwrap();
    let function = dir.path().join("rates");
    std::fs::create_dir(&function).unwrap();
    std::fs::write(
        function.join("function.yaml"),
        format!(
            r#"apiVersion: wasmless.io/v1alpha1
kind: Function
metadata: {{name: rates}}
spec:
  scale: {{min: 0, max: 2}}
  env:
    - {{name: UPSTREAM, value: "{upstream}"}}
    - name: TOKEN
      valueFrom: {{secretKeyRef: {{name: api, key: token}}}}
  outbound:
    allow: ["{upstream}"]
    headers:
      - url: "{upstream}"
        name: X-Api-Key
        allowInsecure: true
        valueFrom: {{secretKeyRef: {{name: api, key: key}}}}
  source: |
    package handlers

    import (
        "fmt"
        "io"
        "net/http"
        "os"
        "time"
    )

    func Handler(w http.ResponseWriter, r *http.Request) {{
        if r.URL.Path == "/events" {{
            w.Header().Set("Content-Type", "text/event-stream")
            for i := 1; i <= 4; i++ {{
                fmt.Fprintf(w, "data: %d\n\n", i)
                w.(http.Flusher).Flush()
                time.Sleep(300 * time.Millisecond)
            }}
            return
        }}
        target := os.Getenv("UPSTREAM") + "/rate"
        if r.URL.Path == "/elsewhere" {{
            target = "http://127.0.0.1:9/"
        }}
        resp, err := http.Get(target)
        if err != nil {{
            http.Error(w, err.Error(), http.StatusBadGateway)
            return
        }}
        defer resp.Body.Close()
        body, _ := io.ReadAll(resp.Body)
        fmt.Fprintf(w, "%s, token %s", body, os.Getenv("TOKEN"))
    }}
"#
        ),
    )
    .unwrap();

    // A Secret's value dev cannot read is said before anything is built.
    for (given, says, flag) in [
        (
            &[][..],
            format!("spec.outbound.headers[0] (X-Api-Key for {upstream}) takes key key of Secret api"),
            "--secret api/key=VALUE",
        ),
        (
            &["--secret", "api/key=k3y"][..],
            "spec.env TOKEN takes key token of Secret api".to_string(),
            "--secret api/token=VALUE",
        ),
    ] {
        let missing = wasmless().arg("dev").args(given).arg(&function).output().unwrap();
        let stderr = String::from_utf8_lossy(&missing.stderr);
        assert!(!missing.status.success(), "{stderr}");
        assert!(stderr.contains(&says) && stderr.contains(flag), "{stderr}");
        assert!(!stderr.contains("built sha256:"), "nothing is built first: {stderr}");
    }

    let (port, admin_port) = (free_port(), free_port());
    let dev = Running::spawn(
        wasmless()
            .args([
                "dev",
                "--port",
                &port.to_string(),
                "--admin-port",
                &admin_port.to_string(),
                "--secret",
                "api/token=t0k3n",
                "--secret",
                "api/key=k3y",
            ])
            .arg(&function)
            .env("WASMLESS_BUILD_CACHE", dir.path().join("cache")),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_for_body(&format!("{url}/"), "rate 1.08, token t0k3n").await;
    dev.wait_for_stderr("note: spec.scale is for the cluster");
    let head = heads.lock().unwrap().last().cloned().unwrap();
    assert!(head.starts_with("GET /rate "), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("x-api-key: k3y\r\n"),
        "the injected header: {head}"
    );

    // What spec.outbound does not list is refused, as on the cluster.
    let (status, body) = get(&format!("{url}/elsewhere")).await.unwrap();
    assert_eq!(status, 502, "{body}");
    assert!(
        body.contains("denied") && body.contains("spec.outbound.allow"),
        "{body}"
    );

    // A handler that flushes streams under dev as on the cluster: the first event leaves
    // before the three sleeps that come after it, not with the last.
    let mut events = wasmless_testkit::http_client()
        .get(format!("{url}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let first = events.chunk().await.unwrap().unwrap();
    assert_eq!(&first[..], b"data: 1\n\n");
    let at_first = Instant::now();
    let mut rest = Vec::new();
    while let Some(chunk) = events.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"data: 2\n\ndata: 3\n\ndata: 4\n\n");
    assert!(
        at_first.elapsed() >= Duration::from_millis(800),
        "the events came together"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn build_and_serve_are_the_builder_and_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("hello.wat");
    std::fs::write(
        &source,
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "Content-Type: text/plain\n\nhello from wat\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 41))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
"#,
    )
    .unwrap();
    let module = dir.path().join("hello.wasm");
    let output = wasmless()
        .args(["build", "--language", "wat", "--source"])
        .arg(&source)
        .arg("--output")
        .arg(&module)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let digest = result["digest"].as_str().unwrap();

    let port = free_port();
    let _serve = Running::spawn(
        wasmless()
            .args([
                "serve",
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--admin-port",
                "0",
            ])
            .arg("--module")
            .arg(&module)
            .args(["--module-digest", digest]),
    );
    wait_for_body(&format!("http://127.0.0.1:{port}/"), "hello from wat\n").await;
}

#[test]
fn crd_prints_the_committed_function_crd() {
    let output = wasmless().arg("crd").output().unwrap();
    assert!(output.status.success());
    let printed = String::from_utf8(output.stdout).unwrap();
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/function.yaml")).unwrap();
    assert_eq!(
        printed, committed,
        "`wasmless crd` prints what crds/function.yaml holds"
    );
    assert!(printed.contains("kind: CustomResourceDefinition") && printed.contains("shortNames:"));
}
