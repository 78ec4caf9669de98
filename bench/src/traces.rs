//! What tracing costs a request: the Rust hello with tracing off, on (every request
//! sampled, exported to a real OpenTelemetry Collector on loopback) and on with the
//! collector down (every span dropped). `--only traces` runs it alone.

use crate::measure::{Load, Server, rss_mib, until_first_200, wrk};
use crate::scenarios::{Settings, build_example, runtime};
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

/// Rounds of the three configurations, alternating.
const ROUNDS: usize = 5;

pub fn run(settings: &Settings) -> anyhow::Result<Vec<Row>> {
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
    let collector = Server::spawn(Command::new(otelcol(settings)?).arg(format!("--config={}", config.display())))?;
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
    let configurations = [
        ("wasmless-runtime, Rust hello, tracing off", None),
        (
            "the same, tracing on (every request sampled, exported to the collector)",
            Some(&up),
        ),
        ("the same, tracing on, the collector down (spans dropped)", Some(&down)),
    ];
    // One run of each is at the mercy of whatever else the 2 cores did meanwhile (two
    // single runs of "off" differed by 1.9x here): the three alternate, round after round,
    // and each row is its median round, with the slowest and fastest beside it, so
    // "within noise" can be read off the table.
    let rounds = if settings.quick { 1 } else { ROUNDS };
    let mut runs: Vec<Vec<(Load, f64)>> = vec![Vec::new(); configurations.len()];
    for round in 1..=rounds {
        for ((name, endpoint), runs) in configurations.iter().zip(&mut runs) {
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
            drop(server);
            // The collector writes the "on" row's spans for a while after its load ends:
            // the next row waits for it, so it does not pay for them.
            wait_until_idle(collector.pid());
            eprintln!(
                "  round {round}/{rounds}, {name}: {:.0} req/s, peak RSS {peak:.0} MiB",
                load.requests_per_second
            );
            runs.push((load, peak));
        }
    }
    Ok(configurations
        .iter()
        .zip(runs)
        .map(|((name, _), mut runs)| {
            runs.sort_by(|a, b| a.0.requests_per_second.total_cmp(&b.0.requests_per_second));
            let (load, _) = runs[runs.len() / 2];
            Row {
                name: name.to_string(),
                load,
                slowest: runs[0].0.requests_per_second,
                fastest: runs[runs.len() - 1].0.requests_per_second,
                rss_peak_mib: runs.iter().map(|(_, peak)| *peak).fold(0.0, f64::max),
                rounds: runs.len(),
            }
        })
        .collect())
}

/// Each configuration's median round.
pub struct Row {
    pub name: String,
    pub load: Load,
    pub slowest: f64,
    pub fastest: f64,
    /// The highest of its rounds.
    pub rss_peak_mib: f64,
    pub rounds: usize,
}

pub fn section(settings: &Settings, rows: &[Row]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{HEADING}\n");
    let _ = writeln!(
        md,
        "The Rust hello, a fresh instance per request, with `--otlp-endpoint` unset, set to an OpenTelemetry \
         Collector on loopback (OTLP receiver, file exporter; 4 spans per request, all sampled), and set to a \
         port nothing listens on (after the first failed export the runtime makes no spans for 5 s at a time, \
         counting them dropped). `wrk --latency -t2 -c{} -d{}s`, after a 1 s warm-up; client, runtime and \
         collector share the 2 cores, so the \"on\" row pays for the collector too. The three alternate for {} \
         rounds, each a new runtime process, and each waits until the collector is idle (it writes the \"on\" \
         row's spans for seconds after that row's load ends); a row is its median round (requests/s, p50, p99), with its slowest \
         and fastest round beside it, and the highest peak RSS of its rounds. Ratios against tracing off's median, \
         in the same run ({}).\n",
        settings.connections,
        settings.load_seconds,
        rows.first().map_or(0, |row| row.rounds),
        crate::report::chrono_free_now()
    );
    let _ = writeln!(
        md,
        "| runtime | requests/s (median) | slowest – fastest round | ratio | p50 | p99 | peak RSS |\n|---|---|---|---|---|---|---|"
    );
    let first = rows.first().map_or(1.0, |row| row.load.requests_per_second);
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} – {:.0} | {:.2} | {:.2} ms | {:.2} ms | {:.0} MiB |",
            row.name,
            row.load.requests_per_second,
            row.slowest,
            row.fastest,
            row.load.requests_per_second / first,
            row.load.p50_ms,
            row.load.p99_ms,
            row.rss_peak_mib,
        );
    }
    let _ = writeln!(
        md,
        "\n`traces`: run alone with `bench/run.sh --only traces` (rewrites this section).\n"
    );
    md
}

/// Waits (at most 30 s) until `pid` has used no CPU for half a second.
fn wait_until_idle(pid: u32) {
    let cpu_ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // After the command's name, in parentheses: utime and stime are the 12th and 13th fields.
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        field(11) + field(12)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = cpu_ticks();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let now = cpu_ticks();
        if now == last {
            return;
        }
        last = now;
    }
}
