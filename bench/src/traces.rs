//! What tracing costs a request: the Rust hello with tracing off, on (every request
//! sampled, exported to a real OpenTelemetry Collector on loopback) and on with the
//! collector down (every span dropped). `--only traces` runs it alone.

use crate::measure::{Server, rss_mib, until_first_200, wrk};
use crate::scenarios::{Settings, Throughput, build_example, runtime};
use anyhow::{Context, bail};
use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};
use wasmless_testkit::free_port;

pub const HEADING: &str = "## Traces: off, on, collector down";

/// The collector the runtime's trace test uses (scripts/lib.sh builds it once).
fn otelcol(settings: &Settings) -> anyhow::Result<String> {
    if let Ok(path) = std::env::var("WASMLESS_OTELCOL") {
        return Ok(path);
    }
    let output = Command::new("bash")
        .args(["-c", ". scripts/lib.sh && otelcol_tool"])
        .current_dir(&settings.root)
        .output()
        .context("cannot run scripts/lib.sh")?;
    if !output.status.success() {
        bail!(
            "cannot build the collector: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_string())
}

pub fn run(settings: &Settings) -> anyhow::Result<Vec<Throughput>> {
    let rust = build_example(settings, "hello-rust", "rust")?;
    let dir = tempfile::tempdir()?;
    let collector_port = free_port();
    let config = dir.path().join("otelcol.yaml");
    // The file exporter, as in the test: the collector does the work a real one would.
    std::fs::write(
        &config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{collector_port}\n\
             exporters:\n  file:\n    path: {}\n\
             service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
            dir.path().join("spans.jsonl").display()
        ),
    )?;
    let _collector = Server::spawn(Command::new(otelcol(settings)?).arg(format!("--config={}", config.display())))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", collector_port)).is_err() {
        if Instant::now() > deadline {
            bail!("the collector did not listen");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let up = format!("http://127.0.0.1:{collector_port}");
    // Nothing listens there: every export is refused at once.
    let down = format!("http://127.0.0.1:{}", free_port());
    let cache = settings.work("traces-cache");
    // A first start fills the compile cache: each row's process loads code, as a pod does.
    let port = free_port();
    let mut first = Server::spawn(&mut runtime(settings, &rust, port, Some(&cache)))?;
    until_first_200(port, Instant::now(), &mut first)?;
    drop(first);
    let mut rows = Vec::new();
    for (name, endpoint) in [
        ("wasmless-runtime, Rust hello, tracing off", None),
        (
            "the same, tracing on (every request sampled, exported to the collector)",
            Some(&up),
        ),
        ("the same, tracing on, the collector down (spans dropped)", Some(&down)),
    ] {
        let port = free_port();
        let mut command = runtime(settings, &rust, port, Some(&cache));
        if let Some(endpoint) = endpoint {
            command.args(["--otlp-endpoint", endpoint]);
        }
        let started = Instant::now();
        let mut server = Server::spawn(&mut command)?;
        until_first_200(port, started, &mut server)?;
        wrk(port, 1, settings.connections)?; // warm-up
        let load = wrk(port, settings.load_seconds, settings.connections)?;
        if load.errors > 0 {
            bail!("{name}: {} errors under load", load.errors);
        }
        let peak = rss_mib(server.pid()).1;
        eprintln!("  {name}: {:.0} req/s", load.requests_per_second);
        rows.push(Throughput {
            name: name.to_string(),
            load,
            rss_idle_mib: None,
            rss_peak_mib: Some(peak),
        });
    }
    Ok(rows)
}

pub fn section(settings: &Settings, rows: &[Throughput]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{HEADING}\n");
    let _ = writeln!(
        md,
        "The Rust hello, a fresh instance per request, with `--otlp-endpoint` unset, set to an OpenTelemetry \
         Collector on loopback (OTLP receiver, file exporter; 4 spans per request, all sampled), and set to a \
         port nothing listens on (after the first failed export the runtime makes no spans for 5 s at a time, \
         counting them dropped). `wrk --latency -t2 -c{} -d{}s`, after a 1 s warm-up; client, runtime and \
         collector share the 2 cores, so the \"on\" row pays for the collector too. Ratios against tracing off, in \
         the same run ({}).\n",
        settings.connections,
        settings.load_seconds,
        crate::report::chrono_free_now()
    );
    let _ = writeln!(
        md,
        "| runtime | requests/s | ratio | p50 | p99 | peak RSS |\n|---|---|---|---|---|---|"
    );
    let first = rows.first().map_or(1.0, |row| row.load.requests_per_second);
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.2} | {:.2} ms | {:.2} ms | {:.0} MiB |",
            row.name,
            row.load.requests_per_second,
            row.load.requests_per_second / first,
            row.load.p50_ms,
            row.load.p99_ms,
            row.rss_peak_mib.unwrap_or_default(),
        );
    }
    let _ = writeln!(
        md,
        "\n`traces`: run alone with `bench/run.sh --only traces` (rewrites this section).\n"
    );
    md
}
