//! A streamed response as a client gets it: the same Go handler (a 1.2 s Server-Sent
//! Events stream of four events, and a 20 MB CSV export written row by row) under native
//! Go net/http and in our runtime as a new pod runs it (the builder's reactor and code,
//! the default 64 MiB memory limit). Time to first byte, time to the last, and the
//! server's peak resident memory over the export. `--only streaming` runs it alone.

use crate::measure::{Server, rss_mib, until_first_200};
use crate::scenarios::{Settings, build_go_handler, go_command, goless_project_with, runtime_with_code};
use anyhow::{Context, bail};
use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;
use wasmless_testkit::free_port;

pub const HEADING: &str = "## Streaming: Server-Sent Events and a 20 MB export";

const HANDLER: &str = r#"package handlers

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

func Handler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/events":
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 1; i <= 4; i++ {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(300 * time.Millisecond)
		}
	case "/export":
		w.Header().Set("Content-Type", "text/csv")
		row := strings.Repeat("x", 50)
		for i := 0; i < 350000; i++ {
			fmt.Fprintf(w, "%08d,%s\n", i, row)
		}
	default:
		w.Write([]byte("ok"))
	}
}
"#;

/// The export's length: 350,000 rows of 60 bytes.
const EXPORT_BYTES: u64 = 350_000 * 60;
const ROUNDS: usize = 5;

pub struct Row {
    pub name: String,
    /// Medians, in milliseconds: the SSE stream's first byte and last; the export's.
    pub events_first_ms: f64,
    pub events_last_ms: f64,
    pub export_first_ms: f64,
    pub export_last_ms: f64,
    pub rss_idle_mib: f64,
    /// The server's peak resident memory (VmHWM) after the exports.
    pub rss_peak_mib: f64,
}

pub fn run(settings: &Settings) -> anyhow::Result<Vec<Row>> {
    let native_dir = settings.work("streaming-native");
    goless_project_with(&native_dir, HANDLER)?;
    crate::measure::time_command(&mut go_command(&["build", "-o", "server", "."], &native_dir))?;
    let module = build_go_handler(settings, "streaming-ours", HANDLER)?;

    let port = free_port();
    let native = measure(
        "native Go net/http",
        Command::new(native_dir.join("server")).env("PORT", port.to_string()),
        port,
    )?;
    let port = free_port();
    let cache = settings.work("streaming-cache");
    let ours = measure(
        "wasmless-runtime, the same handler (Go reactor, a fresh instance per request, 64 MiB limit)",
        &mut runtime_with_code(settings, &module, port, &cache)?,
        port,
    )?;
    Ok(vec![native, ours])
}

fn measure(name: &str, command: &mut Command, port: u16) -> anyhow::Result<Row> {
    let started = Instant::now();
    let mut server = Server::spawn(command)?;
    until_first_200(port, started, &mut server)?;
    let (rss_idle_mib, _) = rss_mib(server.pid());
    let (mut events, mut export) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (first, last, _) = curl(port, "/events")?;
        events.push((first, last));
        let (first, last, bytes) = curl(port, "/export")?;
        if bytes != EXPORT_BYTES {
            bail!("{name}: the export came with {bytes} bytes, not {EXPORT_BYTES}");
        }
        export.push((first, last));
    }
    let (_, rss_peak_mib) = rss_mib(server.pid());
    let median = |times: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        let mut values: Vec<f64> = times.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2] * 1000.0
    };
    let row = Row {
        name: name.to_string(),
        events_first_ms: median(&events, |t| t.0),
        events_last_ms: median(&events, |t| t.1),
        export_first_ms: median(&export, |t| t.0),
        export_last_ms: median(&export, |t| t.1),
        rss_idle_mib,
        rss_peak_mib,
    };
    eprintln!(
        "  {name}: events first byte {:.1} ms of {:.1}; export first byte {:.1} ms, last {:.1} ms; peak RSS {:.1} MiB",
        row.events_first_ms, row.events_last_ms, row.export_first_ms, row.export_last_ms, row.rss_peak_mib
    );
    Ok(row)
}

/// curl's own clock: seconds to the first byte and to the last, and the bytes.
fn curl(port: u16, path: &str) -> anyhow::Result<(f64, f64, u64)> {
    let output = Command::new("curl")
        .args(["-sN", "-o", "/dev/null", "--max-time", "60"])
        .args([
            "-w",
            "%{http_code} %{time_starttransfer} %{time_total} %{size_download}",
        ])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .context("cannot run curl")?;
    let text = String::from_utf8(output.stdout)?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    match fields[..] {
        ["200", first, last, bytes] => Ok((first.parse()?, last.parse()?, bytes.parse()?)),
        _ => bail!("GET {path}: curl said {text:?}"),
    }
}

pub fn section(rows: &[Row]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{HEADING}\n");
    let _ = writeln!(
        md,
        "The same Go handler, a Goless one that flushes: four Server-Sent Events 300 ms apart, \
         and a {:.0} MB CSV export written row by row with `fmt.Fprintf`. Medians of {ROUNDS} \
         rounds with curl on loopback (`bench/run.sh --only streaming`); peak RSS is the \
         server's VmHWM after the rounds. Ours runs as a new pod does, with the default \
         `--memory-limit` of 64 MiB: the export never lies whole in the instance (the writer \
         holds 64 KiB; the host one part of 64 KiB on its way to the client).\n",
        EXPORT_BYTES as f64 / 1e6
    );
    let _ = writeln!(
        md,
        "| server | SSE: first byte | SSE: last byte | export: first byte | export: last byte | RSS idle | peak RSS |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {:.1} ms | {:.0} ms | {:.1} ms | {:.0} ms | {:.1} MiB | {:.1} MiB |",
            row.name,
            row.events_first_ms,
            row.events_last_ms,
            row.export_first_ms,
            row.export_last_ms,
            row.rss_idle_mib,
            row.rss_peak_mib
        );
    }
    if let [native, ours] = rows {
        let _ = writeln!(
            md,
            "\nWe lose on the export: {:.1}× native Go's time to its last byte. Not profiled \
             yet; the suspects are Go's own code compiled to WebAssembly (a `Fprintf` and the \
             garbage collector per row) and a host call per 64 KiB. The export adds {:.1} MiB \
             to our peak over idle, {:.1} MiB to native Go's; our idle figure holds the \
             module's compiled code and the instance pool. Time to the first event is the \
             same order for both: the event leaves when it is flushed.\n",
            ours.export_last_ms / native.export_last_ms,
            ours.rss_peak_mib - ours.rss_idle_mib,
            native.rss_peak_mib - native.rss_idle_mib
        );
    }
    md
}
