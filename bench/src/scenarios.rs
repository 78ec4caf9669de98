//! What is measured, each comparison a function: cold start, throughput and tail
//! latency, memory, build times, and the per-request cost of each ABI.

use crate::measure::{Load, Server, rss_mib, time_command, until_first_200, wrk};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use wasmless_artifact::Digest;
use wasmless_testkit::free_port;

pub struct Settings {
    pub root: PathBuf,
    pub bin_dir: PathBuf,
    pub wasmtime: Option<PathBuf>,
    pub quick: bool,
    pub load_seconds: u64,
    pub connections: u32,
    pub repetitions: usize,
    work: tempfile::TempDir,
}

impl Settings {
    pub fn new(root: PathBuf, bin_dir: PathBuf, wasmtime: Option<PathBuf>, quick: bool) -> anyhow::Result<Self> {
        let root = root.canonicalize()?;
        let bin_dir = bin_dir.canonicalize()?;
        Ok(Self {
            root,
            bin_dir,
            wasmtime: wasmtime.filter(|path| path.exists()),
            quick,
            load_seconds: if quick { 3 } else { 10 },
            connections: 16,
            repetitions: if quick { 3 } else { 7 },
            work: tempfile::tempdir()?,
        })
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    pub fn work(&self, name: &str) -> PathBuf {
        let path = self.work.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }
}

pub struct Timed {
    pub name: String,
    pub detail: String,
    pub time: Duration,
}

pub struct Throughput {
    pub name: String,
    pub load: Load,
    /// Peak resident memory of the server during the run, for our runtime.
    pub rss_idle_mib: Option<f64>,
    pub rss_peak_mib: Option<f64>,
}

pub struct BuildTimes {
    pub language: &'static str,
    pub cold: Option<Duration>,
    pub warm: Duration,
    pub cache_hit: Duration,
}

pub struct GoBreakdown {
    pub instantiate_us: f64,
    pub go_start_us: f64,
    pub handler_us: f64,
    pub total_us: f64,
}

pub struct Results {
    pub outbound: Vec<Throughput>,
    pub cold_starts: Vec<Timed>,
    pub throughput: Vec<Throughput>,
    pub builds: Vec<BuildTimes>,
    pub instantiate: Vec<(String, f64)>,
    pub go_breakdown: Option<GoBreakdown>,
}

/// A handler that calls an upstream on every request, as an API in front of another
/// service does: plain `http.Get`, the body copied through.
const OUTBOUND_HANDLER: &str = "package handlers\n\nimport (\n\t\"io\"\n\t\"net/http\"\n\t\"os\"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tresp, err := http.Get(\"http://127.0.0.1:\" + os.Getenv(\"UPSTREAM_PORT\") + \"/\")\n\tif err != nil {\n\t\thttp.Error(w, err.Error(), http.StatusBadGateway)\n\t\treturn\n\t}\n\tdefer resp.Body.Close()\n\tio.Copy(w, resp.Body)\n}\n";

const GOLESS_HANDLER: &str = "package handlers\n\nimport (\n\t\"net/http\"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tw.Write([]byte(\"This works!\"))\n}\n";

pub fn run_all(settings: &Settings) -> anyhow::Result<Results> {
    eprintln!("building the hello modules with wasmless-builder");
    let go_module = build_example(settings, "hello-go", "go")?;
    let rust_module = build_example(settings, "hello-rust", "rust")?;
    eprintln!("cold starts");
    let cold_starts = cold_starts(settings, &go_module, &rust_module)?;
    let go_cgi = build_goless_cgi(settings)?;
    eprintln!("throughput");
    let throughput = throughput(settings, &go_module, &go_cgi, &rust_module)?;
    eprintln!("build times");
    let builds = vec![build_times(settings, "go")?, build_times(settings, "rust")?];
    eprintln!("Go per-request breakdown");
    let go_breakdown = go_breakdown(settings, &go_cgi)
        .inspect_err(|error| eprintln!("  the Go breakdown failed: {error:#}"))
        .ok();
    eprintln!("outbound calls");
    let outbound = outbound(settings)?;
    Ok(Results {
        outbound,
        cold_starts,
        throughput,
        builds,
        instantiate: criterion_estimates(settings),
        go_breakdown,
    })
}

/// A module built once, with the digest the runtime checks, and the compiled code the
/// builder made for it (what a new pod loads).
pub struct Module {
    pub path: PathBuf,
    pub digest: Digest,
    pub code: Option<(PathBuf, Digest)>,
}

fn builder(settings: &Settings, language: &str, source: &Path, output: &Path, cache: &Path) -> Command {
    let mut command = Command::new(settings.bin("wasmless-builder"));
    command
        .args(["build", "--language", language, "--source"])
        .arg(source)
        .arg("--output")
        .arg(output)
        .arg("--cache-dir")
        .arg(cache)
        .env("WASMLESS_TERMINATION_LOG", "/nonexistent");
    command
}

pub(crate) fn example_source(settings: &Settings, example: &str) -> anyhow::Result<String> {
    let yaml = std::fs::read_to_string(settings.root.join("examples").join(example).join("function.yaml"))?;
    let (_, after) = yaml
        .split_once("source: |\n")
        .or_else(|| yaml.split_once("function: |\n"))
        .context("the example has no inline source")?;
    Ok(after
        .lines()
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n")
}

pub fn build_example(settings: &Settings, example: &str, language: &str) -> anyhow::Result<Module> {
    let dir = settings.work(example);
    let source = dir.join(format!("handler.{}", if language == "rust" { "rs" } else { language }));
    std::fs::write(&source, example_source(settings, example)?)?;
    let path = dir.join("module.wasm");
    time_command(&mut builder(
        settings,
        language,
        &source,
        &path,
        &settings.work("builder-cache"),
    ))?;
    let digest = Digest::of(&std::fs::read(&path)?);
    let code = path.with_extension("cwasm.lz4");
    let code_digest = Digest::of(&std::fs::read(&code).context("the builder wrote no compiled code")?);
    Ok(Module {
        path,
        digest,
        code: Some((code, code_digest)),
    })
}

/// A Goless handler built by the builder in the work folder `work`, as a build Job builds
/// it: the module, its digest, and its compiled code.
pub(crate) fn build_go_handler(settings: &Settings, work: &str, handler: &str) -> anyhow::Result<Module> {
    let dir = settings.work(work);
    let source = dir.join("handler.go");
    std::fs::write(&source, handler)?;
    let path = dir.join("module.wasm");
    time_command(&mut builder(
        settings,
        "go",
        &source,
        &path,
        &settings.work("builder-cache"),
    ))?;
    let code = path.with_extension("cwasm.lz4");
    Ok(Module {
        digest: Digest::of(&std::fs::read(&path)?),
        code: Some((code.clone(), Digest::of(&std::fs::read(&code)?))),
        path,
    })
}

/// The runtime as the operator starts it in a pod: with the builder's compiled code.
pub(crate) fn runtime_with_code(
    settings: &Settings,
    module: &Module,
    port: u16,
    cache: &Path,
) -> anyhow::Result<Command> {
    let (code, code_digest) = module.code.as_ref().context("a module without compiled code")?;
    let mut command = runtime(settings, module, port, Some(cache));
    command
        .arg("--code")
        .arg(code)
        .args(["--code-digest", &code_digest.to_string()]);
    Ok(command)
}

pub fn runtime(settings: &Settings, module: &Module, port: u16, cache: Option<&Path>) -> Command {
    runtime_with_admin(settings, module, port, free_port(), cache)
}

fn runtime_with_admin(settings: &Settings, module: &Module, port: u16, admin: u16, cache: Option<&Path>) -> Command {
    let mut command = Command::new(settings.bin("wasmless-runtime"));
    command
        .arg("--module")
        .arg(&module.path)
        .args([
            "--module-digest",
            &module.digest.to_string(),
            "--bind",
            "127.0.0.1",
            "--watch-interval",
            "0",
        ])
        // `--max-concurrency` stays at its default, 64: wrk keeps 16 requests in flight,
        // and the pool is sized from it, which every start pays for.
        .args(["--port", &port.to_string(), "--admin-port", &admin.to_string()])
        .env("RUST_LOG", "warn");
    if let Some(cache) = cache {
        command.arg("--cache-dir").arg(cache);
    }
    command
}

fn start_to_first_200(command: &mut Command, port: u16) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut server = Server::spawn(command)?;
    until_first_200(port, started, &mut server)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// A Goless project: the handler, and the `main` Goless generates around it.
fn goless_project(dir: &Path) -> anyhow::Result<()> {
    goless_project_with(dir, GOLESS_HANDLER)
}

/// A native Go server of `handler` as Goless runs it: `http.HandleFunc("/", ...)`.
pub(crate) fn goless_project_with(dir: &Path, handler: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("handlers"))?;
    std::fs::write(dir.join("handlers/handler.go"), handler)?;
    std::fs::write(dir.join("go.mod"), "module function\n\ngo 1.21\n")?;
    std::fs::write(
        dir.join("main.go"),
        "package main\n\nimport (\n\t\"function/handlers\"\n\t\"net/http\"\n\t\"os\"\n)\n\nfunc main() {\n\thttp.HandleFunc(\"/\", handlers.Handler)\n\thttp.ListenAndServe(\"127.0.0.1:\"+os.Getenv(\"PORT\"), nil)\n}\n",
    )?;
    Ok(())
}

pub(crate) fn go_command(args: &[&str], dir: &Path) -> Command {
    let mut command = Command::new(std::env::var_os("WASMLESS_GO").unwrap_or_else(|| "go".into()));
    command
        .args(args)
        .current_dir(dir)
        .envs([("GOFLAGS", "-mod=mod"), ("GOPROXY", "off"), ("GOTOOLCHAIN", "local")]);
    command
}

fn cold_starts(settings: &Settings, go: &Module, rust: &Module) -> anyhow::Result<Vec<Timed>> {
    let mut rows = Vec::new();

    // Goless's way: what its init container does on every pod start.
    let goless_reps = if settings.quick { 1 } else { 3 };
    let mut goless = Vec::new();
    let mut builds = Vec::new();
    for rep in 0..goless_reps {
        let dir = settings.work(&format!("goless-{rep}"));
        goless_project(&dir)?;
        let port = free_port();
        let started = Instant::now();
        let mut build = go_command(&["build", "-o", "server", "."], &dir);
        build.env("GOCACHE", dir.join("empty-gocache"));
        builds.push(time_command(&mut build)?);
        let mut server = Server::spawn(Command::new(dir.join("server")).env("PORT", port.to_string()))?;
        goless.push(until_first_200(port, started, &mut server)?);
    }
    rows.push(Timed {
        name: "Goless: go build (empty cache) + start".into(),
        detail: format!("go build alone: {:.1} s", median(builds).as_secs_f64()),
        time: median(goless),
    });

    for (name, module) in [("Goless sample (Go reactor)", go), ("Rust hello (component)", rust)] {
        let mut new_pods = Vec::new();
        for _ in 0..settings.repetitions {
            let empty_cache = tempfile::tempdir()?;
            let port = free_port();
            new_pods.push(start_to_first_200(
                &mut runtime_with_code(settings, module, port, empty_cache.path())?,
                port,
            )?);
        }
        rows.push(Timed {
            name: format!("wasmless-runtime, {name}, new pod (empty cache, precompiled code)"),
            detail: "loads the builder's code; compiles nothing".into(),
            time: median(new_pods),
        });
        let mut misses = Vec::new();
        let mut hits = Vec::new();
        for _ in 0..settings.repetitions.min(3) {
            let cache = tempfile::tempdir()?;
            let port = free_port();
            misses.push(start_to_first_200(
                &mut runtime(settings, module, port, Some(cache.path())),
                port,
            )?);
            for _ in 0..settings.repetitions / 2 + 1 {
                let port = free_port();
                hits.push(start_to_first_200(
                    &mut runtime(settings, module, port, Some(cache.path())),
                    port,
                )?);
            }
        }
        rows.push(Timed {
            name: format!("wasmless-runtime, {name}, no precompiled code, compiled-code cache miss"),
            detail: "compiles the module (a build without code)".into(),
            time: median(misses),
        });
        rows.push(Timed {
            name: format!("wasmless-runtime, {name}, restart (compiled-code cache hit)"),
            detail: "maps the code a previous start cached".into(),
            time: median(hits),
        });
    }
    Ok(rows)
}

/// Busy time per request for the yardstick rows of `throughput`.
pub const BUSY_MICROS: [u32; 2] = [10, 20];

/// The Goless sample as the Go path was before the reactor: a WASI command that speaks
/// CGI through the SDK's `ServeFunc`, Go starting up in every request.
fn build_goless_cgi(settings: &Settings) -> anyhow::Result<Module> {
    let dir = settings.work("goless-cgi");
    std::fs::create_dir_all(dir.join("handlers"))?;
    std::fs::write(dir.join("handlers/handler.go"), GOLESS_HANDLER)?;
    std::fs::write(
        dir.join("go.mod"),
        format!(
            "module function\n\ngo 1.21\n\nrequire wasmless.io/wasmless v0.0.0\n\nreplace wasmless.io/wasmless => {}\n",
            settings.root.join("sdk/go").canonicalize()?.display()
        ),
    )?;
    std::fs::write(
        dir.join("main.go"),
        "package main\n\nimport (\n\t\"function/handlers\"\n\t\"wasmless.io/wasmless\"\n)\n\nfunc main() { wasmless.ServeFunc(handlers.Handler) }\n",
    )?;
    let mut build = go_command(&["build", "-trimpath", "-ldflags=-s", "-o", "module.wasm", "."], &dir);
    build.envs([("GOOS", "wasip1"), ("GOARCH", "wasm"), ("GOWORK", "off")]);
    time_command(&mut build)?;
    let path = dir.join("module.wasm");
    Ok(Module {
        digest: Digest::of(&std::fs::read(&path)?),
        path,
        code: None,
    })
}

fn throughput(settings: &Settings, go: &Module, go_cgi: &Module, rust: &Module) -> anyhow::Result<Vec<Throughput>> {
    let mut rows = Vec::new();
    let mut measure = |name: &str, command: &mut Command, port: u16, ours: bool| -> anyhow::Result<()> {
        if ours {
            // A first start fills the compile cache: the process measured loads code, as
            // a pod does, and its memory is not that of a compilation that happened once.
            let mut first = Server::spawn(command)?;
            until_first_200(port, Instant::now(), &mut first)?;
            drop(first);
        }
        let started = Instant::now();
        let mut server = Server::spawn(command)?;
        until_first_200(port, started, &mut server)?;
        let idle = ours.then(|| rss_mib(server.pid()).0);
        wrk(port, 1, settings.connections)?; // warm-up
        let load = wrk(port, settings.load_seconds, settings.connections)?;
        let peak = ours.then(|| rss_mib(server.pid()).1);
        eprintln!("  {name}: {:.0} req/s", load.requests_per_second);
        rows.push(Throughput {
            name: name.to_string(),
            load,
            rss_idle_mib: idle,
            rss_peak_mib: peak,
        });
        Ok(())
    };

    let port = free_port();
    measure(
        "native axum hello (the ceiling)",
        Command::new(settings.bin("axum-hello")).arg(port.to_string()),
        port,
        false,
    )?;

    // What a fixed cost per request does to a native server on this machine: the
    // yardstick for the per-request cost of a fresh instance (see `criterion_estimates`).
    for busy_micros in BUSY_MICROS {
        let port = free_port();
        measure(
            &format!("native axum hello + {busy_micros} µs of work per request"),
            Command::new(settings.bin("axum-hello")).args([port.to_string(), busy_micros.to_string()]),
            port,
            false,
        )?;
    }

    let dir = settings.work("goless-native");
    goless_project(&dir)?;
    time_command(&mut go_command(&["build", "-o", "server", "."], &dir))?;
    let port = free_port();
    measure(
        "native Go net/http, Goless handler (what Goless runs)",
        Command::new(dir.join("server")).env("PORT", port.to_string()),
        port,
        false,
    )?;

    if let Some(wasmtime) = &settings.wasmtime {
        let port = free_port();
        measure(
            "wasmtime serve 48, Rust hello component (defaults)",
            Command::new(wasmtime)
                .args(["serve", "-Scli", "--addr", &format!("127.0.0.1:{port}")])
                .arg(&rust.path),
            port,
            false,
        )?;
    }
    let cache = settings.work("throughput-cache");
    let port = free_port();
    measure(
        "wasmless-runtime, Rust hello component",
        &mut runtime(settings, rust, port, Some(&cache)),
        port,
        true,
    )?;
    let port = free_port();
    measure(
        "wasmless-runtime, Goless sample (Go reactor, a fresh instance per request)",
        &mut runtime(settings, go, port, Some(&cache)),
        port,
        true,
    )?;
    let port = free_port();
    measure(
        "wasmless-runtime, Goless sample (Go reactor, shared instances: --isolation shared)",
        runtime(settings, go, port, Some(&cache)).args(["--isolation", "shared"]),
        port,
        true,
    )?;
    let port = free_port();
    measure(
        "wasmless-runtime, Goless sample (Go over CGI, the path before the reactor)",
        &mut runtime(settings, go_cgi, port, Some(&cache)),
        port,
        true,
    )?;
    Ok(rows)
}

fn build_times(settings: &Settings, language: &'static str) -> anyhow::Result<BuildTimes> {
    let example = if language == "go" { "hello-go" } else { "hello-rust" };
    let dir = settings.work(&format!("build-{language}"));
    let extension = if language == "go" { "go" } else { "rs" };
    let source = dir.join(format!("handler.{extension}"));
    let text = example_source(settings, example)?;
    let cache = dir.join("builder-cache");
    let output = dir.join("out.wasm");
    let gocache = dir.join("gocache");
    let run = |text: &str, fresh_go_cache: bool| -> anyhow::Result<Duration> {
        std::fs::write(&source, text)?;
        let mut command = builder(settings, language, &source, &output, &cache);
        if fresh_go_cache {
            command.env("GOCACHE", &gocache);
        }
        time_command(&mut command)
    };
    // Cold: nothing compiled before (an empty Go build cache, an empty Rust target).
    let cold = if settings.quick { None } else { Some(run(&text, true)?) };
    if settings.quick {
        run(&text, false)?;
    }
    // Warm: a changed source, the toolchain's caches full.
    let warm = run(&format!("{text}\n// changed\n"), !settings.quick)?;
    // Hit: the same source again.
    let cache_hit = run(&format!("{text}\n// changed\n"), !settings.quick)?;
    Ok(BuildTimes {
        language,
        cold,
        warm,
        cache_hit,
    })
}

/// Mean time per instantiate-and-call from the runtime's criterion bench, if it ran.
fn criterion_estimates(settings: &Settings) -> Vec<(String, f64)> {
    let dir = settings.bin_dir.join("../criterion/instantiate_and_call");
    let mut rows = Vec::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let read = |name: &str| -> Option<serde_json::Value> {
            serde_json::from_str(&std::fs::read_to_string(entry.path().join("new").join(name)).ok()?).ok()
        };
        if let (Some(benchmark), Some(estimates)) = (read("benchmark.json"), read("estimates.json")) {
            let name = benchmark["function_id"].as_str().unwrap_or("?").to_string();
            rows.push((
                name,
                estimates["mean"]["point_estimate"].as_f64().unwrap_or(0.0) / 1000.0,
            ));
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    rows
}

/// Splits the Go path's per-request time into instantiation, Go's own start-up
/// (a module that links the same packages but answers at once) and the handler.
fn go_breakdown(settings: &Settings, go: &Module) -> anyhow::Result<GoBreakdown> {
    let dir = settings.work("go-start-only");
    std::fs::write(dir.join("go.mod"), "module startonly\n\ngo 1.21\n")?;
    std::fs::write(
        dir.join("main.go"),
        "package main\n\nimport (\n\t_ \"net/http\"\n\t_ \"net/http/cgi\"\n\t\"os\"\n)\n\nfunc main() { os.Stdout.Write([]byte(\"Content-Type: text/plain\\n\\nok\")) }\n",
    )?;
    let mut build = go_command(&["build", "-trimpath", "-ldflags=-s", "-o", "start.wasm", "."], &dir);
    build.envs([("GOOS", "wasip1"), ("GOARCH", "wasm")]);
    time_command(&mut build)?;
    let start_path = dir.join("start.wasm");
    let start_only = Module {
        digest: Digest::of(&std::fs::read(&start_path)?),
        path: start_path,
        code: None,
    };

    // Means over 300 sequential requests, the first (a cold slot) left out. Noise only
    // adds time, so of three alternating rounds the least mean is kept.
    let per_request = |module: &Module| -> anyhow::Result<(f64, f64)> {
        let (port, admin) = (free_port(), free_port());
        let mut command = runtime_with_admin(settings, module, port, admin, Some(&settings.work("breakdown-cache")));
        let started = Instant::now();
        let mut server = Server::spawn(&mut command)?;
        until_first_200(port, started, &mut server)?;
        let before = metrics_text(admin)?;
        for _ in 0..300 {
            if !crate::measure::get_ok(port) {
                bail!("a request failed");
            }
        }
        let after = metrics_text(admin)?;
        let mean = |name: &str| -> f64 {
            let value = |metrics: &str, suffix: &str| {
                metrics
                    .lines()
                    .filter(|l| l.starts_with(&format!("{name}_{suffix}")))
                    .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                    .sum::<f64>()
            };
            (value(&after, "sum") - value(&before, "sum")) / (value(&after, "count") - value(&before, "count")) * 1e6
        };
        Ok((
            mean("wasmless_request_duration_seconds"),
            mean("wasmless_instantiate_duration_seconds"),
        ))
    };
    let least = |a: (f64, f64), b: (f64, f64)| (a.0.min(b.0), a.1.min(b.1));
    let (mut go_times, mut start_times) = ((f64::MAX, f64::MAX), (f64::MAX, f64::MAX));
    for _ in 0..3 {
        go_times = least(go_times, per_request(go)?);
        start_times = least(start_times, per_request(&start_only)?);
    }
    let ((total_us, instantiate_us), (start_total_us, start_instantiate_us)) = (go_times, start_times);
    Ok(GoBreakdown {
        instantiate_us,
        go_start_us: start_total_us - start_instantiate_us,
        handler_us: total_us - start_total_us,
        total_us,
    })
}

fn metrics_text(admin_port: u16) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", admin_port))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

/// Only the outbound comparison: what `--only outbound` runs.
pub fn run_outbound(settings: &Settings) -> anyhow::Result<Vec<Throughput>> {
    outbound(settings)
}

/// A handler calling an upstream (the native axum hello, on loopback) on every request:
/// under native Go net/http (its default transport and pool), and in our runtime as a
/// new pod runs it (the builder's reactor and code, a fresh instance per request, the
/// call through the host's pooled client and allow-list), and with shared instances.
fn outbound(settings: &Settings) -> anyhow::Result<Vec<Throughput>> {
    let upstream_port = free_port();
    let mut upstream = Server::spawn(Command::new(settings.bin("axum-hello")).arg(upstream_port.to_string()))?;
    until_first_200(upstream_port, Instant::now(), &mut upstream)?;
    let upstream_env = upstream_port.to_string();

    let mut rows = Vec::new();
    let mut measure = |name: &str, command: &mut Command, port: u16| -> anyhow::Result<()> {
        let started = Instant::now();
        let mut server = Server::spawn(command)?;
        until_first_200(port, started, &mut server)?;
        wrk(port, 1, settings.connections)?; // warm-up
        let load = wrk(port, settings.load_seconds, settings.connections)?;
        if load.errors > 0 {
            bail!("{name}: {} errors under load", load.errors);
        }
        eprintln!("  {name}: {:.0} req/s", load.requests_per_second);
        rows.push(Throughput {
            name: name.to_string(),
            load,
            rss_idle_mib: None,
            rss_peak_mib: None,
        });
        Ok(())
    };

    let dir = settings.work("outbound-native");
    goless_project_with(&dir, OUTBOUND_HANDLER)?;
    time_command(&mut go_command(&["build", "-o", "server", "."], &dir))?;
    let port = free_port();
    measure(
        "native Go net/http, handler calling the upstream with http.Get",
        Command::new(dir.join("server"))
            .env("PORT", port.to_string())
            .env("UPSTREAM_PORT", &upstream_env),
        port,
    )?;

    let module = build_go_handler(settings, "outbound-ours", OUTBOUND_HANDLER)?;
    let allow = format!("http://127.0.0.1:{upstream_port}");
    let env = format!("UPSTREAM_PORT={upstream_port}");
    let cache = settings.work("outbound-cache");
    for (name, isolation) in [
        (
            "wasmless-runtime, the same handler (Go reactor, a fresh instance per request)",
            "request",
        ),
        (
            "wasmless-runtime, the same handler (Go reactor, shared instances)",
            "shared",
        ),
    ] {
        let port = free_port();
        measure(
            name,
            runtime_with_code(settings, &module, port, &cache)?.args([
                "--outbound-allow",
                &allow,
                "--env",
                &env,
                "--isolation",
                isolation,
            ]),
            port,
        )?;
    }
    Ok(rows)
}
