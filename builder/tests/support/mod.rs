//! Running the builder binary, reading the examples, serving modules in-process with
//! the runtime library.

pub use wasmless_testkit::{FakeApiServer, Registry, ServedFakeApi};

/// The in-memory API server on loopback, for the builder process to publish to.
pub async fn fake_api() -> ServedFakeApi {
    FakeApiServer::new().serve().await
}

/// The ConfigMaps stored in `namespace`, by name.
pub fn stored_configmaps(kube: &ServedFakeApi, namespace: &str) -> std::collections::BTreeMap<String, Value> {
    kube.api
        .objects(&format!("/namespaces/{namespace}/configmaps/"))
        .into_iter()
        .map(|object| {
            (
                object["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                object,
            )
        })
        .collect()
}

/// How many ConfigMap writes the builder sent, answered or refused.
pub fn configmap_writes(kube: &ServedFakeApi) -> usize {
    kube.api
        .writes()
        .iter()
        .filter(|r| r.resource() == "configmaps")
        .count()
}

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// An example's function.yaml: its language, inline source and env.
pub struct Example {
    pub language: String,
    pub source: String,
    pub env: Vec<(String, String)>,
}

pub fn example(name: &str) -> Example {
    let path = workspace_root().join("examples").join(name).join("function.yaml");
    let yaml: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let spec = &yaml["spec"];
    let source = spec["source"]
        .as_str()
        .or_else(|| spec["function"].as_str())
        .expect("inline source");
    let env = spec["env"]
        .as_sequence()
        .map(|list| {
            list.iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap().to_string(),
                        e["value"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Example {
        language: spec["language"].as_str().unwrap_or("go").to_string(),
        source: source.to_string(),
        env,
    }
}

pub fn builder() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wasmless-builder"));
    command
        .env_remove("WASMLESS_SOURCE_DIGEST")
        .env_remove("WASMLESS_GOPROXY")
        .env_remove("WASMLESS_CARGO_REGISTRY")
        .env("WASMLESS_TERMINATION_LOG", "/nonexistent/termination-log");
    command
}

/// `wasmless-builder build` of `source` into `output`, ready for more flags.
pub fn build_command(language: &str, source: &Path, output: &Path, cache: &Path) -> Command {
    let mut command = builder();
    command
        .args(["build", "--language", language, "--source"])
        .arg(source)
        .arg("--output")
        .arg(output)
        .arg("--cache-dir")
        .arg(cache);
    command
}

/// Runs `wasmless-builder build`; returns its output.
pub fn build(language: &str, source: &Path, output: &Path, cache: &Path, extra: &[&str]) -> Output {
    build_command(language, source, output, cache)
        .args(extra)
        .output()
        .unwrap()
}

/// The JSON result line of a successful build.
/// Asserts that a build failed as the source's fault (its own exit status, so a Job does
/// not retry it); its stderr.
pub fn failed_as_the_sources_fault(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        output.status.code(),
        Some(wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD),
        "{stderr}"
    );
    stderr
}

pub fn result(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "build failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

/// The runtime library serving one module on loopback until dropped.
pub struct Served {
    pub address: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Served {
    pub async fn start(module: &str, digest: &str, env: &[(String, String)]) -> Self {
        Self::start_with(module, digest, env, &[]).await
    }

    /// [`Served::start`] with more runtime flags.
    pub async fn start_with(module: &str, digest: &str, env: &[(String, String)], flags: &[&str]) -> Self {
        let mut args: Vec<String> = [
            "wasmless-runtime",
            "--module",
            module,
            "--module-digest",
            digest,
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--admin-port",
            "0",
            "--watch-interval",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (key, value) in env {
            args.push("--env".into());
            args.push(format!("{key}={value}"));
        }
        args.extend(flags.iter().map(|flag| flag.to_string()));
        let config = <wasmless_runtime::Config as clap::Parser>::parse_from(args);
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(error) = wasmless_runtime::serve(config, shutdown, |bound| {
                let _ = bound_tx.send(bound);
            })
            .await
            {
                panic!("the runtime failed: {error}");
            }
        });
        let bound = tokio::time::timeout(Duration::from_secs(120), bound_rx)
            .await
            .expect("runtime started")
            .unwrap();
        Self {
            address: bound.function,
            stop: Some(stop),
        }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = wasmless_testkit::http_client()
            .get(format!("http://{}{path}", self.address))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    pub async fn post(&self, path: &str, body: &str) -> (u16, String) {
        let response = wasmless_testkit::http_client()
            .post(format!("http://{}{path}", self.address))
            .header("x-example", "yes")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A Go module proxy the test serves itself on 127.0.0.1: static files in the layout
/// `go mod download` leaves in `$GOMODCACHE/cache/download`, which scripts/goproxy.sh filled
/// once for the handlers in builder/tests/modules/. Counts the requests it answered.
pub struct GoProxy {
    pub url: String,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl GoProxy {
    pub fn start() -> Self {
        let root = goproxy_dir();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let root = root.clone();
                let counted = counted.clone();
                std::thread::spawn(move || serve_file(stream, &root, &counted));
            }
        });
        Self { url, requests }
    }

    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One `GET /<path>` per connection (`Connection: close`), from `root`.
fn serve_file(stream: std::net::TcpStream, root: &Path, requests: &std::sync::atomic::AtomicUsize) {
    serve_file_or(stream, root, requests, &|_| None);
}

/// [`serve_file`], answering with `answer(path)` where it gives an answer.
fn serve_file_or(
    mut stream: std::net::TcpStream,
    root: &Path,
    requests: &std::sync::atomic::AtomicUsize,
    answer: &dyn Fn(&str) -> Option<Vec<u8>>,
) {
    use std::io::{BufRead, Write};
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        line.clear();
    }
    requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    let file = root.join(path.trim_start_matches('/'));
    let body = (!path.contains("..")).then(|| std::fs::read(&file).ok()).flatten();
    let (status, body) = match (answer(path), body) {
        (Some(answer), _) => ("200 OK", answer),
        (None, Some(body)) if file.is_file() => ("200 OK", body),
        _ => ("404 Not Found", b"not found\n".to_vec()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body));
}

/// A crates registry the test serves itself on 127.0.0.1: the static sparse index and
/// `.crate` files scripts/cargo-registry.sh wrote once for the handlers in
/// builder/tests/crates/, with the index's `config.json` naming this server. Records the
/// paths it was asked for.
pub struct CratesRegistry {
    /// The sparse index URL, `sparse+http://127.0.0.1:<port>/index/`.
    pub index: String,
    paths: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl CratesRegistry {
    pub fn start() -> Self {
        let root = cargo_registry_dir();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let config = format!(r#"{{"dl":"{base}/crates/{{crate}}/{{crate}}-{{version}}.crate"}}"#).into_bytes();
        let paths = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = paths.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (root, config, recorded) = (root.clone(), config.clone(), recorded.clone());
                std::thread::spawn(move || {
                    let answer = |path: &str| {
                        recorded.lock().unwrap().push(path.to_string());
                        (path == "/index/config.json").then(|| config.clone())
                    };
                    serve_file_or(stream, &root, &std::sync::atomic::AtomicUsize::new(0), &answer)
                });
            }
        });
        Self {
            index: format!("sparse+{base}/index/"),
            paths,
        }
    }

    /// The `.crate` files downloaded so far, by file name.
    pub fn downloads(&self) -> Vec<String> {
        let paths = self.paths.lock().unwrap();
        paths
            .iter()
            .filter(|p| p.starts_with("/crates/"))
            .map(|p| p.rsplit('/').next().unwrap().to_string())
            .collect()
    }
}

/// The directory scripts/cargo-registry.sh filled, as the script itself names it (`dir`):
/// its key covers the fixtures' Cargo.lock files and the tests' own crates it publishes.
pub fn cargo_registry_dir() -> PathBuf {
    let output = std::process::Command::new("bash")
        .arg(workspace_root().join("scripts/cargo-registry.sh"))
        .arg("dir")
        .env("WASMLESS_CACHE", wasmless_cache())
        .output()
        .expect("bash runs scripts/cargo-registry.sh");
    let registry = String::from_utf8(output.stdout).expect("a path");
    assert!(
        output.status.success() && !registry.trim().is_empty(),
        "no crates for the tests in {}: run scripts/cargo-registry.sh (scripts/setup.sh does), which downloads them once",
        wasmless_cache().join("cargo-registry").display()
    );
    PathBuf::from(registry.trim())
}

/// A Rust handler of builder/tests/crates/ (a Cargo package) copied into `dir`, to change.
pub fn crate_handler(name: &str, dir: &Path) -> PathBuf {
    let from = workspace_root().join("builder/tests/crates").join(name);
    let to = dir.join(name);
    for sub in ["", "src"] {
        std::fs::create_dir_all(to.join(sub)).unwrap();
        for entry in std::fs::read_dir(from.join(sub)).unwrap().flatten() {
            if entry.path().is_file() {
                std::fs::copy(entry.path(), to.join(sub).join(entry.file_name())).unwrap();
            }
        }
    }
    to
}

fn wasmless_cache() -> PathBuf {
    std::env::var_os("WASMLESS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap()).join(".cache/wasmless"))
}

/// The directory scripts/goproxy.sh filled: keyed, as there, by the fixtures' go.sum files.
pub fn goproxy_dir() -> PathBuf {
    let modules = workspace_root().join("builder/tests/modules");
    let mut names: Vec<_> = std::fs::read_dir(&modules)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("go.sum").exists())
        .collect();
    names.sort();
    let sums: Vec<u8> = names
        .iter()
        .flat_map(|p| std::fs::read(p.join("go.sum")).unwrap())
        .collect();
    let key = wasmless_artifact::Digest::of(&sums).hex()[..10].to_string();
    let cache = std::env::var_os("WASMLESS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").unwrap()).join(".cache/wasmless"));
    let modcache = cache.join("goproxy").join(key);
    assert!(
        modcache.join("filled").exists(),
        "no Go modules for the tests in {}: run scripts/goproxy.sh (scripts/setup.sh does), which downloads them once",
        modcache.display()
    );
    modcache.join("cache/download")
}

/// A handler of builder/tests/modules/ copied into `dir`, to change.
pub fn module_handler(name: &str, dir: &Path) -> PathBuf {
    let to = dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(workspace_root().join("builder/tests/modules").join(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to
}
