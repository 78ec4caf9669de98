//! Building the test handlers with the real toolchains, and running the real
//! `wasmless-runtime` binary on loopback.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};
use wasmless_artifact::Digest;
pub use wasmless_testkit::{Registry, free_port};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn handlers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/handlers")
}

fn build_dir() -> PathBuf {
    let dir = workspace_root().join("target/test-handlers");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One compiled-code cache for every runtime [`runtime_command`] starts (`--cache-dir`,
/// keyed by the module's digest and the engine's settings, written atomically): without it
/// each runtime compiles its module again, and compiling the same Go modules was four
/// fifths of this binary's CPU. A hit skips reading and checking the module, so the
/// directory is this build's of the runtime alone (a change to how modules load is tried
/// on each module's first load), and an earlier build's is removed. A test that needs a
/// cache of its own passes `--cache-dir`; one that needs none calls
/// [`without_shared_cache`]. Pools and splits keep none: their tests swap a module's bytes
/// under its pinned digest, which a cache hit never reads.
fn shared_code_cache() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let runtime = std::fs::metadata(env!("CARGO_BIN_EXE_wasmless-runtime")).unwrap();
        let built = runtime
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let this_build = format!("{}-{}", built.as_nanos(), runtime.len());
        let caches = build_dir().join("code-cache");
        for entry in std::fs::read_dir(&caches).into_iter().flatten().flatten() {
            if entry.file_name() != this_build.as_str() {
                let path = entry.path();
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
        caches.join(this_build)
    })
    .clone()
}

/// Gives `command` the shared compiled-code cache, through the flag's environment variable
/// so that a `--cache-dir` in the test's own arguments wins.
fn with_shared_cache(command: &mut Command) -> &mut Command {
    command.env("WASMLESS_CACHE_DIR", shared_code_cache())
}

/// `command` with no compiled-code cache at all, as a runtime started without `--cache-dir`.
pub fn without_shared_cache(command: &mut Command) -> &mut Command {
    command.env_remove("WASMLESS_CACHE_DIR")
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The Rust test handler, built with the SDK for wasm32-wasip2.
pub fn rust_echo() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target_dir = build_dir().join("rust");
            run(Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args([
                    "build",
                    "--release",
                    "--quiet",
                    "--target",
                    "wasm32-wasip2",
                    "--target-dir",
                ])
                .arg(&target_dir)
                .arg("--manifest-path")
                .arg(handlers_dir().join("rust-echo/Cargo.toml")));
            target_dir.join("wasm32-wasip2/release/rust_echo.wasm")
        })
        .clone()
}

/// A Go project in `target/test-handlers/<kind>/<name>` holding the test handler `name`
/// as its `handlers` package, the Go SDK from this checkout, and `main_go`.
fn go_project(kind: &str, name: &str, main_go: &str) -> PathBuf {
    let project = build_dir().join(kind).join(name);
    std::fs::create_dir_all(project.join("handlers")).unwrap();
    std::fs::copy(
        handlers_dir().join(name).join("handler.go"),
        project.join("handlers/handler.go"),
    )
    .unwrap();
    std::fs::write(
        project.join("go.mod"),
        format!(
            "module function\n\ngo 1.21\n\nrequire wasmless.io/wasmless v0.0.0\n\nreplace wasmless.io/wasmless => {}\n",
            workspace_root().join("sdk/go").display()
        ),
    )
    .unwrap();
    std::fs::write(project.join("main.go"), main_go).unwrap();
    project
}

fn go_command() -> String {
    std::env::var("WASMLESS_GO").unwrap_or_else(|_| "go".into())
}

/// `go build <args>` in `project` for wasip1, offline, with this checkout's SDK.
fn go_build(project: &Path, args: &[&std::ffi::OsStr]) {
    run(Command::new(go_command())
        .current_dir(project)
        .arg("build")
        .args(args)
        .arg(".")
        .envs([
            ("GOOS", "wasip1"),
            ("GOARCH", "wasm"),
            ("GOFLAGS", "-mod=mod"),
            ("GOPROXY", "off"),
            ("GOTOOLCHAIN", "local"),
            ("GOWORK", "off"),
        ]));
}

/// A Goless handler (`package handlers`, `func Handler`) built as Goless users'
/// code is: with a generated `main` that calls the Go SDK, `GOOS=wasip1`.
pub fn go_handler(name: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap();
    if let Some((_, path)) = built.iter().find(|(n, _)| n == name) {
        return path.clone();
    }
    let project = go_project(
        "go",
        name,
        "package main\n\nimport (\n\t\"function/handlers\"\n\t\"wasmless.io/wasmless\"\n)\n\nfunc main() { wasmless.ServeFunc(handlers.Handler) }\n",
    );
    let output = project.join("handler.wasm");
    go_build(
        &project,
        &[
            "-trimpath".as_ref(),
            "-ldflags=-s".as_ref(),
            "-o".as_ref(),
            output.as_os_str(),
        ],
    );
    built.push((name.to_string(), output.clone()));
    output
}

/// The builder's overlay of Go's standard library, the same file.
#[path = "../../../builder/src/toolchain/go_overlay.rs"]
#[allow(dead_code)]
mod go_overlay;

/// A Goless handler built as wasmless-builder builds Go: a reactor (`-buildmode=c-shared`)
/// registered with the SDK's `reactor` package, with the builder's overlay of the standard
/// library (the SDK's file added to Go's package runtime, its net/http transport hook,
/// package net's sockets refused), then snapshotted. `snapshot: false` leaves `_initialize` in (the
/// runtime then runs Go's start-up per request).
pub fn go_reactor(name: &str, snapshot: bool) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let key = format!("{name}-{snapshot}");
    let mut built = BUILT.lock().unwrap();
    if let Some((_, path)) = built.iter().find(|(n, _)| *n == key) {
        return path.clone();
    }
    let project = go_project(
        "go-reactor",
        name,
        "package main\n\nimport (\n\t\"function/handlers\"\n\t\"wasmless.io/wasmless/reactor\"\n)\n\nfunc init() { reactor.HandleFunc(handlers.Handler) }\n\nfunc main() {}\n",
    );
    let goroot = Command::new(go_command()).args(["env", "GOROOT"]).output().unwrap();
    let goroot = String::from_utf8(goroot.stdout).unwrap();
    let overlay = go_overlay::write(Path::new(goroot.trim()), &project).unwrap();
    let output = project.join("reactor.wasm");
    go_build(
        &project,
        &[
            "-buildmode=c-shared".as_ref(),
            "-trimpath".as_ref(),
            "-ldflags=-s".as_ref(),
            "-overlay".as_ref(),
            overlay.as_os_str(),
            "-o".as_ref(),
            output.as_os_str(),
        ],
    );
    let path = if snapshot {
        let made = wasmless_host::snapshot::snapshot(&std::fs::read(&output).unwrap()).unwrap();
        let path = project.join("snapshot.wasm");
        std::fs::write(&path, made.wasm).unwrap();
        path
    } else {
        output
    };
    built.push((key, path.clone()));
    path
}

/// A WASI command that writes `output` to stdout: a CGI response, or not.
pub fn cgi_wat(output: &str) -> Vec<u8> {
    let escaped: String = output.bytes().map(|b| format!("\\{b:02x}")).collect();
    wat::parse_str(format!(
        r#"(module
            (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (data (i32.const 64) "{escaped}")
            (func (export "_start")
                (i32.store (i32.const 0) (i32.const 64))
                (i32.store (i32.const 4) (i32.const {len}))
                (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#,
        len = output.len()
    ))
    .unwrap()
}

/// A WASI command whose `_start` body is `body`.
pub fn command_wat(body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
            (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
            (memory (export "memory") 1)
            (func (export "_start") {body}))"#
    ))
    .unwrap()
}

/// Writes a module into `dir` with its `.sha256` beside it.
pub fn write_module(dir: &Path, name: &str, bytes: &[u8]) -> (PathBuf, Digest) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let digest = Digest::of(bytes);
    (path, digest)
}

pub struct Runtime {
    child: Child,
    pub function: SocketAddr,
    pub admin: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Runtime {
    /// Starts the runtime on loopback with ports chosen by the OS, and waits until it
    /// says it is serving.
    pub fn start(module: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Self {
        Self::start_with_env(module, args, &[])
    }

    /// [`Runtime::start`] with these environment variables set for the runtime.
    pub fn start_with_env(module: impl AsRef<std::ffi::OsStr>, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = runtime_command(module, args);
        command.envs(env.iter().copied());
        Self::spawn(command)
    }

    /// The runtime serving the pool table in `dir` (`--pool`), its admin port chosen by the OS,
    /// on loopback unless `args` say `--bind`; Functions load on their first request unless
    /// `args` say `--pool-load-ahead true`.
    pub fn start_pool(dir: &Path, args: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wasmless-runtime"));
        let bind: &[&str] = if args.contains(&"--bind") {
            &[]
        } else {
            &["--bind", "127.0.0.1"]
        };
        command
            .arg("--pool")
            .arg(dir)
            .args(bind)
            .args(["--admin-port", "0"])
            .args(lazy_unless_told(args))
            .args(args)
            .env("RUST_LOG", "info");
        Self::spawn(command)
    }

    /// The runtime serving several revisions side by side (`--traffic <json>`), on
    /// loopback with ports chosen by the OS.
    pub fn start_split(traffic: &serde_json::Value, args: &[&str]) -> Self {
        Self::start_revisions(["--traffic".into(), traffic.to_string()], args)
    }

    /// The runtime following `--traffic-file <file>`.
    pub fn start_traffic_file(file: &std::path::Path, args: &[&str]) -> Self {
        Self::start_revisions(["--traffic-file".into(), file.display().to_string()], args)
    }

    pub fn start_revisions(flag: [String; 2], args: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wasmless-runtime"));
        command
            .args(flag)
            .args(["--bind", "127.0.0.1", "--port", "0", "--admin-port", "0"])
            .args(args)
            .env("RUST_LOG", "info");
        Self::spawn(command)
    }

    /// The runtime with `--pool <source>` (`api:<selector>`, or a directory) and these
    /// environment variables, its admin port chosen by the OS.
    pub fn start_pool_from(source: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wasmless-runtime"));
        command
            .args(["--pool", source])
            .args(["--bind", "127.0.0.1", "--admin-port", "0"])
            .args(lazy_unless_told(args))
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info");
        Self::spawn(command)
    }

    /// The runtime `command` starts (see [`runtime_command`]), once it serves.
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (serving_tx, serving_rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        for (stream, is_stdout) in [
            (Box::new(stdout) as Box<dyn Read + Send>, true),
            (Box::new(stderr), false),
        ] {
            let logs = logs.clone();
            let serving_tx = serving_tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if is_stdout
                        && let Ok(json) = serde_json::from_str::<serde_json::Value>(&line)
                        && json["message"] == "serving"
                    {
                        let addr = |key: &str| json[key].as_str().unwrap().parse::<SocketAddr>().unwrap();
                        let _ = serving_tx.send((addr("address"), addr("admin")));
                    }
                    logs.lock().unwrap().push(line);
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok((function, admin)) = serving_rx.recv_timeout(Duration::from_millis(100)) {
                return Self {
                    child,
                    function,
                    admin,
                    logs,
                };
            }
            if let Some(status) = child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "runtime exited with {status} before serving:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
            assert!(
                Instant::now() < deadline,
                "runtime did not start serving:\n{}",
                logs.lock().unwrap().join("\n")
            );
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.function)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// Waits for a log line containing every one of `needles`.
    pub fn wait_for_log(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(line) = self
                .logs()
                .into_iter()
                .find(|line| needles.iter().all(|n| line.contains(n)))
            {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needles:?} in:\n{}",
                self.logs().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn terminate(&mut self) {
        send_signal(self.child.id(), "TERM");
    }

    pub fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "runtime did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory of the process, from /proc.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    /// CPU time (user + system) the process has used, from /proc.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_millis(ticks * 10)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn send_signal(pid: u32, signal: &str) {
    run(Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()));
}

pub fn runtime_command(module: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wasmless-runtime"));
    with_shared_cache(&mut command);
    command
        .arg("--module")
        .arg(module)
        .args(["--bind", "127.0.0.1", "--port", "0", "--admin-port", "0"])
        .args(args)
        .env("RUST_LOG", "info");
    command
}

/// Runs the runtime expecting it to refuse to start; returns what it printed.
pub fn start_expecting_failure(module: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    let output = runtime_command(module, args).output().unwrap();
    assert!(!output.status.success(), "the runtime started but should have refused");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

pub fn client() -> reqwest::Client {
    wasmless_testkit::http_client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Value of one sample in Prometheus text, e.g.
/// `sample(&text, "wasmless_requests_total", &[("status", "200")])`.
pub fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
        if series_name != name {
            return None;
        }
        labels
            .iter()
            .all(|(key, val)| series_labels.contains(&format!("{key}=\"{val}\"")))
            .then(|| value.parse().ok())?
    })
}

/// GET `url`: the status and the body.
pub async fn get(url: String) -> (u16, String) {
    let response = client().get(url).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Path of the Rust handler, with its digest file beside it (the runtime needs one).
pub fn rust_echo_with_digest() -> std::path::PathBuf {
    with_digest_file(rust_echo())
}

pub fn go_with_digest(name: &str) -> std::path::PathBuf {
    with_digest_file(go_handler(name))
}

pub fn with_digest_file(module: std::path::PathBuf) -> std::path::PathBuf {
    let digest = Digest::of(&std::fs::read(&module).unwrap());
    let mut sidecar = module.clone().into_os_string();
    sidecar.push(".sha256");
    std::fs::write(sidecar, digest.to_string()).unwrap();
    module
}

/// The builder's step, as the builder runs it: the module compiled for the portable
/// target, in the artifact format.
pub fn precompile_for(engine: &wasmtime::Engine, module: &[u8]) -> Vec<u8> {
    let abi = wasmless_host::abi::detect(module).unwrap();
    wasmless_host::precompiled::precompile(engine, abi, module, Digest::of(module)).unwrap()
}

pub fn portable_engine() -> wasmtime::Engine {
    wasmless_host::precompiled::precompile_engine().unwrap()
}

/// `--pool-load-ahead false` unless `args` set it: the pool tests look at what a first request
/// loads.
fn lazy_unless_told(args: &[&str]) -> &'static [&'static str] {
    if args.contains(&"--pool-load-ahead") {
        &[]
    } else {
        &["--pool-load-ahead", "false"]
    }
}
